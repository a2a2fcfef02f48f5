"""The ledger's records: an item, an event, and the fold of one into the other.

An item is exactly the fold of its events (``apply_event``); ``fold`` is the
same rule on an event's parts, for the ledger's hot path, which builds the
new item before the event's ``seq`` is known and the ``Event`` only once, with
it. ``detail_json`` is the one encoding of an event's detail in a SQLite or
PostgreSQL column.
"""

import collections
import dataclasses
import json
import operator

import orjson

from toolkit.identity import idem_key, page_key
from toolkit.ledger.transitions import PERMANENT, TERMINAL, State

S = State

# Item fields a transition may set; everything else is owned by the base.
MUTABLE_FIELDS = ("job_id", "failure", "reason", "artifact_path", "artifact_size",
                  "artifact_sha256", "pages_done", "artifact_mtime_ns", "artifact_ctime_ns",
                  "artifact_ino")
LEASE_FIELDS = ("lease_owner", "lease_host", "lease_pid", "lease_started", "lease_expires")


@dataclasses.dataclass(frozen=True, slots=True)
class Item:
    key: str
    state: State = S.PENDING
    source: str | None = None
    attempt: int = 0
    token: int = 0
    job_id: str | None = None
    failure: str | None = None
    reason: str | None = None
    artifact_path: str | None = None
    artifact_size: int | None = None
    artifact_sha256: str | None = None
    pages_done: int | None = None  # None: the document is one request; n: pages 1..n checkpointed
    lease_owner: str | None = None
    lease_host: str | None = None  # None: recorded before hosts were (taken as this host)
    lease_pid: int | None = None
    lease_started: float | None = None
    lease_expires: float | None = None
    # The artifact's stat when ``done`` was recorded (with artifact_size: git's index):
    # unchanged, the runner trusts the recorded SHA-256; None (older ledgers): it hashes.
    artifact_mtime_ns: int | None = None
    artifact_ctime_ns: int | None = None
    artifact_ino: int | None = None
    updated: float = 0.0  # last: benchmarks/workloads.py builds rows by position

    @property
    def resting(self) -> bool:
        """True when no automation will move the item again."""
        return self.state in TERMINAL or (self.state is S.FAILED and self.failure == PERMANENT)

    @property
    def request_key(self) -> str:
        """The idempotency key of the request in flight: the document's, or its next page's."""
        unit = self.key if self.pages_done is None else page_key(self.key, self.pages_done + 1)
        # An item released unsent by an older toolkit rests in unknown at attempt 0: what
        # it may have sent is attempt 1 (the ledger now records that release as attempt 1).
        return idem_key(unit, max(self.attempt, 1))


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One change: ``op`` is add, move, claim or release."""

    seq: int
    ts: float
    op: str
    key: str
    frm: State | None
    to: State
    attempt: int
    worker: str | None
    token: int
    detail: dict

    def to_json(self) -> dict:
        return {"seq": self.seq, "ts": self.ts, "op": self.op, "key": self.key,
                "from": self.frm and self.frm.value, "to": self.to.value,
                "attempt": self.attempt, "worker": self.worker, "token": self.token,
                "detail": self.detail}

    @classmethod
    def from_json(cls, obj: dict) -> "Event":
        """Rebuild an event; raises KeyError/ValueError/TypeError on a malformed record."""
        frm = obj["from"]
        return cls(int(obj["seq"]), float(obj["ts"]), str(obj["op"]), str(obj["key"]),
                   State(frm) if frm is not None else None, State(obj["to"]),
                   int(obj["attempt"]), obj["worker"], int(obj["token"]), dict(obj["detail"]))


ITEM_FIELDS = tuple(field.name for field in dataclasses.fields(Item))
# An item's fields as a transaction reads and folds them (``Ledger._current``, ``fold``):
# a named tuple, built in one C call where a frozen dataclass sets its 21 fields one
# object.__setattr__ at a time (several times the cost). It never leaves the ledger:
# callers get Items (``Item(*row)``).
ItemRow = collections.namedtuple("ItemRow", ITEM_FIELDS)
_ITEM_VALUES = operator.attrgetter(*ITEM_FIELDS)  # one C call instead of 21 getattr
_FOLDED = {name: ITEM_FIELDS.index(name) for name in (*MUTABLE_FIELDS, *LEASE_FIELDS)}
_STATE, _ATTEMPT, _TOKEN, _UPDATED, _SOURCE = (
    ITEM_FIELDS.index(name) for name in ("state", "attempt", "token", "updated", "source"))
_ADDED = list(_ITEM_VALUES(Item(key="")))  # a new item's defaults, in field order
_ROW = tuple.__new__  # ItemRow(*values) without its Python __new__
_NEW = object.__new__


class _ItemSlots:
    """An Item's slots, in its order, without the frozen ``__setattr__``: ``item_of`` fills
    one with plain attribute stores, then makes it the Item it is laid out as."""

    __slots__ = ITEM_FIELDS




def item_of(row) -> Item:
    """``Item(*row)`` for a row of all 21 fields in order (an ItemRow, a fold).

    The frozen dataclass ``__init__`` sets each field by ``object.__setattr__`` (a call per
    field, several times the rest of a transition's Python); here each is a slot store,
    the one bytecode a slotted class's attribute assignment specializes to, and the
    object then becomes an Item (its layout is the same: ``_ItemSlots``). A row of any
    other length raises ValueError, as the unpacking does.
    """
    item = _NEW(_ItemSlots)
    (item.key, item.state, item.source, item.attempt, item.token, item.job_id, item.failure,
     item.reason, item.artifact_path, item.artifact_size, item.artifact_sha256,
     item.pages_done, item.lease_owner, item.lease_host, item.lease_pid, item.lease_started,
     item.lease_expires, item.artifact_mtime_ns, item.artifact_ctime_ns, item.artifact_ino,
     item.updated) = row
    item.__class__ = Item
    return item


# ``__class__`` assignment needs the same slots in the same order (CPython raises TypeError
# otherwise), and the stores above must follow that order: checked once, at import, so a
# field added to Item without its store there fails here, not in a ledger.
if _ITEM_VALUES(item_of(range(len(ITEM_FIELDS)))) != tuple(range(len(ITEM_FIELDS))):
    raise ImportError("records.item_of stores an Item's fields out of their order")


def fold(item, op: str, key: str, to: State, attempt: int, token: int, ts: float,
         detail: dict) -> ItemRow:
    """The item after an event with these parts, as an ``ItemRow`` (``apply_event``
    without the ``Event``); ``item`` is an Item, an ItemRow, or None before the add."""
    if op == "add":
        values = _ADDED.copy()
        values[0], values[_SOURCE], values[_UPDATED] = key, detail.get("source"), ts
    else:
        values = list(item) if type(item) is ItemRow else list(_ITEM_VALUES(item))
        values[_STATE], values[_ATTEMPT], values[_TOKEN], values[_UPDATED] = \
            to, attempt, token, ts
        for name, value in detail.items():
            index = _FOLDED.get(name)
            if index is not None:
                values[index] = value
    return _ROW(ItemRow, values)


def apply_event(item: Item | None, event: Event) -> Item:
    """Fold one event into an item (``None`` before its ``add``)."""
    assert item is not None or event.op == "add", f"event {event.seq} for unknown item {event.key}"
    return item_of(fold(item, event.op, event.key, event.to, event.attempt, event.token,
                        event.ts, event.detail))


def with_seq(event: Event, seq: int) -> Event:
    """``event`` numbered ``seq`` (what ``dataclasses.replace`` does, without its overhead)."""
    return Event(seq, event.ts, event.op, event.key, event.frm, event.to, event.attempt,
                 event.worker, event.token, event.detail)


_SORTED = orjson.OPT_SORT_KEYS
_REFERENCE = json.JSONEncoder(sort_keys=True).encode  # one encoder, not one per event


def detail_json(detail: dict) -> str:
    """An event's detail as the JSON text of its column (keys sorted).

    orjson (a C encoder, ~5x the standard library's speed on these small dicts) when it
    can; what it refuses -- a lone surrogate of an undecodable file name, an integer
    beyond 64 bits -- and what it would change -- a NaN or infinity, which it writes as
    null -- goes the standard library's way, so no value is lost or altered.
    """
    try:
        text = orjson.dumps(detail, option=_SORTED)
    except orjson.JSONEncodeError:
        return _REFERENCE(detail)
    if b"null" in text and any(type(value) in (dict, list) or
                               (type(value) is float and value - value != 0)
                               for value in detail.values()):
        return _REFERENCE(detail)  # perhaps a NaN/inf that orjson wrote as null
    return text.decode()


# What a rerun's skip decision reads of an item (``Ledger.scan``; ``runner.keying``): its
# state and why it rests, and the artifact's record (path, size, SHA-256, stat). A named
# tuple built in one C call from a row: a resume of n done items builds no Item.
LIGHT_FIELDS = ("key", "state", "failure", "reason", "artifact_path", "artifact_size",
                "artifact_sha256", "artifact_mtime_ns", "artifact_ctime_ns", "artifact_ino")
_LIGHT_VALUES = operator.attrgetter(*LIGHT_FIELDS)


class Light(collections.namedtuple("Light", LIGHT_FIELDS)):
    """An item's fields for the skip decision; ``resting`` is ``Item.resting``'s rule."""

    __slots__ = ()
    resting = Item.__dict__["resting"]


def light(item) -> Light:
    """The ``Light`` row of an Item (or an ItemRow)."""
    return tuple.__new__(Light, _LIGHT_VALUES(item))
