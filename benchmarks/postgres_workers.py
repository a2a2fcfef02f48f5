"""Transitions/s and items/s with 1, 2, 4, 8 worker processes: PostgreSQL against SQLite.

    python benchmarks/postgres_workers.py --pg postgresql://user@127.0.0.1:5432/db

transitions/s: each worker process drives its own items through the six
transactions of a document's life (add, claim, intent, submitted, done,
release) on one shared ledger; the figure is all committed transactions over
the wall time from the first to the last. items/s: ``run_workers`` on a seeded
corpus with the fake provider (real PDF work), the whole batch over its wall
time. Both ledgers are durable (SQLite synchronous=FULL; PostgreSQL
synchronous_commit=on): the server's own ``fsync`` setting is printed, since a
throwaway test cluster may run without it. Seeded; not collected by pytest.
"""

import argparse
import multiprocessing
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from toolkit.documents import make_corpus
from toolkit.ledger import State, open_ledger
from toolkit.provider import Contract
from toolkit.runner import RetryPolicy
from toolkit.runner.workers import run_workers

S = State
TXNS_PER_ITEM = 6


def _drive(location, prefix, items, start, done):
    with open_ledger(location) as ledger:
        start.wait()
        for n in range(items):
            key = f"{prefix}-{n:05d}"
            ledger.add(key)
            token = ledger.claim(key, prefix, ttl=60)
            ledger.move(key, S.PENDING, S.UNKNOWN, token=token, worker=prefix)
            ledger.move(key, S.UNKNOWN, S.SUBMITTED, token=token, worker=prefix, job_id=key)
            ledger.move(key, S.SUBMITTED, S.DONE, token=token, worker=prefix,
                        artifact_path=key, artifact_size=1, artifact_sha256="0" * 64)
            ledger.release(key, token, prefix)
        done.put(time.perf_counter())


def transitions_per_second(location, workers, items) -> float:
    context = multiprocessing.get_context("spawn")
    start, done = context.Barrier(workers + 1), context.Queue()
    open_ledger(location).close()  # tables first
    processes = [context.Process(target=_drive, args=(location, f"w{n}", items, start, done))
                 for n in range(workers)]
    for process in processes:
        process.start()
    start.wait()
    began = time.perf_counter()
    ends = [done.get() for _ in processes]
    for process in processes:
        process.join()
    return workers * items * TXNS_PER_ITEM / (max(ends) - began)


def items_per_second(location, folder, inputs, workers) -> float:
    began = time.perf_counter()
    result = run_workers(location, folder / "provider.db", inputs, folder / "out", workers,
                         Contract(), policy=RetryPolicy(base_delay=0.0))
    elapsed = time.perf_counter() - began
    assert not result.halted and not result.errors and result.unsettled == 0, result
    return len(inputs) / elapsed


def _pg_location(base, schema):
    return f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{schema}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", help="a PostgreSQL URL (a schema per run is created and dropped)")
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--items", type=int, default=150, help="items per worker (transitions)")
    parser.add_argument("--docs", type=int, default=24, help="documents per batch (items/s)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    backends = ["sqlite"] + (["postgres"] if args.pg else [])
    if args.pg:
        import psycopg

        with psycopg.connect(args.pg, autocommit=True) as admin:
            fsync = admin.execute("SHOW fsync").fetchone()[0]
        print(f"PostgreSQL server fsync={fsync}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-pg-") as tmp:
        inputs = make_corpus(Path(tmp) / "in", docs=args.docs, poison=0, seed=args.seed)
        for workers in counts:
            for backend in backends:
                tps, ips = [], []
                for rep in range(args.repeat):
                    for measure, into in (("t", tps), ("i", ips)):
                        folder = Path(tmp) / f"{backend}-{workers}-{rep}-{measure}"
                        folder.mkdir()
                        schema = f"bench_{uuid.uuid4().hex[:12]}"
                        location = (_pg_location(args.pg, schema) if backend == "postgres"
                                    else str(folder / "ledger.sqlite"))
                        try:
                            into.append(transitions_per_second(location, workers, args.items)
                                        if measure == "t" else
                                        items_per_second(location, folder, inputs, workers))
                        finally:
                            if backend == "postgres":
                                with psycopg.connect(args.pg, autocommit=True) as admin:
                                    admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
                rows.append((backend, workers, statistics.median(tps), min(tps), max(tps),
                             statistics.median(ips), min(ips), max(ips)))
                print(f"  {backend} x{workers} done", flush=True)
    print("\n| ledger | workers | transitions/s (median, min–max) | items/s (median, min–max) |")
    print("| --- | ---: | ---: | ---: |")
    for backend, workers, t_med, t_lo, t_hi, i_med, i_lo, i_hi in rows:
        print(f"| {backend} | {workers} | {t_med:,.0f} ({t_lo:,.0f}–{t_hi:,.0f}) | "
              f"{i_med:.1f} ({i_lo:.1f}–{i_hi:.1f}) |")


if __name__ == "__main__":
    main()
