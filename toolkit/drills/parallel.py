"""Running the drill catalogue: one drill after another (``run_catalogue``) or in parallel
processes (``run_parallel``): same results, same order, a fraction of the time.

Drills are independent: each runs in its own temporary folder with its own
ledger, provider and (HTTP drills) service on a port the system picks. So
``run_parallel`` forks one child per drill (``toolkit.pool``), at most ``jobs`` at a time, each
running ``run_drill`` exactly as the sequential ``run_catalogue`` does, and
sends its ``DrillResult`` back pickled over a pipe. Results are returned in
catalogue order and ``progress`` is called in that order too (a drill that
finishes early waits for those before it), so stdout and stderr are the same
whatever the scheduling; only the wall time changes.

Forking (not spawning) keeps the children warm: the parent has imported the
drills, the checker and PyMuPDF once. A child ends with ``os._exit`` (no
handler of the parent's runs twice); one that dies without a result (killed,
or its drill raised) fails the whole catalogue with its traceback, as the
sequential run would have raised.
"""

import os
import pickle
import tempfile
import traceback

from toolkit import pool
from toolkit.drills import CATALOGUE, DRILLS, Drill, DrillResult, run_drill


def chosen_drills(names=None, strategy=None) -> list[Drill]:
    """The drills ``run_catalogue`` runs: all (or the named ones); with ``strategy``, the safe rows."""
    chosen = CATALOGUE if names is None else [DRILLS[name] for name in names]
    if strategy is not None:
        chosen = [drill for drill in chosen if drill.strategy == "safe"]
    return chosen


def run_catalogue(names=None, progress=None, strategy=None) -> list[DrillResult]:
    """Run every drill (or the named ones), in catalogue order.

    With ``strategy``, run each distinct scenario (the safe rows) with that
    strategy instead, expecting what the safe design achieves: a valid verdict.
    """
    results = []
    for drill in chosen_drills(names, strategy):
        results.append(run_drill(drill, strategy=strategy))
        if progress is not None:
            progress(results[-1])
    return results


def cost(drill: Drill) -> tuple:
    """How long ``drill`` runs, roughly, for scheduling only (never for the output).

    Measured sequentially (two loaded cores): an HTTP drill starts a service
    process and waits on real sockets (5-8 s, the slow submit's 3 s job on top),
    OCR drills run Tesseract (scans), long documents go page by page (2-3 s);
    the rest take 0.5-2 s, growing with their documents and runs.
    """
    return (drill.http, "slow_submit" in drill.service_faults, drill.scans, drill.long_docs,
            drill.runs * drill.docs)


def run_parallel(names=None, progress=None, strategy=None, jobs=0) -> list:
    """``run_catalogue``'s results (same drills, same order), ``jobs`` drills at a time.

    The longest drills start first (``cost``: LPT scheduling, so no long drill
    is left alone at the end); results and ``progress`` stay in catalogue order.

    Raises:
        RuntimeError: a drill's process died without a result (its traceback).
    """
    chosen = chosen_drills(names, strategy)
    jobs = jobs or pool.default_jobs()
    if jobs <= 1 or len(chosen) <= 1:
        results = []
        for drill in chosen:
            results.append(_run(drill, strategy))
            if progress is not None:
                progress(results[-1])
        return results
    results, reported, failure = [None] * len(chosen), [0], []

    def reaped(index, result) -> bool:
        try:
            results[index] = _outcome(chosen[index], result[0])
        except RuntimeError as exc:  # start no other drill; those running finish
            failure.append(exc)
            return True
        while not failure and reported[0] < len(chosen) and results[reported[0]] is not None:
            if progress is not None:  # in catalogue order, whoever finished first
                progress(results[reported[0]])
            reported[0] += 1
        return False
    # sorted() is stable: drills of equal cost start in catalogue order (deterministic)
    order = sorted(range(len(chosen)), key=lambda i: cost(chosen[i]), reverse=True)
    pool.run([_task(drill, strategy) for drill in chosen], jobs, reaped, order)
    if failure:
        raise failure[0]
    return results


def _run(drill, strategy):
    """``run_drill`` in a throwaway folder on tmpfs where there is one (``pool.scratch``):
    the drills fsync their ledgers, and on a disk those waits were half the wall time.
    A drill's faults are injected (a full disk is ``faults.fill_disk``), never the medium's."""
    with tempfile.TemporaryDirectory(prefix="drill-", dir=pool.scratch()) as work:
        return run_drill(drill, work, strategy=strategy)


def _task(drill, strategy):
    """A ``pool`` task: run ``drill``, write its pickled result (or traceback) to the pipe."""
    def task(fd: int) -> int:
        # Each child has one CPU's share: Tesseract's OpenMP threads (scan drills) would
        # spin against the other drills (measured: twice the CPU time, 2-3x the wall time).
        os.environ.setdefault("OMP_THREAD_LIMIT", "1")
        code = 0
        try:
            payload = pickle.dumps(("ok", _run(drill, strategy)))
        except BaseException:  # the parent must hear of it, whatever it is
            code = pool.FAILED
            payload = pickle.dumps(("error", traceback.format_exc()[-4000:]))
        with open(fd, "wb") as pipe:
            pipe.write(payload)
        return code
    return task


def _outcome(drill, data: bytes):
    try:
        kind, value = pickle.loads(data)
    except Exception:  # noqa: BLE001 - an empty or cut pipe: the child died
        kind, value = "error", "its process died without a result"
    if kind != "ok":
        raise RuntimeError(f"drill {drill.name} failed: {value}")
    return value
