"""An SQLite ledger's ``-shm`` deleted while a run has it open (outsider o40, HIGH 1).

SQLite takes a missing ``-shm`` to mean that no one has the database open and builds a
new index from the WAL; the live run still has the deleted one mapped. A second run then
wrote beside the first, each blind to the other's commits: documents executed twice and
a corrupt ledger. Real processes: run A stops itself (SIGSTOP) right after its first
intent, holding the ledger open; its ``-shm`` is deleted; run B starts on the same ledger.
"""

import os
import signal
import sqlite3
import subprocess
import sys
import time

from conftest import run_cli
from test_held_by_live_run import STOP_AFTER_FIRST_INTENT, _stopped
from toolkit.documents import make_corpus
from toolkit.ledger import State, open_ledger
from toolkit.provider import provider_stats


def _args(tmp_path):
    return ["run", "--inputs", tmp_path / "in", "--ledger", tmp_path / "L.sqlite",
            "--provider-db", tmp_path / "p.db", "--out", tmp_path / "out",
            "--contract", "non-idempotent", "--no-progress"]


def test_run_on_a_ledger_whose_shm_was_deleted_under_a_live_run_is_refused_not_run_twice(
        tmp_path):
    """Fault: run A holds the SQLite ledger open (stopped by a real SIGSTOP after its first
    intent) and ``L.sqlite-shm`` is deleted; run B starts on the same ledger. Must hold: B
    exits 1 with one line saying the -shm of a ledger in use was deleted, naming A's pid,
    and writes nothing (no new -shm); A, let go, finishes: every document executed once
    at the provider (non-idempotent contract), the ledger passes ``integrity_check``, and
    a run after A (no one live) opens it again. Before: B rebuilt -shm and ran the
    documents A was about to run: executed twice, the ledger corrupt."""
    make_corpus(tmp_path / "in", docs=4, poison=0, seed=1)
    shm = tmp_path / "L.sqlite-shm"
    a = subprocess.Popen([sys.executable, "-c", STOP_AFTER_FIRST_INTENT,
                          *map(str, _args(tmp_path))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _stopped(a.pid):
            assert a.poll() is None and time.monotonic() < deadline, a.communicate()
            time.sleep(0.01)
        shm.unlink()
        b = run_cli(*_args(tmp_path))
        b_left_shm = shm.exists()
    finally:
        os.kill(a.pid, signal.SIGCONT)
        _, a_stderr = a.communicate(timeout=120)
    assert b.returncode == 1, b.stderr
    assert len(b.stderr.strip().splitlines()) == 1 and "Traceback" not in b.stderr, b.stderr
    assert f"is open in live process {a.pid}" in b.stderr, b.stderr
    assert "L.sqlite-shm was deleted" in b.stderr
    assert not b_left_shm  # B built no second index
    assert a.returncode == 0, a_stderr
    stats = provider_stats(tmp_path / "p.db")
    assert stats["executions"] == 4, stats
    db = sqlite3.connect(tmp_path / "L.sqlite")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        db.close()
    again = run_cli(*_args(tmp_path))
    assert again.returncode == 0, again.stderr
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        assert [item.state for item in ledger.items()] == [State.DONE] * 4
    assert provider_stats(tmp_path / "p.db")["executions"] == 4
