"""A view that meets a failing disk says so: the error is about storage, not about
the file's format, so it does not list the supported formats."""

import shutil
import subprocess
import sys

import pytest

from toolkit.ledger import open_ledger

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")]


def test_audit_on_a_disk_that_fails_reads_names_the_io_error_not_the_formats(tmp_path):
    """strace makes the kernel answer EIO to the ledger's reads (pread64, from the 2nd on):
    audit fails with one line naming the I/O error, without 'supported formats' (the file
    IS a supported format), and the ledger is unchanged."""
    ledger = tmp_path / "L.sqlite"
    with open_ledger(ledger) as opened:
        for key in ("a", "b"):
            opened.add(key)
    before = ledger.read_bytes()
    command = ["strace", "-f", "-qq", "--seccomp-bpf", "-o", "/dev/null", f"-P{ledger}",
               "-e", "trace=pread64", "-e", "inject=pread64:error=EIO:when=2+",
               sys.executable, "-m", "toolkit", "audit", str(ledger)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "disk I/O error" in line and "supported formats" not in line
    assert ledger.read_bytes() == before


@pytest.fixture
def read_only_mount(tmp_path):
    """A real tmpfs holding a ledger, then remounted read-only; unmounted afterwards."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("needs permission to mount a tmpfs")
    try:
        with open_ledger(folder / "L.sqlite") as opened:
            opened.add("a")
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        yield folder / "L.sqlite"
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.mark.skipif(shutil.which("mount") is None, reason="needs mount")
def test_health_on_a_read_only_mount_is_not_ready_exit_1_not_bad_input(read_only_mount):
    """The ledger's file system is remounted read-only: `health` and `health --clear` must
    answer "not ready" (exit 1: fix the mount, run again), not "cannot open" (exit 2)."""
    for flags in ((), ("--clear",)):
        result = subprocess.run([sys.executable, "-m", "toolkit", "health", "--ledger",
                                 str(read_only_mount), *flags], capture_output=True, text=True)
        assert result.returncode == 1, result
        assert "read-only file system" in result.stdout + result.stderr
