"""The toolkit SQLite ledger's events, folded in one lean pass; only doubtful keys replayed.

One ``SELECT`` of the events in seq order, fetched in batches. Per batch, a set of types
per column (C loops) vouches for the columns' types; per row, the detail is read by the
replay's own reader (``decode``: ``{}`` costs a comparison) and the key's fold state
(its ``to`` and its ``failure``) advances by one dict lookup in a memo of verdicts
(``_step``), keyed by (state before, op, from, to, the failure the detail sets). A key
all of whose events the replay would apply without a word folds to the ``to`` of its
last event and its add's digest; the other keys (an illegal move, an event before its
add, a damaged row, a move whose verdict needs more than the failure) are read again in
full and replayed by ``history.History`` itself, so every finding keeps its exact words.

Why not SQL (``json_valid``, ``typeof``, ``LAG(to) OVER (PARTITION BY key ORDER BY
seq)``): measured on a 200,000-event ledger (CPU, interleaved), evaluating such
expressions in SQLite's VM costs about as much as handing Python the values themselves
(the detail checks alone 0.5 s, the whole ``SELECT *`` 1.2 s); the window function sorts
every row first (no index on key), about 1.0 s; the earlier pass (SQL's checks, a set
lookup per row) took 2.2-2.8 s and left 16% of the keys to a second read and a replay,
this one 1.8-2.4 s and none of a batch's usual keys (retries of transient failures
included). Nor per batch column by column (move codes by ``map(CODES.get, zip(...))``,
the details decoded by msgspec in one ``map``, the failures scattered by numpy, then a
loop of one memo lookup per row): at 1,000,000 events it folded the same in 4.6-5.8 s
CPU against this loop's 4.3-5.7 s (interleaved, loaded machine), next to 2.1-3.0 s for
the bare ``SELECT *``: what the rows cost as Python objects is most of it either way.

The policy stays in ``transitions.why_illegal``: ``QUIET_MOVES`` is derived by asking it,
as ``history.PLAIN_MOVES`` is, and every other move is judged by calling it (once per
distinct (from, to, failure before, failure after): the memo).
"""

import itertools
import json
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
ABSENT = object()  # the failure of a detail that sets none
_PLAIN = type(None), str  # the failure values the fold judges (others: replayed)
COLUMNS = ("seq", "ts", "op", "key", "frm", "to", "attempt", "worker", "token")
SELECT = f"SELECT {', '.join(map(json.dumps, COLUMNS))}, detail FROM events ORDER BY seq"
BATCH = 1 << 16  # rows per fetch: the row tuples of one batch at a time, then columns
# The types History.check accepts, per column (what sqlite3 hands out: int, float, str,
# bytes, None); the detail is judged by ``decode``, the replay's own reader.
TYPES = {"seq": {int}, "ts": {int, float}, "op": {str}, "key": {str}, "frm": {str, type(None)},
         "to": {str}, "attempt": {int}, "worker": {str, type(None)}, "token": {int}}
_CHECKED = tuple((index, frozenset(TYPES[name])) for index, name in enumerate(COLUMNS))


def _step(before, op, frm, to, failure):
    """The fold state after one event whose fields have the replay's types: (to, failure)
    when the replay applies it without a word, else SLOW. ``before``: the key's state
    (None before its first event); ``failure``: what the detail sets (ABSENT: nothing)."""
    code = CODES.get((op, frm, to))
    if before is SLOW or code is None or failure.__class__ not in _PLAIN and failure is not ABSENT:
        return SLOW
    if op == "add":  # a key's first event, None -> pending; a second add is a finding
        return ("pending", None) if before is None and frm is None and to == "pending" else SLOW
    if before is None:  # an event before its add
        return SLOW
    state, held = before
    after = held if failure is ABSENT else failure
    if frm != state or (op != "move" and to != frm):
        return SLOW
    if op == "move" and code not in PLAIN_MOVES and code not in QUIET_MOVES:
        try:
            why = why_illegal(frm, to, held, _Failure(after))
        except LookupError:
            return SLOW
        if why is not None and why != DONE_WITHOUT_ARTIFACT:  # the replay's own test
            return SLOW
    return (to, after)


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


def _typed(batch: tuple) -> tuple:
    """Per row, whether every column holds a type the replay accepts: a set of types per
    column, row by row only for a batch where one is off."""
    if all(set(map(type, batch[index])) <= kinds for index, kinds in _CHECKED):
        return itertools.repeat(True, len(batch[0]))
    return tuple(all(type(batch[index][row]) in kinds for index, kinds in _CHECKED)
                 for row in range(len(batch[0])))


def scan(db, decode):
    """One pass over the events → (columns {name: list}, state {key: (to, failure) or
    SLOW}, digest {key: add's digest}); ``decode`` reads a detail as
    ``parse_json_column`` (the replay's reader).

    ``state`` holds every key of a row, ``SLOW`` for each key with a row the replay
    must see; the columns hold every row in seq order, the slow keys' too (the caller
    drops the rows the replay does not apply)."""
    columns = {name: [] for name in COLUMNS}
    extends = [columns[name].extend for name in COLUMNS]
    state: dict = {}
    digests: dict = {}
    memo: dict = {}  # (state before, op, from, to, failure set) -> state after
    get, remember, step = state.get, memo.get, _step
    slow, absent, _str, _dict, empty = SLOW, ABSENT, str, dict, "{}"
    cursor = db.execute(SELECT)
    while rows := cursor.fetchmany(BATCH):
        batch = tuple(zip(*rows))
        del rows
        _, _, ops, keys, frms, tos, _, _, _, texts = batch
        for key, op, frm, to, text, ok in zip(keys, ops, frms, tos, texts, _typed(batch)):
            before = get(key)
            if not ok or before is slow:
                state[key] = slow
                continue
            if text == empty:
                failure = absent
            else:
                detail, problem = decode(text)
                if problem is not None or detail.__class__ is not _dict:
                    state[key] = slow
                    continue
                failure = detail.get("failure", absent)
                if op == "add":  # its digest (a fine add is its key's first row)
                    digest = detail.get("digest")
                    if digest.__class__ is _str:
                        digests[key] = digest
            try:
                after = remember((before, op, frm, to, failure))
            except TypeError:  # a failure json made a list or a dict: the replay judges
                after = slow
            else:
                if after is None:
                    after = memo[(before, op, frm, to, failure)] = step(before, op, frm, to,
                                                                        failure)
            state[key] = after
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
