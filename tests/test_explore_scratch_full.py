"""explore with TMPDIR on a real small file system (outsider o29, S6).

A real tmpfs too small for the batch: the uncrashed batch halts on a real ENOSPC, so no
crash point can be judged. The exploration must say so in one line naming TMPDIR (a
storage state, exit 1), not exit 2 with its internal row, and leave nothing behind.
"""

import os
import subprocess
import sys
from pathlib import Path

from conftest import tmpfs_mount

ROOT = Path(__file__).resolve().parents[1]


def test_tmpdir_too_small_for_the_batch_exits_1_with_one_line_naming_tmpdir(tmp_path):
    """Fault: TMPDIR is a 600 KiB tmpfs: the baseline run's ledger meets ENOSPC.
    Property: exit 1, one line naming TMPDIR and the halt, no traceback or row dump; the
    exploration's folder is removed."""
    with tmpfs_mount(tmp_path / "small", "size=600k") as small:
        result = subprocess.run([sys.executable, "-m", "toolkit", "explore", "--docs", "1",
                                 "--every", "4", "--mode", "snapshot"], cwd=ROOT, text=True,
                                capture_output=True, env={**os.environ, "TMPDIR": str(small)},
                                timeout=600)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1, result.stderr
        assert len(lines) == 1 and "Traceback" not in result.stderr
        assert f"TMPDIR: {small}" in lines[0] and "full" in lines[0]
        assert "{" not in lines[0]  # the internal row is not printed
        assert list(small.iterdir()) == []
