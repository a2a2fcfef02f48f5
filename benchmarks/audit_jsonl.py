"""How fast does ``audit()`` read a big JSONL ledger, next to ``pandas.read_json``?

Seeded and self-contained: writes a toolkit JSONL ledger of ``--lines`` events
(default 1,000,000) to a temporary folder, then times ``audit(path)`` and
``pandas.read_json(path, lines=True)`` on the same file, median of
``--repeat`` runs each (wall-clock and CPU time), and prints both and their ratio. Not a test: run it by
hand (``python benchmarks/audit_jsonl.py --lines 100000`` for a quick look).
"""

import argparse
import hashlib
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

T0 = 1_700_000_000.0


def lifecycles(rng: random.Random):
    """Endless (steps, fields) stories: mostly done, some retried, failed or stuck."""
    while True:
        roll = rng.random()
        if roll < 0.80:
            yield ["unknown", "submitted", "done"]
        elif roll < 0.90:
            yield ["unknown", "failed", "unknown", "submitted", "done"]
        elif roll < 0.95:
            yield ["unknown", "failed"]
        elif roll < 0.98:
            yield ["unknown"]
        else:
            yield []


def write_ledger(path: Path, lines: int, seed: int) -> int:
    """Write about ``lines`` event lines; return the number of items."""
    rng = random.Random(seed)
    stories = lifecycles(rng)
    seq, items = 0, 0
    with open(path, "w", encoding="utf-8") as handle:
        while seq < lines:
            items += 1
            source = f"doc-{items:07d}.pdf"
            key = hashlib.sha256(f"{seed}:{source}".encode()).hexdigest()
            digest = hashlib.sha256(source.encode()).hexdigest()
            state, attempt = None, 0
            steps = next(stories)
            for to in [None, *steps]:
                if seq >= lines:
                    break
                seq += 1
                op, detail = "move", {}
                if to is None:
                    op, to, detail = "add", "pending", {"source": source, "digest": digest}
                elif to == "unknown" and state in ("pending", "failed"):
                    attempt += 1
                    if state == "failed":
                        detail = {"failure": None, "reason": None}
                elif to == "failed":  # only a transient failure is followed by a retry
                    last = steps.index("failed") == len(steps) - 1
                    failure = rng.choice(("transient", "permanent")) if last else "transient"
                    detail = {"failure": failure, "reason": "HTTP 503"}
                elif to == "done":
                    detail = {"artifact_path": f"out/{source}", "artifact_size": rng.randrange(1 << 20),
                              "artifact_sha256": hashlib.sha256(key.encode()).hexdigest()}
                event = {"seq": seq, "ts": T0 + seq * 0.01, "op": op, "key": key,
                         "from": state, "to": to, "attempt": attempt, "worker": None,
                         "token": 0, "detail": detail}
                handle.write(json.dumps(event, sort_keys=True) + "\n")
                state = to
    return items


def median_seconds(run, repeat: int) -> tuple[float, float]:
    """Median wall-clock and CPU seconds of ``repeat`` runs (CPU time is what a busy,
    shared machine does not inflate)."""
    wall, cpu = [], []
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        run()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000, help="events to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="runs per reader (median)")
    args = parser.parse_args(argv)

    import pandas as pd

    from toolkit.forensics import audit

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.jsonl"
        items = write_ledger(path, args.lines, args.seed)
        size = path.stat().st_size
        print(f"ledger: {args.lines:,} lines, {items:,} items, {size / 1e6:.1f} MB (seed {args.seed})")
        report = audit(path)
        print(f"audit: {len(report.items):,} items, {len(report.events):,} events, "
              f"plan {report.plan}")
        del report  # time each reader with nothing else held in memory
        ours = median_seconds(lambda: audit(path), args.repeat)
        theirs = median_seconds(lambda: pd.read_json(path, lines=True), args.repeat)
    print(f"median of {args.repeat}                      wall s     cpu s")
    print(f"audit()                          {ours[0]:8.2f}  {ours[1]:8.2f}")
    print(f"pandas.read_json(lines=True)     {theirs[0]:8.2f}  {theirs[1]:8.2f}")
    print(f"ratio audit / read_json          {ours[0] / theirs[0]:8.2f}  {ours[1] / theirs[1]:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
