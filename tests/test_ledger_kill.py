"""A real SIGKILL in the middle of a stream of transitions: what survives."""

import os
import signal
import sqlite3
import subprocess
import sys

import pytest

from toolkit.ledger import State, apply_event, open_ledger

WRITER = r"""
import sys
from toolkit.ledger import open_ledger
ledger = open_ledger(sys.argv[1])
for n in range(100000):
    key = f"k{n:06d}"
    ledger.add(key, source=f"{key}.pdf")
    ledger.move(key, "pending", "unknown")
    ledger.move(key, "unknown", "submitted", job_id=f"job-{n}")
    ledger.move(key, "submitted", "done", artifact_path=f"{key}.pdf", artifact_size=n,
                artifact_sha256="0" * 64)
    # Printed only after the commit returned: every printed key must survive.
    print(key, flush=True)
"""


@pytest.mark.parametrize("backend", ["sqlite", "jsonl"])
@pytest.mark.parametrize("after_lines", [1, 7, 40])
def test_sigkill_mid_stream_keeps_every_committed_transition_and_nothing_half_applied(
        tmp_path, backend, after_lines):
    path = tmp_path / f"ledger.{backend}"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                             text=True)
    committed = [child.stdout.readline().strip() for _ in range(after_lines)]
    os.kill(child.pid, signal.SIGKILL)  # the real thing, wherever the writer is
    child.wait()
    assert child.returncode == -signal.SIGKILL

    if backend == "sqlite":
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with open_ledger(path) as ledger:
        items = {item.key: item for item in ledger.items()}
        events = ledger.events()
        if backend == "jsonl":
            assert ledger.corrupt_lines == []  # at most a torn tail, never interior damage
    for key in committed:
        assert items[key].state is State.DONE and items[key].artifact_size == int(key[1:])
    # Nothing half-applied: every item is exactly the fold of its surviving events.
    folded = {}
    for event in events:
        folded[event.key] = apply_event(folded.get(event.key), event)
    assert folded == items
    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    assert len(items) >= after_lines
