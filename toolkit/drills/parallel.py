"""Running the drill catalogue: one drill after another (``run_catalogue``) or in parallel
processes (``run_parallel``): same results, same order, a fraction of the time.

Drills are independent: each runs in its own temporary folder with its own
ledger, provider and (HTTP drills) service on a port the system picks. So
``run_parallel`` forks one child per drill, at most ``jobs`` at a time, each
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
import selectors
import sys
import traceback

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


def default_jobs() -> int:
    """One drill per CPU this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def run_parallel(names=None, progress=None, strategy=None, jobs=0) -> list:
    """``run_catalogue``'s results (same drills, same order), ``jobs`` drills at a time.

    Raises:
        RuntimeError: a drill's process died without a result (its traceback).
    """
    chosen = chosen_drills(names, strategy)
    jobs = jobs or default_jobs()
    if jobs <= 1 or len(chosen) <= 1:
        results = []
        for drill in chosen:
            results.append(run_drill(drill, strategy=strategy))
            if progress is not None:
                progress(results[-1])
        return results
    results, reported, failure = [None] * len(chosen), 0, None
    pending, running = list(enumerate(chosen)), {}
    with selectors.DefaultSelector() as selector:
        while pending or running:
            while pending and len(running) < jobs:
                index, drill = pending.pop(0)
                pid, read_fd = _start(drill, strategy)
                running[read_fd] = (index, pid, [])
                selector.register(read_fd, selectors.EVENT_READ)
            for key, _ in selector.select():
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    running[key.fd][2].append(chunk)
                    continue
                selector.unregister(key.fd)
                os.close(key.fd)
                index, pid, chunks = running.pop(key.fd)
                os.waitpid(pid, 0)
                try:
                    results[index] = _outcome(chosen[index], b"".join(chunks))
                except RuntimeError as exc:  # start no other drill; reap those running
                    failure, pending = failure or exc, []
            while failure is None and reported < len(chosen) and results[reported] is not None:
                if progress is not None:  # in catalogue order, whoever finished first
                    progress(results[reported])
                reported += 1
    if failure is not None:
        raise failure
    return results


def _start(drill, strategy) -> tuple[int, int]:
    """Fork a child that runs ``drill`` and writes its pickled result (or error) to a pipe."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            os.close(read_fd)
            try:
                payload = pickle.dumps(("ok", run_drill(drill, strategy=strategy)))
            except BaseException:  # the parent must hear of it, whatever it is
                code = 70
                payload = pickle.dumps(("error", traceback.format_exc()[-4000:]))
            with open(write_fd, "wb") as pipe:
                pipe.write(payload)
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _outcome(drill, data: bytes):
    try:
        kind, value = pickle.loads(data)
    except Exception:  # noqa: BLE001 - an empty or cut pipe: the child died
        kind, value = "error", "its process died without a result"
    if kind != "ok":
        raise RuntimeError(f"drill {drill.name} failed: {value}")
    return value
