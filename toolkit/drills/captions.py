"""Captions of naive twins: the fault, then what the naive design does there.

A twin inherits its safe drill's input, contract and fault, never its
remedy: "recover by lookup, never resubmit" under a blind retry would tell
the student the opposite of what the run shows.
"""

# What each naive design does at the fault: its twin's caption says this, never the
# safe design's remedy ("recover by lookup") that the twin does not do.
NAIVE_WAYS = {
    "blind-retry": "blind retry: no reply, so submit again",
    "timeout-as-failed": "timeout-as-failed: a timeout is recorded failed, retried under a new key",
    "batch-commit": "batch commit: progress is written every few items, the rest redone",
    "rewrite-state": "rewrite-state: one JSON state file rewritten in place on every item",
    "no-lease": "no lease: each worker takes any pending item",
    "output-exists": "output-exists: a document whose output file exists counts as done",
    "steal-expired": "steal-expired: a worker takes expired leases, the owner never checks its own",
    "ignore-write-errors": "ignore-write-errors: a failed ledger write is ignored, work goes on",
    "restart-long-docs": "restart-long-docs: a long document starts again at page 1",
}


def twin_summary(summary: str, strategy) -> str:
    """The caption of ``summary``'s fault run with ``strategy``: the fault, then what the
    naive design does (the safe remedy after a colon is dropped)."""
    if strategy == "safe" or strategy not in NAIVE_WAYS:
        return summary
    return f"{summary.partition(': ')[0]}; {NAIVE_WAYS[strategy]}"
