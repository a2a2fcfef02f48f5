"""The audit's typed reading of a JSONL ledger's event lines: op, from and to as words of
the vocabulary, and a batch's rows packed in one go; the report stays the reference's."""

import json
from unittest import mock

import msgspec

from toolkit.forensics import audit, lines
from toolkit.forensics.columns import VOCABULARY
from toolkit.forensics.jsonl import _worded_event

T0 = 1_700_000_000.0


def _history(items: int) -> list[dict]:
    """Each item added, sent and done: the events a clean batch writes, seq 1, 2, 3, ..."""
    events = []
    for n in range(items):
        key, state = f"k{n:04d}", None
        for to in ("pending", "unknown", "submitted", "done"):
            detail = {"source": f"doc-{n}.pdf"} if to == "pending" else {}
            if to == "done":
                detail = {"artifact_path": f"out/doc-{n}.pdf", "artifact_size": n,
                          "artifact_sha256": "0" * 64}
            events.append({"seq": len(events) + 1, "ts": T0 + len(events), "op":
                           "add" if state is None else "move", "key": key, "from": state,
                           "to": to, "attempt": 0 if state is None else 1, "worker": None,
                           "token": 0, "detail": detail})
            state = to
    return events


def _write(path, events) -> None:
    path.write_text("".join(json.dumps(event) + "\n" for event in events), encoding="utf-8")


def _same_as_reference(path):
    fast = audit(path, now=0.0)
    with mock.patch.object(lines, "FAST", False):
        reference = audit(path, now=0.0)
    assert fast.to_json() == reference.to_json()
    assert [row[:2] for row in fast.rows] == [row[:2] for row in reference.rows]
    assert fast.events.equals(reference.events)
    return fast


def test_event_words_decoded_are_the_vocabularys_own_strings(tmp_path):
    """Fault: none (a clean line). Property: the typed decoder hands back op, from and to
    as the very string objects the fold's vocabulary holds (no new string per field, and
    the (op, from, to) lookup meets its own keys)."""
    line = json.dumps(_history(1)[2]).encode()
    event = msgspec.json.Decoder(_worded_event()).decode(line)
    words = {word for triple in VOCABULARY for word in triple if word is not None}
    assert any(event.op is word for word in words)
    assert any(event.frm is word for word in words)
    assert any(event.to is word for word in words)


def test_word_outside_the_vocabulary_in_a_clean_batch_is_one_corrupt_line(tmp_path):
    """Fault: one line of 400 edited to a state no ledger writes ("paused"), and one to an
    op none writes. Property: the typed decoder refuses both, so they go the reference way
    and each is one corrupt line (kept out of the event table); the report is exactly the
    json reference reader's."""
    events = _history(100)
    events[149]["to"] = "paused"
    events[250]["op"] = "resume"
    path = tmp_path / "ledger.jsonl"
    _write(path, events)
    report = _same_as_reference(path)
    assert report.corrupt_lines == [150, 251]
    assert len(report.events) == 398


def test_seq_beyond_64_bits_in_a_batch_keeps_every_integer_exact(tmp_path):
    """Fault: one event line in a batch of 300 holds a seq of 2**64 (no int64 holds it).
    Property: the packed rows are refused for that batch and the event table keeps the
    integer exactly, as the reference reader does (and the seq disorder is reported)."""
    events = _history(75)
    events[120]["seq"] = 2**64
    path = tmp_path / "ledger.jsonl"
    _write(path, events)
    report = _same_as_reference(path)
    assert 2**64 in list(report.events["seq"])
    assert "seq_disorder" in {anomaly.kind for anomaly in report.anomalies}
