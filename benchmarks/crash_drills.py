"""Section 5: crash exploration (snapshot and real-SIGKILL modes) and the drill catalogue.

* crash points/s: ``toolkit.explore`` on the same batch in both modes, back to
  back in each repetition (the ratio is per repetition). Snapshot mode runs
  its points a few per supervisor process (``toolkit.explore.SHARED``); the
  same run also measures it with one supervisor per point (``SHARED = 1``,
  the path before sharing), interleaved, for the ratio. A point counts only
  when its recovery ran and the checker judged it (``total()["recovered"]``;
  every row must: no point takes another's result, there is no memo of
  recoveries, and no two copies of the two-document batch are alike anyway).
  The rate includes the recording (snapshot mode) or the uncrashed baseline
  (real mode).
* bare forks/s of this warm process: what one fork costs, for scale.
* ``drill all`` wall time, in forked parallel processes (one per CPU) and one
  after the other, in this (warm) process. ``--quick`` runs a few drills.
* CPU time (this process and its reaped children, ``getrusage``) per crash
  point and per ``drill all``: what a loaded machine distorts least. Divided
  by the cores, it bounds the wall time a quiet machine can reach.
  ``benchmarks/profile_explore.py`` splits a crash point's CPU by phase.
"""

import resource
import time

from measure import Figure, Row, check, interleave, rate, ratio
from sections import bare_forks, log

QUICK_DRILLS = ("crash-after-submit", "crash-after-submit/blind-retry")


def explore(cfg) -> list[Row]:
    try:
        from toolkit.explore import Plan
        from toolkit.explore import explore as run_explore
        from toolkit.pool import default_jobs
    except ImportError as exc:
        return [Row("5", "crash points explored/s", None, ">= 100 /s",
                    note=f"not measured: toolkit.explore not importable ({exc})")]
    import toolkit.explore

    log(f"5 crash exploration, {cfg.explore_docs} documents, snapshot and real modes")
    points, supervisors = {}, {}
    cpu = {"snapshot": [], "real": [], "snapshot-1": []}
    shared = toolkit.explore.SHARED

    def one(mode, per_supervisor=shared):
        def run():
            toolkit.explore.SHARED = per_supervisor
            try:
                before = cpu_seconds()
                result = run_explore(Plan(docs=cfg.explore_docs, every=cfg.explore_every,
                                          jobs=0, mode=mode))
            finally:
                toolkit.explore.SHARED = shared
            recovered = result.total()["recovered"]  # recovery ran and was judged
            assert result.mode == mode and recovered == len(result.rows), result.total()
            label = mode if per_supervisor == shared else f"{mode}-1"
            points[label], supervisors[label] = recovered, result.supervisors
            cpu[label].append((cpu_seconds() - before) / recovered * 1000)
            return rate(recovered, result.seconds)
        return run

    r = interleave(cfg.heavy_reps, {"snapshot": one("snapshot"), "real": one("real"),
                                    "snapshot-1": one("snapshot", 1),
                                    "forks": lambda: bare_forks(cfg.forks)})
    snap, real = Figure(r["snapshot"], "/s"), Figure(r["real"], "/s")
    every = f", every {cfg.explore_every}th step" if cfg.explore_every > 1 else ""
    batch = f"safe, {cfg.explore_docs} docs{every}, {points['snapshot']} points"
    return [Row("5", f"crash points explored/s, snapshot mode ({batch}, copy+recover+check, "
                     f"{supervisors['snapshot']} supervisor processes)",
                snap, *check(snap, ">=", 100)),
            Row("5", f"crash points explored/s, real SIGKILL mode ({batch}, replay+check)",
                real),
            Row("5", "  ratio snapshot / real mode", ratio(r["snapshot"], r["real"])),
            Row("5", "  snapshot mode, one supervisor process per point (no sharing)",
                Figure(r["snapshot-1"], "/s")),
            Row("5", "  ratio shared supervisors / one per point",
                ratio(r["snapshot"], r["snapshot-1"])),
            Row("5", "  CPU per crash point, snapshot mode (parent + children)",
                Figure(cpu["snapshot"], "ms")),
            Row("5", "  CPU per crash point, snapshot mode, one supervisor per point",
                Figure(cpu["snapshot-1"], "ms")),
            Row("5", "  CPU per crash point, real SIGKILL mode (parent + children)",
                Figure(cpu["real"], "ms")),
            Row("5", f"  snapshot-mode points/s if CPU-bound on {default_jobs()} cores",
                Figure([default_jobs() * 1000 / ms for ms in cpu["snapshot"]], "/s")),
            Row("5", "bare fork+exit+wait of this warm process", Figure(r["forks"], "/s")),
            Row("5", "  ratio snapshot-mode crash points / bare forks",
                ratio(r["snapshot"], r["forks"]))] + drill_all(cfg)


def cpu_seconds() -> float:
    """CPU time of this process and of its children reaped so far (user + system)."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def drill_all(cfg) -> list[Row]:
    from toolkit.drills import CATALOGUE
    from toolkit.drills.parallel import run_parallel
    from toolkit.pool import default_jobs

    names = None if cfg.drills is None else list(cfg.drills)  # --quick: a few drills
    count = len(CATALOGUE) if names is None else len(names)
    jobs = default_jobs()
    log(f"5 drill catalogue ({count} drills), {jobs} processes and one after the other")

    cpu = []

    def wall(jobs_now):
        def run():
            start, before = time.perf_counter(), cpu_seconds()
            results = run_parallel(names, jobs=jobs_now)
            assert len(results) == count
            if jobs_now > 1:
                cpu.append(cpu_seconds() - before)
            return time.perf_counter() - start
        return run

    # the sequential catalogue takes about a minute per repetition; --quick proves it runs
    reps = 1 if cfg.drills is not None else min(cfg.heavy_reps, 2)
    r = interleave(reps, {"parallel": wall(jobs), "sequential": wall(1)})
    what = "drill all" if names is None else f"{count} drills (quick)"
    parallel = Figure(r["parallel"], "s")
    return [Row("5", f"{what}: wall time, {jobs} forked processes", parallel,
                *(check(parallel, "<=", 30) if names is None else ("", ""))),
            Row("5", f"{what}: wall time, one after the other", Figure(r["sequential"], "s")),
            Row("5", "  ratio sequential / parallel", ratio(r["sequential"], r["parallel"])),
            Row("5", f"{what}: CPU time, {jobs} forked processes (parent + children)",
                Figure(cpu, "s")),
            Row("5", f"  {what}: wall if CPU-bound on {jobs} cores (CPU / cores)",
                Figure([seconds / jobs for seconds in cpu], "s"))]
