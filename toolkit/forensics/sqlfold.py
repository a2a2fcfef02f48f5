"""The toolkit SQLite ledger's events, folded in one lean pass; only doubtful keys replayed.

One ``SELECT`` of the events in seq order, fetched in batches (``sqlevents``: SQLite names
each row's move by its vocabulary code and packs it with attempt and token into one
integer), the later seqs read by a forked child meanwhile on a big ledger (``ahead``,
``sqlparts``). No Python statement runs per row: per batch, C loops (``map``, sets of types
per column) turn the rows into numbers (the code, the key's id, the failure the detail
sets, whether a column holds a type the replay refuses), the written details decoded in
one call by the replay's own reader (``many``: into the two members the fold reads); then numpy
orders the rows by key id (a stable sort: a key's rows stay in seq order) and checks every
key's chain at once (``sqlchains.verdicts``). A key all of whose events the replay would
apply without a word folds to the ``to`` of its last event and its add's digest; the other
keys (an illegal move, an event before its add, a damaged row, a move whose verdict needs
more than the failure) are read again in full and replayed by ``history.History`` itself,
so every finding keeps its exact words.

Keys are numbered by the items rows first (``index``: the caller reads the items table
before the events), so the fold's verdicts line up with the items rows by position: no
lookup by key after the scan, and the keys with events but no item row are the ids past
them (``Folded.unlisted``).

Measured at 1,000,000 events (248,225 keys; benchmarks/audit_jsonl.py's tasks, a fresh
process per sample, 10 rounds interleaved on a machine loaded by others, medians): CPU
5.86 s before this layout (each items row looked up by key, the set difference of the
fold's keys and the items'), 5.28 s with it; wall 7.36 s -> 6.27 s; a bare ``SELECT * FROM
events`` fetchall 2.10 s CPU, 2.60 s wall (ratio 2.8x -> 2.5x). Callgrind, 100,000 events:
3.00 -> 2.85 G instructions (the packed integer: 0.07 G of it), the SELECT 1.38 G. The
scan itself got slower on that benchmark (its key's events are consecutive, so numbering
keys in order of first sight hit the cache; numbered by the items rows, each lookup is a
miss): matching the items rows got faster by more.

What stays is what the rows cost as Python objects: the fetch of the events and items is
about 1.1 times that SELECT (callgrind), each value a sqlite3 call under the connection's
mutex and every row a release of the GIL; and a dict lookup per event row. Not done in
SQL: the chain check (``LAG(to) OVER (PARTITION BY key ORDER BY seq)`` sorts every row, no
index on key, about 1.0 s), the types of seq, ts, key and worker (sets of types over the
fetched values cost less than ``typeof`` in SQLite's VM), the details (SQLite reads JSON
otherwise than the replay: a duplicate name's first value, NaN refused) and the items rows
(``json_group_array`` then one msgspec decode cost more than the rows themselves, and
SQLite 3.40 writes a REAL in 15 digits).
"""

import collections.abc
import itertools
import json
import operator

from toolkit.forensics.history import DETAIL_FIELDS, VOCABULARY
from toolkit.forensics.model import STATES
from toolkit.forensics.sqlchains import QUIET_MOVES, verdicts
from toolkit.forensics.sqlevents import CODE, PACKED, PLAIN, Unpacked, usable
from toolkit.forensics.sqlparts import ABSENT, Ahead, merged, read

__all__ = ["ABSENT", "CODE", "QUIET_MOVES", "SLOW", "Folded", "ahead", "scan", "slow_rows",
           "usable", "without"]

assert "input_digest" not in DETAIL_FIELDS  # only an add sets it: the fold below relies on it
assert "failure" in DETAIL_FIELDS  # any event's detail may set it: the fold tracks it


SLOW = object()  # the fold state of a key that is replayed
COLUMNS = ("seq", "ts", "op", "key", "frm", "to", "attempt", "worker", "token")


# a key's fold by its verdict (an index in STATES, or SLOW_STATE), None: no row of the key
_NAMES = [*STATES, SLOW, None]
# A detail read broken (not JSON, not an object): a failure no fold judges, so its key is
# replayed, where the replay's reader says what is wrong with it.
BROKEN = {"failure": object()}


def one_by_one(decode):
    """``many`` from ``decode`` alone: each text read by itself."""
    def many(texts):
        details = [BROKEN if problem is not None or obj.__class__ is not dict else obj
                   for obj, problem in map(decode, texts)]
        return (list(map(dict.get, details, itertools.repeat("failure"),
                         itertools.repeat(ABSENT))),
                list(map(dict.get, details, itertools.repeat("digest"))))

    return many


def ahead(db, many, numbering):
    """A child process that reads the later events for ``scan`` while this one reads the
    items table (``sqlparts.Ahead``; ``numbering``: how the items keys are numbered), or
    None; call before reading the items rows, and hand it to ``scan`` (which reaps it)."""
    (items,) = db.execute("SELECT count(*) FROM items").fetchone()
    return Ahead.start(db, PACKED, many, items, numbering)


def scan(db, decode, many=None, index=None, later=None):
    """One pass over the events → (columns {name: values}, state {key: the state its events
    fold to, or SLOW} (a ``Folded``), each key's add digest or None by key id). ``decode``
    reads a detail as ``parse_json_column`` does (the replay's reader), ``many`` (optional)
    reads a list of them at once: (their failures, their digests), each what ``decode``'s
    object holds under "failure" (``ABSENT``: none) and "digest" (None: none), and
    ``BROKEN``'s where ``decode`` finds a problem. ``index`` ({key: id}, ids 0 .. n-1,
    filled in here): the keys numbered before (the items rows', in their order:
    ``Folded.numbered``); each other key of a row gets the next id, in order of first rows.
    ``later``: an ``ahead`` reading the events from its split on (reaped here, whatever
    happens).

    ``state`` holds every key of a row, ``SLOW`` for each key with a row the replay
    must see; the columns hold every row in seq order, the slow keys' too (the caller
    drops the rows the replay does not apply)."""
    import numpy as np

    many = many or one_by_one(decode)
    index = {} if index is None else index
    numbered = len(index)
    try:
        try:
            part = _read(np, db, PACKED, many, index, later)
        finally:
            if later is not None:
                later.close()
    except Unpacked:  # an attempt or token WORD cannot hold (damage): each column as it is
        index = dict(itertools.islice(index.items(), numbered))
        part = _read(np, db, PLAIN, many, index, None)
    return _fold(np, part, index, numbered)


def _read(np, db, reader, many, index, later):
    """Every event row as ``reader`` reads them, one ``sqlparts.Part``: those from
    ``later.split`` on as the child read them (if it failed, read here).

    Raises:
        Unpacked: from ``PACKED.numbers``.
    """
    if later is None:
        return read(np, db.execute(reader.query()), reader, many, index)
    numbered = len(index)
    part = read(np, db.execute(reader.query(" WHERE seq < ?"), (later.split,)), reader, many,
                index)
    taken = later.take()
    if taken is None or taken[1] != numbered:  # it failed (or read other items rows than
        # these, which one snapshot never gives): its rows read here, by this numbering
        rest = read(np, db.execute(reader.query(" WHERE seq >= ?"), (later.split,)), reader,
                    many, index)
        return merged(np, part, rest, index, numbered, [])
    rest, _, new = taken
    return merged(np, part, rest, index, numbered, new)


def _fold(np, part, index, numbered):
    """``scan``'s answer from the rows ``part`` holds (every event row, in seq order)."""
    columns, code, key_id = part.columns, part.code, part.key_ids
    keyed, folds, firsts = verdicts(np, key_id, code, part.fids, part.off, part.failures)
    verdict = np.full(len(index), len(_NAMES) - 1, np.int8)  # None: no row of the key
    verdict[keyed] = folds
    # each key's add is its first row (a key whose first row is anything else is SLOW):
    # its digest, when its detail was written and sets a text
    found, add_rows = [None] * len(index), part.add_rows
    if len(add_rows):
        slot = np.minimum(np.searchsorted(add_rows, firsts), len(add_rows) - 1)
        has = add_rows[slot] == firsts
        digests = list(map(part.add_digests.__getitem__, slot[has].tolist()))
        collections.deque(map(found.__setitem__, keyed[has].tolist(), digests), 0)
    for name in ("attempt", "token"):
        if name not in columns:
            columns[name] = part.numbers[name]
    for at, name in enumerate(("op", "frm", "to")):
        columns[name] = Words(code, at)
    if columns["key"] is None:  # (sqlparts.merged) each row's key a text, named by its id
        columns["key"] = Keys(list(index), key_id)
    state = Folded(index, list(map(_NAMES.__getitem__, verdict.tolist())), found, numbered,
                   key_id)
    return {name: columns[name] for name in COLUMNS}, state, found


class Folded(collections.abc.Mapping):
    """``scan``'s state, {key: the state its events fold to, or SLOW}, as the scan holds it:
    ``index`` {key: its id} and, per id, its state (None: no row has the key, not in the
    mapping) and its add's digest. The first ``numbered`` ids are the items rows' keys in
    their order: ``sqlrows.fold_items`` reads their states by position, with no lookup by
    key (a dict of a quarter-million 64-character keys costs a cache miss or two per
    lookup). ``key_ids``: each row's key id, in seq order."""

    def __init__(self, index: dict, states: list, digests: list, numbered: int, key_ids):
        self.index, self.states, self.digests = index, states, digests
        self.numbered, self.key_ids = numbered, key_ids

    def __getitem__(self, key):
        state = self.states[self.index[key]]
        if state is None:
            raise KeyError(key)
        return state

    def __iter__(self):
        return itertools.compress(self.index, map(operator.is_not, self.states,
                                                  itertools.repeat(None)))

    def __len__(self):
        return len(self.states) - self.states.count(None)

    def digest_map(self) -> dict:
        """{key: its add's digest} of the keys that have one."""
        return {key: digest for key, digest in zip(self.index, self.digests)
                if digest is not None}

    def lookup(self, keys) -> tuple[list, list]:
        """(state or SLOW, digest) of each of ``keys``, None and None for a key with no
        event."""
        at = list(map(self.index.get, keys, itertools.repeat(len(self.states))))
        states, digests = [*self.states, None], [*self.digests, None]
        return list(map(states.__getitem__, at)), list(map(digests.__getitem__, at))

    def unlisted(self):
        """(key, state) of each key of a row that is none of the first ``numbered``."""
        return zip(itertools.islice(self.index, self.numbered, None), self.states[self.numbered:])


class Words:
    """The op, from or to column (``part`` 0, 1, 2) of the rows' vocabulary codes: the
    words by iteration, a numpy object array when a frame asks. Code -1 (words none of the
    vocabulary's) is None: such a row is never applied, so ``without`` drops it."""

    def __init__(self, code, part: int):
        self.code, self.part = code, part

    def __len__(self):
        return len(self.code)

    def __iter__(self):
        table = _WORDS[self.part]
        return map(table.__getitem__, self.code.tolist())

    def __array__(self, dtype=None, copy=None):
        import numpy as np

        return np.array(_WORDS[self.part], dtype=object)[self.code]


class Keys:
    """The key column when every row's key is a text: ``names[id]`` for each row's key id
    (no string per row kept); the keys by iteration, a numpy object array when a frame
    asks."""

    def __init__(self, names: list, ids):
        self.names, self.ids = names, ids

    def __len__(self):
        return len(self.ids)

    def __iter__(self):
        return map(self.names.__getitem__, self.ids.tolist())

    def __array__(self, dtype=None, copy=None):
        import numpy as np

        return np.array(self.names, dtype=object)[self.ids]


_WORDS = [[triple[part] for triple in VOCABULARY] + [None] for part in range(3)]  # [-1]: None


def slow_rows(db, columns, state, fields):
    """Every event row (``fields``) of the slow keys, in seq order (``state``: scan's)."""
    import numpy as np

    slow = [at for at, last in enumerate(state.states) if last is SLOW]
    if not slow:
        return []
    rows = np.flatnonzero(np.isin(state.key_ids, slow)).tolist()
    seqs = list(map(columns["seq"].__getitem__, rows))
    quoted = ", ".join(f'"{name}"' for name in fields)
    return db.execute(f"SELECT {quoted} FROM events WHERE seq IN "
                      "(SELECT value FROM json_each(?)) ORDER BY seq", (json.dumps(seqs),))


def without(columns: dict, dropped: set) -> dict:
    """The columns without the rows whose seq is in ``dropped``, plus ``line`` (None)."""
    if dropped:
        import numpy as np

        keep = [seq not in dropped for seq in columns["seq"]]
        kept = np.array(keep, bool)
        columns = {name: values[kept] if isinstance(values, np.ndarray)
                   else list(itertools.compress(values, keep))
                   for name, values in columns.items()}
    columns["line"] = [None] * len(columns["seq"])
    return columns
