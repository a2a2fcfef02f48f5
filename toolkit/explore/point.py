"""One crash point in its supervisor process (crash, rerun, judge), and the uncrashed run.

``explore`` forks the uncrashed run (``_record``: in snapshot mode the recording,
which copies the batch folder at each step) from the exploring process, then
runs the points in supervisors (``_explore_point``: real mode, one forked
supervisor per point, which forks the killed run and the reruns; snapshot mode,
a few supervisors, each taking its points one after another from their copies).
The uncrashed run's reruns, if it did not rest, and its judgement are an
``_explore_point`` too, given the run's messages (``ran``).
"""

import os
import tempfile
from pathlib import Path

from toolkit.explore.child import Paths, fork, run_batch, run_here
from toolkit.explore.judge import _judge, _note_kill, _rested
from toolkit.explore.memo import install
from toolkit.explore.powerloss import drop_unsynced, lost_acknowledged, lost_deferred, synced_size


def _enter(memo, temp) -> None:
    """Set up this (forked) process for the runs of a point or of the recording, once."""
    if memo is not None:  # this process and the runs it forks, once: see ``memo``
        install(memo)
    if temp is not None:
        # The runs' private input copies (the runner's ``toolkit-inputs-*``, one folder per
        # run) go inside the exploration's folder: in RAM when that is /dev/shm, removed with
        # it once every process is gone (``scratch``). In a /tmp on disk, making and removing
        # them cost ~0.25 ms of CPU and ~2.5 ms of wall time per run. No run reads another's.
        os.makedirs(temp, exist_ok=True)
        tempfile.tempdir = os.fspath(temp)


def _record(fd, plan, paths, inputs, names, snapshots=None, memo=None, temp=None) -> dict:
    """The uncrashed run (snapshot mode: the recording), in a child of the exploring process."""
    import shutil

    _enter(memo, temp)
    shutil.rmtree(paths.root, ignore_errors=True)  # a leftover of an interrupted exploration
    paths.root.mkdir(parents=True)
    return run_batch(fd, plan, paths, inputs, names, run=0, record=True, snapshots=snapshots)


def _explore_point(fd, plan, work: Path, inputs, names, point,
                   record_first=False, record_recovery=False, snapshots=None, start=None,
                   start_step=None, memo=None, temp=None, ran=None) -> dict:
    """One crash point, in a (forked) supervisor process: crash, rerun, judge.

    ``start`` (snapshot mode): the copy of the batch folder taken at step
    ``start_step``; the reruns start from it instead of a replay killed there.
    The supervisor may have run other points before (``fork_shared``), each in
    its own folder. ``memo`` (snapshot mode): the provider's work cache and the
    inputs' checks. ``temp``: the temporary folder of this process and the runs it
    forks (None: the system's). ``ran``: the ``(messages, status)`` of the first run,
    made already in ``work`` (the uncrashed run, ``_record``): its reruns and judgement.
    """
    import shutil

    _enter(memo, temp)
    if ran is None:
        shutil.rmtree(work, ignore_errors=True)  # a leftover of an interrupted exploration
        work.parent.mkdir(parents=True, exist_ok=True)
        if start is None:
            work.mkdir()
    paths = Paths(work, work / plan.ledger_file())
    row = {"point": point.k, "how": point.how, "step": None, "kind": None,
           "recovery_point": point.j, "recovery_step": None, "runs": 0}
    errors, lost, acked, deferred, reached = [], [], 0, 0, True

    if start is None:
        messages, status = ran or fork(run_batch, plan, paths, inputs, names, run=0,
                                       kill_at=point.k, how=point.how, record=record_first,
                                       snapshots=snapshots)
        reached &= _note_kill(row, "step", messages, status, point.k)
    else:  # same depth as the real mode's folder: the roots, relative to it, resolve alike
        os.rename(start, work)  # each copy serves one point: no second copy
        messages, status = [], 0
        row.update(step=start_step["label"], kind=start_step["kind"])
    first_steps = [m for m in messages if m["t"] == "step"]
    position = next((m["position"] for m in messages if m["t"] == "end"), None)
    errors += [m["error"] for m in messages if m["t"] == "error"]
    if plan.power_loss and point.k is not None:  # the uncrashed baseline keeps its power
        drop_unsynced(paths.ledger, synced_size(messages) or 0)
        lost = lost_acknowledged(paths.ledger, messages)
        deferred = lost_deferred(paths.ledger, messages)  # not acked as durable: allowed
        acked = sum(m["t"] == "ack" for m in messages)
    rested, recovery_steps = _rested(messages), []
    while not rested and row["runs"] < plan.runs:
        kill_at = point.j if row["runs"] == 0 else None
        # From a copy, the first rerun runs here, in this supervisor: a fork of the exploring
        # parent that may have recovered and judged other points (other folders) before;
        # what a run keeps of its process is its identity (pid and start, new for the copy:
        # the recording's owner is gone) and caches of pure functions. One fork per point
        # saved, and the copy-on-write faults of a fresh one.
        run = run_here if start is not None and row["runs"] == 0 else fork
        messages, status = run(run_batch, plan, paths, inputs, names, run=row["runs"] + 1,
                                kill_at=kill_at, record=record_recovery and row["runs"] == 0)
        if row["runs"] == 0:
            recovery_steps = [m for m in messages if m["t"] == "step"]
            reached &= _note_kill(row, "recovery_step", messages, status, kill_at)
        row["runs"] += 1
        errors += [m["error"] for m in messages if m["t"] == "error"]
        rested = _rested(messages)

    row.update(_judge(plan, paths, inputs, rested, lost, reached))
    row["errors"] = errors
    if plan.power_loss:
        row.update(acked=acked, lost_acked=len(lost), lost_deferred=deferred)
    shutil.rmtree(work, ignore_errors=True)
    halted = [m["halted"] for m in messages if m["t"] == "end" and m["halted"]]
    return {"row": row, "first_steps": first_steps, "recovery_steps": recovery_steps,
            "position": position, "pid": os.getpid(), "halted": halted[-1] if halted else None}
