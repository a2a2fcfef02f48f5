"""Where does group commit's extra CPU go? (a helper for section 10 of run.py)

    python benchmarks/profile_group.py [--workers 8] [--items 30] [--reps 8]

Section 10 prints "workers' CPU per transition, group commit / ceiling": the
SQLite ledger with group commit against the same workers with durable=False.
This splits the gap by taking one cost away at a time, the same forked workers
and lifecycles as section 10 (``concurrency._drive``), interleaved, medians:

  ceiling    durable=False: no fsync, no flush protocol (SQLite's busy handler);
  queued     the same with group commit's writer queue lent (no fsync);
  protocol   group commit with the fsync stubbed out: the flush protocol's own
             locks, counters and Python, and no process ever waits for a flush;
  waiting    group commit with a 200 µs sleep in place of each fsync: the
             processes block and wake as with a disk, but the kernel writes nothing;
  group      group commit, real fdatasync (section 10's row).

Each row: transitions/s, fsyncs (or stand-ins) per transition, the workers' CPU
per transition (user + system, ``RUSAGE_CHILDREN``) and their voluntary and
involuntary context switches per transition. "waiting - protocol" is what
blocking costs a process that runs again; "group - waiting" is the fsync's own.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import concurrency  # noqa: E402
import workloads  # noqa: E402

from toolkit.ledger.sqlite import SqliteLedger  # noqa: E402

VARIANTS = {  # name -> (ledger options, what replaces the WAL's fsync, None: the fsync)
    "ceiling": ({"durable": False}, None),
    "queued": ({"durable": False, "writer_queue": True}, None),
    "protocol": ({"group_commit": True}, lambda self: None),
    "waiting": ({"group_commit": True}, lambda self: time.sleep(0.0002)),
    "group": ({"group_commit": True}, None),
}
FIELDS = ("ru_utime", "ru_stime", "ru_nvcsw", "ru_nivcsw")


def run(folder: Path, name: str, workers: int, items: int) -> dict:
    """One sample of ``name``: forked workers on a fresh ledger, barrier to last end."""
    options, sync = VARIANTS[name]
    path = folder / f"{name}.sqlite"
    real_sync = SqliteLedger._sync_wal
    if sync is not None:  # set before the fork: the workers inherit it
        SqliteLedger._sync_wal = sync
    try:
        began, ends, before, after = concurrency.forked(str(path), workers, items, options)
    finally:
        SqliteLedger._sync_wal = real_sync
        for suffix in ("", "-wal", "-shm", "-flush"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    count = workers * items * workloads.LIFECYCLE
    spent = {field: (getattr(after, field) - getattr(before, field)) / count for field in FIELDS}
    return {"rate": count / (max(end for end, _ in ends) - began),
            "fsyncs": sum(fsyncs for _, fsyncs in ends) / count,
            "cpu": (spent["ru_utime"] + spent["ru_stime"]) * 1e6,
            "vcsw": spent["ru_nvcsw"], "ivcsw": spent["ru_nivcsw"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--items", type=int, default=30, help="lifecycles per worker")
    parser.add_argument("--reps", type=int, default=8)
    args = parser.parse_args()
    names = list(VARIANTS)
    samples = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as folder:
        for rep in range(args.reps):  # the order rotates, as measure.interleave does
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                samples[name].append(run(Path(folder), name, args.workers, args.items))
    print(f"{args.workers} workers x {args.items} lifecycles, {args.reps} interleaved reps, "
          "medians (per transition)")
    print(f"{'variant':10s} {'trans/s':>8s} {'fsyncs':>7s} {'CPU µs':>7s} {'vol.csw':>8s} "
          f"{'invol.csw':>9s}")
    for name in names:
        med = {key: statistics.median(s[key] for s in samples[name]) for key in samples[name][0]}
        print(f"{name:10s} {med['rate']:8.0f} {med['fsyncs']:7.2f} {med['cpu']:7.1f} "
              f"{med['vcsw']:8.2f} {med['ivcsw']:9.2f}")


if __name__ == "__main__":
    main()
