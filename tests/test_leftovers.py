"""Leftovers of killed processes: owner-named scratch folders, swept when the owner is dead.

A run's private snapshots of its inputs (``toolkit-inputs-<pid>-<ticks>-*`` in TMPDIR)
and explore's work folder (``explore-<pid>-<ticks>-*`` in TMPDIR if set, else /dev/shm) survive a
SIGKILL; the next process of the same kind removes them, never a live owner's.
SIGTERM and SIGINT (Ctrl-C to the process group) stop explore with its cleanup run.
"""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from toolkit import liveness

pytestmark = pytest.mark.slow

KILL_AFTER_FIRST_SNAPSHOT = """
import os, signal, sys
from toolkit.cli import main
from toolkit.runner.pipeline import Pipeline

real = Pipeline._snapshot
def snapshot(self, digest, data):
    path = real(self, digest, data)
    os.kill(os.getpid(), signal.SIGKILL)  # mid-run: the snapshot folder is on disk
Pipeline._snapshot = snapshot
sys.exit(main(sys.argv[1:]))
"""


def _toolkit(*args, env, script=None):
    argv = [sys.executable] + (["-c", script] if script else ["-m", "toolkit"]) + list(args)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def sleeper():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield child
    child.kill()
    child.wait()


def test_run_killed_by_sigkill_leaves_its_inputs_folder_and_the_next_run_sweeps_it(
        tmp_path, sleeper):
    """SIGKILL mid-run leaves ``toolkit-inputs-<pid>-<ticks>-*``; the next run removes it and
    keeps the folder of a live owner."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    assert _toolkit("fixtures", str(tmp_path / "in"), "--docs", "2", "--poison", "0",
                    env=env).returncode == 0
    batch = ["run", "--inputs", str(tmp_path / "in"), "--ledger", str(tmp_path / "l.jsonl"),
             "--provider-db", str(tmp_path / "p.db"), "--out", str(tmp_path / "out"),
             "--no-progress"]
    killed = _toolkit(*batch, env=env, script=KILL_AFTER_FIRST_SNAPSHOT)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = glob.glob(str(tmp / "toolkit-inputs-*"))
    assert len(left) == 1 and os.listdir(left[0])  # the input's bytes, left behind
    live = tmp / f"toolkit-inputs-{sleeper.pid}-{liveness.start_ticks(sleeper.pid)}-x"
    live.mkdir()
    rerun = _toolkit(*batch, env=env)
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(glob.glob(str(tmp / "toolkit-inputs-*"))) == [str(live)]


STARTED = []  # explore processes of the running test, killed at its end if still there


@pytest.fixture(autouse=True)
def _no_stray_explore():
    yield
    for child in STARTED:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    STARTED.clear()


def _explore(tmp, *extra, preexec_fn=None):
    env = dict(os.environ, TMPDIR=str(tmp))
    with open(tmp / "err", "w") as err:
        child = subprocess.Popen([sys.executable, "-m", "toolkit", "explore", "--docs", "1",
                                  *extra], env=env, start_new_session=True,
                                 stdout=subprocess.DEVNULL, stderr=err, preexec_fn=preexec_fn)
    STARTED.append(child)
    return child


def _finish(child, tmp) -> str:
    """Wait for ``child``; return what it wrote on stderr."""
    child.wait(timeout=120)
    return (tmp / "err").read_text()


def _workdir(child, tmp) -> str:
    """Wait until ``child`` has made its owner-named work folder; return its path."""
    scratch = str(tmp)  # TMPDIR is set: explore works there, not in /dev/shm
    for _ in range(3000):  # polled, not timed: the folder stays until explore ends
        found = glob.glob(os.path.join(scratch, f"explore-{child.pid}-*"))
        if found:
            return found[0]
        assert child.poll() is None, _finish(child, tmp)
        time.sleep(0.01)
    raise AssertionError("explore never made its folder")


def test_explore_killed_by_sigkill_leaves_its_folder_and_the_next_explore_sweeps_it(tmp_path):
    """SIGKILL to explore's process group leaves ``explore-<pid>-<ticks>-*``; the next explore
    removes it, and leaves none of the input snapshots of the runs it killed itself."""
    child = _explore(tmp_path, "--every", "2")
    folder = _workdir(child, tmp_path)
    os.killpg(child.pid, signal.SIGKILL)
    _finish(child, tmp_path)
    assert os.path.isdir(folder)
    again = _explore(tmp_path, "--every", "4")
    err = _finish(again, tmp_path)
    assert again.returncode == 0, err
    assert not os.path.exists(folder)
    # its crash points SIGKILLed runs that held input snapshots: swept as it ends
    assert not glob.glob(str(tmp_path / "toolkit-inputs-*"))


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 128 + signal.SIGTERM),
                                            (signal.SIGINT, 130)])
def test_explore_stopped_by_sigterm_or_sigint_to_its_group_cleans_up_and_exits(
        tmp_path, signum, status):
    """TERM or INT (Ctrl-C) sent to explore's process group mid-exploration: explore stops
    with 143 or 130 and removes its folder. TERM's explore starts with SIGINT ignored, as a
    shell without job control starts ``explore &``: SIGTERM still stops it (SIGINT stays
    ignored there: ``test_outsider_o28_misc``)."""
    ignore = signum == signal.SIGTERM
    child = _explore(tmp_path, "--every", "2", preexec_fn=(
        lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore else None)
    folder = _workdir(child, tmp_path)
    os.killpg(child.pid, signum)
    err = _finish(child, tmp_path)
    assert child.returncode == status, err
    assert not os.path.exists(folder)
    assert "Traceback" not in err
