"""How much reliability costs: one command, one table (issue 10).

    python benchmarks/run.py            # the full run (a few minutes on 2 cores)
    python benchmarks/run.py --quick    # tiny sizes: proves it runs (CI smoke test)

Each figure is the median over repetitions with its min–max. Every ratio is
taken within one repetition between two measurements made back to back in
this run (the baselines are never constants from elsewhere); the ledger
rates alternate with their bare loops block by block on the same file system,
so a neighbour's burst of disk traffic hits both sides. Progress goes to
stderr; stdout holds a short header (date, machine, versions, file system)
and the table. ``--only 1,2`` runs some sections.
"""

import argparse
import compileall
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # measure, workloads, sections, batches, audit_jsonl
sys.path.insert(1, str(HERE.parent))  # toolkit, when run from a checkout

import concurrency  # noqa: E402
import crash_drills  # noqa: E402
import measure  # noqa: E402
import ocr_routes  # noqa: E402
import pages  # noqa: E402
import sections  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Config:
    reps: int  # repetitions of the fast figures
    heavy_reps: int  # repetitions of the figures that take seconds each
    huge_reps: int  # repetitions of the 1M-line audit and the 10,000-item run
    blocks: int  # interleaved blocks per repetition (sections 1-2)
    block_items: int  # item lifecycles per block (x6 transitions)
    fast_scale: int  # more items per block for the subjects without fsync
    rewrite_sizes: tuple
    atomic_size: int
    audit_lines: int
    resume_sizes: tuple
    resume_budget: float  # seconds per sample; bigger sizes are projected, not run
    explore_docs: int
    explore_every: int  # explore every k-th durable step only
    forks: int
    batch_docs: tuple  # (healthy, poison)
    run_items: int
    run_big: int  # the second run of section 7 (one sample: minutes at full size)
    long_pages: int  # pages of the long document (section 8; text pages of section 9)
    ocr_pages: int  # scanned pages read by Tesseract (section 9)
    worker_counts: tuple = (1, 2, 4, 8, 16)  # concurrent workers (section 10)
    worker_items: int = 30  # lifecycles per worker (x6 transitions)
    drills: tuple | None = None  # the drills timed in section 5 (None: the whole catalogue)


CONFIGS = {
    "full": Config(reps=5, heavy_reps=3, huge_reps=2, blocks=6, block_items=8, fast_scale=5,
                   rewrite_sizes=(500, 1_000, 2_000), atomic_size=250, audit_lines=1_000_000,
                   resume_sizes=(5_000, 20_000, 200_000), resume_budget=60.0,
                   explore_docs=2, explore_every=1, forks=300, batch_docs=(27, 3),
                   run_items=10_000, run_big=100_000, long_pages=40, ocr_pages=10),
    "quick": Config(reps=2, heavy_reps=2, huge_reps=2, blocks=2, block_items=2, fast_scale=2,
                    rewrite_sizes=(25, 50, 100), atomic_size=25, audit_lines=5_000,
                    resume_sizes=(150, 600), resume_budget=3.0,
                    explore_docs=1, explore_every=4, forks=30, batch_docs=(2, 1),
                    run_items=30, run_big=60, long_pages=8, ocr_pages=2, worker_counts=(1, 8),
                    worker_items=3, drills=crash_drills.QUICK_DRILLS),
}
SECTIONS = ("1", "2", "3", "4", "5", "6", "7", "8", "9", "10")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 repetitions")
    parser.add_argument("--reps", type=int, help="override every repetition count (>= 2)")
    parser.add_argument("--dir", type=Path, help="folder for the files (default: system temp)")
    parser.add_argument("--only", help="comma-separated sections, e.g. 1,2,3")
    parser.add_argument("--rewrite-sizes", help="e.g. 1000,5000,10000 (the issue's sizes)")
    parser.add_argument("--resume-sizes", help="e.g. 20000,200000")
    parser.add_argument("--resume-budget", type=float, help="seconds per resume sample")
    parser.add_argument("--readme", type=Path,
                        help="also write the header and table into this README's benchmark block")
    args = parser.parse_args(argv)

    mode = "quick" if args.quick else "full"
    cfg = CONFIGS[mode]
    if args.reps:
        cfg = dataclasses.replace(cfg, reps=args.reps, heavy_reps=args.reps, huge_reps=args.reps)
    if args.rewrite_sizes:
        cfg = dataclasses.replace(cfg, rewrite_sizes=_sizes(args.rewrite_sizes))
    if args.resume_sizes:
        cfg = dataclasses.replace(cfg, resume_sizes=_sizes(args.resume_sizes))
    if args.resume_budget:
        cfg = dataclasses.replace(cfg, resume_budget=args.resume_budget)
    only = set(args.only.split(",")) if args.only else set(SECTIONS)
    if not only <= set(SECTIONS):
        parser.error(f"--only takes sections among {','.join(SECTIONS)}")

    if args.readme:  # a README without the block fails now, not after a long run
        measure.replace_block(args.readme.read_text(), "")
    # Byte-compile the toolkit first, as pip does for an installed package: the libraries it
    # is measured against (pyarrow, pandas) are, and with PYTHONDONTWRITEBYTECODE set (this
    # machine's default) every fresh child would otherwise compile ~50 modules from source.
    compileall.compile_dir(HERE.parent / "toolkit", quiet=1)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rt-bench-", dir=args.dir) as tmp:
        folder = Path(tmp)
        rows, memory = [], []
        if only & {"1", "2"}:
            rows += [row for row in sections.ledger_rates(cfg, folder) if row.section in only]
        if "3" in only:
            rows += sections.rewrite(cfg, folder)
        if "4" in only or "7" in only:
            audit_rows, memory = sections.audit(cfg, folder)
            rows += audit_rows if "4" in only else []
        if "4" in only:
            rows += sections.resume(cfg, folder)
        if "5" in only:
            rows += crash_drills.explore(cfg)
        if "6" in only:
            rows += sections.real_batch(cfg, folder)
        if "7" in only:
            rows += memory + sections.big_run(cfg, folder)
        if "8" in only:
            rows += pages.long_documents(cfg, folder)
        if "9" in only:
            rows += ocr_routes.document_routes(cfg, folder)
        if "10" in only:
            rows += concurrency.group_commit(cfg, folder)
        reps = f"{cfg.reps}/{cfg.heavy_reps}/{cfg.huge_reps}"
        header = measure.header(folder, mode, reps)
    print("\n".join(header))
    print()
    print(measure.render(rows))
    sections.log("done")
    total = (f"total {time.monotonic() - started:,.0f} s; rates are per second, "
             f"ratios per repetition; 'MISSED' marks a target the median does not meet")
    print(f"\n({total})")
    if args.readme:
        # Written from this run's rows only: the table in README is never edited by hand.
        block = "\n".join(["```", *header, total, "```", "", measure.markdown(rows)])
        args.readme.write_text(measure.replace_block(args.readme.read_text(), block))
    return 0


def _sizes(text: str) -> tuple:
    return tuple(int(part.replace("_", "")) for part in text.split(","))


if __name__ == "__main__":
    raise SystemExit(main())
