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


def vouched(ledger, paths, keyers_, index=None) -> list:
    """For each of ``paths``, in order, the item at rest that the ledger keyed its bytes into,
    else None (one ``stat`` of each input the ``index`` vouches for, one read of each other
    input; one ledger query for them all). ``paths`` come in ``inputindex.order``.

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
    known = ledger.get_many([key for _, keys in candidates for key in keys])
    for at, keys in candidates:
        items = [known[key] for key in keys if key in known]
        if len(items) == 1 and items[0].resting:
            found[at] = items[0]
    return found
