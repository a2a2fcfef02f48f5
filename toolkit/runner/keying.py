"""Keying a rerun's inputs by what the ledger already holds (``Pipeline.enqueue``).

An input's key is its content digest plus its request options, and the options
are routed by a look at its pages (a scan goes the OCR route): MuPDF opens the
file. Bytes keyed by an earlier run were routed then, and the ledger holds the
key they got: of the keys a digest can have (``keyers``), the one the ledger
holds is theirs. An input whose key names one item at rest (done, parked,
poison) needs nothing else: no MuPDF, no snapshot, no write (``vouched``).
An input whose stat is the one the input index recorded is not even read: its
recorded digest stands for its bytes (``inputindex``, git's index).
Anything else (a new input, two candidate items, an item still in flight) is
keyed in full, from a fresh read: the bytes keyed are the bytes sent.
"""

from toolkit import documents
from toolkit.identity import content_digest, task_keyer
from toolkit.runner.inputindex import now_ns
from toolkit.runner.inputs import Odd, read_stat


def keyers(options: dict) -> list:
    """One ``digest -> key`` function per option set an input can be keyed with."""
    plain, scanned = documents.ocr_routes(options)
    return [task_keyer(route) for route in ((plain,) if scanned == plain else (plain, scanned))]


def vouched(ledger, paths, keyers_, index=None, scan=False) -> list:
    """For each of ``paths``, in order, the item at rest that the ledger keyed its bytes into,
    else None (one ``stat`` of each input the ``index`` vouches for, one read of each other
    input; one ledger query for them all, or with ``scan`` one ordered pass over the whole
    ledger: ``merged``). ``paths`` come in ``inputindex.order``. An item is an Item, or with
    ``scan`` a ``Light`` row: the fields the skip decision reads, no Item built.

    A list aligned with ``paths``, not a dict by path: a ``Path``'s hash is Python code, and
    a rerun of n inputs would pay it 3n times."""
    found, candidates = [None] * len(paths), []
    for at, path in enumerate(paths):
        digest = index.digest(path) if index is not None else None
        if digest is None:
            started = now_ns()  # before the read: what ``index.note`` may vouch for
            try:
                data, info = read_stat(path)
            except Odd:
                continue  # the full keying quarantines it
            digest = content_digest(data)
            if index is not None:
                index.note(path, info, started, digest)
        candidates.append((at, [keyer(digest) for keyer in keyers_]))
    wanted = [key for _, keys in candidates for key in keys]
    known = merged(ledger, wanted) if scan else ledger.get_many(wanted)
    for at, keys in candidates:
        items = [known[key] for key in keys if key in known]
        if len(items) == 1 and items[0].resting:
            found[at] = items[0]
    return found


def use_scan(ledger, inputs: int) -> bool:
    """The rule: one ordered pass over the ledger when the batch is at least a third of it.

    Measured on SQLite (CPU): a key looked up by ``get_many`` costs about three rows of
    the scan, and an input has one or two candidate keys, so below a third of the ledger
    the look-ups cost less than the pass (a 10-input rerun on 200,000 items stays 20
    look-ups, not a 200,000-row pass). An empty ledger (a first run) has nothing to merge.
    """
    count = getattr(ledger, "item_count", None)
    if count is None or inputs == 0:
        return False
    rows = count()
    return 0 < rows <= SCAN_SHARE * inputs


SCAN_SHARE = 3  # the scan pays when rows <= SCAN_SHARE * inputs (``use_scan``)


def merged(ledger, keys) -> dict:
    """The rows of ``keys`` that exist, by key: one pass over ``ledger.scan()``, each row
    kept when its key is wanted (a hash join: a set look-up per row, in C; no order needed,
    so the scan reads the table as stored, about half the cost of reading it by key)."""
    wanted = set(keys)
    if not wanted:
        return {}
    return {row[0]: row for row in ledger.scan(ordered=False) if row[0] in wanted}
