"""A ledger record edited by hand into ``pending`` after an attempt (outsider o45 H1).

A run is killed right after an intent (the item ``unknown``, attempt 1: its request may
have been sent). Someone then edits the record back to ``pending``: the JSONL line's
``"to"`` (same length, an editor's save), or the SQLite row's state. No run writes that
(no edge enters pending; each intent counts an attempt), so the next intent would be
attempt 2, sent without a lookup where keys are not idempotent: executed twice when
attempt 1 had been sent. Real processes: the run stops itself after its first intent and
is SIGKILLed there.
"""

import json
import os
import signal
import sqlite3

import pytest

from conftest import run_cli
from test_held_by_live_run import stopped_after_first_intent
from toolkit.documents import make_corpus
from toolkit.provider import provider_stats


def _args(tmp_path, ledger):
    return ["run", "--inputs", tmp_path / "in", "--ledger", ledger,
            "--provider-db", tmp_path / "p.db", "--out", tmp_path / "out",
            "--contract", "non-idempotent", "--no-progress"]


def _edit_back_to_pending(ledger) -> None:
    if ledger.suffix == ".jsonl":
        lines = ledger.read_bytes().split(b"\n")
        last = lines[-2]  # the intent, the last line written
        assert b'"note": "intent"' in last and b'"to": "unknown"' in last, last
        lines[-2] = last.replace(b'"to": "unknown"', b'"to": "pending"')
        ledger.write_bytes(b"\n".join(lines))
    else:
        db = sqlite3.connect(ledger)
        with db:
            assert db.execute("UPDATE items SET state = 'pending' WHERE state = 'unknown'"
                              ).rowcount == 1
        db.close()


@pytest.mark.parametrize("suffix", [".jsonl", ".sqlite"])
def test_an_item_edited_back_to_pending_after_its_intent_is_never_sent_again_unlooked(
        tmp_path, suffix):
    """Fault: kill -9 right after an intent, then the item's record edited by hand back to
    ``pending`` (non-idempotent keys). Must hold: the rerun halts before any intent, exit 2,
    one line saying the record was edited and naming salvage; nothing is sent. Following
    it: salvage parks the item, the run on the new ledger ends at rest with it parked,
    ``resolve --release`` and a run (which looks its attempts up first) send it once: the
    document is executed once. Before: the rerun sent attempt 2 with no lookup, exit 0."""
    make_corpus(tmp_path / "in", docs=1, poison=0, seed=3)
    ledger = tmp_path / f"L{suffix}"
    with stopped_after_first_intent(_args(tmp_path, ledger)) as a:
        os.kill(a.pid, signal.SIGKILL)
    _edit_back_to_pending(ledger)
    again = run_cli(*_args(tmp_path, ledger))
    assert again.returncode == 2, again.stderr
    assert len(again.stderr.strip().splitlines()) >= 1 and "Traceback" not in again.stderr
    assert "pending after attempt 1" in again.stderr and "--salvage" in again.stderr
    assert provider_stats(tmp_path / "p.db")["submit_calls"] == 0  # nothing sent, then or now

    new = tmp_path / f"L.salvaged{suffix}"
    salvaged = run_cli("ledger", ledger, "--salvage", new, "--out", tmp_path / "out", "--json")
    assert salvaged.returncode == 0, salvaged.stderr
    (key,) = json.loads(salvaged.stdout)["needs_review"]
    parked = run_cli(*_args(tmp_path, new))
    assert parked.returncode == 0 and "needs_review=1" in parked.stdout, parked.stderr
    released = run_cli("resolve", "--ledger", new, "--key", key, "--release", "--note", "t")
    assert released.returncode == 0, released.stderr
    done = run_cli(*_args(tmp_path, new))
    assert done.returncode == 0 and "done=1" in done.stdout, (done.stdout, done.stderr)
    stats = provider_stats(tmp_path / "p.db")
    assert stats["executions"] == 1 and stats["submit_calls"] == 1, stats


def test_a_key_cell_overwritten_with_bytes_not_utf8_is_damage_and_its_advice_finishes_the_batch(
        tmp_path):
    """Outsider o46 M5. Fault: bytes overwritten inside an item's key in the SQLite file,
    after a finished run (``integrity_check`` passes: SQLite does not look at text), so the
    key no longer decodes as UTF-8. Must hold: the run and salvage call it damage (exit 2,
    one line: move it aside, salvage from nothing), never a storage error to clear with
    ``health --clear`` or a full TMPDIR; following that line finishes the batch with every
    document executed once (non-idempotent keys: the salvaged ledger looks each up).
    Before: run exit 1 and a health marker, for ever; salvage blamed TMPDIR."""
    make_corpus(tmp_path / "in", docs=3, poison=0, seed=3)
    ledger = tmp_path / "L.sqlite"
    first = run_cli(*_args(tmp_path, ledger))
    assert first.returncode == 0, first.stderr
    data = bytearray(ledger.read_bytes())
    at = data.index(b"\x00" * 8)  # past the header: find a key's 64 hex in the pages
    at = next(i for i in range(at, len(data) - 64)
              if all(0x30 <= b <= 0x39 or 0x61 <= b <= 0x66 for b in data[i:i + 64]))
    data[at + 18:at + 58] = b"\xde\xad\xbe\xef" * 10
    ledger.write_bytes(data)
    again = run_cli(*_args(tmp_path, ledger))
    new = tmp_path / "N.sqlite"
    refused = run_cli("ledger", ledger, "--salvage", new, "--out", tmp_path / "out")
    for result in (again, refused):
        assert result.returncode == 2, result.stderr
        assert "is damaged (Could not decode to UTF-8" in result.stderr, result.stderr
        assert "TMPDIR" not in result.stderr and "health --clear" not in result.stderr
    assert not (tmp_path / "L.sqlite.health").exists()
    ledger.rename(tmp_path / "L.sqlite.damaged")  # the advice, step by step
    salvaged = run_cli("ledger", ledger, "--salvage", new, "--out", tmp_path / "out")
    assert salvaged.returncode == 0, salvaged.stderr
    done = run_cli(*_args(tmp_path, new))
    assert done.returncode == 0 and "done=3" in done.stdout, (done.stdout, done.stderr)
    stats = provider_stats(tmp_path / "p.db")
    assert stats["executions"] == 3 and stats["submit_calls"] == 3, stats
