"""The toolkit SQLite ledger's events, folded in one lean pass; only doubtful keys replayed.

One ``SELECT`` of the events in seq order, fetched in batches, SQLite naming each row's
(op, from, to) by its vocabulary code (``CODE``: a ``CASE`` over the words, compared as
bytes, so a code is exactly ``CODES.get`` of the row's values) and handing an empty
detail as NULL. No Python statement runs per row: per batch, C loops (``map``, sets of
types per column) turn the rows into three numbers each (the code, the failure its detail
sets, whether a column holds a type the replay refuses), the written details decoded in
one call by the replay's own reader (``many``); then numpy orders the rows by key (a
stable sort: a key's rows stay in seq order) and checks every key's chain at once
(``_verdicts``). A key all of whose events the replay would apply without a word folds to
the ``to`` of its last event and its add's digest; the other keys (an illegal move, an
event before its add, a damaged row, a move whose verdict needs more than the failure)
are read again in full and replayed by ``history.History`` itself, so every finding keeps
its exact words.

Measured at 1,000,000 events (248,225 keys; in-process CPU, a fresh process per sample,
interleaved with a bare ``SELECT * FROM events`` fetchall, on a machine loaded by others):
the whole SQLite audit took 7.9-8.8 s with the earlier row loop (one memo lookup of the
verdict per row), 5.9-6.8 s with this pass, against 1.9-2.5 s for the SELECT (ratio 3.5-4.2x
before, 2.7-3.2x now). What stays is what the rows cost as Python objects (the fetch is
about the SELECT itself) and memory-bound lookups by key (each a cache miss or two: the
items table's rows are matched to the fold with one lookup each, ``Folded``). Not done in
SQL: the chain check (``LAG(to) OVER (PARTITION BY key ORDER BY seq)`` sorts every row, no
index on key, about 1.0 s), the column types (``typeof`` of six columns per row cost more
in SQLite's VM, about 0.5 s, than sets of types over the fetched values) and the details
(SQLite reads JSON otherwise than the replay: a duplicate name's first value, NaN refused).

The policy stays in ``transitions.why_illegal``: ``QUIET_MOVES`` is derived by asking it,
as ``history.PLAIN_MOVES`` is, and every other move is judged by calling it (once per
distinct (move, failure before, failure after)).
"""

import collections.abc
import itertools
import json
import operator
import sqlite3

from toolkit.forensics.history import CODES, DETAIL_FIELDS, PLAIN_MOVES, VOCABULARY
from toolkit.forensics.model import STATES
from toolkit.ledger.transitions import DONE_WITHOUT_ARTIFACT, PERMANENT, TRANSIENT, why_illegal

assert "input_digest" not in DETAIL_FIELDS  # only an add sets it: the fold below relies on it
assert "failure" in DETAIL_FIELDS  # any event's detail may set it: the fold tracks it


class _Unread:
    """The item's failure before a move, which ``why_illegal`` must not look at."""

    def _refuse(self, *args):
        raise LookupError("failure")

    __eq__ = __ne__ = __bool__ = __str__ = __format__ = __hash__ = _refuse


class _World:
    """An item after the move whose every field holds ``value``."""

    def __init__(self, value):
        self.value = value

    def get(self, name):
        return self.value


# The values an item's failure and artifact fields are probed with: absent, the words
# the policy knows, and things of other types.
PROBES = (None, TRANSIENT, PERMANENT, "", "x", 0, -1, 1.5, "0" * 64, [], {}, object())


def _quiet_moves() -> frozenset:
    """The move codes the replay never reports, whatever the item held before or holds
    after: ``why_illegal`` never reads the failure before, and in every probed world
    answers None or ``DONE_WITHOUT_ARTIFACT`` (which the replay leaves to the
    done_without_artifact check of the item row). The plain moves, plus the moves into
    done."""
    quiet = set()
    for code, (op, frm, to) in enumerate(VOCABULARY):
        if op != "move" or frm is None:
            continue
        if code in PLAIN_MOVES:
            quiet.add(code)
            continue
        try:
            verdicts = {why_illegal(frm, to, _Unread(), _World(value)) for value in PROBES}
        except LookupError:
            continue
        if verdicts <= {None, DONE_WITHOUT_ARTIFACT}:
            quiet.add(code)
    return frozenset(quiet)


class _Failure:
    """The item after a judged move, as ``why_illegal`` reads it: its failure alone. Any
    other field asked for (the artifact's) is a verdict the fold cannot give: the key is
    replayed."""

    __slots__ = ("failure",)

    def __init__(self, failure):
        self.failure = failure

    def get(self, name):
        if name != "failure":
            raise LookupError(name)
        return self.failure


QUIET_MOVES = _quiet_moves()
SLOW = object()  # the fold state of a key that is replayed
class _Absent:
    """The type of ``ABSENT`` alone (a failure of type ``object`` is ``BROKEN``'s)."""


ABSENT = _Absent()  # the failure of a detail that sets none
_PLAIN = type(None), str  # the failure values the fold judges (others: replayed)
COLUMNS = ("seq", "ts", "op", "key", "frm", "to", "attempt", "worker", "token")
BATCH = 1 << 16  # rows per fetch: the row tuples of one batch at a time, then columns


def _code_sql() -> str:
    """SQL for a row's vocabulary code, ``CODES[(op, frm, to)]``, or -1 when a word is none
    of the vocabulary's or no text (a BLOB, a number: NULL through the sum). Compared as
    bytes (``COLLATE BINARY``: a column declared NOCASE would match "ADD"); a NULL from
    only as None."""
    ops, frms, tos = sorted({op for op, _, _ in VOCABULARY}), (None, *STATES), STATES
    assert all(code == (ops.index(op) * len(frms) + frms.index(frm)) * len(tos) + tos.index(to)
               for code, (op, frm, to) in enumerate(VOCABULARY))  # VOCABULARY's own order

    def case(column, words, shift=0):
        whens = " ".join(f"WHEN '{word}' THEN {index + shift}" for index, word in enumerate(words))
        return f"CASE {column} COLLATE BINARY {whens} END"

    return (f"coalesce((({case('op', ops)}) * {len(frms)} + (CASE WHEN frm IS NULL THEN 0 "
            f"ELSE {case('frm', STATES, 1)} END)) * {len(tos)} + {case(chr(34) + 'to' + chr(34), tos)}, -1)")


CODE = _code_sql()
SELECT = (f"SELECT seq, ts, key, attempt, worker, token, {CODE}, "
          "CASE WHEN detail = '{}' COLLATE BINARY THEN NULL ELSE detail END "
          "FROM events ORDER BY seq")
# The types History.check accepts for the columns fetched as they are (what sqlite3 hands
# out: int, float, str, bytes, None); op, from and to are the code's, the detail is judged
# by ``decode``, the replay's own reader.
TYPES = ({int}, {int, float}, {str}, {int}, {str, type(None)}, {int})  # seq ... token
_CHECKED = tuple(enumerate(map(frozenset, TYPES)))


def usable(db) -> bool:
    """True when ``seq`` is the events table's rowid (an integer, unique): the replayed
    rows are then fetched by seq. Anything else (a PostgreSQL ledger's connection too: its
    SQL has no pragmas) is read the reference way."""
    if not isinstance(db, sqlite3.Connection):
        return False
    pk = db.execute("SELECT name, upper(type) FROM pragma_table_info('events') "
                    "WHERE pk > 0").fetchall()
    if pk != [("seq", "INTEGER")]:
        return False
    try:
        db.execute("SELECT rowid FROM events LIMIT 0")
    except sqlite3.OperationalError:  # a WITHOUT ROWID table
        return False
    return True


def _typed(batch: tuple):
    """Per row, whether every column holds a type the replay accepts: None when every row
    does (a set of types per column: C loops), else a bool per row."""
    if all(set(map(type, batch[index])) <= kinds for index, kinds in _CHECKED):
        return None
    return [all(type(batch[index][row]) in kinds for index, kinds in _CHECKED)
            for row in range(len(batch[0]))]


# The fold's numbers: a state's index in STATES (``NO_STATE``: a from of None); per
# vocabulary code, its op's kind and its from and to.
ADD, MOVE, OTHER = 0, 1, 2
NO_STATE = len(STATES)
_OP_KIND = [ADD if op == "add" else MOVE if op == "move" else OTHER for op, _, _ in VOCABULARY]
_FROM = [NO_STATE if frm is None else STATES.index(frm) for _, frm, _ in VOCABULARY]
_TO = [STATES.index(to) for _, _, to in VOCABULARY]
FIRST = CODES[("add", None, "pending")]  # the one first event a key folds from
_PASSED = sorted(PLAIN_MOVES | QUIET_MOVES)  # the moves no failure can make illegal
_NAMES = [*STATES, SLOW]  # a key's fold: the state it ends in, or SLOW
# A detail read broken (not JSON, not an object): a failure no fold judges, so its key is
# replayed, where the replay's reader says what is wrong with it.
BROKEN = {"failure": object()}
BAD, UNSET, NO_FAILURE = -1, 0, 1  # failure ids: a value the fold does not judge; none set;
# null; then each text the details set, in order of first sight (``values``)


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
        return [BROKEN if problem is not None or obj.__class__ is not dict else obj
                for obj, problem in map(decode, texts)]

    return many


def scan(db, decode, many=None):
    """One pass over the events → (columns {name: values}, state {key: the state its events
    fold to, or SLOW} (a ``Folded``), each key's add digest or None in order of first
    rows). ``decode`` reads a detail as ``parse_json_column`` does (the replay's reader),
    ``many`` (optional) a list of them at once: a dict each, ``BROKEN`` where ``decode``
    finds a problem.

    ``state`` holds every key of a row, ``SLOW`` for each key with a row the replay
    must see; the columns hold every row in seq order, the slow keys' too (the caller
    drops the rows the replay does not apply)."""
    import numpy as np

    many = many or one_by_one(decode)
    fetched = ("seq", "ts", "key", "attempt", "worker", "token", "code")
    columns = {name: [] for name in fetched}
    extends = [columns[name].extend for name in fetched]
    off, failures, written_at, digests = [], [], [], []
    order: dict = {}  # key -> the index of its first row, in order of first rows
    ids = {ABSENT: UNSET, None: NO_FAILURE}  # failure -> id; the texts from 2 on
    get, repeat, compress, is_not = dict.get, itertools.repeat, itertools.compress, \
        operator.is_not
    cursor, at = db.execute(SELECT), 0
    while rows := cursor.fetchmany(BATCH):
        batch = tuple(zip(*rows))
        del rows
        keys, texts, size = batch[2], batch[7], len(batch[0])
        for extend, values in zip(extends, batch):
            extend(values)
        typed = _typed(batch)
        off.append(np.zeros(size, bool) if typed is None else ~np.array(typed, bool))
        written = list(map(is_not, texts, repeat(None)))  # NULL: "{}", which sets nothing
        details = many(list(compress(texts, written)))
        where = np.flatnonzero(np.array(written, bool))
        fid = np.zeros(size, np.int32)  # UNSET
        fid[where] = _failure_ids(list(map(get, details, repeat("failure"), repeat(ABSENT))),
                                  ids)
        failures.append(fid)
        written_at.append(where + at)
        digests += map(get, details, repeat("digest"))
        at += size
    keys = columns["key"]
    # each row's key named by the index of the key's first row (setdefault keeps it)
    first = np.fromiter(map(order.setdefault, keys, itertools.count()), np.int64, len(keys))
    code = np.array(columns.pop("code"), np.int32)
    state = _verdicts(np, first, code, _concat(np, failures, np.int32), _concat(np, off, bool),
                      list(ids))
    # each key's add is its first row (a key whose first row is anything else is SLOW):
    # its digest, when its detail was written and sets a text
    written_at = _concat(np, written_at, np.int64)
    starts = np.fromiter(order.values(), np.int64, len(order))
    slot = np.minimum(np.searchsorted(written_at, starts), max(len(written_at) - 1, 0))
    has = (written_at[slot] == starts) if len(written_at) else np.zeros(len(starts), bool)
    found = [None] * len(starts)
    for at, digest in zip(np.flatnonzero(has).tolist(),
                          map(digests.__getitem__, slot[has].tolist())):
        if digest.__class__ is str:
            found[at] = digest
    for part, name in enumerate(("op", "frm", "to")):
        columns[name] = Words(code, part)
    return {name: columns[name] for name in COLUMNS}, Folded(order, starts, state, found), found


class Folded(collections.abc.Mapping):
    """``scan``'s state, {key: the state its events fold to, or SLOW}, as the scan holds it:
    {key: its first row} and, per key in order of first rows, its state and its add's
    digest. ``lookup`` answers a list of keys with one dict lookup each (a dict of a
    quarter-million 64-character keys costs a cache miss or two per lookup)."""

    def __init__(self, first: dict, starts, states: list, digests: list):
        self.first, self.starts, self.states, self.digests = first, starts, states, digests

    def __getitem__(self, key):
        return self.states[self._index(self.first[key])]

    def _index(self, row: int) -> int:
        return int(self.starts.searchsorted(row))

    def __iter__(self):
        return iter(self.first)

    def __len__(self):
        return len(self.first)

    def digest_map(self) -> dict:
        """{key: its add's digest} of the keys that have one."""
        return {key: digest for key, digest in zip(self.first, self.digests)
                if digest is not None}

    def lookup(self, keys) -> tuple[list, list]:
        """(state or SLOW, digest) of each of ``keys``, None and None for a key with no
        event."""
        import numpy as np

        rows = np.fromiter(map(self.first.get, keys, itertools.repeat(-1)), np.int64, len(keys))
        index = np.where(rows < 0, len(self.states), self.starts.searchsorted(rows)).tolist()
        states, digests = [*self.states, None], [*self.digests, None]
        return list(map(states.__getitem__, index)), list(map(digests.__getitem__, index))


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


def _verdicts(np, first, code, fid, off, values) -> list:
    """Per key (in order of its first row, ``first`` naming it per row), the state its rows
    fold to, or SLOW.

    A key folds when its first row is an add (None -> pending), each later row is no add
    and starts from the state the row before it left (a claim or release keeps it), every
    row has the replay's types, a detail that is an object and a failure of None or text,
    and every move the policy judges gets None or ``DONE_WITHOUT_ARTIFACT`` from
    ``why_illegal`` (asked once per distinct move, failure before and failure after)."""
    rows = len(first)
    if not rows:
        return []
    order = np.argsort(first, kind="stable")  # by key, each key's rows in seq order
    key, code, fid, bad = first[order], code[order], fid[order], off[order]
    bad |= (code < 0) | (fid == BAD)
    code = np.where(code < 0, FIRST, code)  # (off already) any code, to index the tables
    kind, frm, to = (np.array(table, np.int8)[code] for table in (_OP_KIND, _FROM, _TO))
    starts = np.ones(rows, bool)
    starts[1:] = key[1:] != key[:-1]
    bad |= starts & (code != FIRST)  # an event before its add
    # a second add; a row that does not start where the one before it left the key
    later = ~starts
    bad[1:] |= later[1:] & ((kind[1:] == ADD) | (frm[1:] != to[:-1]))
    bad |= (kind == OTHER) & (to != frm)  # a claim or release that changes the state
    # the failure the key holds after each row: the last one a detail set, the add's
    # None whatever its detail says (forward-filled; each key starts at its add)
    fid = np.where(starts, NO_FAILURE, fid)
    held = np.where(fid != UNSET, np.arange(rows), 0)
    np.maximum.accumulate(held, out=held)
    held = fid[held]
    judged = np.flatnonzero(later & (kind == MOVE) & ~np.isin(code, _PASSED))
    if len(judged):
        width = len(values) + 1  # ids + 1: BAD is 0
        cases = (code[judged].astype(np.int64) * width + held[judged - 1] + 1) * width \
            + held[judged] + 1
        distinct, index = np.unique(cases, return_inverse=True)
        refused = np.array([_refused(case, width, values) for case in distinct.tolist()],
                           bool)
        bad[judged] |= refused[index]
    keys = np.flatnonzero(starts)  # the sorted rows where each key begins
    slow = np.logical_or.reduceat(bad, keys)
    ends = np.append(keys[1:], rows) - 1
    return list(map(_NAMES.__getitem__, np.where(slow, len(STATES), to[ends]).tolist()))


def _refused(case: int, width: int, values: list) -> bool:
    """Whether the replay reports a move: its code and the failure ids before and after
    (each plus one) packed in ``case``."""
    case, after = divmod(case, width)
    code, before = divmod(case, width)
    if before == 0 or after == 0:  # BAD: the key is replayed anyway
        return True
    _, frm, to = VOCABULARY[code]
    try:
        why = why_illegal(frm, to, values[before - 1], _Failure(values[after - 1]))
    except LookupError:
        return True
    return why is not None and why != DONE_WITHOUT_ARTIFACT


def slow_rows(db, columns, state, fields):
    """Every event row (``fields``) of the slow keys, in seq order."""
    pairs = zip(state.first, state.states) if isinstance(state, Folded) else state.items()
    slow = {key for key, last in pairs if last is SLOW}
    if not slow:
        return []
    seqs = [seq for seq, key in zip(columns["seq"], columns["key"]) if key in slow]
    quoted = ", ".join(f'"{name}"' for name in fields)
    return db.execute(f"SELECT {quoted} FROM events WHERE seq IN "
                      "(SELECT value FROM json_each(?)) ORDER BY seq", (json.dumps(seqs),))


def without(columns: dict, dropped: set) -> dict:
    """The columns without the rows whose seq is in ``dropped``, plus ``line`` (None)."""
    if dropped:
        keep = [seq not in dropped for seq in columns["seq"]]
        columns = {name: list(itertools.compress(values, keep))
                   for name, values in columns.items()}
    columns["line"] = [None] * len(columns["seq"])
    return columns
