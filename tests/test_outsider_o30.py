"""Outsider o30 (README only): a released item with no attempt on record, and a blank
unterminated last line.

T2: ``"attempt": 0`` on an intent made every ``run`` exit 1 with a traceback (the request
key of attempt 0 does not exist); the same state is reached without any edit when an
operator releases an item that salvage parked before its first intent. T4: a final
"line" of only spaces or a CR without a newline was a torn line for the audit, while the
ledger (and README: blank lines are no event and no damage) skipped it.
"""

import json

from toolkit import documents
from toolkit.cli import main
from toolkit.forensics import audit
from toolkit.ledger import State
from toolkit.ledger.jsonl import JsonlLedger
from toolkit.provider import provider_stats

from test_outsider_o27_ledger import _lines, _run


def _executions(folder):
    return provider_stats(folder / "p.db")["executions"]


def test_intent_with_attempt_0_on_record_is_looked_up_as_attempt_1_never_a_traceback(
        tmp_path, capsys):
    """Fault: the last intent line of a batch says ``"attempt": 0`` (edited, or written by
    a release of an item with no attempt). Property: the run looks up attempt 1, finds the
    job the first run sent and adopts it: exit 0, no traceback, no second execution."""
    documents.make_corpus(tmp_path / "in", docs=2, poison=0, seed=5)
    assert _run(tmp_path, tmp_path / "L.jsonl") == 0
    lines, before = _lines(tmp_path / "L.jsonl"), _executions(tmp_path)
    intents = [n for n, line in enumerate(lines) if b'"to": "unknown"' in line]
    cut = lines[:intents[-1] + 1]
    obj = json.loads(cut[-1])
    cut[-1] = json.dumps({**obj, "attempt": 0}).encode() + b"\n"
    (tmp_path / "L.jsonl").write_bytes(b"".join(cut))
    # a run killed at that intent leaves no end record in the witness (runner/witness.py),
    # whose entry from the whole run would refuse this shorter ledger as an older copy
    (tmp_path / "out" / ".witness.json").unlink()
    capsys.readouterr()
    assert _run(tmp_path, tmp_path / "L.jsonl") == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "attempt must be" not in err
    assert _executions(tmp_path) == before
    with JsonlLedger(tmp_path / "L.jsonl", view=True) as view:
        assert view.counts()["done"] == 2


def test_release_of_an_item_salvage_parked_before_its_first_intent_starts_attempt_1(
        tmp_path, capsys):
    """Fault: a corrupt line; salvage parks the pending items (attempt 0); the operator
    releases them. Property: the release records attempt 1 (what the lost lines may have
    sent), and the next run answers by lookup: exit 0, no traceback, no execution."""
    documents.make_corpus(tmp_path / "in", docs=2, poison=0, seed=5)
    assert _run(tmp_path, tmp_path / "A.jsonl") == 0
    lines = _lines(tmp_path / "A.jsonl")
    adds = [line for line in lines if b'"op": "add"' in line]
    (tmp_path / "F.jsonl").write_bytes(b"".join([lines[0], adds[0], b"{bad\n", *adds[1:]]))
    assert main(["ledger", str(tmp_path / "F.jsonl"), "--salvage", str(tmp_path / "G.jsonl")]) == 0
    with JsonlLedger(tmp_path / "G.jsonl", view=True) as view:
        parked = [item.key for item in view.items() if item.state is State.NEEDS_REVIEW]
    assert len(parked) == 2
    for key in parked:
        assert main(["resolve", "--ledger", str(tmp_path / "G.jsonl"), "--key", key,
                     "--release", "--note", "checked"]) == 0
    with JsonlLedger(tmp_path / "G.jsonl", view=True) as view:
        assert {view.get(key).attempt for key in parked} == {1}
    before = _executions(tmp_path)
    capsys.readouterr()
    assert _run(tmp_path, tmp_path / "G.jsonl") == 0
    assert "Traceback" not in capsys.readouterr().err
    assert _executions(tmp_path) == before  # found by lookup, or parked: never sent again


def test_blank_unterminated_final_line_is_no_damage_for_the_audit(tmp_path):
    """Fault: spaces and a tab, or a lone CR, after the last newline. Property: the audit
    reports no torn line (the ledger's own blank-line rule), like the ledger."""
    documents.make_corpus(tmp_path / "in", docs=1, poison=0, seed=5)
    assert _run(tmp_path, tmp_path / "L.jsonl") == 0
    body = (tmp_path / "L.jsonl").read_bytes()
    for tail in (b"  \t", b"\r"):
        path = tmp_path / "B.jsonl"
        path.write_bytes(body + tail)
        kinds = {finding.kind for finding in audit(path).anomalies}
        assert "torn_line" not in kinds, kinds
        with JsonlLedger(path, view=True) as view:
            assert view.torn_tail is None and not view.damaged
