"""Outsider o33 Q3/Q7: a run SIGKILLed during an intent, its final line then cut by hand
INSIDE the key's hex (20 hex left) or inside the intent's note (the writer sorts the
fields, so ``"detail": {"note": "intent"}`` comes before the key: a cut there leaves no
key), was rerun and sent the same request again (a double on a non-idempotent provider).
The torn tail now names every item it can be (``ledger.torn.tail_keys``): a prefix of 8
hex or more, the items not at rest whose key starts with it; an intent cut before its key,
the items holding a lease in a state an intent moves from. Each is marked and looked up
before its next send. The audit reads the tail by the same rule: it names the key(s) and
plans ``reconcile`` for them, and parks no other item for a tail the run cuts.

Each ledger comes from a real run SIGKILLed once the provider executed a document, cut
back to the executed key's intent line, then cut by hand (``test_torn_key_cut``).
"""

import json
import subprocess

import pytest

from test_torn_key_cut import _command, _sent_intent_last, _twice
from toolkit.forensics import audit
from toolkit.ledger import State
from toolkit.ledger.jsonl import JsonlLedger
from toolkit.provider import provider_stats

pytestmark = pytest.mark.slow


def _inside_the_key(last: bytes) -> bytes:
    return last[:last.index(b'"key": "') + 8 + 20]  # 20 hex left


def _inside_the_note(last: bytes) -> bytes:
    return last[:last.index(b'"note": "int') + 12]  # "int…": the key is after it


def _after_the_key_field(last: bytes) -> bytes:
    return last[:last.index(b'"key": "') + 8]  # no hex left


def _compact_inside_the_key(last: bytes) -> bytes:
    # the line as ``jq -c`` writes it (no spaces), then cut inside the key's hex
    compact = json.dumps(json.loads(last), separators=(",", ":"), sort_keys=True).encode()
    return compact[:compact.index(b'"key":"') + 7 + 20]


@pytest.mark.parametrize("cut", [_inside_the_key, _inside_the_note, _after_the_key_field,
                                 _compact_inside_the_key])
def test_hand_cut_inside_the_intents_key_or_note_is_looked_up_not_sent_twice(tmp_path, cut):
    """The rerun through the CLI adopts the job the provider already has; the audit of the
    cut ledger names the key (not "-"), plans reconcile for it and run for the others."""
    key, lines = _sent_intent_last(tmp_path)
    ledger = tmp_path / "L.jsonl"
    ledger.write_bytes(b"".join(lines[:-1]) + cut(lines[-1]))
    copy = tmp_path / "cut.jsonl"  # audited after the run (it reads the cut ledger)
    copy.write_bytes(ledger.read_bytes())
    executed = provider_stats(tmp_path / "p.db")["executions"]
    done = subprocess.run(_command(tmp_path), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _twice(tmp_path) == 0  # on main: 1 (the cut intent's document, executed again)
    assert provider_stats(tmp_path / "p.db")["executions"] == executed + 2  # the other two
    with JsonlLedger(ledger, view=True) as view:
        assert view.get(key).state is State.DONE and view.torn_marks == {}
        assert any("cut as torn" in str(e.detail.get("note")) for e in view.events()
                   if e.key == key)
    report = audit(copy)
    torn = [a for a in report.anomalies if a.kind == "torn_line"]
    assert [a.key for a in torn] == [key]  # on main: [None] ("-")
    plans = dict(zip(report.items["key"], report.items["action"]))
    assert plans.pop(key) == "reconcile" and set(plans.values()) == {"run"}  # main: all review
    assert report.corrupt_lines == [len(lines)]  # unusable, not damage parking every item


def _shared_prefix_ledger(path):
    """Three items whose keys share their first 20 hex: two pending, claimed by a worker
    (the run's lease), one cancelled; the final intent line cut inside its key's hex."""
    prefix = "0123456789abcdef0123"
    keys = [prefix + c * 44 for c in "abc"]
    with JsonlLedger(path) as writer:
        for key in keys:
            writer.add(key)
        writer.claim(keys[0], "w", 60)
        writer.claim(keys[1], "w", 60)
        writer.move(keys[2], State.PENDING, State.CANCELLED)
    data = path.read_bytes()
    intent = (b'{"attempt": 1, "detail": {"note": "intent"}, "from": "pending", "key": "'
              + keys[0].encode() + b'", "op": "move"')
    path.write_bytes(data + intent[:intent.index(b'"key": "') + 8 + 20])
    return keys


def test_key_prefix_shared_by_two_items_marks_both_not_the_one_at_rest(tmp_path):
    """20 hex could be either pending item's (a lookup each costs a lookup, never a send):
    both are marked in the header, in one rewrite on open; the cancelled one is not. The audit
    names both, and after the writer's cut, notes both marks."""
    path = tmp_path / "l.jsonl"
    keys = _shared_prefix_ledger(path)
    report = audit(path)
    assert sorted(a.key for a in report.anomalies if a.kind == "torn_line") == keys[:2]
    plans = dict(zip(report.items["key"], report.items["action"]))
    assert [plans[key] for key in keys] == ["reconcile", "reconcile", "skip"]
    with JsonlLedger(path) as writer:  # a writer opens it: cut, marked
        assert sorted(writer.torn_marks) == keys[:2]
    assert path.read_bytes().endswith(b"\n")
    header = json.loads(path.read_bytes().split(b"\n", 1)[0])
    assert sorted(mark["key"] for mark in header["torn"]) == keys[:2]
    notes = audit(path).notes  # each key in full: 12 hex would name all three
    assert all(any(key in note for note in notes) for key in keys[:2])
    assert not any(keys[2] in note for note in notes)


def test_key_prefix_of_8_hex_names_its_item_and_of_7_hex_none(tmp_path):
    """8 hex left name the item; 7 name too many keys to be one's: no prefix match (an intent cut there is read
    as one cut before its key: only items holding a lease)."""
    path = tmp_path / "l.jsonl"
    key = "ab" * 32
    with JsonlLedger(path) as writer:
        writer.add(key)
    path.write_bytes(path.read_bytes() + b'{"attempt": 0, "detail": {}, "from": "pending", '
                     b'"key": "' + key[:7].encode())
    with JsonlLedger(path, view=True) as view:
        assert view.torn_tail is not None and view.torn_keys == []
    path.write_bytes(path.read_bytes()[:-7] + key[:8].encode())
    with JsonlLedger(path, view=True) as view:
        assert view.torn_keys == [key]
