"""Outsider S1: a JSONL ledger whose last line is a whole, valid event but has lost its
final newline (``truncate -s -1``, an editor, ``printf %s "$(cat L)" > L``, a CR for the LF).

The ledger took such a line for a torn write: it dropped it (an intent: the document had
been sent) and the next run sent the document again, a second execution on a
non-idempotent provider. The rule now (``replay.whole_line``, one place for the ledger and
the audit): a final line without its newline that reads whole as an event IS the event;
the writer puts the newline before its next line; the audit names it in a note. Only a
final line that does not read whole is torn (cut, as before).
"""

import json

import pytest

from toolkit import documents
from toolkit.cli import main
from toolkit.forensics import audit
from toolkit.ledger import State
from toolkit.ledger.jsonl import JsonlLedger
from toolkit.provider.records import provider_stats

from test_outsider_o27_ledger import _lines, _run


def _cut_after_last_intent(tmp_path, capsys, ending: bytes):
    """A real non-idempotent batch of 3 run to rest; its ledger cut back to the last
    document's intent line, whose newline is replaced by ``ending``. The provider has
    executed all 3 (so a resend is a second execution). Returns the ledger's path."""
    documents.make_corpus(tmp_path / "in", docs=3, poison=0, seed=5)
    ledger = tmp_path / "L.jsonl"
    assert _run(tmp_path, ledger) == 0
    lines = _lines(ledger)
    last = max(at for at, line in enumerate(lines[1:], 1)
               if json.loads(line)["detail"].get("note") == "intent")
    ledger.write_bytes(b"".join(lines[:last]) + lines[last].rstrip(b"\n") + ending)
    # The state a run killed just after that intent leaves: such a run records no end in
    # the witness under --out (runner/witness.py), whose entry from this run's end would
    # rightly see the lines cut here as lost (an older copy, refused).
    (tmp_path / "out" / ".witness.json").unlink()
    capsys.readouterr()
    return ledger, json.loads(lines[last])


@pytest.mark.parametrize("ending", [b"", b"\r", b" "], ids=["no-newline", "cr", "space"])
def test_unterminated_final_intent_is_kept_and_never_executed_twice(tmp_path, capsys, ending):
    ledger, intent = _cut_after_last_intent(tmp_path, capsys, ending)
    with JsonlLedger(ledger, view=True) as view:
        assert view.torn_tail is None and not view.damaged
        assert view.get(intent["key"]).state is State.UNKNOWN  # the intent is read
    assert _run(tmp_path, ledger) == 0
    stats = provider_stats(tmp_path / "p.db")
    assert stats["executions"] == 3, stats
    assert max(t["succeeded"] for t in stats["per_task"].values()) == 1
    # the writer put the newline before its next line: every line whole, the history intact
    assert ledger.read_bytes().endswith(b"\n")
    for line in _lines(ledger)[1:]:
        json.loads(line)
    with JsonlLedger(ledger, view=True) as view:
        assert not view.damaged and view.torn_tail is None
        assert {item.state for item in view.items()} == {State.DONE}
        assert intent["seq"] in {event.seq for event in view.events()}


def test_unterminated_final_event_is_named_by_audit_not_torn(tmp_path, capsys):
    ledger, intent = _cut_after_last_intent(tmp_path, capsys, b"")
    report = audit(ledger)
    kinds = {a.kind for a in report.anomalies}
    assert "torn_line" not in kinds and "corrupt_line" not in kinds, kinds
    assert any("unterminated" in note for note in report.notes), report.notes
    items = report.items
    assert list(items[items["key"] == intent["key"]]["state"]) == ["unknown"]
    # the contrast: a final line cut inside (a torn write) is still torn, for both, and
    # the writer still cuts it before its first append
    ledger.write_bytes(ledger.read_bytes()[:-5])
    assert "torn_line" in {a.kind for a in audit(ledger).anomalies}
    with JsonlLedger(ledger) as writer:
        assert writer.torn_tail is not None
        assert writer.get(intent["key"]).state is not State.UNKNOWN
        writer.add("k-new", "new.pdf")
    for line in _lines(ledger)[1:]:
        json.loads(line)
