"""Outsider T1: a JSONL ledger whose FINAL intent line was damaged by hand (``truncate -s
-2``, a cut inside a string, two events glued) read exactly like a torn write and was cut:
the item went back to ``pending`` and the next run sent its request again, executed twice
on a non-idempotent provider. Bytes cannot tell a hand cut from a crash's torn write, so a
torn tail that names a key is now cut at once with a mark in the header (``ledger.torn``),
and that key's next request is looked up before it is sent: found, adopted.

Each ledger here comes from a real run SIGKILLed once the provider executed a document,
then cut back to the sent key's intent line (what a power cut leaves: the ``submitted``
line after it is written unsynced), then damaged by hand.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import sigkill_at_executions
from toolkit.documents import make_corpus
from toolkit.forensics import audit
from toolkit.ledger import State
from toolkit.ledger.jsonl import JsonlLedger
from toolkit.provider import provider_stats

pytestmark = pytest.mark.slow

INTENT = b'"note": "intent"'


def _command(folder):
    return [sys.executable, "-m", "toolkit", "run", "--inputs", str(folder / "in"),
            "--ledger", str(folder / "L.jsonl"), "--provider-db", str(folder / "p.db"),
            "--out", str(folder / "out"), "--contract", "non-idempotent", "--no-progress"]


def _sent_intent_last(folder) -> tuple[str, list[bytes]]:
    """A real run killed after its first execution; the ledger cut back to end with the
    executed key's intent line. (that key, the ledger's lines)."""
    for _ in range(5):
        make_corpus(folder / "in", docs=3, poison=0, seed=5)
        assert sigkill_at_executions(_command(folder), folder / "p.db", [1]) == 1
        # The kill follows the first execution by a poll: on a loaded machine the run may
        # have sent a second document meanwhile, whose intent the cut below would remove
        # (not the one damaged line this test is about). Only a run killed after exactly
        # one execution is the premise; another is run again from nothing.
        if provider_stats(folder / "p.db")["executions"] == 1:
            break
        for leftover in folder.iterdir():
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    else:
        pytest.fail("no run was killed after exactly one execution in 5 tries")
    ledger = folder / "L.jsonl"
    lines = ledger.read_bytes().splitlines(keepends=True)
    at = next(n for n, line in enumerate(lines) if INTENT in line)
    key = json.loads(lines[at])["key"]
    assert provider_stats(folder / "p.db")["per_task"]  # its request was executed
    ledger.write_bytes(b"".join(lines[:at + 1]))
    # The witness in --out saw this intent (a run records its first intent there before
    # sending: witness_progress), so with it a cut of that line is refused as an older copy
    # (test_hand_cut_after_a_run_that_ended_is_refused_by_the_witness_then_salvaged). The
    # mark is what protects a ledger no witness follows: a program driving Runner itself,
    # a witness deleted. Here: deleted.
    (folder / "out" / ".witness.json").unlink()
    return key, lines[:at + 1]


def _truncate_2(lines):
    return b"".join(lines)[:-2]  # ``truncate -s -2``: the newline and the closing brace


def _cut_in_a_string(lines):
    last = lines[-1]
    return b"".join(lines[:-1]) + last[:last.index(b'"op": "mo') + 8]  # inside "move"


def _glued(lines):
    # the last two events on one final line (no newline between them, none after)
    return b"".join(lines[:-2]) + lines[-2].rstrip(b"\n") + lines[-1].rstrip(b"\n")


def _twice(folder) -> int:
    return sum(t["succeeded"] > 1 for t in provider_stats(folder / "p.db")["per_task"].values())


@pytest.mark.parametrize("damage", [_truncate_2, _cut_in_a_string, _glued])
def test_hand_cut_final_intent_of_a_sent_request_is_looked_up_not_sent_twice(tmp_path, damage):
    """The damaged final line names the key; the rerun through the CLI adopts the job the
    provider already has (found by lookup) instead of executing the document again."""
    key, lines = _sent_intent_last(tmp_path)
    (tmp_path / "L.jsonl").write_bytes(damage(lines))
    executed = provider_stats(tmp_path / "p.db")["executions"]
    done = subprocess.run(_command(tmp_path), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _twice(tmp_path) == 0  # on main: 1 (the cut intent's document, executed again)
    assert provider_stats(tmp_path / "p.db")["executions"] == executed + 2  # the other two
    with JsonlLedger(tmp_path / "L.jsonl", view=True) as ledger:
        assert ledger.get(key).state is State.DONE
        assert any("cut as torn" in str(e.detail.get("note")) for e in ledger.events()
                   if e.key == key)
        assert ledger.torn_marks == {}  # spent by the key's next intent


def test_kill9_right_after_the_cut_is_recorded_keeps_the_mark_for_the_rerun(tmp_path):
    """A writer opens the hand-cut ledger (the cut and its mark written in one atomic
    rewrite) and is SIGKILLed at once, before any append: the file has no torn tail left,
    so only the header's mark remembers the key. The audit names it; the rerun looks the
    key up and executes nothing twice."""
    key, lines = _sent_intent_last(tmp_path)
    ledger = tmp_path / "L.jsonl"
    ledger.write_bytes(_truncate_2(lines))
    child = subprocess.run([sys.executable, "-c", (
        "import os, signal, sys; from toolkit.ledger.jsonl import JsonlLedger; "
        "JsonlLedger(sys.argv[1]); os.kill(os.getpid(), signal.SIGKILL)"), str(ledger)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert child.returncode == -signal.SIGKILL
    assert ledger.read_bytes().endswith(b"\n")  # cut: no torn tail left to find again
    header = json.loads(ledger.read_bytes().split(b"\n", 1)[0])
    assert [mark["key"] for mark in header["torn"]] == [key]
    with JsonlLedger(ledger, view=True) as view:
        assert view.torn_tail is None and list(view.torn_marks) == [key]
    assert any(key[:12] in note and "looks up" in note for note in audit(ledger).notes)
    executed = provider_stats(tmp_path / "p.db")["executions"]
    assert subprocess.run(_command(tmp_path), capture_output=True).returncode == 0
    assert _twice(tmp_path) == 0
    assert provider_stats(tmp_path / "p.db")["executions"] == executed + 2


def test_compaction_keeps_a_pending_cut_mark_and_drops_a_spent_one(tmp_path):
    """A pending mark is the only record of the cut: a compaction (which rewrites the
    header and drops the event lines that would spend it) must keep it."""
    key = "ab" * 32
    ledger = tmp_path / "l.jsonl"
    with JsonlLedger(ledger) as writer:
        writer.add(key)
        writer.add("cd" * 32)
    ledger.write_bytes(ledger.read_bytes() + b'{"attempt": 1, "detail": {"note": "intent"}, '
                       b'"from": "pending", "key": "' + key.encode() + b'", "op": "mo')
    with JsonlLedger(ledger) as writer:
        assert writer.torn_marks == {key: 2}
        writer.compact()
    with JsonlLedger(ledger) as writer:
        assert writer.torn_marks == {key: 2} and not writer.damaged
        writer.move(key, State.PENDING, State.UNKNOWN, note="intent")
    with JsonlLedger(ledger) as writer:
        assert writer.torn_marks == {}  # spent by the intent after the cut
        writer.compact()
    assert b"torn" not in ledger.read_bytes().split(b"\n", 1)[0]


def test_torn_tail_naming_no_key_is_cut_at_the_first_append_as_before(tmp_path):
    """A torn tail whose bytes hold no whole 64-hex key field (cut before it, or a short
    key) is what a crash leaves: the file is not rewritten on open, no mark is made, and
    the first append cuts it (a guard: this must not change)."""
    ledger = tmp_path / "l.jsonl"
    key = "ab" * 32
    with JsonlLedger(ledger) as writer:
        writer.add(key)
    whole = ledger.read_bytes()
    for number, tail in enumerate((
            b'{"attempt": 1, "detail": {"note": "int',
            b'{"attempt": 1, "detail": {"note": "intent"}, "from": "pending", "key": "ab')):
        ledger.write_bytes(whole + tail)
        with JsonlLedger(ledger) as writer:
            assert writer.torn_tail is not None and writer.torn_keys == []
            assert ledger.read_bytes() == whole + tail  # not rewritten on open
            assert writer.torn_marks == {}
        with JsonlLedger(ledger) as writer:
            writer.add(f"k{number}")
        assert ledger.read_bytes().startswith(whole) and ledger.read_bytes().endswith(b"\n")
        assert b"torn" not in ledger.read_bytes().split(b"\n", 1)[0]
        whole = ledger.read_bytes()


def test_salvage_of_an_intact_ledger_with_a_keyed_torn_tail_keeps_the_key_marked(tmp_path):
    """Salvage reads a view (which records no cut) of a ledger that lost nothing else: its
    new ledger has no salvage mark, so without the torn mark the key would be sent
    unlooked-up from it."""
    from toolkit.ledger.salvage import salvage

    key = "ef" * 32
    ledger = tmp_path / "l.jsonl"
    with JsonlLedger(ledger) as writer:
        writer.add(key)
    ledger.write_bytes(ledger.read_bytes() + b'{"attempt": 1, "detail": {"note": "intent"}, '
                       b'"from": "pending", "key": "' + key.encode() + b'", "op": "move", "se')
    salvage(ledger, tmp_path / "S.jsonl")
    with JsonlLedger(tmp_path / "S.jsonl", view=True) as new:
        assert new.salvaged is None and new.torn_marks == {key: 1}


def test_hand_cut_after_a_run_that_ended_is_refused_by_the_witness_then_salvaged(tmp_path):
    """README's torn-tail paragraph, the other case: a run that ENDED witnessed its last
    seq in --out, so the hand-cut ledger is an older copy there: refused (exit 2, one
    line naming --salvage); the salvaged ledger (marked) is run with nothing sent twice."""
    make_corpus(tmp_path / "in", docs=3, poison=0, seed=5)
    assert subprocess.run(_command(tmp_path), capture_output=True).returncode == 0
    ledger = tmp_path / "L.jsonl"
    ledger.write_bytes(ledger.read_bytes()[:-2])
    refused = subprocess.run(_command(tmp_path), capture_output=True, text=True)
    assert refused.returncode == 2 and "older copy" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "--salvage" in refused.stderr
    assert subprocess.run([sys.executable, "-m", "toolkit", "ledger", str(ledger), "--salvage",
                           str(tmp_path / "S.jsonl"), "--out", str(tmp_path / "out")],
                          capture_output=True).returncode == 0
    command = _command(tmp_path)
    command[command.index(str(ledger))] = str(tmp_path / "S.jsonl")
    assert subprocess.run(command, capture_output=True).returncode == 0
    stats = provider_stats(tmp_path / "p.db")
    assert _twice(tmp_path) == 0 and stats["executions"] == 3


def test_torn_tail_naming_a_key_at_rest_is_no_mark_and_no_rewrite(tmp_path):
    """A cut line of a cancelled (or done) item came after its last request (a release):
    nothing more is sent for it, so no mark, no rewrite; the first append cuts it."""
    key = "ab" * 32
    ledger = tmp_path / "l.jsonl"
    with JsonlLedger(ledger) as writer:
        writer.add(key)
        writer.move(key, State.PENDING, State.CANCELLED)
    tail = b'{"attempt": 0, "detail": {}, "from": "cancelled", "key": "' + key.encode() + b'", "op'
    ledger.write_bytes(ledger.read_bytes() + tail)
    with JsonlLedger(ledger) as writer:
        assert writer.torn_keys == [key] and writer.torn_marks == {}
        assert ledger.read_bytes().endswith(tail)  # not rewritten on open
