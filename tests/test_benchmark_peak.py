"""The audit benchmark's peak memory figure covers every process the measured one starts."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from audit_jsonl import _run  # noqa: E402

CHILD_MB = 150

FORKS_A_HEAVY_CHILD = f"""
import os
pid = os.fork()
if pid == 0:
    held = bytearray({CHILD_MB} << 20)  # zero-filled: every page touched
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_benchmark_peak_counts_the_memory_of_a_child_the_measured_process_starts(tmp_path):
    """What breaks: the figure was the measured process's own VmHWM, so an audit that
    rendered in a forked child reported the parent's peak alone (the child's pages never
    counted). Must hold: a process that forks a child holding 150 MB is measured at 150
    MB or more, though its own peak is a bare interpreter's."""
    script = tmp_path / "forks.py"
    script.write_text(FORKS_A_HEAVY_CHILD)
    _, peak, _, _ = _run([str(script)])
    assert peak >= CHILD_MB
