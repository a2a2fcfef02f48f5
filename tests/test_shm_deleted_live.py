"""An SQLite ledger's ``-shm`` deleted while a run has it open (outsider o40, HIGH 1).

SQLite takes a missing ``-shm`` to mean that no one has the database open and builds a
new index from the WAL; the live run still has the deleted one mapped. A second run then
wrote beside the first, each blind to the other's commits: documents executed twice and
a corrupt ledger. Real processes: run A stops itself (SIGSTOP) right after its first
intent, holding the ledger open; its ``-shm`` is deleted; run B starts on the same ledger.
"""

import os
import sqlite3

import pytest

from conftest import run_cli
from test_held_by_live_run import stopped_after_first_intent
from toolkit.documents import make_corpus
from toolkit.ledger import State, open_ledger
from toolkit.provider import provider_stats


def _args(tmp_path):
    return ["run", "--inputs", tmp_path / "in", "--ledger", tmp_path / "L.sqlite",
            "--provider-db", tmp_path / "p.db", "--out", tmp_path / "out",
            "--contract", "non-idempotent", "--no-progress"]


@pytest.mark.parametrize("side", ["-shm", "-wal"])
def test_run_on_a_ledger_whose_shm_or_wal_was_deleted_under_a_live_run_is_refused_not_run_twice(
        tmp_path, side):
    """Fault: run A holds the SQLite ledger open (stopped by a real SIGSTOP after its first
    intent) and ``L.sqlite-shm`` (or ``-wal``) is deleted; run B, then ``ledger L.sqlite``,
    start on it. Must hold: B exits 1 with one line saying that file was deleted while A
    (its pid) has it open, and writes nothing; the view answers without writing; neither
    makes a new -shm or -wal; A, let go, finishes: every document
    executed once at the provider (non-idempotent contract), the ledger passes
    ``integrity_check``, and a run after A opens it again. Before: B rebuilt -shm and ran
    the documents A was about to run: executed twice, the ledger corrupt."""
    make_corpus(tmp_path / "in", docs=4, poison=0, seed=1)
    deleted = tmp_path / f"L.sqlite{side}"
    with stopped_after_first_intent(_args(tmp_path)) as a:
        deleted.unlink()
        b = run_cli(*_args(tmp_path))
        view = run_cli("ledger", tmp_path / "L.sqlite")
        made_again = deleted.exists()
    assert b.returncode == 1, b.stderr
    assert len(b.stderr.strip().splitlines()) == 1 and "Traceback" not in b.stderr, b.stderr
    assert f"{side} was deleted while live process {a.pid} has it open" in b.stderr
    assert view.returncode == 0, view.stderr
    assert not made_again  # no one built a second index or WAL
    assert a.returncode == 0, a.stderr_text
    assert provider_stats(tmp_path / "p.db")["executions"] == 4
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


def test_a_wal_emptied_in_place_under_a_live_run_ends_it_with_exit_1_not_at_rest(tmp_path):
    """Fault (outsider o41 F2): ``: > L.sqlite-wal`` while run A has the ledger open (A
    stopped by a real SIGSTOP after its first intent, then let go). SQLite writes A's next
    frames behind a hole of zeros; the database is damaged. Must hold: A does not end "at
    rest" with exit 0: its close finds the WAL headerless and says the ledger is damaged
    (one line, salvage named, exit 2 as every damaged ledger); no document executed twice.
    Before: A printed done=4 and exited 0 on a ledger nothing could open."""
    make_corpus(tmp_path / "in", docs=4, poison=0, seed=1)
    with stopped_after_first_intent(_args(tmp_path)) as a:
        os.truncate(tmp_path / "L.sqlite-wal", 0)
    assert a.returncode == 2, a.stderr_text
    assert len(a.stderr_text.strip().splitlines()) == 1, a.stderr_text
    assert "-wal was emptied or overwritten" in a.stderr_text and "--salvage" in a.stderr_text
    stats = provider_stats(tmp_path / "p.db")
    assert all(task["executions"] <= 1 for task in stats["per_task"].values()), stats
