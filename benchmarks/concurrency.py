"""Section 10: transitions/s with N concurrent workers, group commit against the fsync limit.

Each worker process (forked, so no interpreter start in the clock) drives its
own items through the six transactions of a document's life on one shared
ledger; a sample is all committed transitions over the wall time from the
barrier to the last worker's end. Per repetition, back to back:

  * the single-writer fsync limit: the bare one-row ``INSERT`` + ``COMMIT`` loop
    (WAL, synchronous=FULL), one process: at most 1/fsync commits per second;
  * the SQLite ledger with group commit, 1, 2, 4, 8, 16 worker processes;
  * the CPU ceiling: the same workers with ``durable=False`` (no fsync at all). It
    is not all CPU: without group commit the workers have no writer queue, and a
    worker that finds SQLite's write lock taken sleeps in SQLite's busy handler
    (1, 2, 5, 10 ms ...) while the lock may already be free. So, for 8 workers,
    also the same with the writer queue lent (``writer_queue``: no sleeps);
  * beside each SQLite rate, the fsyncs each transition cost (group commit: the
    flushes a worker ran itself) and the workers' CPU per transition (rusage);
  * JSONL, one process: 8 threads with group commit, against the same bare limit;
  * PostgreSQL, 1-16 worker connections, synchronous_commit=on: on the server
    ``TOOLKIT_TEST_PG`` names, else on a throwaway cluster (``pg_server``, fsync=on) when
    PostgreSQL is installed; the server's ``fsync`` is printed in the label.
"""

import multiprocessing
import os
import resource
import threading
import time
import uuid
from pathlib import Path

import workloads as w
from measure import Figure, Row, check, interleave, ratio

S10 = "10"


def _fsyncs(ledger) -> int:
    """The fsyncs this worker ran itself (group commit: the flushes no other process's
    fsync made unnecessary); 0 without a group."""
    group, shared = getattr(ledger, "_group", None), getattr(ledger, "_flushes", None)
    if group is None:
        return 0
    return group.flushes - (shared.skipped if shared is not None else 0)


def _drive(location, options, prefix, items, start, done):
    from toolkit.ledger import open_ledger
    from toolkit.ledger.group import SharedFlushes

    options = dict(options)
    queue = options.pop("writer_queue", False)
    with open_ledger(location, **options) as ledger:
        if queue:  # durable=False has no writer queue: lend it group commit's (no fsync)
            ledger._flushes = ledger._ctx.flushes = SharedFlushes(f"{ledger.path}-flush")
        start.wait()
        w.lifecycle(ledger, w.keys(items, prefix), worker=prefix)
        done.put((time.perf_counter(), _fsyncs(ledger)))


def forked(location, workers: int, items: int, options: dict) -> tuple:
    """Run ``workers`` forked processes, ``items`` lifecycles each, on one ledger: (the
    clock at the barrier, each worker's (end, fsyncs), the children's rusage before and
    after: the workers', collected as they are joined)."""
    from toolkit.ledger import open_ledger

    context = multiprocessing.get_context("fork")
    start, done = context.Barrier(workers + 1), context.Queue()
    open_ledger(location).close()  # tables first, outside the clock
    procs = [context.Process(target=_drive, args=(location, options, f"w{n}", items, start, done))
             for n in range(workers)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for proc in procs:
        proc.start()
    start.wait()
    began = time.perf_counter()
    ends = [done.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"worker exited {proc.exitcode}")
    return began, ends, before, resource.getrusage(resource.RUSAGE_CHILDREN)


def processes_run(location, workers: int, items: int, options: dict) -> tuple:
    """(transitions/s, fsyncs per transition, workers' CPU µs per transition) of
    ``workers`` forked processes, ``items`` lifecycles each. The CPU is the workers'
    user + system time, opening and closing their ledgers included; the rate counts
    barrier to last end only."""
    began, ends, before, after = forked(location, workers, items, options)
    transitions = workers * items * w.LIFECYCLE
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return (transitions / (max(end for end, _ in ends) - began),
            sum(fsyncs for _, fsyncs in ends) / transitions, cpu / transitions * 1e6)


def processes_rate(location, workers: int, items: int, options: dict) -> float:
    """Transitions/s of ``workers`` forked processes, ``items`` lifecycles each."""
    return processes_run(location, workers, items, options)[0]


def threads_rate(path: Path, threads: int, items: int, options: dict) -> float:
    """Transitions/s of ``threads`` threads on one ledger object (JSONL: one writer process)."""
    from toolkit.ledger import open_ledger

    w._fresh(path)
    with open_ledger(path, **options) as ledger:
        barrier = threading.Barrier(threads + 1)

        def drive(n):
            barrier.wait()
            w.lifecycle(ledger, w.keys(items, f"t{n}"), worker=f"t{n}")
        pool = [threading.Thread(target=drive, args=(n,)) for n in range(threads)]
        for thread in pool:
            thread.start()
        barrier.wait()
        began = time.perf_counter()
        for thread in pool:
            thread.join()
        seconds = time.perf_counter() - began
    w._fresh(path)
    return threads * items * w.LIFECYCLE / seconds


def _bare_limit(folder: Path, items: int) -> float:
    subject = w.BareSqlite(folder, "FULL")
    try:
        subject.step(1)
        return items * w.LIFECYCLE / subject.step(items)
    finally:
        subject.close()


def group_commit(cfg, folder: Path) -> list[Row]:
    counts, items = cfg.worker_counts, cfg.worker_items
    count = [0]

    def sqlite(workers, options):
        def go():
            count[0] += 1
            path = folder / f"group-{count[0]}.sqlite"
            try:
                return processes_run(str(path), workers, items, options)
            finally:
                w._fresh(path)
                w._fresh(Path(f"{path}-flush"))
        return go

    runs = {"bare": lambda: _bare_limit(folder, items * 2)}
    for n in counts:
        runs[f"group{n}"] = sqlite(n, {"group_commit": True})
        runs[f"cpu{n}"] = sqlite(n, {"durable": False})
    if 8 in counts:  # the target's ceiling, once more without SQLite's busy-wait sleeps
        runs["queued8"] = sqlite(8, {"durable": False, "writer_queue": True})
    jsonl = folder / "group-threads.jsonl"
    runs["jsonl_group"] = lambda: threads_rate(jsonl, 8, items, {"group_commit": True})
    runs["jsonl_plain"] = lambda: threads_rate(jsonl, 8, items, {})
    from sections import log

    log(f"10 group commit: {', '.join(map(str, counts))} worker processes x {items} lifecycles")
    r = interleave(cfg.heavy_reps, runs)
    extra = {}  # fsyncs and CPU per transition of the SQLite runs, beside their rates
    for name in [name for name in r if name.startswith(("group", "cpu", "queued"))]:
        r[name], extra[f"{name}_fsyncs"], extra[f"{name}_cpu"] = map(list, zip(*r[name]))
    rows = [Row(S10, "single-writer fsync limit: bare INSERT+COMMIT loop (synchronous=FULL)",
                Figure(r["bare"], "/s"))]
    for n in counts:
        vs_bare, vs_cpu = ratio(r[f"group{n}"], r["bare"]), ratio(r[f"group{n}"], r[f"cpu{n}"])
        target = n == 8
        rows += [
            Row(S10, f"SQLite ledger, group commit, {n} worker process{'es' * (n > 1)}",
                Figure(r[f"group{n}"], "/s")),
            Row(S10, f"  CPU ceiling: same {n} workers, durable=False", Figure(r[f"cpu{n}"], "/s")),
            Row(S10, f"  ratio group commit / fsync limit, {n} workers", vs_bare,
                *(check(vs_bare, ">=", 2.0) if target else ())),
            Row(S10, f"  ratio group commit / CPU ceiling, {n} workers", vs_cpu,
                *(check(vs_cpu, ">=", 0.7) if target else ())),
            Row(S10, f"  fsyncs per transition, group commit, {n} workers",
                Figure(extra[f"group{n}_fsyncs"], "")),
            Row(S10, f"  workers' CPU per transition, group commit / ceiling, {n} workers",
                ratio(extra[f"group{n}_cpu"], extra[f"cpu{n}_cpu"])),
        ]
        if n == 8 and "queued8" in r:
            rows += [
                Row(S10, "  CPU ceiling, writer queue lent: same 8 workers, durable=False",
                    Figure(r["queued8"], "/s")),
                Row(S10, "  ratio group commit / CPU ceiling with writer queue, 8 workers",
                    ratio(r["group8"], r["queued8"])),
            ]
    rows += [Row(S10, "JSONL ledger, 8 threads, group commit", Figure(r["jsonl_group"], "/s")),
             Row(S10, "JSONL ledger, 8 threads, one fsync per transition",
                 Figure(r["jsonl_plain"], "/s")),
             Row(S10, "  ratio JSONL group commit / fsync limit",
                 ratio(r["jsonl_group"], r["bare"]))]
    return rows + postgres(cfg, folder)


def postgres(cfg, folder: Path) -> list[Row]:
    """PostgreSQL's own group commit: N worker connections on ``TOOLKIT_TEST_PG``, else on a
    throwaway cluster made for it (``fsync=on``) beside ``folder`` (rows say why when not run)."""
    url = os.environ.get("TOOLKIT_TEST_PG")
    if url:
        return _postgres(cfg, url)
    import subprocess

    import pg_server

    # Beside the run's folder, on the same disk as the SQLite ledgers it is compared to;
    # where the server's account cannot reach that folder (initdb fails: a private --dir, as
    # pytest's), in the system temp folder.
    for parent in (folder.parent, None):
        try:
            with pg_server.throwaway(fsync=True, parent=parent) as (url, _):
                return _postgres(cfg, url)
        except FileNotFoundError as error:
            why = str(error)
            break
        except subprocess.CalledProcessError as error:
            why = f"{Path(error.cmd[0]).name} failed: {error.stderr.decode(errors='replace')}"
            why = why.strip().splitlines()[0] if why.strip() else "initdb failed"
    return [Row(S10, "PostgreSQL ledger, 1-16 workers", None,
                note=f"not measured: {why}; or set TOOLKIT_TEST_PG to a throwaway server")]


def _postgres(cfg, url: str) -> list[Row]:
    import psycopg

    from sections import log

    with psycopg.connect(url, autocommit=True) as admin:
        fsync = admin.execute("SHOW fsync").fetchone()[0]
        commit = admin.execute("SHOW synchronous_commit").fetchone()[0]
    log(f"10 PostgreSQL (fsync={fsync}), {', '.join(map(str, cfg.worker_counts))} workers")

    def go(workers):
        def run():
            schema = f"bench_{uuid.uuid4().hex[:12]}"
            location = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
            try:
                return processes_rate(location, workers, cfg.worker_items, {})
            finally:
                with psycopg.connect(url, autocommit=True) as admin:
                    admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        return run

    r = interleave(cfg.heavy_reps, {n: go(n) for n in cfg.worker_counts})
    rows = [Row(S10, f"PostgreSQL ledger, {n} worker connection{'s' * (n > 1)} "
                     f"(fsync={fsync}, synchronous_commit={commit})", Figure(r[n], "/s"))
            for n in cfg.worker_counts]
    top = max(cfg.worker_counts)
    rows.append(Row(S10, f"  ratio PostgreSQL {top} workers / 1 worker", ratio(r[top], r[1])))
    return rows
