"""Where does a ledger transition spend its time? (a helper for section 1 of run.py)

    python benchmarks/profile_ledger.py [--backend sqlite|jsonl] [--durable] [--group-commit]
                                        [--items 500] [--cpu-only | --after-sleep]

First, CPU and wall microseconds per transition of the ledger and of the bare
loops that bound it (``workloads``: the one-INSERT loop, the same SQL without
Python, the append(+fsync) loop, the in-memory policy), in interleaved blocks
in this one process: CPU time (``time.process_time``) is what a loaded machine
distorts least, and "ledger CPU - same SQL CPU" is the Python a transition
costs. Then ``--items`` lifecycles (6 transitions each, as the safe runner
does) twice: once with every SQLite statement (or JSONL system call) timed,
giving microseconds per transition by statement and the Python rest (the
timing wrappers' own cost included); once under cProfile, printing the
functions with the most time of their own.

The first pass also prints off-CPU time (wall - CPU): where the ledger and its
baseline wait alike (no extra fsync, checkpoint or write), the gap is CPU.
``--after-sleep`` asks why that CPU is larger with durable=True than without:
the same transaction timed alone back to back, after a 200 µs sleep and after an
fsync of another file (a thread that slept runs its next instructions slower).
"""

import argparse
import collections
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import workloads  # noqa: E402

from toolkit.ledger import open_ledger  # noqa: E402


class TimedDb:
    """Wraps an ``sqlite3.Connection``: time per statement kind (first words)."""

    def __init__(self, db, spent):
        self._db, self._spent = db, spent

    def execute(self, sql, *args):
        words = sql.split()
        kind = " ".join(words[:3] if words[0] == "INSERT" else words[:2] if words[0] in (
            "UPDATE", "BEGIN") else words[:1])
        start = time.perf_counter()
        try:
            return self._db.execute(sql, *args)
        finally:
            self._spent[kind] += time.perf_counter() - start

    def __getattr__(self, name):
        return getattr(self._db, name)


def _timed_os(spent, module):
    """Time os.write / os.fsync / os.fdatasync / os.fstat as a backend module calls them
    (JSONL; SQLite's group commit, which fdatasyncs the WAL itself)."""
    import importlib

    jsonl = importlib.import_module(module)
    real = jsonl.os

    class TimedOs:
        def __getattr__(self, name):
            func = getattr(real, name)
            if name not in ("write", "fsync", "fdatasync", "fstat"):
                return func

            def timed(*args):
                start = time.perf_counter()
                try:
                    return func(*args)
                finally:
                    spent[f"os.{name}"] += time.perf_counter() - start
            return timed

    jsonl.os = TimedOs()
    return lambda: setattr(jsonl, "os", real)


def cpu_pass(backend: str, durable: bool, items: int, blocks: int) -> dict[str, tuple]:
    """name -> (CPU µs, wall µs) per transition, subjects alternating block by block."""
    with tempfile.TemporaryDirectory(prefix="rt-cpu-") as tmp:
        folder = Path(tmp)
        sync = "FULL" if durable else "NORMAL"
        factories = {"ledger": lambda: workloads.LedgerSubject(folder, f".{backend}", durable),
                     "memory": workloads.LedgerSubject.memory}
        if backend == "sqlite":
            factories["bare one-INSERT loop"] = lambda: workloads.BareSqlite(folder, sync)
            factories["same SQL, no Python"] = lambda: workloads.SqlFloor(folder, sync)
        else:
            factories["bare append loop"] = lambda: workloads.BareAppend(folder, fsync=durable)
            if durable:  # beside the baseline, which stays fsync (the ledger's call)
                factories["bare, fdatasync"] = lambda: workloads.BareAppend(
                    folder, sync="fdatasync")
        subjects = {name: make() for name, make in factories.items()}
        cpu, wall = collections.Counter(), collections.Counter()
        try:
            for subject in subjects.values():
                subject.step(1)  # warm-up outside the clocks
            names = list(subjects)
            for block in range(blocks):
                shift = block % len(names)
                for name in names[shift:] + names[:shift]:
                    start = time.process_time()
                    wall[name] += subjects[name].step(items)
                    cpu[name] += time.process_time() - start
        finally:
            for subject in subjects.values():
                subject.close()
    count = blocks * items * workloads.LIFECYCLE
    return {name: (cpu[name] / count * 1e6, wall[name] / count * 1e6) for name in subjects}


def print_cpu(backend: str, durable: bool, items: int, blocks: int) -> None:
    figures = cpu_pass(backend, durable, items, blocks)
    print(f"{backend}, durable={durable}: µs per transition, {blocks} interleaved blocks of "
          f"{items * workloads.LIFECYCLE} transitions each")
    print(f"  {'subject':<24} {'CPU':>8} {'wall':>8} {'off-CPU':>8}")
    for name, (cpu, wall) in figures.items():
        print(f"  {name:<24} {cpu:8.1f} {wall:8.1f} {wall - cpu:8.1f}")
    floor = figures.get("same SQL, no Python", figures.get("bare append loop"))
    ledger = figures["ledger"]
    print(f"  {'ledger - baseline':<24} {ledger[0] - floor[0]:8.1f} {ledger[1] - floor[1]:8.1f} "
          f"{(ledger[1] - ledger[0]) - (floor[1] - floor[0]):8.1f}")
    print("    (CPU: the Python a transition pays beyond its baseline; off-CPU = wall - CPU:\n"
          "     time waiting for the disk or a core -- equal on both sides when the ledger pays\n"
          "     no extra fsync, checkpoint or write: then the whole gap is CPU)")
    if "bare append loop" in figures and durable:
        print(f"  {'bare loop / ledger, wall':<24} "
              f"{figures['bare append loop'][1] / figures['ledger'][1]:8.2f}x   (target >= 0.9x)")
    print(f"  {'calls/transition':<24} {calls_per_transition(backend, durable):8.1f}"
          "   (cProfile: Python functions and the C ones they call)\n")


def after_sleep_pass(backend: str, transactions: int = 1200) -> dict[str, dict[str, float]]:
    """Does a transition cost more CPU right after its thread slept (as each one does after
    its fsync)? Subject -> pause -> median CPU µs (``time.thread_time``) of one transaction,
    timed alone, after: nothing (back to back), ``time.sleep(200 µs)`` (no I/O at all), an
    append+fsync of another file (the sleep a durable transition takes). The subjects run
    without fsync of their own (durable=False, synchronous=NORMAL), so the pause is the
    only sleep; the same work either way."""
    import os
    import statistics

    def pause_fsync():
        os.write(fd, line)
        os.fsync(fd)

    pauses = {"back to back": lambda: None, "after sleep": lambda: time.sleep(0.0002),
              "after fsync": pause_fsync}
    result = {}
    with tempfile.TemporaryDirectory(prefix="rt-sleep-") as tmp:
        folder = Path(tmp)
        fd = os.open(folder / "other.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        line = b"x" * (workloads.EVENT_BYTES - 1) + b"\n"
        factories = {"ledger": lambda: workloads.LedgerSubject(folder, f".{backend}", False),
                     "policy alone (memory)": workloads.LedgerSubject.memory}
        if backend == "sqlite":
            factories["same SQL, no Python"] = lambda: workloads.SqlFloor(folder, "NORMAL")
        try:
            for name, make in factories.items():
                for pause_name, pause in pauses.items():
                    subject = make()
                    try:
                        subject.step(2)
                        spent = []
                        for _ in range(transactions // workloads.LIFECYCLE):
                            for one in _transactions(subject):
                                pause()
                                start = time.thread_time()
                                one()
                                spent.append(time.thread_time() - start)
                    finally:
                        subject.close()
                    result.setdefault(name, {})[pause_name] = statistics.median(spent) * 1e6
        finally:
            os.close(fd)
    return result


def _transactions(subject):
    """One item's lifecycle as ``LIFECYCLE`` calls, each one transaction of ``subject``."""
    if isinstance(subject, workloads.SqlFloor):
        key = workloads.keys(1, f"sleep{subject.count}")[0]
        subject.count += 1
        return [lambda tx=tx: subject.run(tx, key) for tx in subject.transactions]
    ledger, number = subject.ledger, subject.count
    subject.count += 1
    key, worker, box = workloads.keys(1, f"sleep{number}")[0], "bench", {}
    S = workloads.S
    return [
        lambda: ledger.add(key, source="doc.pdf", digest=key),
        lambda: box.update(token=ledger.claim(key, worker, 60.0)),
        lambda: ledger.move(key, S.PENDING, S.UNKNOWN, token=box["token"], worker=worker,
                            note="intent"),
        lambda: ledger.move(key, S.UNKNOWN, S.SUBMITTED, token=box["token"], worker=worker,
                            job_id="job-1"),
        lambda: ledger.move(key, S.SUBMITTED, S.DONE, token=box["token"], worker=worker,
                            job_id="job-1", artifact_path="out/doc.pdf", artifact_size=12345,
                            artifact_sha256=key),
        lambda: ledger.release(key, box["token"], worker),
    ]


def print_after_sleep(backend: str) -> None:
    figures = after_sleep_pass(backend)
    pauses = list(next(iter(figures.values())))
    print(f"{backend}: median CPU µs of one transaction, timed alone (durable=False: the "
          "pause is its only sleep)")
    print(f"  {'subject':<24}" + "".join(f" {name:>13}" for name in pauses))
    for name, row in figures.items():
        print(f"  {name:<24}" + "".join(f" {row[pause]:13.1f}" for pause in pauses))
    print()


def calls_per_transition(backend: str, durable: bool, items: int = 50) -> float:
    """Function calls per transition as cProfile counts them (a figure load cannot move)."""
    with tempfile.TemporaryDirectory(prefix="rt-calls-") as tmp:
        with open_ledger(Path(tmp) / f"ledger.{backend}", durable=durable) as ledger:
            workloads.lifecycle(ledger, workloads.keys(5, "warm"), first=10**6)
            profile = cProfile.Profile()
            profile.enable()
            workloads.lifecycle(ledger, workloads.keys(items, "counted"))
            profile.disable()
    # lifecycle's own f-string and loop are in the count too: they are the caller's
    return pstats.Stats(profile).total_calls / (items * workloads.LIFECYCLE)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "jsonl"), default="sqlite")
    parser.add_argument("--durable", action="store_true", help="durable=True (fsync per commit)")
    parser.add_argument("--group-commit", action="store_true",
                        help="group_commit=True (with --durable: the shared-fsync path)")
    parser.add_argument("--items", type=int, default=500, help="lifecycles per pass")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--blocks", type=int, default=6, help="interleaved blocks (CPU pass)")
    parser.add_argument("--cpu-only", action="store_true", help="only the CPU pass")
    parser.add_argument("--after-sleep", action="store_true",
                        help="only: CPU of one transaction back to back vs after a sleep/fsync")
    args = parser.parse_args(argv)
    if args.after_sleep:
        print_after_sleep(args.backend)
        return 0
    print_cpu(args.backend, args.durable, max(1, args.items // args.blocks), args.blocks)
    if args.cpu_only:
        return 0
    transitions = args.items * workloads.LIFECYCLE
    with tempfile.TemporaryDirectory(prefix="rt-profile-") as tmp:
        path = Path(tmp) / f"ledger.{args.backend}"
        spent = collections.Counter()
        with open_ledger(path, durable=args.durable, group_commit=args.group_commit) as ledger:
            restore = _timed_os(spent, f"toolkit.ledger.{args.backend}")
            if args.backend == "sqlite":
                ledger._db = TimedDb(ledger._db, spent)
            start = time.perf_counter()
            workloads.lifecycle(ledger, workloads.keys(args.items, "timed"))
            total = time.perf_counter() - start
            if args.backend == "sqlite":
                ledger._db = ledger._db._db
            restore()
            print(f"{args.backend}, durable={args.durable}: {transitions:,} transitions, "
                  f"{total / transitions * 1e6:.1f} µs each ({transitions / total:,.0f}/s)")
            for kind, seconds in spent.most_common():
                print(f"  {kind:<22} {seconds / transitions * 1e6:7.1f} µs/transition")
            rest = total - sum(spent.values())
            print(f"  {'Python (the rest)':<22} {rest / transitions * 1e6:7.1f} µs/transition")
            profile = cProfile.Profile()
            profile.enable()
            workloads.lifecycle(ledger, workloads.keys(args.items, "profiled"), first=args.items)
            profile.disable()
        print(f"\ncProfile of another {transitions:,} transitions (profiler overhead included):")
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
