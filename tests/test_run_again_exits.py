"""Exit 1 ("run again") versus exit 2 (bad input) where an outsider found them crossed, and
the one list of a ledger's companion files.

* A ledger folder on a real filesystem with no free inode (a small tmpfs, ``nr_inodes``):
  SQLite says "unable to open database file" as it does for a missing folder, the JSONL
  lock meets ENOSPC. It is the storage's, exit 1, like a disk out of bytes.
* A JSONL ledger held by another live process (its one writer): exit 1 naming that
  process, as ``resolve`` already answered, never exit 2.
* ``audit --csv`` refuses every file the toolkit keeps beside a ledger: the list is
  ``storage.COMPANIONS``, checked here against the files a real run leaves.
"""

import errno
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from test_review_resolve import cli, parked  # noqa: F401 (fixture)
from toolkit import storage
from conftest import tmpfs_mount
from toolkit.documents import make_corpus
from toolkit.ledger import open_ledger
from toolkit.provider import provider_stats
from toolkit.runner.ops import health_marker, mark_unhealthy


def _fill(folder) -> list[Path]:
    """Take every free inode of ``folder``'s filesystem with empty files; returns them."""
    fillers = []
    while True:
        filler = folder / f"filler{len(list(folder.glob('filler*')))}"
        try:
            filler.touch()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC  # the inode table is full, not the bytes
            break
        fillers.append(filler)
    assert os.statvfs(folder).f_favail == 0 and os.statvfs(folder).f_bavail > 0
    return fillers


@pytest.fixture
def inode_less(tmp_path):
    """A real tmpfs mounted at ``tmp_path / "fs"`` with few inodes; unmounted in cleanup,
    skipped where mount is refused (not root)."""
    with tmpfs_mount(tmp_path / "fs", "size=4m,nr_inodes=16") as folder:
        yield folder


def _run(capsys, tmp_path, ledger):
    return cli(capsys, "run", "--inputs", tmp_path / "in", "--ledger", ledger,
               "--provider-db", tmp_path / "p.db", "--out", tmp_path / "out", "--no-progress")


@pytest.mark.parametrize("name, existing", [("l.sqlite", False), ("l.jsonl", False),
                                            ("l.sqlite", True)])
def test_ledger_folder_out_of_inodes_exits_1_run_again_then_resumes_once_freed(
        inode_less, tmp_path, capsys, name, existing):
    """What breaks: the ledger's filesystem has free bytes but no free inode, for a new
    ledger (SQLite's database file, the JSONL lock) or an existing SQLite one (its -wal
    cannot be created). Must hold: `run` answers exit 1 and one line (the storage's, as
    for a disk out of bytes), nothing executed; once the operator frees inodes the same
    command finishes the batch (exit 0)."""
    folder = inode_less
    make_corpus(tmp_path / "in", docs=2, poison=0, seed=4)
    ledger = folder / name
    if existing:  # a ledger made while inodes were free, closed (its -wal and -shm removed)
        with open_ledger(ledger):
            pass
        assert sorted(p.name for p in folder.iterdir()) == [name]
    before = sorted(folder.iterdir()), ledger.exists() and ledger.read_bytes()
    fillers = _fill(folder)
    status, _, err = _run(capsys, tmp_path, ledger)
    assert (status, err.count("\n")) == (1, 1) and "Traceback" not in err, err
    assert (sorted(set(folder.iterdir()) - set(fillers)),
            ledger.exists() and ledger.read_bytes()) == before
    # an existing ledger is opened before the provider's database is created (outsider o24 F12)
    assert not (tmp_path / "p.db").exists() if existing else \
        provider_stats(tmp_path / "p.db")["executions"] == 0
    for filler in fillers:  # the operator frees the inodes
        filler.unlink()
    status, out, _ = _run(capsys, tmp_path, ledger)
    assert status == 0 and "done=2" in out


def test_sqlite_ledger_in_rollback_journal_mode_out_of_inodes_exits_1(
        inode_less, tmp_path, capsys):
    """What breaks: an existing SQLite ledger in rollback-journal mode (as older ledgers and
    the audit fixture are) on a filesystem with one free inode: the open's switch to WAL
    takes it for the -wal, and the first BEGIN cannot create the -shm ("cannot begin a
    transaction: unable to open database file"). Must hold: exit 1 (run again: the
    storage's), one line, nothing executed; once inodes are freed the command finishes."""
    folder = inode_less
    make_corpus(tmp_path / "in", docs=2, poison=0, seed=4)
    ledger = folder / "l.sqlite"
    with open_ledger(ledger):
        pass
    db = sqlite3.connect(ledger)
    assert db.execute("PRAGMA journal_mode=DELETE").fetchone() == ("delete",)
    db.close()
    fillers = _fill(folder)
    fillers.pop().unlink()  # one inode left: the switch to WAL creates -wal, not -shm
    status, _, err = _run(capsys, tmp_path, ledger)
    assert (status, err.count("\n")) == (1, 1) and "Traceback" not in err, err
    assert not (tmp_path / "p.db").exists()  # the ledger is opened first (outsider o24 F12)
    for filler in fillers:
        filler.unlink()
    status, out, _ = _run(capsys, tmp_path, ledger)
    assert status == 0 and "done=2" in out


def test_provider_database_folder_out_of_inodes_exits_1_run_again(inode_less, tmp_path, capsys):
    """What breaks: the fake provider's database is to be created on a filesystem with no
    free inode. Must hold: exit 1 and one line (README: a storage error of the provider's
    database halts the batch, failed closed: health names the cause), no ledger made;
    with inodes freed and health cleared, the same command finishes the batch."""
    make_corpus(tmp_path / "in", docs=2, poison=0, seed=4)
    fillers = _fill(inode_less)
    ledger = tmp_path / "l.sqlite"
    command = ("run", "--inputs", tmp_path / "in", "--ledger", ledger, "--provider-db",
               inode_less / "p.db", "--out", tmp_path / "out", "--no-progress")
    status, _, err = cli(capsys, *command)
    assert (status, err.count("\n")) == (1, 1) and "provider database" in err, err
    assert not ledger.exists() and "provider database" in health_marker(ledger).read_text()
    for filler in fillers:
        filler.unlink()
    assert cli(capsys, "health", "--ledger", ledger, "--clear")[0] == 0
    status, out, _ = cli(capsys, *command)
    assert status == 0 and "done=2" in out


def test_an_unnamed_os_error_of_a_full_filesystem_exits_1_not_bad_input(inode_less, capsys):
    """What breaks: a command's write meets ENOSPC where no layer names it (``fixtures``
    writing its corpus onto a filesystem with no free inode). Must hold: one line naming
    the file, exit 1 (the storage's, run again once freed), not the exit 2 of bad input."""
    _fill(inode_less)
    (inode_less / "filler0").unlink()  # one inode: the corpus folder, none for a file in it
    status, _, err = cli(capsys, "fixtures", inode_less / "corpus", "--docs", 2, "--poison", 0)
    assert (status, err.count("\n")) == (1, 1), err
    assert "No space left on device" in err and "doc-000.pdf" in err


def test_ledger_in_a_missing_folder_stays_bad_input_exit_2(tmp_path, capsys):
    """What breaks: the ledger's folder does not exist (SQLite's same "unable to open
    database file"). Must hold: that is the user's input, exit 2 and one line, nothing
    created; the inode probe does not turn it into "run again"."""
    make_corpus(tmp_path / "in", docs=1, poison=0, seed=4)
    status, _, err = _run(capsys, tmp_path, tmp_path / "missing" / "l.sqlite")
    assert (status, err.count("\n")) == (2, 1) and "no folder" in err  # checked by stat
    assert not (tmp_path / "p.db").exists()  # before the provider's database (o24 F12)
    assert not (tmp_path / "missing").exists()


HOLD = """
import sys
from toolkit.ledger import open_ledger
with open_ledger(sys.argv[1]):  # the one writer, as a running batch is
    print("holding", flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


@pytest.mark.slow
def test_run_on_a_jsonl_ledger_held_by_a_live_process_exits_1_naming_its_pid(tmp_path, capsys):
    """What breaks: a second `run` types a JSONL ledger whose one writer (a real, live
    process) holds its lock. Must hold: exit 1, one line naming that process's pid
    ("run again when it ends", as `resolve` answers), the ledger byte-identical, nothing
    executed, no health marker (a busy ledger is not a failed one); once the holder
    exits the same command runs the batch."""
    make_corpus(tmp_path / "in", docs=2, poison=0, seed=5)
    ledger = tmp_path / "l.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(ledger)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "holding\n"
        before = ledger.read_bytes()
        status, _, err = _run(capsys, tmp_path, ledger)
        assert (status, err.count("\n")) == (1, 1), err
        assert f"busy: open in another writer (live process {holder.pid})" in err
        assert ledger.read_bytes() == before and not health_marker(ledger).exists()
        assert not (tmp_path / "p.db").exists() or \
            provider_stats(tmp_path / "p.db")["executions"] == 0
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    status, out, _ = _run(capsys, tmp_path, ledger)
    assert status == 0 and "done=2" in out


@pytest.mark.parametrize("suffix", ["-flush", ".health", ".roots.json.lock"])
def test_csv_onto_a_flush_counter_health_marker_or_roots_lock_is_refused_exit_2(
        parked, tmp_path, capsys, suffix):
    """What breaks: ``audit --csv`` names a companion the old list lacked: the group-commit
    counter, the not-ready marker (a CSV there would stand in for "why the batch stopped"),
    the roots' lock. Must hold: one line, exit 2, no file written."""
    path = parked[0]
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    status, _, err = cli(capsys, "audit", path, "--csv", f"{path}{suffix}")
    assert (status, err.count("\n")) == (2, 1) and "refusing to write over it" in err
    assert {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("name", ["l.sqlite", "l.jsonl"])
def test_every_file_a_run_keeps_beside_its_ledger_is_in_the_one_companion_list(
        tmp_path, capsys, name):
    """What breaks: a module starts keeping a new file beside the ledger, or spells one
    of the names itself, and ``audit --csv`` no longer knows it. Must hold: after a real
    run, with the ledger open with group commit (its -wal, -shm, -flush) and the batch
    marked not ready, every file named ``<ledger>*`` is the ledger or
    ``<ledger><suffix>`` for a suffix of ``storage.COMPANIONS``."""
    make_corpus(tmp_path / "in", docs=2, poison=1, seed=6)
    ledger = tmp_path / "l" / name
    ledger.parent.mkdir()
    status, _, _ = _run(capsys, tmp_path, ledger)
    assert status == 0
    allowed = {f"{name}{suffix}" for suffix in ("", *storage.COMPANIONS)}
    with open_ledger(ledger, group_commit=True) as open_one:
        open_one.add("one-more")
        assert mark_unhealthy(ledger, "a drill of the marker")
        beside = {p.name for p in ledger.parent.iterdir()}
        assert beside <= allowed, beside - allowed
    assert {f"{name}.inputs", f"{name}.roots.json", f"{name}.roots.json.lock",
            f"{name}.health"} <= beside
    assert ({f"{name}-wal", f"{name}-shm", f"{name}-flush"} if name.endswith(".sqlite")
            else {f"{name}.lock"}) <= beside
    assert health_marker(ledger) == Path(f"{ledger}{storage.HEALTH}")
