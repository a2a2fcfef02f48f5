"""Vocabulary of the audit: findings, the report, and the adapter registry.

An adapter turns one file format into a ``Raw`` result: normalized item
records, optional event columns, the unusable line numbers and the findings
only the format can see (torn and corrupt lines, duplicate keys, history).
``register`` puts it in ``ADAPTERS``; insertion order is detection priority.
"""

import collections.abc
import contextlib
import dataclasses
import functools
import gc
import itertools
import operator
from collections.abc import Callable
from typing import Any

# Every kind of finding, in the order the text report lists them.
KINDS = (
    "torn_line",              # final line without its newline: the write never finished
    "corrupt_line",           # an interior line that is not a valid record
    "seq_gap",                # our JSONL: seqs no line holds (lines deleted or lost)
    "seq_disorder",           # our JSONL: an event seq not above the one before (lines copied, moved)
    "missing_header",         # our JSONL: snapshot lines with no header line above them
    "snapshot_mismatch",      # our JSONL: snapshot lines the header does not count (deleted, copied)
    "corrupt_record",         # a database row that is not a valid record
    "unknown_state",          # a row whose state is no word of its format (a dead worker's "running")
    "opaque_payload",         # payloads not JSON or text (a pickle): never decoded, names unknown
    "unaudited_table",        # tables beside the queue that the audit did not read (never silent)
    "unchecked_inputs",       # --inputs given, but items record no input name (or no digest)
    "missing_history",        # events of a key whose add was lost: its state is unprovable
    "hot_journal",            # SQLite: a writer died mid-transaction (its journal remains)
    "duplicate_key",          # conflicting records for one key
    "illegal_transition",     # our history has a move the transition table forbids
    "history_mismatch",       # our SQLite items table disagrees with its own events
    "done_without_artifact",  # done, but no artifact path or SHA-256 to verify against
    "unsafe_artifact_path",   # the artifact path escapes --artifacts (never opened)
    "shared_output",          # --output-name gives other items the same file: whose is it?
    "artifact_missing",       # the artifact file is absent or unreadable
    "artifact_mismatch",      # size or SHA-256 differs from the record
    "unsafe_input_path",      # the input name escapes --inputs (never opened)
    "input_missing",          # the input file is absent or unreadable (its content never read)
    "input_renamed",          # its recorded content is in --inputs under another name (run finds it)
    "stale_input",            # the input's content no longer matches its recorded digest
    "stuck_unknown",          # unknown with no reply recorded and no live lease
)
ACTIONS = ("skip", "verify", "reconcile", "retry", "review", "run")
STATES = ("pending", "unknown", "submitted", "done", "failed", "needs_review", "cancelled",
          "partial")

# Event columns (``line`` is the 1-based line of a JSONL record, None in SQLite).
EVENT_COLUMNS = ("seq", "ts", "op", "key", "frm", "to", "attempt", "worker", "token", "line")


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic GC for an audit or its JSON: a million new objects would set off
    full collections over and over (each walks every live object, a second apiece at a
    million lines), for nothing: the audit creates no cycles. Restored on the way out.

    Order on the way out: every object made while paused is still in the youngest
    generation, so the first collection after ``gc.enable()`` would walk them all (0.3-1.4 s
    at a million lines). ``freeze`` then ``unfreeze`` first moves them to the oldest
    generation (two list splices, no walk), where the next full collection sees them as it
    would have anyway. Only when nothing was frozen before: unfreezing would also release
    what the program froze on purpose (objects kept out of the GC before a fork)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


@dataclasses.dataclass(frozen=True, slots=True)
class Anomaly:
    """One finding: ``key`` is None for findings about a line rather than an item."""

    key: str | None
    kind: str
    detail: str

    def to_json(self) -> dict:
        return {"key": self.key, "kind": self.kind, "detail": self.detail}


_VALUE = Anomaly.__dict__["detail"]  # the slot under ``detail``: a ``Worded`` keeps its value there


class Worded(Anomaly):
    """An ``Anomaly`` whose detail is ``words(value)``, put into words each time it is read
    and never kept: a big batch has a finding per done item that quotes the item's own
    artifact path (the item already holds the path), ~200 bytes an item kept for nothing
    until the report is written. Reads, compares, hashes and serializes as the
    ``Anomaly`` with that detail."""

    __slots__ = ("words",)

    def __init__(self, key, kind: str, words: Callable[[Any], str], value):
        setattr_ = object.__setattr__  # frozen: set as the dataclass's own __init__ does
        setattr_(self, "key", key)
        setattr_(self, "kind", kind)
        setattr_(self, "words", words)
        _VALUE.__set__(self, value)

    @property
    def detail(self) -> str:
        return self.words(_VALUE.__get__(self))

    def to_json(self) -> dict:
        return {"key": self.key, "kind": self.kind, "detail": self.words(_VALUE.__get__(self))}

    def __eq__(self, other):
        if not isinstance(other, Anomaly):
            return NotImplemented
        return (self.key, self.kind, self.detail) == (other.key, other.kind, other.detail)

    __hash__ = Anomaly.__hash__  # (key, kind, detail), the detail as read

    def __repr__(self):
        return repr(Anomaly(self.key, self.kind, self.detail))

    @classmethod
    def many(cls, keys: list, kind: str, words: Callable[[Any], str], values: list) -> list:
        """``[Worded(key, kind, words, value) for key, value in zip(keys, values)]`` made in
        C loops (one ``object.__new__`` and a slot set per field, each a ``map``): no
        ``__init__`` call per finding, for the quarter-million a big batch has."""
        made = list(map(object.__new__, itertools.repeat(cls, len(keys))))
        for slot, given in ((_KEY, keys), (_KIND, itertools.repeat(kind)),
                            (_WORDS, itertools.repeat(words)), (_VALUE, values)):
            collections.deque(map(slot.__set__, made, given), 0)
        return made


_KEY, _KIND = Anomaly.__dict__["key"], Anomaly.__dict__["kind"]
_WORDS = Worded.__dict__["words"]


class Rows(collections.abc.Sequence):
    """``Report.rows``: (Record, action, why) per item, ordered by key, each tuple made
    when it is read. Kept as parallel columns: the records; each one's plan, an (action,
    why, marker) answer shared by every item planned alike (``planner.Planner``: ``marker``
    in the why stands for the detail of the item's ``done_without_artifact`` finding, put
    back when read, a ``Worded`` finding worded only then); and where the item's findings
    begin in the report's ``anomalies`` and how many there are, a key's findings being
    next to each other there (``forensics._ordered``). A quarter-million items then hold no tuple, no
    why string and no list of findings of their own (~100 MB)."""

    __slots__ = ("records", "plans", "first", "counts", "anomalies")

    def __init__(self, records: list, plans: list, first, counts, anomalies: list):
        self.records, self.plans, self.anomalies = records, plans, anomalies
        self.first, self.counts = first, counts

    def __len__(self):
        return len(self.records)

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self.records))
            if step != 1:
                return [self[at] for at in range(start, stop, step)]
            return [row[:3] for row in self.read(start, stop)]
        if index < 0:
            index += len(self.records)
        if not 0 <= index < len(self.records):
            raise IndexError(index)
        return next(self.read(index, index + 1))[:3]

    def __iter__(self):
        for record, action, why, _ in self.read():
            yield record, action, why

    def actions(self) -> list:
        """Each row's action, no why worded."""
        return [plan[0] for plan in self.plans]

    def read(self, start: int = 0, stop: int | None = None):
        """(Record, action, why, kinds found on it in report order) of rows ``start`` to
        ``stop``; the kinds an empty tuple when none."""
        records, plans, first, anomalies = self.records, self.plans, self.first, self.anomalies
        rows, empty = slice(start, len(records) if stop is None else stop), ()
        for record, (action, why, marker), at, count in zip(records[rows], plans[rows],
                                                             first[rows], self.counts[rows]):
            if count == 0:
                yield record, action, why, empty
            elif count == 1:  # the usual: one finding
                anomaly = anomalies[at]
                if marker is not None:
                    why = why.replace(marker, anomaly.detail)
                yield record, action, why, [anomaly.kind]
            else:
                found = anomalies[at:at + count]
                if marker is not None:  # the first of its kind: the one the plan read
                    quoted = next(a for a in found if a.kind == "done_without_artifact")
                    why = why.replace(marker, quoted.detail)
                yield record, action, why, [anomaly.kind for anomaly in found]

    def only(self, action) -> "Rows":
        """The rows planned ``action``, as ``Rows``."""
        keep = [index for index, plan in enumerate(self.plans) if plan[0] == action]
        return Rows([self.records[at] for at in keep], [self.plans[at] for at in keep],
                    [self.first[at] for at in keep], [self.counts[at] for at in keep],
                    self.anomalies)


@dataclasses.dataclass(frozen=True, eq=False)
class Report:
    """What ``audit`` found; ``to_json()`` is the DESIGN.md ``audit --json`` shape.

    ``rows`` is one (``Record``, action, why) per item, ordered by key: the
    audit's result, for anything that walks the items (``per_item``). ``items``
    is the same as a pandas.DataFrame (``ITEM_COLUMNS`` plus ``action`` and
    ``why``), ordered by key; ``events`` has ``EVENT_COLUMNS`` or is None when
    the format keeps no history. Both frames are built on first use, once:
    ``audit --json`` needs neither, and a million-row frame costs seconds.
    """

    path: str
    format: str
    rows: Any = dataclasses.field(repr=False)  # [(Record, action, why)] ordered by key: ``Rows``
    event_columns: Any = dataclasses.field(repr=False)  # {name: list | ndarray} | None
    corrupt_lines: list[int]
    anomalies: list[Anomaly]
    plan: dict[str, int]
    by_state: dict[str, int]
    notes: list[str] = dataclasses.field(default_factory=list)  # what the file says of itself

    @functools.cached_property
    def items(self):
        """One row per item as a pandas.DataFrame (``ITEM_COLUMNS``, action, why)."""
        rows = self.rows  # column by column: no tuple per row
        columns = {name: list(map(operator.attrgetter(name), rows.records))
                   for name in ITEM_COLUMNS}
        columns.update(action=rows.actions(), why=[why for _, _, why in rows])
        return frame(columns)

    @functools.cached_property
    def events(self):
        """The history as a pandas.DataFrame (``EVENT_COLUMNS``), or None."""
        if self.event_columns is None:
            return None
        return frame(self.event_columns, EVENT_HINTS)

    def to_json(self) -> dict:
        return {"format": self.format, "items": len(self.rows), "by_state": dict(self.by_state),
                "corrupt_lines": list(self.corrupt_lines),
                "anomalies": [anomaly.to_json() for anomaly in self.anomalies],
                "plan": dict(self.plan), **({"notes": list(self.notes)} if self.notes else {})}


EVENT_HINTS = {"seq": "int64", "ts": "float64", "attempt": "int64", "token": "int64",
               "line": "int64"}


def _column(np, values, hint=None):
    """One numpy array per column, built once (pandas then copies nothing).

    ``hint``: the dtype the reader already validated (event seq, ts, ...); the
    values' types are inferred only when it does not fit. A numpy array (the
    fold's columns) is taken as it is.
    """
    if hasattr(values, "__array__"):  # numpy, or the fold's packed columns
        return np.asarray(values)
    if hint is not None:
        try:
            return np.array(values, dtype=hint)
        except (TypeError, ValueError, OverflowError):
            pass
    kinds = set(map(type, values))
    try:
        if kinds == {int}:
            return np.array(values, dtype=np.int64)
        if kinds and kinds <= {int, float}:
            return np.array(values, dtype=np.float64)
    except OverflowError:
        pass
    return np.fromiter(values, dtype=object, count=len(values))  # never 2-D, whatever they hold


def frame(columns: dict, hints=None):
    """A pandas.DataFrame of ``columns`` ({name: values}), numbers as ``hints`` say."""
    import numpy as np
    import pandas as pd

    hints = {} if hints is None else {name: getattr(np, kind) for name, kind in hints.items()}
    # Text columns in pandas' own (Python) string storage, pyarrow installed or not: a
    # ledger's text may hold lone surrogates (a JSON "\ud800"), which Arrow refuses.
    with pd.option_context("mode.string_storage", "python"):
        return pd.DataFrame({name: _column(np, values, hints.get(name))
                             for name, values in columns.items()},
                            columns=list(columns), copy=False)


@dataclasses.dataclass(slots=True)
class Record:
    """One normalized item; every adapter fills what its format knows.

    Mutable on purpose (the fold updates it in place) and slotted: a million-
    event ledger holds hundreds of thousands of these.
    """

    key: str
    state: str | None = None        # ours: one of STATES
    raw_state: Any = None           # what the file said (``timeout``, ...)
    source: Any = None              # input file name
    input_digest: Any = None        # content digest of the input, when recorded
    attempt: Any = None
    job_id: Any = None              # the provider's job, when one was acknowledged
    failure: Any = None             # transient / permanent / None (unclassified)
    reason: Any = None
    artifact_path: Any = None
    artifact_size: Any = None
    artifact_sha256: Any = None
    lease_owner: Any = None
    lease_expires: Any = None
    updated: Any = None             # timestamp of the last change, as recorded


ITEM_COLUMNS = tuple(field.name for field in dataclasses.fields(Record))


@dataclasses.dataclass
class Raw:
    """An adapter's result, before the checks that every format shares."""

    items: dict[str, Record] = dataclasses.field(default_factory=dict)
    events: dict[str, list] | None = None
    corrupt_lines: list[int] = dataclasses.field(default_factory=list)
    anomalies: list[Anomaly] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # e.g. a salvage's mark

    def finding(self, key, kind, detail, line=None):
        if line is not None:
            self.corrupt_lines.append(line)
        self.anomalies.append(Anomaly(key, kind, detail))


@dataclasses.dataclass(frozen=True)
class Adapter:
    """One format: ``container`` is "sqlite" or "jsonl".

    sqlite: ``sniff(db, tables)`` gets a read-only connection and
    {table: set(columns)} of its real tables; ``read(db, tables)`` → Raw.
    jsonl: ``sniff(obj)`` gets the first line that parses as an object;
    ``read(path)`` → Raw. ``describe`` is the phrase the error message lists.
    """

    name: str
    container: str
    sniff: Callable
    read: Callable
    describe: str


ADAPTERS: dict[str, Adapter] = {}


def register(name: str, container: str, sniff: Callable, describe: str):
    """Decorator: register ``read`` as the adapter for format ``name``."""

    def wrap(read):
        ADAPTERS[name] = Adapter(name, container, sniff, read, describe)
        return read

    return wrap


def supported() -> str:
    """One line naming every format the audit reads."""
    return "supported formats: " + "; ".join(f"{a.name} ({a.describe})" for a in ADAPTERS.values())
