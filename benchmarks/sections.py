"""The table's sections: each measures its figures and returns its rows.

Numbers follow issue 10: 1 ledger vs the fsync limit, 2 durability levels,
3 the rewrite-the-state-file design, 4 audit and resume of large ledgers,
5 crash exploration, 6 ledger overhead on real work, 7 peak memory.
"""

import gc
import os
import shutil
import sys
import time
from pathlib import Path

import workloads as w
from measure import Figure, Row, check, exponent_figure, in_child, interleave, paired, rate, ratio

S1, S2 = "1", "2"


_START = time.monotonic()


def log(message: str) -> None:
    print(f"[bench {time.monotonic() - _START:6.1f} s] {message}", file=sys.stderr, flush=True)


# -- 1 and 2: transitions per second against the physical limits ------------------------

def ledger_rates(cfg, folder: Path) -> list[Row]:
    log("1-2 ledger transitions/s against bare loops (interleaved blocks)")
    fast = ("bare_normal", "floor_normal", "sqlite_fast", "bare_write", "jsonl_fast", "memory")
    factories = {
        "bare_full": lambda: w.BareSqlite(folder, "FULL"),
        "floor": lambda: w.SqlFloor(folder, "FULL"),
        "sqlite": lambda: w.LedgerSubject(folder, ".sqlite", True),
        "bare_fsync": lambda: w.BareAppend(folder, fsync=True),
        "jsonl": lambda: w.LedgerSubject(folder, ".jsonl", True),
        "bare_normal": lambda: w.BareSqlite(folder, "NORMAL"),
        "floor_normal": lambda: w.SqlFloor(folder, "NORMAL"),
        "sqlite_fast": lambda: w.LedgerSubject(folder, ".sqlite", False),
        "bare_write": lambda: w.BareAppend(folder, fsync=False),
        "jsonl_fast": lambda: w.LedgerSubject(folder, ".jsonl", False),
        "memory": lambda: w.LedgerSubject.memory(),
    }
    r = paired(cfg.reps, cfg.blocks, cfg.block_items, factories, w.LIFECYCLE,
               scale=dict.fromkeys(fast, cfg.fast_scale))
    fig = {name: Figure(samples, "/s") for name, samples in r.items()}
    sqlite_ratio = ratio(r["sqlite"], r["bare_full"])
    floor_ratio = ratio(r["sqlite"], r["floor"])
    jsonl_ratio = ratio(r["jsonl"], r["bare_fsync"])
    cpu = Figure([1e6 / x for x in r["sqlite_fast"]], "us")
    return [
        Row(S1, "bare SQLite INSERT+COMMIT, 1 row/txn (WAL, synchronous=FULL)", fig["bare_full"]),
        Row(S1, "  same SQL as the ledger, no Python (item+event row/txn)", fig["floor"]),
        Row(S1, "SQLite ledger, durable=True (1 txn/transition + event row)", fig["sqlite"]),
        Row(S1, "  ratio SQLite ledger / bare commit loop", sqlite_ratio,
            *check(sqlite_ratio, ">=", 0.8)),
        Row(S1, "  ratio same SQL, no Python / bare commit loop",
            ratio(r["floor"], r["bare_full"])),
        Row(S1, "  ratio SQLite ledger / same SQL, no Python", floor_ratio,
            *check(floor_ratio, ">=", 0.9)),
        Row(S1, "bare append+fsync, 1 line per record", fig["bare_fsync"]),
        Row(S1, "JSONL ledger, durable=True (append+fsync per event)", fig["jsonl"]),
        Row(S1, "  ratio JSONL ledger / bare append+fsync", jsonl_ratio,
            *check(jsonl_ratio, ">=", 0.9)),
        Row(S2, "bare SQLite INSERT+COMMIT (WAL, synchronous=NORMAL)", fig["bare_normal"]),
        Row(S2, "  same SQL as the ledger, no Python (NORMAL)", fig["floor_normal"]),
        Row(S2, "SQLite ledger, durable=False (synchronous=NORMAL)", fig["sqlite_fast"]),
        Row(S2, "  CPU per transition, SQLite ledger durable=False", cpu),
        Row(S2, "  ratio durable=False / bare NORMAL loop",
            ratio(r["sqlite_fast"], r["bare_normal"])),
        Row(S2, "  speed-up SQLite durable=False / durable=True",
            ratio(r["sqlite_fast"], r["sqlite"])),
        Row(S2, "bare append, no fsync", fig["bare_write"]),
        Row(S2, "JSONL ledger, durable=False (flush, no fsync)", fig["jsonl_fast"]),
        Row(S2, "  ratio durable=False / bare append", ratio(r["jsonl_fast"], r["bare_write"])),
        Row(S2, "  speed-up JSONL durable=False / durable=True",
            ratio(r["jsonl_fast"], r["jsonl"])),
        Row(S2, "ledger policy alone (in-memory backend, no storage)", fig["memory"]),
    ]


# -- 3: the rewrite-the-state-file design ---------------------------------------------

def rewrite(cfg, folder: Path) -> list[Row]:
    rows, naive, sqlite, jsonl = [], [], [], []
    for n in cfg.rewrite_sizes:
        log(f"3 rewrite-state vs ledger, {n:,} items")
        r = interleave(cfg.heavy_reps, {
            "naive": lambda: w.rewrite_state(folder, n),
            "sqlite": lambda: w.ledger_lifecycles(folder, n, ".sqlite", False),
            "jsonl": lambda: w.ledger_lifecycles(folder, n, ".jsonl", False),
        })
        naive.append(r["naive"])
        sqlite.append(r["sqlite"])
        jsonl.append(r["jsonl"])
        rows += [Row("3", f"n={n:,}: rewrite state file in place per item (no fsync)",
                     Figure(r["naive"], "s")),
                 Row("3", f"n={n:,}: SQLite ledger durable=False, {w.LIFECYCLE} txns/item",
                     Figure(r["sqlite"], "s")),
                 Row("3", f"  n={n:,}: ratio rewrite / SQLite ledger",
                     ratio(r["naive"], r["sqlite"])),
                 Row("3", f"  n={n:,}: ratio rewrite / JSONL ledger durable=False",
                     ratio(r["naive"], r["jsonl"]))]
    sizes = list(cfg.rewrite_sizes)
    rows += [Row("3", "exponent k in t ~ n^k: rewrite state file", exponent_figure(sizes, naive)),
             Row("3", "exponent k: SQLite ledger", exponent_figure(sizes, sqlite), "~ 1"),
             Row("3", "exponent k: JSONL ledger", exponent_figure(sizes, jsonl), "~ 1")]
    n = cfg.atomic_size
    log(f"3 atomic fsync'd rewrite vs durable ledger, {n:,} items")
    r = interleave(cfg.heavy_reps, {
        "atomic": lambda: w.rewrite_state(folder, n, atomic=True),
        "sqlite": lambda: w.ledger_lifecycles(folder, n, ".sqlite", True),
    })
    rows += [Row("3", f"n={n:,}: rewrite via temp+fsync+rename+dir fsync",
                 Figure(r["atomic"], "s")),
             Row("3", f"n={n:,}: SQLite ledger durable=True", Figure(r["sqlite"], "s")),
             Row("3", f"  n={n:,}: ratio atomic rewrite / SQLite durable=True",
                 ratio(r["atomic"], r["sqlite"]))]
    return rows


# -- 4 and 7: audit of a large JSONL ledger, against pyarrow and pandas; SQLite vs SELECT

def audit(cfg, folder: Path) -> tuple[list[Row], list[Row]]:
    import audit_jsonl  # owned by the audit's engineer: its rows for sections 4 and 7

    return audit_jsonl.section(cfg, folder)


# -- 4: resume of a large, nearly done ledger ---------------------------------------

def resume(cfg, folder: Path) -> list[Row]:
    from batches import batch_seconds, record_roots, resume_fixture, tmpfs

    from toolkit.ledger import open_ledger
    from toolkit.provider import FakeProvider

    rows, sizes, samples = [], [], []
    files = tmpfs(folder, 2 * max(cfg.resume_sizes)) / f"resume-toolkit-bench-{os.getpid()}"
    try:
        for n in cfg.resume_sizes:
            if samples:
                k = exponent_figure(sizes, samples).median if len(sizes) > 1 else 1.0
                projected = Figure(samples[-1], "s").median * (n / sizes[-1]) ** max(k, 1.0)
                if projected > cfg.resume_budget:
                    rows.append(Row("4", f"resume, n={n:,}: not run", None, "",
                                    note=f"projected {projected:,.0f} s per sample from t ~ n^"
                                         f"{max(k, 1.0):.2f} > budget {cfg.resume_budget:,.0f} s"))
                    break
            log(f"4 resume of a {n:,}-item ledger, 99% done (building it)")
            shutil.rmtree(files, ignore_errors=True)
            pristine, inputs = resume_fixture(files / "fx", n)
            ledger = folder / "resume.sqlite"

            def fresh_copy():
                for suffix in ("-wal", "-shm"):
                    Path(f"{ledger}{suffix}").unlink(missing_ok=True)
                shutil.copyfile(pristine, ledger)
                shutil.copyfile(f"{pristine}.inputs", f"{ledger}.inputs")  # the stat index
                record_roots(ledger, files / "fx")  # once: the first run's, as it left them
                # Both sides start with no garbage pending: a collection that an earlier
                # sample's garbage is due lands in neither (the read of 200,000 items spent
                # up to a quarter of its time in a gen-2 pass it did not cause).
                gc.collect()

            # CPU time of this process, both sides (the machine is shared: a neighbour's
            # burst stretches wall time, not what the resume computes).
            def read_all():
                fresh_copy()
                start = time.process_time()
                with open_ledger(ledger) as opened:
                    opened.items()
                return time.process_time() - start

            def run_again(count=[0]):
                fresh_copy()
                count[0] += 1
                provider = FakeProvider(files / f"p{count[0]}.sqlite", files / f"prov{count[0]}")
                try:
                    seconds, counts = batch_seconds(open_ledger(ledger), provider,
                                                    files / "fx" / "out", inputs,
                                                    clock=time.process_time)
                finally:
                    provider.close()
                assert counts["done"] == round(n * 0.99), counts  # nothing re-executed or lost
                return seconds

            log(f"4 resume of {n:,} items: timing")
            r = interleave(cfg.heavy_reps, {"read": read_all, "resume": run_again})
            sizes.append(n)
            samples.append(r["resume"])
            rows += [Row("4", f"resume, n={n:,} (99% done, 1% failed): Runner.run(), CPU",
                         Figure(r["resume"], "s")),
                     Row("4", "  per item", Figure([t / n * 1e6 for t in r["resume"]], "us")),
                     Row("4", f"  n={n:,}: open ledger + read all items (lower bound), CPU",
                         Figure(r["read"], "s")),
                     Row("4", f"  n={n:,}: ratio resume / read all items",
                         (gap := ratio(r["resume"], r["read"])), *check(gap, "<=", 2.0))]
        if len(sizes) > 1:
            rows.append(Row("4", "exponent k in t ~ n^k: resume", exponent_figure(sizes, samples),
                            "~ 1"))
    finally:
        shutil.rmtree(files, ignore_errors=True)
        for suffix in ("", "-wal", "-shm", ".inputs", ".roots.json", ".roots.json.lock"):
            Path(f"{folder / 'resume.sqlite'}{suffix}").unlink(missing_ok=True)
    return rows


# -- 5: crash exploration ----------------------------------------------------------

def bare_forks(count: int) -> float:
    """Forks/s of this (already warm) process: fork, child exits at once, wait."""
    start = time.perf_counter()
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    return rate(count, time.perf_counter() - start)


# 5: crash exploration and drills live in crash_drills.py


# -- 6: ledger overhead on real work -------------------------------------------------

def real_batch(cfg, folder: Path) -> list[Row]:
    from batches import batch_seconds

    from toolkit.documents import make_corpus
    from toolkit.ledger import open_ledger
    from toolkit.provider import FakeProvider

    healthy, poison = cfg.batch_docs
    inputs = make_corpus(folder / "corpus", docs=healthy, poison=poison, seed=0)
    count = [0]

    def arm(make_ledger):
        def go():
            count[0] += 1
            work = folder / f"batch-{count[0]}"
            provider = FakeProvider(work / "provider.sqlite", work / "provider")
            try:
                seconds, counts = batch_seconds(make_ledger(work), provider, work / "out", inputs)
            finally:
                provider.close()
                shutil.rmtree(work, ignore_errors=True)
            assert counts["done"] == healthy, counts
            return seconds
        return go

    log(f"6 the {len(inputs)}-document batch: SQLite ledger vs in-memory ledger")
    r = interleave(cfg.heavy_reps, {
        "memory": arm(lambda work: w.MemoryLedger()),
        "durable": arm(lambda work: open_ledger(work / "ledger.sqlite")),
        "fast": arm(lambda work: open_ledger(work / "ledger.sqlite", durable=False)),
    })
    shutil.rmtree(folder / "corpus", ignore_errors=True)
    overhead = ratio(r["durable"], r["memory"])
    return [Row("6", f"{len(inputs)}-document batch, in-memory ledger (real PDF work)",
                Figure(r["memory"], "s")),
            Row("6", "same batch, SQLite ledger durable=True (default)", Figure(r["durable"], "s")),
            Row("6", "  ratio durable=True / in-memory", overhead, *check(overhead, "<=", 1.10)),
            Row("6", "same batch, SQLite ledger durable=False", Figure(r["fast"], "s")),
            Row("6", "  ratio durable=False / in-memory", ratio(r["fast"], r["memory"]))]


# -- 7: peak memory of a large run -----------------------------------------------------

def big_run(cfg, folder: Path) -> list[Row]:
    """Peak memory above start of a run of ``cfg.run_items`` and ``cfg.run_big`` items."""
    from batches import tiny_pdfs, tmpfs

    rows = []
    for n in (cfg.run_items, cfg.run_big):
        files = tmpfs(folder, 3 * n) / f"resume-toolkit-run-{os.getpid()}"
        medium = "tmpfs" if str(files).startswith("/dev/shm") else "disk"
        log(f"7 peak memory of a {n:,}-item run (stub provider, a fresh process per sample)")
        try:
            tiny_pdfs(files / "inputs", n)
            results = []
            for _ in range(cfg.huge_reps if n == cfg.run_items else 1):
                shutil.rmtree(files / "out", ignore_errors=True)
                for stale in ("ledger.sqlite", "ledger.sqlite-wal", "ledger.sqlite-shm"):
                    (files / stale).unlink(missing_ok=True)
                result = in_child("run", files)
                assert result["done"] == n, result
                results.append(result)
        finally:
            shutil.rmtree(files, ignore_errors=True)
        above = Figure([x["peak_mb"] - x["base_mb"] for x in results], "MB")
        rows += [Row("7", f"peak RSS, {n:,}-item run (safe runner, SQLite ledger, instant "
                          "provider)", Figure([x["peak_mb"] for x in results], "MB")),
                 Row("7", f"  n={n:,}: of which the run (peak - RSS before the run)", above,
                     *check(above, "<=", 150)),
                 Row("7", f"  time of that run (files on {medium})",
                     Figure([x["seconds"] for x in results], "s"))]
    return rows
