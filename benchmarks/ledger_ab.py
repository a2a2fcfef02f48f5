"""Before/after of the ledger's hot path in one run: two source trees, alternating.

    python benchmarks/ledger_ab.py --before /work/main --after . [--reps 6] [--items 100]

Each repetition runs one child process per tree (the order alternating), and each child
measures, in interleaved blocks (``profile_ledger.cpu_pass``), its own ledger against the
bare loops of its own run: the rates of rows 1 and 2 (durable JSONL and SQLite against the
append+fsync loop, the one-INSERT loop and the same SQL without Python) and CPU µs per
transition (``time.process_time``; durable=False: no fsync wait). A ratio is taken within
one child; the table gives the median and min-max over repetitions, per tree.

By default both trees are measured by this tree's benchmarks (the same baselines: a change
of ``toolkit`` alone); ``--own-baselines`` makes each child import ``profile_ledger`` and
``workloads`` from its own tree's ``benchmarks/`` (a change of the baselines themselves).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(items: int, blocks: int, own: bool = False) -> dict:
    import toolkit.ledger  # from PYTHONPATH (the tree measured), before profile_ledger
    # puts its tree on sys.path: the modules imported first are the ones used

    tree = Path(toolkit.ledger.__file__).parents[2]
    sys.path.insert(0, str(tree / "benchmarks" if own else HERE))
    import profile_ledger

    out = {"tree": str(tree)}
    for backend in ("jsonl", "sqlite"):
        for durable in (True, False):
            figures = profile_ledger.cpu_pass(backend, durable, items, blocks)
            for name, (cpu, wall) in figures.items():
                out[f"{backend} durable={durable} {name}"] = {"cpu": cpu, "wall": wall}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="source tree of the old code")
    parser.add_argument("--after", default=str(HERE.parent), help="source tree of the new code")
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--items", type=int, default=100, help="lifecycles per block")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--own-baselines", action="store_true",
                        help="each tree's own benchmarks/ (its bare loops and same-SQL floor)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.items, args.blocks, args.own_baselines)))
        return 0
    trees = {"before": args.before, "after": args.after}
    runs = {name: [] for name in trees}
    for rep in range(args.reps):
        for name in (list(trees) if rep % 2 == 0 else list(trees)[::-1]):
            env = {**os.environ, "PYTHONPATH": str(Path(trees[name]).resolve())}
            result = subprocess.run([sys.executable, __file__, "--before", "-", "--child",
                                     "--items", str(args.items), "--blocks", str(args.blocks)]
                                    + ["--own-baselines"] * args.own_baselines,
                                    env=env, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(result.stdout))
            assert runs[name][-1].pop("tree") == str(Path(trees[name]).resolve()), name
            print(f"rep {rep + 1}/{args.reps} {name} done", file=sys.stderr, flush=True)

    def ratio(run, subject, base, backend):  # rates: the inverse of the times
        return run[f"{backend} durable=True {base}"]["wall"] / \
            run[f"{backend} durable=True {subject}"]["wall"]

    def take(name, kind):
        return lambda run: run[name][kind]

    def beyond(backend, durable, base, kind="cpu"):
        """The ledger's CPU (or off-CPU: wall - CPU) per transition beyond its baseline's."""
        def value(run, name):
            figure = run[f"{backend} durable={durable} {name}"]
            return figure["cpu"] if kind == "cpu" else figure["wall"] - figure["cpu"]
        return lambda run: value(run, "ledger") - value(run, base)

    rows = [
        ("JSONL ledger / bare append+fsync (wall)",
         lambda r: ratio(r, "ledger", "bare append loop", "jsonl"), "x"),
        ("SQLite ledger / same SQL, no Python (wall)",
         lambda r: ratio(r, "ledger", "same SQL, no Python", "sqlite"), "x"),
        ("SQLite ledger / bare one-INSERT loop (wall)",
         lambda r: ratio(r, "ledger", "bare one-INSERT loop", "sqlite"), "x"),
        ("JSONL durable=True CPU/transition", take("jsonl durable=True ledger", "cpu"), "us"),
        ("  bare append+fsync CPU", take("jsonl durable=True bare append loop", "cpu"), "us"),
        ("  bare append+fsync wall", take("jsonl durable=True bare append loop", "wall"), "us"),
        ("JSONL durable=False CPU/transition", take("jsonl durable=False ledger", "cpu"), "us"),
        ("SQLite durable=True CPU/transition", take("sqlite durable=True ledger", "cpu"), "us"),
        ("  same SQL, no Python (FULL) wall",
         take("sqlite durable=True same SQL, no Python", "wall"), "us"),
        ("SQLite durable=False CPU/transition", take("sqlite durable=False ledger", "cpu"), "us"),
        ("  same SQL, no Python (NORMAL) CPU",
         take("sqlite durable=False same SQL, no Python", "cpu"), "us"),
        ("policy alone (in-memory) CPU/transition", take("jsonl durable=False memory", "cpu"),
         "us"),
        # Where the durable gap goes: CPU beyond the baseline's, between fsyncs (durable) and
        # back to back (durable=False: warm caches), and the off-CPU time beyond it (an extra
        # fsync, checkpoint or write would show here).
        ("SQLite CPU beyond same SQL, durable=True", beyond("sqlite", True, "same SQL, no Python"),
         "us"),
        ("  same, durable=False (back to back)", beyond("sqlite", False, "same SQL, no Python"),
         "us"),
        ("  off-CPU beyond same SQL, durable=True",
         beyond("sqlite", True, "same SQL, no Python", "off"), "us"),
        ("JSONL CPU beyond bare append, durable=True", beyond("jsonl", True, "bare append loop"),
         "us"),
        ("  same, durable=False (back to back)", beyond("jsonl", False, "bare append loop"), "us"),
        ("  off-CPU beyond bare append+fsync, durable=True",
         beyond("jsonl", True, "bare append loop", "off"), "us"),
    ]
    print(f"{'measurement':<46} {'before':>24} {'after':>24}")
    for label, take, unit in rows:
        cells = []
        for name in trees:
            values = [take(run) for run in runs[name]]
            cells.append(f"{statistics.median(values):.2f}{unit} "
                         f"({min(values):.2f}-{max(values):.2f})")
        print(f"{label:<46} {cells[0]:>24} {cells[1]:>24}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
