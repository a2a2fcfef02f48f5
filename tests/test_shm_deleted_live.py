"""An SQLite ledger's ``-shm`` deleted while a run has it open (outsider o40, HIGH 1).

SQLite takes a missing ``-shm`` to mean that no one has the database open and builds a
new index from the WAL; the live run still has the deleted one mapped. A second run then
wrote beside the first, each blind to the other's commits: documents executed twice and
a corrupt ledger. Real processes: run A stops itself (SIGSTOP) right after its first
intent, holding the ledger open; its ``-shm`` is deleted; run B starts on the same ledger.
"""

import os
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import run_cli
from test_held_by_live_run import stopped_after_first_intent
from toolkit.documents import make_corpus
from toolkit.errors import ToolkitError
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
    intent) and ``L.sqlite-shm`` (or ``-wal``) is deleted; run B, then ``ledger L.sqlite``
    and ``audit L.sqlite``, start on it. Must hold: B exits 1 with one line saying that
    file was deleted while A (its pid) has it open, and writes nothing; the views answer
    without writing where they can read every commit (a copy of the file and its WAL:
    ``-shm`` deleted), and with a deleted ``-wal``, whose commits only A holds, refuse in
    one line naming A, exit 1 (outsider o42 F5: they showed an older state as now, exit
    0); none makes a new -shm or -wal; A, let go, finishes: every document
    executed once at the provider (non-idempotent contract), the ledger passes
    ``integrity_check``, and a run after A opens it again. Before: B rebuilt -shm and ran
    the documents A was about to run: executed twice, the ledger corrupt."""
    make_corpus(tmp_path / "in", docs=4, poison=0, seed=1)
    deleted = tmp_path / f"L.sqlite{side}"
    with stopped_after_first_intent(_args(tmp_path)) as a:
        deleted.unlink()
        b = run_cli(*_args(tmp_path))
        views = [run_cli(command, tmp_path / "L.sqlite") for command in ("ledger", "audit")]
        made_again = deleted.exists()
    assert b.returncode == 1, b.stderr
    assert len(b.stderr.strip().splitlines()) == 1 and "Traceback" not in b.stderr, b.stderr
    assert f"{side} was deleted while live process {a.pid} has it open" in b.stderr
    for view in views:
        if side == "-shm":
            assert view.returncode == 0, view.stderr
        else:
            assert view.returncode == 1 and len(view.stderr.strip().splitlines()) == 1
            assert f"-wal was deleted while live process {a.pid} has it open" in view.stderr
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


def test_salvage_of_a_ledger_whose_shm_was_deleted_under_a_live_run_is_refused_naming_it(
        tmp_path):
    """Fault (outsider o42 F1): run A holds the ledger (a real SIGSTOP after its first
    intent), ``L.sqlite-shm`` is deleted, then ``ledger L --salvage NEW``. Must hold: the
    salvage is refused as a run is, exit 1, one line naming A's pid, no NEW written; A,
    let go, finishes, every document executed once. Before: the busy check asked the
    deleted -shm's lock, found none, and wrote NEW unmarked ("lost: nothing") from a
    history A went on writing: a run on NEW sent 162 of 300 documents again."""
    make_corpus(tmp_path / "in", docs=4, poison=0, seed=1)
    new = tmp_path / "new.sqlite"
    with stopped_after_first_intent(_args(tmp_path)) as a:
        (tmp_path / "L.sqlite-shm").unlink()
        salvage = run_cli("ledger", tmp_path / "L.sqlite", "--salvage", new,
                          "--out", tmp_path / "out")
    assert salvage.returncode == 1, salvage.stderr
    assert len(salvage.stderr.strip().splitlines()) == 1, salvage.stderr
    assert f"busy: open in live process {a.pid}" in salvage.stderr
    assert not new.exists()
    assert a.returncode == 0, a.stderr_text
    assert provider_stats(tmp_path / "p.db")["executions"] == 4


def test_a_run_on_a_ledger_damaged_under_a_stopped_live_run_is_refused_naming_it_not_sent_to_move_it(
        tmp_path):
    """Fault (outsider o42 F2): run A holds the ledger (a real SIGSTOP after its first
    intent) and its WAL is emptied in place (``: > L.sqlite-wal``); run B starts on it.
    Must hold: B exits 1, one line saying the ledger reads as damaged while A (its pid)
    has it open, with no ``mv`` and no salvage to follow (moved aside or salvaged, A goes
    on writing the old file and a run on the copy sends A's work again); A, let go, ends
    on the damage (exit 2); no document executed twice. Before: B said "move it aside,
    salvage from nothing, run", and following it executed 530 documents for 300."""
    make_corpus(tmp_path / "in", docs=4, poison=0, seed=1)
    with stopped_after_first_intent(_args(tmp_path)) as a:
        os.truncate(tmp_path / "L.sqlite-wal", 0)
        b = run_cli(*_args(tmp_path))
        views = [run_cli(*command) for command in (("ledger", tmp_path / "L.sqlite"),
                                                   ("audit", tmp_path / "L.sqlite"),
                                                   ("health", "--ledger", tmp_path / "L.sqlite"))]
    assert b.returncode == 1, b.stderr
    assert len(b.stderr.strip().splitlines()) == 1 and "Traceback" not in b.stderr, b.stderr
    assert f"reads as damaged" in b.stderr and f"live process {a.pid} has it open" in b.stderr
    assert "mv " not in b.stderr and "--salvage" not in b.stderr
    for view in views:  # (o44 F3, F7: an older state as now, "ready", exit 0; audit, exit 2)
        assert view.returncode == 1, view.stderr
        assert f"-wal was emptied or cut while live process {a.pid}" in view.stderr
    assert a.returncode == 2, a.stderr_text
    stats = provider_stats(tmp_path / "p.db")
    assert all(task["executions"] <= 1 for task in stats["per_task"].values()), stats


def test_a_wal_emptied_under_a_live_run_halts_it_damaged_though_a_checkpoint_restarts_the_wal(
        tmp_path):
    """Fault (outsider o42 F3): ``: > L.sqlite-wal`` while run A is stopped (a real
    SIGSTOP after its first intent), then A goes on with a batch long enough for SQLite's
    checkpoints to restart the WAL, header and all, before A ends. Must hold: A halts at
    its next transition, the ledger damaged (exit 2, one line naming salvage), not
    acknowledging a transition written behind the hole. Before: the check at the close
    found a fresh header, and A ended "done=300", exit 0, on a ledger nothing opens."""
    make_corpus(tmp_path / "in", docs=120, poison=0, seed=1)
    with stopped_after_first_intent(_args(tmp_path)) as a:
        os.truncate(tmp_path / "L.sqlite-wal", 0)
    assert a.returncode == 2, a.stderr_text
    assert "-wal was emptied or overwritten" in a.stderr_text and "--salvage" in a.stderr_text
    assert "health --clear" not in a.stderr_text  # the damage refuses the next run itself
    stats = provider_stats(tmp_path / "p.db")
    assert stats["executions"] <= 2, stats  # the first document, and none past the hole


def _executions(provider_db) -> int:
    """The provider's executions so far; 0 while its database is still being made."""
    try:
        return provider_stats(provider_db)["executions"]
    except ToolkitError:
        return 0


def _workers_with(tmp_path, fault, docs=60) -> tuple[int, str, str]:
    """``run --workers 2`` on ``docs`` documents made here (None: those in the folder),
    ``fault()`` done once the provider has executed three more; the run's (exit code,
    stdout, stderr)."""
    if docs is not None:
        make_corpus(tmp_path / "in", docs=docs, poison=0, seed=1)
    before = _executions(tmp_path / "p.db")
    run = subprocess.Popen([sys.executable, "-m", "toolkit", *map(str, _args(tmp_path)),
                            "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        deadline = time.monotonic() + 120  # a guard against a hang, not a timing
        while _executions(tmp_path / "p.db") < before + 3:
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.02)
        fault()
        out, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    return run.returncode, out, err


def test_workers_whose_wal_is_emptied_under_them_halt_damaged_exit_2_naming_salvage_only(
        tmp_path):
    """Fault (outsider o42 F4): ``: > L.sqlite-wal`` while ``run --workers 2`` writes (once
    the provider has executed a few documents). Must hold: exit 2; each worker's halt line
    says the ledger is damaged and names salvage (never a storage error to run again on,
    the witness folder's free space, or ``health --clear``); the count line says the items
    are unknown, never ``items=0``. Before: exit 1, "(items=0, workers=2)", lines of "disk
    I/O error" and "free space there", and a health marker whose clearing said "damaged"."""
    code, out, err = _workers_with(tmp_path, lambda: os.truncate(tmp_path / "L.sqlite-wal", 0))
    halts = [line for line in err.splitlines() if line.startswith("halted")]
    assert code == 2, err
    assert halts and all("is damaged" in line and "--salvage" in line for line in halts), err
    assert "free space" not in err and "health --clear" not in err, err
    assert "items unknown: the ledger is damaged" in out and "items=0" not in out, out


def test_workers_whose_shm_and_wal_are_deleted_under_them_halt_without_calling_it_damaged(
        tmp_path):
    """Fault (outsider o44 F2): ``L.sqlite-shm``, then ``L.sqlite-wal``, deleted while
    ``run --workers 2`` writes. The workers' own connections go on writing the deleted
    files and their close puts every commit into the ledger, which stays whole; a reader
    opened after the deletion finds no WAL and SQLite says "disk I/O error". Must hold:
    the halt says the side files were deleted (exit 1), never that the ledger is damaged
    with advice to move it aside (following that drops every recorded ``done``); after
    it, the ledger passes ``integrity_check`` and a rerun ends at rest, no document
    executed twice. Before: exit 2, "damaged (disk I/O error) … move it aside"."""
    def delete_both():
        (tmp_path / "L.sqlite-shm").unlink()
        (tmp_path / "L.sqlite-wal").unlink()

    code, _, err = _workers_with(tmp_path, delete_both)
    assert code in (0, 1), err
    assert "is damaged" not in err and "move it aside" not in err, err
    db = sqlite3.connect(tmp_path / "L.sqlite")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        db.close()
    cleared = run_cli("health", "--ledger", tmp_path / "L.sqlite", "--clear")  # the advice
    assert cleared.returncode == 0, cleared.stderr
    again = run_cli(*_args(tmp_path))
    assert again.returncode == 0, again.stderr
    stats = provider_stats(tmp_path / "p.db")
    assert all(task["executions"] == 1 for task in stats["per_task"].values()), stats
    with open_ledger(tmp_path / "L.sqlite") as ledger:  # an intent the halt came between
        states = [item.state for item in ledger.items()]  # and its send is parked (keys
    assert states.count(State.DONE) == stats["executions"]  # are not idempotent), never lost
    assert states.count(State.DONE) + states.count(State.NEEDS_REVIEW) == 60


def _break_an_early_events_page(ledger) -> int:
    """Overwrite the b-tree header of a middle leaf page of the ``events`` table (events a
    finished run wrote, checkpointed into the file: a later run appends after them and
    never rewrites that page, nor reads it: the first leaf it may read) with 0xFF bytes,
    in place, as a stray program would; its page number."""
    db = sqlite3.connect(ledger)
    try:
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        pages = [row[0] for row in db.execute(
            "SELECT pageno FROM dbstat WHERE name = 'events' AND pagetype = 'leaf' "
            "ORDER BY pageno")]
    finally:
        db.close()
    assert len(pages) >= 4, pages
    middle = pages[len(pages) // 2]
    with open(ledger, "r+b") as handle:
        handle.seek((middle - 1) * page_size)
        handle.write(b"\xff" * 12)
    return middle


def _settled_first_batch(tmp_path) -> None:
    """40 documents done (their events checkpointed into the ledger file as the run
    closes), then 20 more put in the folder for the next run."""
    make_corpus(tmp_path / "first", docs=60, poison=0, seed=1)
    (tmp_path / "in").mkdir()
    for path in sorted((tmp_path / "first").glob("*.pdf"))[:40]:
        path.rename(tmp_path / "in" / path.name)
    first = run_cli(*_args(tmp_path))
    assert first.returncode == 0 and not (tmp_path / "L.sqlite-wal").exists(), first.stderr
    for path in sorted((tmp_path / "first").glob("*.pdf")):
        path.rename(tmp_path / "in" / path.name)


def test_a_ledger_overwritten_by_hand_under_a_live_run_is_never_called_at_rest(tmp_path):
    """Fault (outsider o44 F4): bytes of the SQLite ledger's file overwritten in place
    (the header of a page of old events) while a run is live (stopped by a real SIGSTOP
    after its first intent), on a page the run never reads or writes again. Must hold:
    the run ends with exit 2 and one line saying the ledger is damaged, naming salvage,
    never exit 0 "at rest" on a file whose ``quick_check`` fails. Before: exit 0, done."""
    _settled_first_batch(tmp_path)
    with stopped_after_first_intent(_args(tmp_path)) as a:
        _break_an_early_events_page(tmp_path / "L.sqlite")
    assert a.returncode == 2, a.stderr_text
    assert "is damaged" in a.stderr_text and "--salvage" in a.stderr_text, a.stderr_text
    assert "Traceback" not in a.stderr_text


def test_workers_whose_ledger_is_overwritten_by_hand_under_them_end_exit_2_not_at_rest(
        tmp_path):
    """Fault (outsider o44 F4): the same overwrite while ``run --workers 2`` writes. Must
    hold: exit 2, the items unknown (never a count read from a damaged file), and one
    line saying the ledger is damaged and naming salvage. Before: exit 0, ``done=…``."""
    _settled_first_batch(tmp_path)
    code, out, err = _workers_with(tmp_path, lambda: _break_an_early_events_page(
        tmp_path / "L.sqlite"), docs=None)
    assert code == 2, (out, err)
    assert "items unknown: the ledger is damaged" in out, out
    assert "is damaged" in err and "--salvage" in err and "Traceback" not in err, err
