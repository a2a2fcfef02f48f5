"""Where the course's example ledgers are, from wherever the kernel runs.

The audit notebook is also a tool (``papermill ... -p ledger my.sqlite``), run
from the repository root as often as from ``notebooks/``. Its parameters
default to None, and ``audit_target`` fills them with the course's fixture
ledger only when no ledger was given: a user's ledger is never audited
against the fixture's artifacts. Paths are relative to the current folder,
so the outputs read the same on every machine.

``audit_tool`` is the notebook's audit call: a bad parameter (a missing or
unreadable ledger, a folder that is not one) stops the run with one line that
names the papermill parameter, never a page of traceback.
"""

import os
import re
from pathlib import Path

from toolkit.errors import ToolkitError

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


class ParameterError(ToolkitError):
    """A papermill parameter the audit cannot use. IPython shows an exception's
    ``_render_traceback_()`` instead of its traceback, so the error output (and papermill's
    message) is this one line."""

    def _render_traceback_(self):
        return [f"ParameterError: {self}"]


# The CLI's flags as the notebook's parameters are called.
_FLAGS = (("--artifacts", "-p artifacts"), ("--inputs", "-p inputs"),
          ("--output-name", "-p output_name"))


def audit_tool(ledger=None, artifacts=None, inputs=None, output_name=None):
    """``forensics.audit`` of ``audit_target(ledger, artifacts, inputs)``; a bad parameter
    raises ``ParameterError``: one line, in the parameters' names, the supported formats by
    name only (``toolkit.forensics.supported()`` describes each)."""
    from toolkit.forensics import audit, supported

    given = ledger is not None
    ledger, artifacts, inputs = audit_target(ledger, artifacts, inputs)
    try:
        return audit(ledger, artifacts=artifacts, inputs=inputs, output_name=output_name)
    except ToolkitError as error:
        names = re.findall(r"(?:: |; )([\w-]+) \(", supported())  # the names, not the prose
        message = str(error).replace(f"; {supported()}", f" (reads: {', '.join(names)})")
        for flag, parameter in _FLAGS:
            message = message.replace(flag, parameter)
        raise ParameterError(f"-p ledger: {message}" if given and message.startswith(
            "cannot audit") else message) from None


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
