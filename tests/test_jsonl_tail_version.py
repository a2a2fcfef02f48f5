"""Outsider S9: a header edited to ``"version": 2`` was silent in the audit, and salvage
refused it with no way out; the halt of a run whose ledger was replaced mid-run said
"(seen at close)" even when it was seen at an append.

Now the refusal (run, ledger, salvage) says what to do (the newer toolkit, or the version
put back, then audit and salvage) and the audit notes it in the same words; a halt names
where it was seen, once.
"""

import json

from toolkit import documents
from toolkit.cli import main
from toolkit.forensics import audit
from toolkit.ledger.header import VERSION

from test_outsider_o27_ledger import _lines, _run
from test_outsider_o28_ledger import _cp_mv, _interrupted_run


def test_header_version_edited_is_noted_by_audit_and_refusal_says_the_way_out(
        tmp_path, capsys):
    documents.make_corpus(tmp_path / "in", docs=2, poison=0, seed=4)
    ledger = tmp_path / "L.jsonl"
    assert _run(tmp_path, ledger) == 0
    lines = _lines(ledger)
    header = json.loads(lines[0])
    ledger.write_bytes(json.dumps({**header, "version": 2}).encode() + b"\n"
                       + b"".join(lines[1:]))
    capsys.readouterr()
    assert main(["ledger", str(ledger), "--salvage", str(tmp_path / "S.jsonl")]) != 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f'set "version": {VERSION} in line 1' in err and "--salvage" in err, err
    report = audit(ledger)
    assert any("format version 2" in note for note in report.notes), report.notes
    # the way out works: the version put back, salvage reads it
    ledger.write_bytes(json.dumps({**header, "version": VERSION}).encode() + b"\n"
                       + b"".join(lines[1:]))
    assert main(["ledger", str(ledger), "--salvage", str(tmp_path / "S.jsonl")]) == 0


def test_ledger_replaced_mid_run_halt_says_it_was_seen_at_an_append(tmp_path):
    code, err = _interrupted_run(tmp_path, _cp_mv, lines=40)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "(seen at append)" in err, err
