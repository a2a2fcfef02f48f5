"""``run --workers N`` killed by ``kill -9`` of the run's own process only (not its group):
its worker processes must not go on sending (billed, with nobody to see it: outsider o34
R3). Real processes, a real SIGKILL, the provider's counters."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from test_witness_ledger import _run_args
from toolkit.documents import make_corpus
from toolkit.provider import provider_stats

pytestmark = pytest.mark.slow


def _running(process) -> bool:
    """Alive and not a zombie (a dead worker whose new parent has not reaped it yet)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_run_killed_alone_takes_its_workers_with_it_and_nothing_more_is_sent(tmp_path):
    make_corpus(tmp_path / "in", docs=60, poison=0, seed=9)  # a storm: retries wait
    child = subprocess.Popen([sys.executable, "-m", "toolkit", *map(str, _run_args(
        tmp_path, tmp_path / "L.sqlite")), "--workers", "2", "--transient-rate", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = psutil.Process(child.pid)
    deadline = time.monotonic() + 120
    workers = []
    while time.monotonic() < deadline and child.poll() is None:
        try:
            workers = [p for p in run.children(recursive=True)
                       if "spawn_main" in " ".join(p.cmdline())]
        except psutil.Error:  # a child came and went while we looked
            continue
        out = tmp_path / "out"
        if len(workers) == 2 and out.is_dir() and sum(
                name.endswith(".pdf") for name in os.listdir(out)) >= 2:
            break
        time.sleep(0.01)
    assert child.poll() is None and len(workers) == 2, "the run ended first"
    os.kill(child.pid, signal.SIGKILL)  # the run alone: its workers are not in the kill
    child.wait()
    at_kill = provider_stats(tmp_path / "p.db")["executions"]
    until = time.monotonic() + 60
    while (alive := [p for p in workers if _running(p)]) and time.monotonic() < until:
        time.sleep(0.05)
    assert alive == []
    # At most the request each worker had in flight; on main both went on to the end (60).
    assert provider_stats(tmp_path / "p.db")["executions"] <= at_kill + 2 < 60
