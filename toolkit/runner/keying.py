"""Keying a rerun's inputs by what the ledger already holds (``Pipeline.enqueue``).

An input's key is its content digest plus its request options, and the options
are routed by a look at its pages (a scan goes the OCR route): MuPDF opens the
file. Bytes keyed by an earlier run were routed then, and the ledger holds the
key they got: of the keys a digest can have (``keyers``), the one the ledger
holds is theirs. An input whose key names one item at rest (done, parked,
poison) needs nothing else: no MuPDF, no snapshot, no write (``vouched``).
An input whose stat is the one the input index recorded is not even read: its
recorded digest stands for its bytes (``inputindex``, git's index), and the key the
index recorded with it under the same keyer (the same fingerprint) for that key.
Anything else (a new input, two candidate items, an item still in flight) is
keyed in full, from a fresh read: the bytes keyed are the bytes sent.
"""

from toolkit import documents
from toolkit.identity import content_digest, task_keyer
from toolkit.ledger import State
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
    ``scan`` a ``Light`` row: the fields the skip decision reads, no Item built. The
    ``index`` was opened with the fingerprint of ``keyers_[0]``: the keys it gives are that
    keyer's.

    A list aligned with ``paths``, not a dict by path: a ``Path``'s hash is Python code, and
    a rerun of n inputs would pay it 3n times. Each step runs over the whole list (the
    index's merge, each route's keys, the join): no call per input the index vouches for."""
    n = len(paths)
    # Each input's digest (None: read it, below), its first route's key (None: key the
    # digest) and its line of the new index, in order.
    digests, keys, lines = index.vouch(paths) if index is not None else \
        ([None] * n, [None] * n, [None] * n)
    unread = [at for at, digest in enumerate(digests) if digest is None] \
        if None in digests else []  # most of a rerun: one pass in C, none in Python
    stats = []  # (at, stat, read start) of each input read: its line, once it has its key
    for at in unread:
        started = now_ns()  # before the read: what ``index.line`` may vouch for
        try:
            data, info = read_stat(paths[at])
        except Odd:
            continue  # no digest: the full keying quarantines it
        digests[at] = content_digest(data)
        stats.append((at, info, started))
    unkeyed = [at for at, key in enumerate(keys) if key is None and digests[at] is not None] \
        if None in keys else []  # most of a rerun: every key recorded
    for at, key in zip(unkeyed, keyers_[0].many([digests[at] for at in unkeyed])):
        keys[at] = key
    if index is not None:
        for at, info, started in stats:
            lines[at] = index.line(paths[at], info, started, digests[at], keys[at])
        index.keep(lines, keys)  # a recorded line (with our key); a new one if settled
    return _joined(ledger, digests, keys, keyers_, scan)


def _joined(ledger, digests, first_keys, keyers_, scan) -> list:
    """For each digest (None: none), the one item at rest among its candidate keys (one per
    route: ``first_keys`` holds the first route's, aligned with ``digests``) that the ledger
    holds, else None: no key, two (the bytes keyed under both routes: the full keying
    decides), or one not at rest.

    With ``scan``, the first route's keys are merged first; the others are computed (one
    SHA-256 per input and route) and merged only when the ledger holds items that no first
    key named (``item_count`` counted after the pass: items are never deleted, so a count
    equal to the matches proves the pass saw no other row, and no other key of any input
    can be there). A rerun of text documents pays one key per input, not two."""
    whole = None not in digests  # most of a rerun: every input has its digest
    present = digests if whole else [digest for digest in digests if digest is not None]
    routes = [first_keys if whole else [key for key in first_keys if key is not None]]
    if scan:
        known = merged(ledger, routes[0])
        if len(keyers_) > 1 and ledger.item_count() > len(known):  # a second pass
            routes += [keyer.many(present) for keyer in keyers_[1:]]
            known.update(merged(ledger, [key for keys in routes[1:] for key in keys]))
    else:
        routes += [keyer.many(present) for keyer in keyers_[1:]]  # identity.TaskKeyer
        known = ledger.get_many([key for keys in routes for key in keys])
    found = [None] * len(digests)
    slots = range(len(digests)) if whole else \
        [at for at, digest in enumerate(digests) if digest is not None]
    if len(routes) == 1:  # one candidate key per input: the item it names, if at rest
        get, done = known.get, State.DONE
        for at, key in zip(slots, routes[0]):  # done: at rest, without ``resting``'s frame
            if (item := get(key)) is not None and (item.state is done or item.resting):
                found[at] = item
        return found
    for at, keys in zip(slots, zip(*routes)):
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
