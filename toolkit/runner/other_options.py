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

That check alone is a check-then-create race: two runs started at once on one ledger,
one with the flag, both find no other item, both add theirs, both send (o38 F1). So
each key this run checked keeps the other routing's key (``pipeline.other_routing``),
and ``backs_off`` looks again after the item's intent is durable, before the send: of
two items of one content under both routings that still count, the one whose first
intent has the smaller seq (``Ledger.first_intents``: commit order on every backend)
is sent, the other is recorded as not sent (``unknown -> failed(transient)``, "not
sent") and refused as above. Why no interleaving lets both send: say A's first intent
committed before B's (seq a < b). B looks after its own intent committed, so after A's:
it reads A's item and seq a < b, and backs off (A still counting; if A was cancelled or
found poison meanwhile, nothing of A's is sent any more). A looks after a committed;
B's intent is either not committed yet (A does not see it: no seq) or has seq b > a:
either way A goes on. One of them sends; an intent of the same item later (a retry)
keeps its first seq, so the order never flips while both count.
"""

from toolkit.advice import absolute, toolkit_command
from toolkit.identity import task_key
from toolkit.ledger import PERMANENT, TRANSIENT, State
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
    pipeline.other_routing[key] = other  # looked at again after the intent: ``backs_off``
    found = pipeline.ledger.get_many([key, other])
    item = found.get(other)
    if key in found or item is None or not _counts(item):
        return False  # already ours, never run otherwise, or given up: sent as keyed
    line = _line(entry_name(path), item, routing in options, pipeline.page_by_page_from,
                 getattr(pipeline.ledger, "path", None))
    pipeline.refused_options.setdefault(item.key, line)
    return True


def backs_off(pipeline, item, token: int) -> bool:
    """True when ``item``, whose intent is durable and not yet sent, must not be sent: the
    same content under the other routing is an item that still counts and whose first
    intent came first (see the module's docstring for the order). Then the intent is
    recorded as not sent (fenced by ``token``) and the refusal kept as ``refused`` does."""
    other_key = pipeline.other_routing.get(item.key)
    if other_key is None:
        return False  # not keyed by this run's intake (never routed otherwise)
    ledger = pipeline.ledger
    other = ledger.get(other_key)
    if other is None or not _counts(other):
        return False
    firsts = ledger.first_intents([item.key, other_key])
    if other_key not in firsts or firsts[other_key] > firsts.get(item.key, firsts[other_key]):
        return False  # its intent, if any, is later than ours: it backs off, not us
    line = _line(item.source or item.key, other, item.pages_done is not None,
                 pipeline.page_by_page_from, getattr(ledger, "path", None))
    ledger.move(item.key, S.UNKNOWN, S.FAILED, token=token, worker=pipeline.worker,
                failure=TRANSIENT, reason=f"not sent: {line}", note="not sent")
    pipeline.refused_options.setdefault(other_key, line)
    return True


def _counts(item) -> bool:
    """Whether an item of the same content still counts: not cancelled, not poison."""
    return item.state is not S.CANCELLED and \
        not (item.state is S.FAILED and item.failure == PERMANENT)


def _line(name: str, item, paged_now: bool, threshold, ledger_path) -> str:
    """One line: the input, the other item, the flag difference, the ways on (a cancel as a
    command that pastes: ``advice``; DB stands for the run's provider database)."""
    recorded = "page by page" if not paged_now else "whole"
    now = f"page by page (--page-by-page-from {threshold})" if paged_now else \
        "whole (no --page-by-page-from)" if threshold is None else \
        f"whole (--page-by-page-from {threshold} is above its page count)"  # o38 F4
    again = "the --page-by-page-from it was run with" if not paged_now else \
        "no --page-by-page-from, or a PAGES above its page count"
    ledger = absolute(ledger_path) if ledger_path else "LEDGER"
    cancel = toolkit_command("cancel", "--ledger", ledger, "--provider-db",
                             "DB", "--key", item.key)
    other_way = f"cancel that item to send it so ({cancel}; DB: the run's provider database)" \
        if item.state is not S.DONE else "start another batch (another --ledger, --new-batch)"
    return (f"{name}: its content is recorded {recorded} (item {item.key[:12]}, "
            f"{item.state.value}) and this run would send it {now}: not sent; rerun with "
            f"{again}, or {other_way}")
