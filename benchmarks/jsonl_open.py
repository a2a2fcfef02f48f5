"""What does opening a big JSONL ledger cost: ``ledger PATH`` and ``health``, two trees?

Writes (once, cached under ``--cache``) a toolkit JSONL ledger of ``--lines`` events with
its header (benchmarks/audit_jsonl.py's seeded generator), then runs each command in a
fresh process under ``/usr/bin/time -v`` with ``PYTHONPATH`` set to each tree in turn,
interleaved, ``--repeat`` times, and prints CPU time (user + system) and peak RSS per
tree and command: ``python benchmarks/jsonl_open.py --lines 152000 --trees /work/main .``
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from audit_jsonl import write_ledger  # noqa: E402

HEADER = b'{"format": "resume-toolkit-ledger-jsonl", "version": 1}\n'
COMMANDS = {"ledger": ["ledger", "{path}"], "health": ["health", "--ledger", "{path}"]}


def ledger_file(cache: Path, lines: int, seed: int = 7) -> Path:
    path = cache / f"ledger-{lines}-{seed}.jsonl"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        body = cache / f".body-{lines}-{seed}"
        write_ledger(body, lines, seed)
        with open(path.with_suffix(".tmp"), "wb") as out, open(body, "rb") as handle:
            out.write(HEADER)
            while block := handle.read(1 << 24):
                out.write(block)
        path.with_suffix(".tmp").rename(path)
        body.unlink()
    return path


def measure(tree: str, command: list[str]) -> tuple[float, float, int]:
    """(CPU seconds, peak RSS MB, exit status) of one command in a fresh process."""
    tree = str(Path(tree).resolve())
    done = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-m", "toolkit", *command],
                          env={"PYTHONPATH": tree, "PATH": "/usr/bin:/bin"}, cwd="/",  # -m: the
                          # current folder comes first on sys.path, before PYTHONPATH
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    text = done.stderr
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", text)[1])
    system = float(re.search(r"System time \(seconds\): ([\d.]+)", text)[1])
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)[1]) / 1024
    status = int(re.search(r"Exit status: (\d+)", text)[1])
    return user + system, rss, status


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=152_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/qviews"))
    parser.add_argument("--trees", nargs="+", default=["/work/main", str(HERE.parent)])
    parser.add_argument("--commands", nargs="+", default=list(COMMANDS))
    args = parser.parse_args()
    path = ledger_file(args.cache, args.lines)
    print(f"{path} ({path.stat().st_size / 1e6:.0f} MB, {args.lines} events)")
    results = {}
    for _ in range(args.repeat):  # interleaved: the load of the machine hits every tree
        for name in args.commands:
            for tree in args.trees:
                command = [part.format(path=path) for part in COMMANDS[name]]
                results.setdefault((name, tree), []).append(measure(tree, command))
    for (name, tree), samples in results.items():
        cpu = sorted(sample[0] for sample in samples)
        rss = sorted(sample[1] for sample in samples)
        print(f"{name:7} {tree:24} CPU {cpu[0]:6.2f}-{cpu[-1]:6.2f} s  peak RSS "
              f"{rss[0]:6.0f}-{rss[-1]:6.0f} MB  exit {sorted({s[2] for s in samples})}")


if __name__ == "__main__":
    main()
