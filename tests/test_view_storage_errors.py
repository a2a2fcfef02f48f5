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
