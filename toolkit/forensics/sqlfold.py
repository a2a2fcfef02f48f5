"""The toolkit SQLite ledger's events, folded in one lean pass; only doubtful keys replayed.

One ``SELECT`` of the events in seq order, fetched in batches (``sqlevents``: SQLite names
each row's move by its vocabulary code and packs it with attempt and token into one
integer). No Python statement runs per row: per batch, C loops (``map``, sets of types per
column) turn the rows into numbers (the code, the key's id, the failure the detail sets,
whether a column holds a type the replay refuses), the written details decoded in one call
by the replay's own reader (``many``: into the two members the fold reads); then numpy
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
from toolkit.forensics.sqlchains import BAD, FIRST, NO_FAILURE, QUIET_MOVES, UNSET, verdicts
from toolkit.forensics.sqlevents import CODE, PACKED, PLAIN, Unpacked, typed, usable

__all__ = ["CODE", "QUIET_MOVES", "SLOW", "Folded", "scan", "slow_rows", "usable", "without"]

assert "input_digest" not in DETAIL_FIELDS  # only an add sets it: the fold below relies on it
assert "failure" in DETAIL_FIELDS  # any event's detail may set it: the fold tracks it


SLOW = object()  # the fold state of a key that is replayed


class _Absent:
    """The type of ``ABSENT`` alone (a failure of type ``object`` is ``BROKEN``'s)."""


ABSENT = _Absent()  # the failure of a detail that sets none
_PLAIN = type(None), str  # the failure values the fold judges (others: replayed)
COLUMNS = ("seq", "ts", "op", "key", "frm", "to", "attempt", "worker", "token")
BATCH = 1 << 16  # rows per fetch: the row tuples of one batch at a time, then columns


# a key's fold by its verdict (an index in STATES, or SLOW_STATE), None: no row of the key
_NAMES = [*STATES, SLOW, None]
# A detail read broken (not JSON, not an object): a failure no fold judges, so its key is
# replayed, where the replay's reader says what is wrong with it.
BROKEN = {"failure": object()}


def _failure_ids(failures: list, ids: dict) -> list:
    """The id of each detail's failure (``ABSENT``: none set) in ``ids``, new texts added;
    ``BAD`` for a value of another type (a number, a list: the replay judges those)."""
    if set(map(type, failures)) <= {str, type(None), _Absent}:  # hashable, and no
        for value in set(failures) - ids.keys():  # 1 == True == 1.0 among them
            ids[value] = len(ids)
        return list(map(ids.__getitem__, failures))
    return [ids.setdefault(value, len(ids)) if value.__class__ in _PLAIN or value is ABSENT
            else BAD for value in failures]


def one_by_one(decode):
    """``many`` from ``decode`` alone: each text read by itself."""
    def many(texts):
        details = [BROKEN if problem is not None or obj.__class__ is not dict else obj
                   for obj, problem in map(decode, texts)]
        return (list(map(dict.get, details, itertools.repeat("failure"),
                         itertools.repeat(ABSENT))),
                list(map(dict.get, details, itertools.repeat("digest"))))

    return many


def scan(db, decode, many=None, index=None):
    """One pass over the events → (columns {name: values}, state {key: the state its events
    fold to, or SLOW} (a ``Folded``), each key's add digest or None by key id). ``decode``
    reads a detail as ``parse_json_column`` does (the replay's reader), ``many`` (optional)
    reads a list of them at once: (their failures, their digests), each what ``decode``'s
    object holds under "failure" (``ABSENT``: none) and "digest" (None: none), and
    ``BROKEN``'s where ``decode`` finds a problem. ``index`` ({key: id}, ids 0 .. n-1,
    filled in here): the keys numbered before (the items rows', in their order:
    ``Folded.numbered``); each other key of a row gets the next id, in order of first rows.

    ``state`` holds every key of a row, ``SLOW`` for each key with a row the replay
    must see; the columns hold every row in seq order, the slow keys' too (the caller
    drops the rows the replay does not apply)."""
    import numpy as np

    many = many or one_by_one(decode)
    index = {} if index is None else index
    numbered = len(index)
    try:
        return _scan(np, db.execute(PACKED.sql), PACKED, many, index, numbered)
    except Unpacked:  # an attempt or token WORD cannot hold (damage): each column as it is
        index = dict(itertools.islice(index.items(), numbered))
        return _scan(np, db.execute(PLAIN.sql), PLAIN, many, index, numbered)


def _scan(np, cursor, reader, many, index, numbered):
    """``scan`` of the rows ``cursor`` hands as ``reader`` (``sqlevents``) reads them.

    Raises:
        Unpacked: from ``PACKED.numbers``.
    """
    columns = {name: [] for name in reader.kept}
    extends = [columns[name].extend for name in reader.kept]
    codes, numbers, off, failures, key_ids = [], [], [], [], []
    add_rows, add_digests = [], []  # each add's row with a detail written, its digest
    ids = {ABSENT: UNSET, None: NO_FAILURE}  # failure -> id; the texts from 2 on
    repeat, compress, is_not = itertools.repeat, itertools.compress, operator.is_not
    number, new = index.get, index.setdefault
    at = 0  # the batch's first row
    while rows := cursor.fetchmany(BATCH):
        batch = tuple(zip(*rows))
        del rows
        keys, texts, size = batch[reader.key], batch[reader.text], len(batch[0])
        code, more = reader.numbers(np, batch)
        codes.append(code)
        numbers.append(more)
        for extend, values in zip(extends, batch):
            extend(values)
        ok = typed(batch, reader.checked)
        off.append(np.zeros(size, bool) if ok is None else ~np.array(ok, bool))
        # each row's key by its id: one dict lookup each in C; a key seen first gets the
        # next id (``len`` is read before ``new`` inserts it)
        key_id = np.fromiter(map(number, keys, repeat(-1)), np.int64, size)
        for row in np.flatnonzero(key_id < 0).tolist():
            key_id[row] = new(keys[row], len(index))
        key_ids.append(key_id)
        written = list(map(is_not, texts, repeat(None)))  # NULL: "{}", which sets nothing
        failure, digest = many(list(compress(texts, written)))
        where = np.flatnonzero(np.array(written, bool))
        fid = np.zeros(size, np.int32)  # UNSET
        fid[where] = _failure_ids(failure, ids)
        failures.append(fid)
        adds = np.flatnonzero(code[where] == FIRST)  # (of the written details)
        add_rows.append(where[adds] + at)
        add_digests += map(digest.__getitem__, adds.tolist())
        at += size
    code, key_id = _concat(np, codes, np.int32), _concat(np, key_ids, np.int64)
    keyed, folds, firsts = verdicts(np, key_id, code, _concat(np, failures, np.int32),
                                    _concat(np, off, bool), list(ids))
    verdict = np.full(len(index), len(_NAMES) - 1, np.int8)  # None: no row of the key
    verdict[keyed] = folds
    # each key's add is its first row (a key whose first row is anything else is SLOW):
    # its digest, when its detail was written and sets a text
    found, add_rows = [None] * len(index), _concat(np, add_rows, np.int64)
    if len(add_rows):
        slot = np.minimum(np.searchsorted(add_rows, firsts), len(add_rows) - 1)
        has = add_rows[slot] == firsts
        digests = [digest if digest.__class__ is str else None
                   for digest in map(add_digests.__getitem__, slot[has].tolist())]
        collections.deque(map(found.__setitem__, keyed[has].tolist(), digests), 0)
    for name in ("attempt", "token"):
        if name not in columns:
            columns[name] = _concat(np, [more[name] for more in numbers], np.int64)
    for part, name in enumerate(("op", "frm", "to")):
        columns[name] = Words(code, part)
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


_WORDS = [[triple[part] for triple in VOCABULARY] + [None] for part in range(3)]  # [-1]: None


def _concat(np, parts, dtype):
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


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
