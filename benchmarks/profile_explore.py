"""Where does a crash point spend its CPU? (a helper for section 5 of run.py)

    python benchmarks/profile_explore.py [--mode snapshot|real] [--docs 2] [--reps 5]
                                         [--cprofile DIR]

Runs ``toolkit.explore`` on the benchmark's batch (safe, ``--docs`` documents)
``--reps`` times after one warm-up, with CPU timers (``time.process_time``: what
a loaded machine distorts least) around each phase. The timers are installed
in this process before anything forks, so every supervisor, recording and run
inherits them; each process sends its totals through an inherited pipe as its
points end. Printed, in ms per crash point (median over the repetitions):

* parent: this process (corpus, input checks, ``prefile``, the rows), of which
  ``prefile`` (rendering the later documents while the recording runs);
* recording: the uncrashed run that copies the batch folder at each step (forked
  from this process), of which ``copy`` (``snapshot.copy_tree``) and ``render``
  (``documents.process`` computed for real);
* per point (the supervisors' processes; the uncrashed run's judgement is one of
  their calls): ``recovery`` (the run from the copy,
  ``run_here``), ``judge`` (``collect_history`` + ``check``, of which
  ``check``), ``remove`` (the point's folder), and ``rest``: the supervisor
  process's CPU outside these (its fork's copy-on-write faults, the restore's
  rename, messages);
* total: ``getrusage`` of this process and its children, as section 5 counts it.

In the real mode (``--mode real``) a supervisor forks its runs: their CPU is in
the total only, not in ``points``; and its judge reads the inputs with MuPDF
(no memo: the real mode is the reference).

``--cprofile DIR`` also writes a cProfile (CPU clock) per supervisor point and
per recording (``pstats`` files), for ``python -m pstats``.
"""

import argparse
import collections
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import toolkit.explore as explore_module  # noqa: E402
import toolkit.explore.point as point_module  # noqa: E402
from toolkit import documents  # noqa: E402
from toolkit.explore import Plan, explore, snapshot  # noqa: E402

_SPENT = collections.defaultdict(float)  # phase -> CPU seconds in this process
_PIPE = [None]  # write end: totals of each process, one JSON line per report


def _timed(phase, function):
    def timed(*args, **kwargs):
        start = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            _SPENT[phase] += time.process_time() - start
    return timed


def _report(kind: str) -> None:
    line = json.dumps({"kind": kind, "pid": os.getpid(), "cpu": time.process_time(), **_SPENT})
    os.write(_PIPE[0], (line + "\n").encode())  # below PIPE_BUF: one write, whole


def _install(profile_dir) -> None:
    """Timers (and profilers) around each phase, in this process before any fork."""
    run_batch, explore_point = point_module.run_batch, explore_module._explore_point
    # before the memo wraps it (in the forked supervisors): a render is a cache miss
    documents.process = _timed("render", documents.process)

    def recording(fd, *args, **kwargs):
        if kwargs.get("snapshots") is None:  # a forked rerun (real mode): not the recording
            return run_batch(fd, *args, **kwargs)
        _SPENT.clear()  # inherited from the supervisor that forked us
        result = _profiled(profile_dir, "recording", run_batch, fd, *args, **kwargs)
        _report("recording")
        return result

    def point(fd, *args, **kwargs):
        result = _profiled(profile_dir, "point", explore_point, fd, *args, **kwargs)
        _report("supervisor")  # the uncrashed run's judgement is one of their calls
        return result

    point_module.run_batch, explore_module._explore_point = recording, point
    point_module.run_here = _timed("recovery", point_module.run_here)
    point_module._judge = _timed("judge", point_module._judge)
    explore_module.prefile = _timed("prefile", explore_module.prefile)
    snapshot.copy_tree = _timed("recording: copy", snapshot.copy_tree)
    import shutil

    from toolkit import checker

    shutil.rmtree = _timed("remove", shutil.rmtree)
    checker.check = _timed("judge: check", checker.check)


def _profiled(profile_dir, kind, function, *args, **kwargs):
    if profile_dir is None:
        return function(*args, **kwargs)
    import cProfile

    profile = cProfile.Profile(time.process_time)
    profile.enable()
    try:
        return function(*args, **kwargs)
    finally:
        profile.disable()
        profile.dump_stats(Path(profile_dir) / f"{kind}-{os.getpid()}-{time.monotonic_ns()}")


def _cpu() -> float:
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _drain(read_fd) -> list[dict]:
    data = b""
    while True:
        try:
            chunk = os.read(read_fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return [json.loads(line) for line in data.splitlines()]


def one(plan, read_fd) -> dict:
    _drain(read_fd)
    _SPENT.clear()
    before, own = _cpu(), time.process_time()
    result = explore(plan)
    total, own = _cpu() - before, time.process_time() - own
    points = len(result.rows)
    assert result.total()["recovered"] == points, result.total()
    last = {}  # pid -> its last report (the totals are cumulative per process)
    for report in _drain(read_fd):
        last[(report["kind"], report["pid"])] = report
    sups = [r for (kind, _), r in last.items() if kind == "supervisor"]
    rec = [r for (kind, _), r in last.items() if kind == "recording"]

    def per_point(reports, key):
        return 1000 * sum(r.get(key, 0.0) for r in reports) / points

    row = {"parent": 1000 * own / points, "parent: prefile": 1000 * _SPENT["prefile"] / points,
           "recording": per_point(rec, "cpu"), "recording: copy": per_point(rec, "recording: copy"),
           "recording: render": per_point(rec, "render"),
           "points": per_point(sups, "cpu"), "points: recovery": per_point(sups, "recovery"),
           "points: judge": per_point(sups, "judge"),
           "points: judge: check": per_point(sups, "judge: check"),
           "points: remove": per_point(sups, "remove")}
    row["points: rest"] = row["points"] - sum(row[k] for k in ("points: recovery",
                                                               "points: judge", "points: remove"))
    row["total (getrusage)"] = 1000 * total / points
    row["points/s"] = result.total()["points_per_s"]
    row["n"] = points
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("snapshot", "real"), default="snapshot")
    parser.add_argument("--docs", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cprofile", type=Path, help="folder for cProfile files")
    args = parser.parse_args(argv)
    if args.cprofile:
        args.cprofile.mkdir(parents=True, exist_ok=True)
    read_fd, _PIPE[0] = os.pipe()
    os.set_blocking(read_fd, False)
    _install(args.cprofile)
    plan = Plan(docs=args.docs, jobs=0, mode=args.mode)
    explore(plan)  # warm-up, as the benchmark's first repetition is
    rows = [one(plan, read_fd) for _ in range(args.reps)]
    print(f"explore --mode {args.mode} --docs {args.docs}: {rows[0]['n']} points, "
          f"{args.reps} repetitions; CPU ms per crash point, median [min-max]")
    for key in rows[0]:
        if key == "n":
            continue
        values = sorted(row[key] for row in rows)
        print(f"  {key:24s} {statistics.median(values):7.2f}  [{values[0]:.2f}-{values[-1]:.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
