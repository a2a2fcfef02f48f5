"""A full TMPDIR under a run and under ``provider-stats`` (outsider o42 F7): a real ENOSPC
on a real tmpfs (``tmpfs_mount``, filled by ``fill_disk``). The run keeps a private copy of
each input there while it is in flight; ``provider-stats`` reads a private copy of the
database there. Either failing is the scratch space's fault, to be named as such."""

import os
import subprocess
import sys

from conftest import fill_disk, tmpfs_mount
from toolkit.documents import make_corpus
from toolkit.provider import provider_stats


def _cli(*args, tmpdir=None):
    env = {**os.environ, **({"TMPDIR": str(tmpdir)} if tmpdir else {})}
    return subprocess.run([sys.executable, "-m", "toolkit", *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env)


def _run(tmp_path, tmpdir=None):
    return _cli("run", "--inputs", tmp_path / "in", "--ledger", tmp_path / "l.sqlite",
                "--provider-db", tmp_path / "p.db", "--out", tmp_path / "out", "--no-progress",
                tmpdir=tmpdir)


def test_run_whose_tmpdir_is_full_halts_naming_tmpdir_and_what_to_do(tmp_path):
    """Fault: TMPDIR a full tmpfs (one page left: room for one input's copy, not three).
    Must hold: the run halts, exit 1, its line naming that TMPDIR and saying to free space
    there or set TMPDIR elsewhere; nothing is sent. Before: "storage: [Errno 28] No space
    left on device", no path, and ``health --clear`` the only advice."""
    make_corpus(tmp_path / "in", docs=3, poison=0, seed=1)
    with tmpfs_mount(tmp_path / "t", "size=64k") as scratch:
        fill_disk(scratch, room=4096)  # one page: the probe of tempfile, then one copy
        run = _run(tmp_path, tmpdir=scratch)
    assert run.returncode == 1, run.stderr
    assert f"TMPDIR {str(scratch)!r}: cannot write this run's copy of an input" in run.stderr
    assert "free space there or set TMPDIR" in run.stderr
    assert "Errno 28" not in run.stderr
    assert not (tmp_path / "p.db").exists() or \
        provider_stats(tmp_path / "p.db")["submit_calls"] == 0


def test_provider_stats_with_a_full_tmpdir_is_the_scratch_space_not_a_bad_database(tmp_path):
    """Fault: ``provider-stats`` with TMPDIR a full tmpfs: its private copy's ``-shm`` does
    not fit ("disk I/O error"). Must hold: exit 1, one line naming TMPDIR as full; never
    "is not a provider database" (exit 2, bad input) for a database that is whole."""
    make_corpus(tmp_path / "in", docs=1, poison=0, seed=1)
    assert _run(tmp_path).returncode == 0
    with tmpfs_mount(tmp_path / "t", "size=64k") as scratch:
        stats = _cli("provider-stats", "--provider-db", tmp_path / "p.db", tmpdir=scratch)
    assert stats.returncode == 1, stats.stderr
    assert len(stats.stderr.strip().splitlines()) == 1, stats.stderr
    assert f"TMPDIR {str(scratch)!r}" in stats.stderr and "not a provider database" not in \
        stats.stderr
