"""The toolkit SQLite ledger's events, checked without replaying every one in Python.

SQLite judges each event row's types and detail text (``OK``); one tight pass over
four columns per row then asks a single set lookup (``FINE``) whether the replay
(``history.History``) would have anything to say about it. A key all of whose
events are fine folds to the ``to`` of its last event and its add's digest, with
every event in the history; the other keys (an illegal move, an event before its
add, a damaged row, a move whose verdict depends on the item) are read again in
full and replayed by ``History`` itself, so every finding keeps its exact words.

Why not a window function (``LAG(to) OVER (PARTITION BY key ORDER BY seq)``): the
events table has no index on key, so SQLite sorts every row first, which alone
costs about as much CPU as the bare ``SELECT`` the audit is measured against; a
dict lookup per row in the pass below costs a tenth of it.

The policy stays in ``transitions.why_illegal``: ``QUIET_MOVES`` is derived by
asking it, as ``history.PLAIN_MOVES`` is.
"""

import itertools
import json
import sqlite3

from toolkit.forensics.history import CODES, DETAIL_FIELDS, PLAIN_MOVES, VOCABULARY
from toolkit.forensics.model import STATES
from toolkit.ledger.transitions import DONE_WITHOUT_ARTIFACT, PERMANENT, TRANSIENT, why_illegal

assert "input_digest" not in DETAIL_FIELDS  # only an add sets it: the fold below relies on it


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


def _fine() -> frozenset:
    """(state before, op, from, to) of every event the replay applies without a word:
    the first add of a key, a claim or release that keeps the state, a quiet move."""
    fine = {(None, "add", None, "pending")}
    fine.update((frm, op, frm, frm) for op in ("claim", "release") for frm in STATES)
    fine.update((frm, op, frm, to) for op, frm, to in map(VOCABULARY.__getitem__, _quiet_moves()))
    assert all((op, frm, to) in CODES for _, op, frm, to in fine)
    return frozenset(fine)


QUIET_MOVES = _quiet_moves()
FINE = _fine()

# 1 when json reads the detail as an object, else 0 (the row is then replayed, which says
# why). Errs towards 0: SQLite's JSON is strict where json is lenient (NaN), and what
# json might refuse is kept out by length: at most 1000 characters nest at most 500 deep
# (json's recursion limit is 1000) and hold no number of 4300 digits (int's limit). Text
# sorts below any BLOB (``< x''``), JSON text starting with ``{`` is an object, and
# SQLite's JSON stops at a NUL where json does not. An add's detail comes to Python as
# well, for its digest.
DETAIL_OK = """(detail = '{}' OR (detail < x'' AND detail GLOB '{*' AND length(detail) <= 1000
    AND json_valid(detail) AND instr(detail, char(0)) = 0) OR detail IS NULL OR detail = '')"""
COLUMNS = ("seq", "ts", "op", "key", "frm", "to", "attempt", "worker", "token")
SELECT = (f"SELECT {', '.join(map(json.dumps, COLUMNS))}, {DETAIL_OK}, "
          "CASE WHEN op = 'add' THEN detail END FROM events ORDER BY seq")
BATCH = 1 << 16  # rows per fetch: the row tuples of one batch at a time, then columns
# The types History.check accepts, per column (what sqlite3 hands out: int, float, str,
# bytes, None); detail is judged by DETAIL_OK.
TYPES = {"seq": {int}, "ts": {int, float}, "op": {str}, "key": {str}, "frm": {str, type(None)},
         "to": {str}, "attempt": {int}, "worker": {str, type(None)}, "token": {int}}
_CHECKED = tuple((index, frozenset(TYPES[name])) for index, name in enumerate(COLUMNS))


def usable(db) -> bool:
    """True when ``seq`` is the events table's rowid (an integer, unique): the replayed
    rows are then fetched by seq. Anything else (a PostgreSQL ledger's connection too: its
    SQL has no pragmas nor SQLite's JSON checks) is read the reference way."""
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


SLOW = object()  # the state of a key that is replayed


def _typed(batch: tuple, oks: tuple) -> tuple:
    """``oks`` (DETAIL_OK per row), 0 too where a column holds a type the replay refuses:
    a set of types per column, row by row only for a batch where one is off."""
    if all(set(map(type, batch[index])) <= kinds for index, kinds in _CHECKED):
        return oks
    return tuple(ok and all(type(batch[index][row]) in kinds for index, kinds in _CHECKED)
                 for row, ok in enumerate(oks))


def scan(db, decode):
    """One pass over the events → (columns {name: list}, state {key: to or SLOW},
    digest {key: add's digest}); ``decode`` reads a detail as ``parse_json_column``.

    ``state`` holds every key of a row, ``SLOW`` for each key with a row the replay
    must see; the columns hold every row in seq order, the slow keys' too (the caller
    drops the rows the replay does not apply)."""
    columns = {name: [] for name in COLUMNS}
    extends = [columns[name].extend for name in COLUMNS]
    state: dict = {}
    digests: dict = {}
    get, fine, _str, _type = state.get, FINE, str, type
    cursor = db.execute(SELECT)
    while rows := cursor.fetchmany(BATCH):
        batch = tuple(zip(*rows))
        del rows
        _, _, ops, keys, frms, tos, _, _, _, oks, details = batch
        oks = _typed(batch, oks)
        for key, op, frm, to, ok in zip(keys, ops, frms, tos, oks):
            if ok and (get(key), op, frm, to) in fine:
                state[key] = to
            else:
                state[key] = SLOW
        # an add's detail (the only ones SELECT hands out): its digest; a fine add is its
        # key's first row. compress and filter pick the same rows: those with a true text.
        for key, text in zip(itertools.compress(keys, details), filter(None, details)):
            digest = decode(text)[0].get("digest")
            if _type(digest) is _str:
                digests[key] = digest
        for extend, values in zip(extends, batch):
            extend(values)
    return columns, state, digests


def slow_rows(db, columns, state, fields):
    """Every event row (``fields``) of the slow keys, in seq order."""
    slow = {key for key, last in state.items() if last is SLOW}
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
