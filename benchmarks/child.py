"""One measured task in a fresh interpreter: prints one JSON object on stdout.

``python benchmarks/child.py audit PATH`` | ``pandas PATH`` | ``run FOLDER``

``seconds`` times the task alone (imports and setup excluded); ``peak_mb`` is
the process's peak resident set (``VmHWM``, imports included) and
``base_mb`` its resident set just before the task, after the imports.
"""

import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo, for ``toolkit``


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def _peak_mb() -> float:
    """This process's own peak resident set: ``VmHWM``, the high-water mark of its memory
    map, which ``exec`` starts afresh. Not ``ru_maxrss``: Linux carries the exec'ing
    process's old map into it, so a child of a 700 MB benchmark parent read 700 MB
    whatever it did (the 2026-12-02 run of section 7 after section 4's audits)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # no /proc: KiB


def main(argv) -> dict:
    task, target = argv[0], Path(argv[1])
    import pandas as pd

    if task == "audit":
        from toolkit.forensics import audit

        def work():
            report = audit(target)
            return {"items": len(report.items)}
    elif task == "pandas":
        def work():
            return {"rows": len(pd.read_json(target, lines=True))}
    elif task == "run":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from batches import InstantProvider, batch_seconds

        from toolkit.ledger import open_ledger

        inputs = sorted((target / "inputs").glob("*.pdf"))

        def work():
            ledger = open_ledger(target / "ledger.sqlite")  # default durability
            seconds, counts = batch_seconds(ledger, InstantProvider(), target / "out", inputs)
            return {"done": counts["done"], "items": len(inputs)}
    else:
        raise SystemExit(f"unknown task {task!r}")
    base = _rss_mb()
    start = time.perf_counter()
    result = work()
    seconds = time.perf_counter() - start
    peak = _peak_mb()
    return {"task": task, "seconds": seconds, "peak_mb": peak, "base_mb": base, **result}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
