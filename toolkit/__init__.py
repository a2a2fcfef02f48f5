"""resume-toolkit: interruption-safe batch document processing, drilled and audited.

Importing the package is cheap: pandas, matplotlib and PyMuPDF load only in
the functions that need them.
"""

from toolkit.errors import ToolkitError
from toolkit.identity import file_task_key, idem_key, task_key
from toolkit.ledger import Event, Item, State, open_ledger

__all__ = ["ToolkitError", "task_key", "file_task_key", "idem_key", "State", "Item", "Event",
           "open_ledger"]
