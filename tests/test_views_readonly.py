"""Read-only views never write: ``ledger PATH`` and ``audit PATH`` leave every byte,
mtime and directory entry as they found them."""

import os
import shutil
import signal
import sqlite3
import subprocess
import sys

import pytest

from toolkit.cli import main
from toolkit.ledger import open_ledger


def _listing(folder):
    """Names, bytes and mtimes of everything in ``folder``: what a view must not change."""
    return {entry.name: (entry.stat(follow_symlinks=False).st_mtime_ns,
                         open(entry.path, "rb").read())
            for entry in os.scandir(folder)}


def _wal_dead_writer(folder, drop_shm):
    """A WAL ledger whose writer was SIGKILLed with commits still only in its ``-wal``."""
    path = folder / "l.sqlite"
    code = ("import sys, time\nfrom toolkit.ledger import open_ledger\n"
            f"ledger = open_ledger({str(path)!r})\n"
            "for n in range(5):\n    ledger.add(f'k{n}', source=f'd{n}.pdf')\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert os.path.getsize(f"{path}-wal") > 0  # the commits live in the WAL only
    if drop_shm:
        os.unlink(f"{path}-shm")
    return path


def _older_schema(folder):
    """A format-1 ledger written before ``pages_done`` and ``lease_host`` existed."""
    path = folder / "l.sqlite"
    with open_ledger(path) as ledger:
        ledger.add("k1", source="a.pdf")
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE items DROP COLUMN pages_done")
    db.execute("ALTER TABLE items DROP COLUMN lease_host")
    db.execute("PRAGMA journal_mode=DELETE")
    db.close()
    return path


def _empty_sqlite(folder):
    path = folder / "l.sqlite"
    path.write_bytes(b"")
    return path


def _jsonl(folder):
    path = folder / "l.jsonl"
    with open_ledger(path) as ledger:
        ledger.add("k1", source="a.pdf")
    for extra in folder.iterdir():
        if extra != path:
            extra.unlink()  # only the ledger itself: a lock file would be the view's doing
    return path


CASES = {"wal-dead-writer": lambda f: _wal_dead_writer(f, False),
         "wal-dead-writer-no-shm": lambda f: _wal_dead_writer(f, True),
         "older-schema": _older_schema, "zero-byte-sqlite": _empty_sqlite, "jsonl": _jsonl}


@pytest.mark.slow
@pytest.mark.parametrize("view", ["ledger", "audit"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_read_only_view_leaves_bytes_mtimes_and_listing_unchanged(tmp_path, case, view, capsys):
    """Fault: a view of a ledger whose WAL writer died (with and without ``-shm``), of an
    older schema, of a 0-byte ``.sqlite``, of a JSONL file. Property: every file's bytes
    and mtime and the folder's entries are exactly what they were (no ``-shm``, no
    migration, no schema, no ``PATH.lock``)."""
    folder = tmp_path / "batch"
    folder.mkdir()
    path = CASES[case](folder)
    before = _listing(folder)
    main([view, str(path)])
    capsys.readouterr()
    assert _listing(folder) == before


def test_ledger_table_keeps_one_row_per_item_for_a_file_name_with_a_newline(tmp_path, capsys):
    """Fault: an input's file name holds a newline. Property: the ``ledger`` table still
    has one line per item (the newline shown escaped)."""
    path = tmp_path / "l.sqlite"
    with open_ledger(path) as ledger:
        ledger.add("k1", source="two\nlines.pdf")
        ledger.add("k2", source="plain.pdf")
    assert main(["ledger", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any("two\\nlines.pdf" in line for line in out)
    assert len([line for line in out if line.startswith(("k1 ", "k2 "))]) == 2 and not any(
        line.strip().startswith("lines.pdf") for line in out)


@pytest.mark.slow
@pytest.mark.parametrize("drop_shm", [False, True], ids=["with-shm", "no-shm"])
def test_provider_stats_of_a_database_left_by_a_killed_writer_changes_no_file(
        tmp_path, small_corpus, drop_shm, capsys):
    """Fault: the fake provider's writer is SIGKILLed with commits only in its ``-wal``
    (with and without its ``-shm``). Property: ``provider-stats`` counts those commits and
    leaves every file's bytes and mtime and the folder's entries as they were."""
    folder = tmp_path / "batch"
    folder.mkdir()
    path = folder / "p.sqlite"
    code = ("import sys, time\nfrom toolkit.provider import FakeProvider\n"
            f"provider = FakeProvider({str(path)!r}, {str(folder / 'jobs')!r})\n"
            f"provider.submit('k:1', {str(small_corpus[0])!r}, {{}})\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert os.path.getsize(f"{path}-wal") > 0
    if drop_shm:
        os.unlink(f"{path}-shm")
    shutil.rmtree(folder / "jobs")  # the provider's uploads: only the database files stay
    before = _listing(folder)
    assert main(["provider-stats", "--provider-db", str(path), "--json"]) in (0, None)
    assert '"submit_calls": 1' in capsys.readouterr().out
    assert _listing(folder) == before
