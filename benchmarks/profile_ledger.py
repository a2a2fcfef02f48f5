"""Where does a ledger transition spend its time? (a helper for section 1 of run.py)

    python benchmarks/profile_ledger.py [--backend sqlite|jsonl] [--durable] [--group-commit]
                                        [--items 500]

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
    print(f"  {'subject':<24} {'CPU':>8} {'wall':>8}")
    for name, (cpu, wall) in figures.items():
        print(f"  {name:<24} {cpu:8.1f} {wall:8.1f}")
    floor = figures.get("same SQL, no Python", figures.get("bare append loop"))
    print(f"  {'ledger CPU - baseline':<24} {figures['ledger'][0] - floor[0]:8.1f}"
          "   (the Python a transition pays beyond its baseline)")
    if "bare append loop" in figures and durable:
        print(f"  {'bare loop / ledger, wall':<24} "
              f"{figures['bare append loop'][1] / figures['ledger'][1]:8.2f}x   (target >= 0.9x)")
    print(f"  {'calls/transition':<24} {calls_per_transition(backend, durable):8.1f}"
          "   (cProfile: Python functions and the C ones they call)\n")


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
    args = parser.parse_args(argv)
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
