"""``health`` is a real probe: a small durable write, refused paths, a durable marker."""

import resource
import shutil
import sqlite3
import subprocess
import sys

import pytest

from toolkit.ledger import open_ledger


def health(cwd, ledger, *extra, prefix=(), preexec_fn=None):
    return subprocess.run([*prefix, sys.executable, "-m", "toolkit", "health", "--ledger", ledger,
                           *extra], cwd=cwd, capture_output=True, text=True, timeout=120,
                          preexec_fn=preexec_fn)


def test_health_of_a_path_that_is_not_a_ledger_exits_2_with_one_line(tmp_path, small_corpus):
    """A directory, a PDF renamed .sqlite, an unknown suffix, a foreign SQLite database:
    the old health said 'ready' (exit 0) for most of them. Each is one line, exit 2,
    and nothing is created or changed."""
    (tmp_path / "folder.sqlite").mkdir()
    shutil.copyfile(small_corpus[0], tmp_path / "renamed.sqlite")
    (tmp_path / "notes.txt").write_text("hello")
    with sqlite3.connect(tmp_path / "theirs.db") as db:
        db.execute("CREATE TABLE orders (id INTEGER)")
    before = sorted(p.name for p in tmp_path.iterdir())
    for name in ("folder.sqlite", "renamed.sqlite", "notes.txt", "theirs.db"):
        result = health(tmp_path, name)
        assert result.returncode == 2, (name, result.stdout, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (Debian strace)")
def test_health_probe_on_a_full_disk_is_not_ready_and_clear_keeps_the_marker(tmp_path):
    """The kernel answers ENOSPC to every write of the ledger's WAL (strace): --clear
    'proved' the ledger writable with an empty transaction and removed the marker. Now
    --clear exits 1 with one line and keeps the marker; once the disk is back, --clear
    clears it. (Plain health never writes into the ledger, so it probes the folder
    instead: tests/test_outsider_o25_rest.py fills a real tmpfs for it.)"""
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        ledger.add("k")
    (tmp_path / "l.sqlite.health").write_text('{"ready": false, "reason": "disk full"}')
    full = ("strace", "-f", "-qq", "--seccomp-bpf", "-o", "/dev/null",
            f"-P{tmp_path / 'l.sqlite-wal'}", "-e", "trace=pwrite64,write",
            "-e", "inject=pwrite64,write:error=ENOSPC")
    cleared = health(tmp_path, "l.sqlite", "--clear", prefix=full)
    assert cleared.returncode == 1 and len(cleared.stderr.strip().splitlines()) == 1, cleared
    assert (tmp_path / "l.sqlite.health").exists()
    assert health(tmp_path, "l.sqlite", "--clear").returncode == 0
    assert not (tmp_path / "l.sqlite.health").exists()
    assert health(tmp_path, "l.sqlite").returncode == 0


def test_health_probe_of_a_jsonl_ledger_fails_beyond_the_file_size_limit(tmp_path):
    """RLIMIT_FSIZE of 64 bytes: the probe's durable write fails (EFBIG), so health says
    not ready (exit 1) and leaves no probe file; without the limit it is ready."""
    with open_ledger(tmp_path / "l.jsonl") as ledger:
        ledger.add("k")
    before = sorted(p.name for p in tmp_path.iterdir())

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    limited = health(tmp_path, "l.jsonl", preexec_fn=limit)
    assert limited.returncode == 1 and "cannot be written" in limited.stdout, limited
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert health(tmp_path, "l.jsonl").returncode == 0
