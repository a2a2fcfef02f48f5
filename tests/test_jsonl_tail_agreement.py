"""Outsider S7: ``run`` and ``audit`` disagreed on the same JSONL ledger.

A BOM before an interior line, ``"seq": 20.0`` or ``20.5``, ``"attempt": 1.0``,
``"token": 1.0`` were read by the ledger (``int()`` of anything) and corrupt for the audit;
``"attempt": -1`` was read by both, and later made ``run`` exit 1 with a raw ValueError.
Now one validator (``replay.EventLine``, through ``replay.event_parts`` for lines read the
reference way) decides for both: each of these is a corrupt line, for the ledger (it
refuses writes, one line naming the line) and for the audit (``corrupt_line``, that line).

A valid 3 MB line (a long note) was read by the ledger and refused by the audit (a 1 MiB
limit), which then flagged the intact lines of its key after it. Now both read every line
up to one limit (``gaps.LINE_LIMIT``), and both call a longer one corrupt in the same words,
and read on from its newline: the lines after it are never flagged.
"""

import json

import pytest

from toolkit import documents
from toolkit.cli import main
from toolkit.forensics import audit
from toolkit.ledger import gaps
from toolkit.ledger.jsonl import JsonlLedger

from test_outsider_o27_ledger import _lines, _run


@pytest.fixture
def batch(tmp_path, capsys):
    """A real non-idempotent batch of 6 documents run to rest: (folder, its ledger's lines)."""
    documents.make_corpus(tmp_path / "in", docs=6, poison=0, seed=7)
    assert _run(tmp_path, tmp_path / "L.jsonl") == 0
    capsys.readouterr()
    return tmp_path, _lines(tmp_path / "L.jsonl")


def _field(value, name):
    def change(line):
        obj = json.loads(line)
        obj[name] = value(obj[name])
        return json.dumps(obj).encode() + b"\n"
    return change


EDITS = {
    "bom": lambda line: b"\xef\xbb\xbf" + line,
    "seq-float": _field(float, "seq"),
    "seq-half": _field(lambda seq: seq + 0.5, "seq"),
    "attempt-float": _field(float, "attempt"),
    "token-float": _field(float, "token"),
    "attempt-negative": _field(lambda _: -1, "attempt"),
    # outsider o30 T3: an op outside the ledger's four was read by the ledger (as a move)
    "op-unknown": _field(lambda _: "x", "op"),
}


def _verdicts(tmp_path, path, capsys, number):
    """(the ledger's corrupt lines, the audit's, the run's exit and stderr)."""
    with JsonlLedger(path, view=True) as view:
        ledger = list(view.corrupt_lines)
    report = audit(path)
    capsys.readouterr()
    code = _run(tmp_path, path)
    return ledger, list(report.corrupt_lines), code, capsys.readouterr().err


@pytest.mark.parametrize("edit", EDITS, ids=list(EDITS))
@pytest.mark.parametrize("where", ["interior", "last"])
def test_odd_event_line_is_corrupt_for_ledger_and_audit_alike(batch, capsys, edit, where):
    tmp_path, lines = batch
    at = 7 if where == "interior" else len(lines) - 1
    path = tmp_path / "odd.jsonl"
    path.write_bytes(b"".join([*lines[:at], EDITS[edit](lines[at]), *lines[at + 1:]]))
    ledger, audited, code, err = _verdicts(tmp_path, path, capsys, at + 1)
    assert ledger == audited == [at + 1], (ledger, audited)
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert f"corrupt lines {at + 1}" in err and "Traceback" not in err, err


def test_long_valid_line_is_read_by_ledger_and_audit_alike_and_never_flags_lines_after(
        batch, capsys):
    tmp_path, lines = batch
    path = tmp_path / "long.jsonl"
    obj = json.loads(lines[9])
    obj["detail"]["note"] = "x" * 3_000_000
    path.write_bytes(b"".join([*lines[:9], json.dumps(obj).encode() + b"\n", *lines[10:]]))
    with JsonlLedger(path, view=True) as view:
        assert not view.damaged
    report = audit(path)
    assert report.corrupt_lines == [] and not report.anomalies or \
        {a.kind for a in report.anomalies} <= {"done_without_artifact"}, report.anomalies
    assert "nan" not in json.dumps(report.to_json())


def test_line_over_the_limit_is_corrupt_for_both_in_the_same_words_and_lines_after_read(
        batch, capsys):
    tmp_path, lines = batch
    path = tmp_path / "over.jsonl"
    obj = json.loads(lines[9])
    obj["detail"]["note"] = "x" * (gaps.LINE_LIMIT + 10)
    big = json.dumps(obj).encode() + b"\n"
    path.write_bytes(b"".join([*lines[:9], big, *lines[10:]]))
    words = gaps.too_long(len(big) - 1)
    with JsonlLedger(path, view=True) as view:
        assert view.corrupt_lines == [10]
        assert words in view.corruption()
    report = audit(path)
    assert report.corrupt_lines == [10]
    assert any(words in a.detail for a in report.anomalies if a.kind == "corrupt_line")
    # the lines after it are read: only line 10's key can lack its history
    flagged = {a.detail.split(":")[0] for a in report.anomalies if a.kind == "corrupt_line"}
    assert flagged == {"line 10"}, flagged
    assert main(["ledger", str(path), "--salvage", str(tmp_path / "S.jsonl")]) == 0
