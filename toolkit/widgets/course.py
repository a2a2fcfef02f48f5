"""Where the course's example ledgers are, from wherever the kernel runs.

The audit notebook is also a tool (``papermill ... -p ledger my.sqlite``), run
from the repository root as often as from ``notebooks/``. Its parameters
default to None, and ``audit_target`` fills them with the course's fixture
ledger only when no ledger was given: a user's ledger is never audited
against the fixture's artifacts. Paths are relative to the current folder,
so the outputs read the same on every machine.
"""

import os
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ledgers"


def fixture(name: str) -> str:
    """The course's example ledger (or folder) ``name``, relative to the current folder."""
    return os.path.relpath(FIXTURES / name)


def audit_target(ledger=None, artifacts=None, inputs=None) -> tuple:
    """``(ledger, artifacts, inputs)`` to audit: yours as given (None: the artifacts root the
    ledger recorded, inputs not checked), or with no ledger the fixture with its folders."""
    if ledger is None:
        return fixture("toolkit.jsonl"), fixture("artifacts"), fixture("inputs")
    return str(ledger), artifacts, inputs


def run_batch(paths, work, provider) -> list[tuple]:
    """Notebook 03's rename story: the safe runner over ``paths`` with the ledger and outputs
    in ``work`` (the same ones run after run) and no backoff sleeps; the ledger's items as
    ``(source, key prefix, state)`` afterwards."""
    from toolkit.runner.registry import open_strategy

    runner = open_strategy("safe", Path(work) / "ledger.sqlite", provider, Path(work) / "out",
                           sleep=lambda seconds: None)
    try:
        runner.run(list(paths))
        return [(item.source, item.key[:8], item.state.value) for item in runner.ledger.items()]
    finally:
        runner.close()
