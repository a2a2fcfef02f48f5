"""The one registry of strategies and the one loader, for the CLI, drills, workers and explore.

A strategy is named (``safe``, ``blind-retry``, ...) or given as
``module:Class``: any ``toolkit.runner.Pipeline`` subclass of your own.
"""

import importlib
import os
from pathlib import Path

from toolkit.errors import LedgerError, ToolkitError
from toolkit.runner import Runner
from toolkit.runner.naive import (BatchCommit, BlindRetry, IgnoreWriteErrors, NoLease,
                                  OutputExists, RestartLongDocs, RewriteState, StealExpired,
                                  TimeoutAsFailed)
from toolkit.runner.ops import integrity, require_healthy

STRATEGIES = {"safe": Runner, "blind-retry": BlindRetry, "output-exists": OutputExists,
              "batch-commit": BatchCommit, "rewrite-state": RewriteState, "no-lease": NoLease,
              "timeout-as-failed": TimeoutAsFailed, "steal-expired": StealExpired,
              "ignore-write-errors": IgnoreWriteErrors, "restart-long-docs": RestartLongDocs}


def strategy_label(strategy) -> str:
    """How a strategy is shown in a table: its name, or its class's qualified name."""
    if isinstance(strategy, type):
        return strategy.__qualname__
    return strategy


def resolve_strategy(name):
    """The strategy class for a CLI name, a ``module:Name`` reference, or a class.

    Raises:
        ToolkitError: one line, for an unknown name, a module that does not
            import, a missing attribute, or something that is not a pipeline.
    """
    if isinstance(name, type):
        cls, name = name, name.__qualname__
    elif name in STRATEGIES:
        return STRATEGIES[name]
    elif not isinstance(name, str) or ":" not in name:
        raise ToolkitError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)} "
                           "or give module:Class")
    else:
        module_name, _, attribute = name.partition(":")
        module = _import_user_module(module_name, name)
        cls = getattr(module, attribute, None)
        if cls is None:
            raise ToolkitError(f"module {module_name!r} has no {attribute!r}")
    shaped = isinstance(cls, type) and all(callable(getattr(cls, method, None))
                                           for method in ("run", "close", "process"))
    if not shaped:
        raise ToolkitError(f"{name!r} is not a pipeline: it needs run(inputs), process(key) and "
                           "close(); subclass toolkit.runner.Pipeline (or Runner)")
    return cls


def _import_user_module(module_name: str, name: str):
    """Import the user's module; anything it does at import time is one line, not an exit.

    A team's script may run its batch at import (no ``__main__`` guard): its
    prints go to stderr so they never corrupt ``--json`` on stdout, and its
    ``sys.exit()`` (SystemExit) or any exception becomes a ``ToolkitError``.
    """
    import contextlib
    import sys

    try:
        with contextlib.redirect_stdout(sys.stderr):
            return importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - user code fails in one line here
        raise ToolkitError(f"cannot import {module_name!r} for strategy {name!r}: "
                           f"{type(exc).__name__}: {exc}") from exc


def open_run_ledger(name, ledger_path):
    """The ledger strategy ``name`` keeps, opened and judged before a run creates anything
    else (``run`` opens the provider's database only after it); None for rewrite-state,
    which keeps its own ``.json``. Hand it to ``open_strategy`` (or ``close()`` it).

    A refusal leaves the folder as it found it: what the open itself created is removed
    (``_tidy``), and a JSONL ledger with corrupt interior lines or missing seqs is refused
    here, before any write (no header upgrade, no health marker: the file says it already).

    Raises:
        NotReadyError: an earlier run failed closed.
        LedgerError: not a ledger of ours, a newer format, busy in another writer, storage;
            (JSONL) corrupt interior lines or missing seqs: damage a person salvages (run
            ``audit``, then ``ledger --salvage``), which no rerun gets past: exit 2, as
            ``ledger`` and ``review`` answer the same file.
    """
    if resolve_strategy(name) is RewriteState:
        _state_file(ledger_path)
        return None
    require_healthy(ledger_path)
    from toolkit.ledger import canonical_path, open_ledger
    from toolkit.ledger.postgres import postgres_url

    ours = []  # the JSONL lock this open creates (none of a URL, SQLite or a bad name)
    if not postgres_url(ledger_path) and Path(ledger_path).suffix.lower() == ".jsonl":
        base = os.fspath(canonical_path(ledger_path))
        ours = [Path(base + ".lock")] if not os.path.lexists(base + ".lock") else []
    try:
        ledger = open_ledger(ledger_path)
    except LedgerError as exc:
        _tidy(ours, lock=type(exc) is LedgerError)  # refused for what it holds: see _tidy
        raise
    try:
        damage = integrity(ledger)
    except LedgerError:  # an SQLite ledger's pages damaged (exit 2): no work on it
        ledger.close()
        raise
    if damage is not None:
        _tidy(ours, lock=True)  # while we hold the lock, before close: see _tidy
        ledger.close()
        raise LedgerError(damage)
    return ledger


def _state_file(ledger_path):
    """rewrite-state's ``.json`` file, or a one-line ToolkitError."""
    if Path(ledger_path).suffix != ".json":
        raise ToolkitError("rewrite-state keeps its progress in a .json file: "
                           "--ledger STATE.json")
    return ledger_path


def _tidy(ours, lock: bool) -> None:
    """Remove the lock file a refused open created (``ours``), no other.

    A JSONL writer creates ``<ledger>.lock`` before it reads the file (the ``.upgrade`` file
    of a header upgrade cut short is removed by the ledger itself, ``JsonlLedger._rewrite``).
    A lock file must never be unlinked under a live holder, so ``lock`` only when no writer
    can hold it: we hold it ourselves (a corrupt ledger: a concurrent opener was refused as
    busy, a later one makes a new file), or the file was refused for what it holds (not
    ours, a newer version: every writer refuses it). After a storage failure it stays.
    """
    if lock:
        for path in ours:
            path.unlink(missing_ok=True)


def open_strategy(name, ledger_path, provider, out_dir, **options) -> Runner:
    """Open the ledger the strategy keeps and return its runner (``close()`` it).

    ``name``: a CLI name, a ``module:Name`` reference or a ``Pipeline`` class.
    ``ledger_path``: a path or URL, or the ledger ``open_run_ledger`` opened (the runner
    closes it). The ledger's health is checked here, before any pipeline code runs, so a
    pipeline that overrides ``run()`` cannot skip it.

    Raises:
        ToolkitError: a bad strategy, or a ledger that failed closed and was not cleared.
    """
    cls = resolve_strategy(name)
    if options.get("page_by_page_from") is not None and not getattr(cls, "sends_pages", False):
        raise ToolkitError(f"strategy {getattr(cls, 'name', name)!r} does not send long "
                           "documents page by page")
    if cls is RewriteState:
        return RewriteState(_state_file(ledger_path), provider, out_dir, **options)
    from toolkit.ledger import Ledger, open_ledger

    if isinstance(ledger_path, Ledger):  # opened and judged by open_run_ledger
        require_healthy(ledger_path.path)
        return cls(ledger_path, provider, out_dir, **options)
    require_healthy(ledger_path)
    return cls(open_ledger(ledger_path), provider, out_dir, **options)
