"""resume-toolkit: interruption-safe batch document processing, drilled and audited.

Importing the package is cheap: pandas, matplotlib and PyMuPDF load only in
the functions that need them.
"""

from toolkit.errors import ToolkitError
from toolkit.identity import file_task_key, idem_key, task_key
from toolkit.ledger import Event, Item, State, open_ledger

# The public API beyond the vocabulary loads on first use (PEP 562): ``from toolkit
# import Runner`` imports the runner then, and nothing heavy before it is needed.
_LAZY = {"Pipeline": "toolkit.runner", "Runner": "toolkit.runner", "RetryPolicy": "toolkit.runner",
         "check": "toolkit.checker", "audit": "toolkit.forensics", "run_drill": "toolkit.drills",
         "DRILLS": "toolkit.drills"}

__all__ = ["ToolkitError", "task_key", "file_task_key", "idem_key", "State", "Item", "Event",
           "open_ledger", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # once loaded, an ordinary attribute
        return value
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
