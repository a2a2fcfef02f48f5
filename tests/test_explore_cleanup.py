"""SIGINT and SIGTERM at any moment of a real ``explore``: no scratch folder, no process left.

A real ``python -m toolkit explore`` is started and interrupted at seeded moments, each
one proved reached by what its work folder holds just before the signal:

* ``copying``: the recording child is taking its snapshot copies (``<work>/snapshots``
  holds some, no crash point has started): the copier is a grandchild of explore;
* ``shared``: the shared supervisors (``child.fork_shared``) are recovering points
  (``<work>/points`` holds point folders);
* ``real``: the real mode's supervisors replay and kill (``points/<k>-kill-None``).

The signal goes to explore alone (``kill PID``: its children are not told) or to its
process group (Ctrl-C), and now and then again while the first one's cleanup runs
(held: it must not cut the removal short). Afterwards nothing named ``explore-<pid>-*`` is left in TMPDIR
nor in /dev/shm, no ``toolkit-inputs-*`` in TMPDIR, and no process carrying this
test's marker in its environment is alive (psutil): a supervisor killed by explore must
not leave its own children writing into a folder explore is removing.
"""

import glob
import os
import random
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

MARK = "TOOLKIT_EXPLORE_CLEANUP_PROBE"
PHASES = {  # phase -> (explore arguments, what must be present before the signal)
    "copying": ("--docs", "4", "--mode", "snapshot", "--jobs", "2"),
    "shared": ("--docs", "4", "--mode", "snapshot", "--jobs", "2"),
    "real": ("--docs", "2", "--mode", "real", "--jobs", "2"),
}


def _marked(marker: str) -> list[psutil.Process]:
    """Live processes (not zombies) whose environment carries ``marker``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(MARK) == marker:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _points(work: str) -> list[str]:
    try:
        return [name for name in os.listdir(os.path.join(work, "points")) if name != "baseline"]
    except OSError:
        return []


def _count(folder: str) -> int:
    try:
        return len(os.listdir(folder))
    except OSError:
        return 0


def trial(tmp, phase: str, signum: int, group: bool, rng: random.Random) -> dict:
    """One explore interrupted in ``phase``; returns what was present and what was left."""
    marker = uuid.uuid4().hex
    env = dict(os.environ, TMPDIR=str(tmp), **{MARK: marker})
    with open(tmp / "err", "w") as err:
        child = subprocess.Popen([sys.executable, "-m", "toolkit", "explore", *PHASES[phase],
                                  "--json"], env=env, start_new_session=True, cwd=tmp,
                                 stdout=subprocess.DEVNULL, stderr=err)
    want = rng.randint(1, 6)  # copies (or point folders) present before the signal
    work, before, forked, fired, twice = None, 0, 0, False, False
    try:
        while child.poll() is None:  # polled, not timed
            if work is None:
                found = [path for where in (str(tmp), "/dev/shm")
                         for path in glob.glob(os.path.join(where, f"explore-{child.pid}-*"))]
                work = found[0] if found else None
                time.sleep(0.001)
                continue
            copies, points = _count(os.path.join(work, "snapshots")), _points(work)
            if phase == "copying":
                ready, before = copies >= want and not points, copies
            else:
                ready, before = len(points) >= min(want, 2), len(points)
            if ready:  # and explore's children (supervisors, the copier) are running
                try:
                    forked = len(psutil.Process(child.pid).children(recursive=True))
                except psutil.Error:
                    break
                if forked < (2 if phase == "copying" else 1):
                    continue  # the copier just ended: not this moment
                for _ in range(rng.randint(0, 200)):  # a seeded few microseconds more
                    pass
                (os.killpg if group else os.kill)(child.pid, signum)
                fired = True
                if rng.random() < 0.3:  # a second one, as the cleanup of the first runs
                    for _ in range(rng.randint(0, 20000)):
                        pass
                    (os.killpg if group else os.kill)(child.pid, signum)
                    twice = True
                break
            time.sleep(0.001)
        child.wait(timeout=300)
        # after explore exits, nothing it forked may still run (give a killed one its exit)
        left_procs = []
        for _ in range(50):
            left_procs = _marked(marker)
            if not left_procs:
                break
            time.sleep(0.02)
        left = [path for where in (str(tmp), "/dev/shm")
                for path in glob.glob(os.path.join(where, f"explore-{child.pid}-*"))]
        left += glob.glob(str(tmp / "toolkit-inputs-*"))
        return {"fired": fired, "twice": twice, "before": before, "forked": forked,
                "status": child.returncode,
                "left": left, "procs": [p.pid for p in left_procs],
                "err": (tmp / "err").read_text()}
    finally:
        for proc in _marked(marker):  # never leave a stray to the next test
            try:
                proc.kill()
            except psutil.Error:
                pass
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        for path in glob.glob(f"/dev/shm/explore-{child.pid}-*"):
            subprocess.run(["rm", "-rf", path])


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_sigint_or_sigterm_in_copying_or_supervisors_leaves_no_folder_and_no_process(tmp_path, phase):
    rng = random.Random(f"cleanup-{phase}")
    fired, enough = 0, 10 if phase == "shared" else 6  # shared: the rarer leak (3 in 20)
    for attempt in range(2 * enough):
        if fired >= enough:
            break
        signum = rng.choice((signal.SIGINT, signal.SIGTERM))
        group = rng.random() < 0.5
        result = trial(tmp_path, phase, signum, group, rng)
        if not result["fired"]:
            continue  # explore finished before the phase was reached: not a try
        fired += 1
        # the signal landed in that phase: copies (or point folders) present, and the
        # copier (a child of the baseline's supervisor) or a supervisor running
        assert result["before"] >= 1
        assert result["forked"] >= (2 if phase == "copying" else 1), result
        # a second signal may land once explore has put back the default handlers: its
        # cleanup was over by then, the process dies of it
        assert result["status"] == 128 + signum or (result["twice"] and
                                                    result["status"] == -signum), result
        # one line, no traceback: not even from a child forked just as a group signal lands
        # (it raised in its after-fork hooks: "Exception ignored in ... _after_fork")
        assert "Traceback" not in result["err"], result["err"]
        assert result["left"] == [], (attempt, signum, group, result)
        assert result["procs"] == [], (attempt, signum, group, result)
    assert fired >= 3, f"the signal landed in {phase} only {fired} times"


def test_dev_shm_chosen_over_an_explicit_tmpdir_work_folder_is_made_in_tmpdir(tmp_path):
    """A user who sets TMPDIR expects explore's scratch there, not in /dev/shm."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    with open(tmp_path / "err", "w") as err:
        child = subprocess.Popen([sys.executable, "-m", "toolkit", "explore", "--docs", "1",
                                  "--json"], env=env, start_new_session=True, cwd=tmp_path,
                                 stdout=subprocess.DEVNULL, stderr=err)
    try:
        seen = set()
        while child.poll() is None:  # polled until it ends: where did its folder appear?
            for where in (str(tmp_path), "/dev/shm"):
                if glob.glob(os.path.join(where, f"explore-{child.pid}-*")):
                    seen.add(where)
            time.sleep(0.001)
        assert child.wait() == 0, (tmp_path / "err").read_text()
        assert seen == {str(tmp_path)}
        assert not glob.glob(str(tmp_path / f"explore-{child.pid}-*"))
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        for path in glob.glob(f"/dev/shm/explore-{child.pid}-*"):
            subprocess.run(["rm", "-rf", path])
