"""An input whose content the ledger holds under other request options: refused, not sent.

The options are part of a request's identity (``identity.task_key``), and
``--page-by-page-from`` changes them for long documents (``intake.routed_options``).
A rerun that forgets the flag, or changes it, keys a document it already paid for
under another key: a new request, the whole document executed again, and the old
item left behind as if its input were gone. So before ``Intake`` records a key new
to the ledger, it asks ``refused``: when the same content digest under the other
routing names an item that still counts (not at rest, or done, or parked for
review; not cancelled, not poison), that input is refused with one line naming
the difference and the way on, nothing recorded, nothing sent. ``Pipeline``
keeps the lines by the other item's key (``refused_options``), so that item is
not called a stray whose input is gone, and ``run`` exits 2 (bad input).
"""

from toolkit.advice import toolkit_command
from toolkit.identity import task_key
from toolkit.ledger import PERMANENT, State
from toolkit.runner.inputs import entry_name

S = State


def refused(pipeline, path, digest: str, options: dict, key: str, routing: str) -> bool:
    """True when ``path`` (content ``digest``, about to be keyed ``key`` with ``options``)
    must not be sent: the ledger lacks ``key`` and holds the same content under the
    other value of the ``routing`` option (one ledger read of both keys). The line
    saying so is kept in ``pipeline.refused_options``, by the other item's key."""
    other_options = {name: value for name, value in options.items() if name != routing}
    if routing not in options:
        other_options[routing] = True
    other = task_key(digest, other_options)
    found = pipeline.ledger.get_many([key, other])
    item = found.get(other)
    if key in found or item is None or item.state is S.CANCELLED or \
            (item.state is S.FAILED and item.failure == PERMANENT):
        return False  # already ours, never run otherwise, or given up: sent as keyed
    line = _line(entry_name(path), item, routing in options, pipeline.page_by_page_from,
                 getattr(pipeline.ledger, "path", None))
    pipeline.refused_options.setdefault(item.key, line)
    return True


def _line(name: str, item, paged_now: bool, threshold, ledger_path) -> str:
    """One line: the input, the other item, the flag difference, the ways on (a cancel as a
    command that pastes: ``advice``; DB stands for the run's provider database)."""
    recorded = "page by page" if not paged_now else "whole"
    now = f"page by page (--page-by-page-from {threshold})" if paged_now else \
        "whole (no --page-by-page-from)"
    again = "the --page-by-page-from it was run with" if not paged_now else \
        "no --page-by-page-from, or a PAGES above its page count"
    cancel = toolkit_command("cancel", "--ledger", str(ledger_path or "LEDGER"), "--provider-db",
                             "DB", "--key", item.key)
    other_way = f"cancel that item to send it so ({cancel}; DB: the run's provider database)" \
        if item.state is not S.DONE else "start another batch (another --ledger, --new-batch)"
    return (f"{name}: its content is recorded {recorded} (item {item.key[:12]}, "
            f"{item.state.value}) and this run would send it {now}: not sent; rerun with "
            f"{again}, or {other_way}")
