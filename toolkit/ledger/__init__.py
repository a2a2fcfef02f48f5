"""The client ledger: states, guarded transitions, leases, events.

The policy lives here, once: the transition table (``transitions.py``), the
from-state guard, the fencing-token check, the attempt counter and event emission. Backends supply
five primitives inside one transaction (``_txn``, ``_load``, ``_write``,
``_items``, ``_events``) plus ``close``. Every change is one event, and an
item is exactly the fold of its events (``apply_event``, in records.py): the
JSONL backend replays them, the SQLite backend stores both and must agree.

Every transition pays this module's Python on top of its SQL and fsync, so
the path a transition takes is kept short: states compared by identity, no
Enum() call for a State already given, one lookup of the transition table
(``MOVES``: an edge without conditions skips ``why_illegal``), this process's
pid and start time read once (not a system call per claim), the new item
folded once and the event built once (by the backend, when its ``seq`` is
known).
"""

import operator
import os
import threading
import time
from pathlib import Path

from toolkit.errors import (
    IllegalTransitionError,
    LeaseHeldError,
    LedgerError,
    StaleTokenError,
    StateConflictError,
)
from toolkit.ledger.group import Commit
from toolkit.liveness import alive, host_id, my_start, start_ticks
# The records (items, events, their fold) and the transition policy live in their own
# modules (records.py, transitions.py); both are re-exported from here.
from toolkit.ledger.records import (ITEM_FIELDS, LEASE_FIELDS, MUTABLE_FIELDS, Event, Item,
                                    apply_event, item_of, light, with_seq)
from toolkit.ledger.transitions import (ARTIFACT_FIELDS, MOVES, PERMANENT, TERMINAL,
                                        TRANSIENT, TRANSITIONS, State, bad_artifact,
                                        why_illegal)
# Opening a ledger by its location (opening.py); re-exported from here.
from toolkit.ledger.opening import canonical_path, open_ledger

S = State
_MUTABLE = frozenset(MUTABLE_FIELDS)
_FAILURES = (TRANSIENT, PERMANENT)
_NEW_ATTEMPT = frozenset({S.PENDING, S.FAILED})  # entering unknown from these starts one
# The members the hot path compares with, as module names: ``State.FAILED`` is a lookup
# through the Enum class (about as much as the rest of a comparison's line), these are one.
_PENDING, _UNKNOWN, _DONE, _FAILED = S.PENDING, S.UNKNOWN, S.DONE, S.FAILED
_AFTER = ("failure", *ARTIFACT_FIELDS)  # what the policy reads of an item after a move
_AFTER_VALUES = operator.attrgetter(*_AFTER)
_RELEASED = dict.fromkeys(LEASE_FIELDS)
HOST = host_id()  # where this process runs, in this boot: a lease names its owner's host
_SELF: list = []  # [pid, start ticks] of this process, read once; a forked child re-reads
os.register_at_fork(after_in_child=_SELF.clear)


def _this_process() -> list:
    """``[pid, start ticks]`` of this process: os.getpid() is a system call per claim
    otherwise (Python does not cache it), two with the start time's lookup."""
    if not _SELF:
        _SELF[:] = os.getpid(), my_start()
    return _SELF


def owner_alive(item: Item) -> bool | None:
    """Is the lease owner's process still the one that claimed? (a reused pid is not)

    None when the owner runs on another host: its process table is not ours to
    read, so only the lease's expiry can tell (and fencing guards a slow owner).
    One helper decides, for leases and the provider's executors: ``liveness.alive``.
    """
    return alive(item.lease_host, item.lease_pid, item.lease_started)


def lease_held(item: Item, now: float, respect_live_owner: bool = True) -> bool:
    """Does an owner other than this process still hold ``item``'s lease? (``claim``'s rule,
    which refuses such a lease; see its docstring for the clauses.) Not held: unowned, its
    owner's process gone (orphaned), or expired unless its owner is another live process
    of this host (``respect_live_owner``). An owner on another host holds it until expiry.
    """
    if item.lease_owner is None:
        return False
    alive = owner_alive(item)  # True, False, or None: another host's process
    if alive is False:  # orphaned
        return False
    expired = item.lease_expires is not None and item.lease_expires <= now
    other_live_process = (respect_live_owner and alive is True
                          and item.lease_pid not in (None, _this_process()[0]))
    return not expired or other_live_process


class Ledger:
    """Durable client ledger; use ``open_ledger(path)`` to get one.

    Every mutating call is one transaction that checks the item's current
    state and fencing token, writes the item change and appends its event.
    ``on_event(event)`` is called after each commit.

    Raises (from every mutating call):
        StateConflictError: the item is not in the named from-state.
        IllegalTransitionError: the table has no such edge.
        StaleTokenError: the token is not the item's current one.
        LedgerError: the backend could not record the change.
    """

    # DEFERRED SYNC (``sync=False``; the rule is in group.py's docstring): committed and
    # visible, its fsync left to the next barrier. Backends that cannot defer sync all.
    defers_sync = False
    # The mark of a ledger written by ``ledger --salvage`` (salvage.py), or None: lines were
    # lost before it, so any request it never recorded may have been sent (the runner looks
    # each one up before sending it). Read at open: JSONL's header line, SQLite's meta row
    # (``sqlite.salvage_mark``); a PostgreSQL ledger is never salvaged.
    salvaged: dict | None = None

    def __init__(self, path, *, durable: bool = True, clock=time.time, on_event=None):
        self.path = Path(path)
        self.durable = durable
        self.clock = clock
        self.on_event = on_event
        self._lock = threading.RLock()
        self._group = None  # a group.GroupCommit when the backend shares its fsyncs

    # -- primitives every backend implements -------------------------------
    def _txn(self):
        """A context manager: exclusive, all-or-nothing. A backend whose ledger lock (held
        by the caller) is the whole transaction, the one write in ``_write`` its commit,
        sets ``_txn = None`` instead (JSONL): ``Commit`` then calls nothing."""
        raise NotImplementedError

    def _load(self, key: str) -> Item | None:
        raise NotImplementedError

    def _write(self, old: Item | None, new: Item, parts: tuple) -> int:
        """Persist ``new`` and the event of ``parts`` (guarded on ``old``); return its seq.

        ``parts`` are the event's fields after ``seq`` (ts, op, key, frm, to, attempt,
        worker, token, detail): ``Event(seq, *parts)`` is the event, built only where
        it is kept (JSONL's history) or announced (``on_event``).
        """
        raise NotImplementedError

    def _current(self, key: str):
        """The item as the transaction reads it: an ``Item``, or anything with its fields
        as attributes (SQLite: an ``ItemRow``, cheaper to build); never returned to a caller."""
        return self._load(key)

    def _as_item(self, row) -> Item:
        """The Item of a folded row (``records.ItemRow``), as handed to a caller."""
        return item_of(row)

    def _items(self) -> list[Item]:
        raise NotImplementedError

    def _events(self) -> list[Event]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # -- public API ----------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def get(self, key: str) -> Item | None:
        with self._lock:
            return self._load(key)

    def items(self) -> list[Item]:
        """All items, ordered by key."""
        with self._lock:
            return sorted(self._items(), key=lambda item: item.key)

    def events(self) -> list[Event]:
        """The whole history, ordered by seq."""
        with self._lock:
            return self._events()

    def get_many(self, keys) -> dict[str, Item]:
        """The items of ``keys`` that exist, by key (a backend may read them in one query)."""
        with self._lock:
            return self._load_many(list(keys))

    def _load_many(self, keys: list[str]) -> dict[str, Item]:
        return {key: item for key in keys if (item := self._load(key)) is not None}

    def unsettled(self) -> list[Item]:
        """The items not at rest (``Item.resting`` is False), ordered by key."""
        with self._lock:
            return sorted(self._unsettled(), key=lambda item: item.key)

    def _unsettled(self) -> list[Item]:  # a backend may select them without reading the rest
        return [item for item in self._items() if not item.resting]

    def counts(self) -> dict[str, int]:
        """Number of items per state (every state present, zero included)."""
        counts = {state.value: 0 for state in State}
        for item in self.items():
            counts[item.state.value] += 1
        return counts

    def add(self, key: str, source: str | None = None, digest: str | None = None, *,
            sync: bool = True) -> bool:
        """Record a new ``pending`` item; False (and nothing written) if it exists.

        ``digest`` (the input's content digest) goes into the event so an audit
        can later tell whether the input changed under a done item. ``sync``: see
        ``DEFERRED SYNC`` below (every mutating call takes it).
        """
        detail = {"source": source} if digest is None else {"source": source, "digest": digest}
        with Commit(self, sync) as commit:
            if self._current(key) is not None:
                return False
            commit(None, "add", key, None, _PENDING, 0, None, 0, detail)
            return True

    def move(self, key: str, frm: State, to: State, *, token: int = 0,
             worker: str | None = None, note: str | None = None, sync: bool = True,
             **fields) -> Item:
        """Transition ``key`` from ``frm`` to ``to`` and return the new item.

        ``fields`` may set job_id, failure, reason and artifact_*. Entering
        ``unknown`` from ``pending`` or ``failed`` starts a new attempt.
        """
        # Coerce only what is not a State already: an Enum() call per argument adds up.
        if frm.__class__ is not State:
            frm = State(frm)
        if to.__class__ is not State:
            to = State(to)
        plain = MOVES[frm].get(to)  # None: no such edge; True: no condition to judge
        if plain is None:
            raise IllegalTransitionError(frm, to)
        if fields and not _MUTABLE.issuperset(fields):
            raise TypeError(f"move() cannot set {sorted(fields.keys() - _MUTABLE)}")
        if (to is _FAILED) != (fields.get("failure") in _FAILURES):
            raise IllegalTransitionError(frm, to, "failure='transient' or 'permanent' goes "
                                         "with a move to failed, only")
        with Commit(self, sync) as commit:
            item = self._guard(key, frm, token)
            if item.attempt and frm is _PENDING and to is _UNKNOWN:  # (a rare branch)
                from toolkit.ledger.salvage import edited_record

                raise edited_record(self.path, key, item.attempt)
            if not plain:
                after = dict(zip(_AFTER, _AFTER_VALUES(item)))
                after.update(fields)  # why_illegal and bad_artifact read the _AFTER names only
                why = why_illegal(frm, to, item.failure, after)
                if why is None and to is _DONE:
                    why = bad_artifact(after)
                if why is not None:
                    raise IllegalTransitionError(frm if frm is not _FAILED
                                                 else f"failed({item.failure})", to, why)
            # Entering unknown from pending or failed starts an attempt; so does a release
            # (needs_review -> unknown) of an item with none on record (a pending item that
            # salvage parked): the lost lines may hold its first intent, attempt 1.
            attempt = item.attempt + 1 if to is _UNKNOWN and (
                frm in _NEW_ATTEMPT or not item.attempt) else item.attempt
            if frm is _FAILED:  # the old failure belongs to the old attempt
                fields = {"failure": None, "reason": None, **fields}
            if note is not None:
                fields["note"] = note
            return self._as_item(commit(item, "move", key, frm, to, attempt, worker, token, fields))

    def claim(self, key: str, worker: str, ttl: float, *, pid: int | None = None,
              host: str | None = None, respect_live_owner: bool = True,
              sync: bool = True) -> int:
        """Take the item's lease for ``ttl`` seconds; return the new fencing token.

        Claim succeeds when the lease is
          unowned   -- nobody holds it (never claimed, or released), or
          mine      -- ``worker`` already holds it (renewal; the token still advances), or
          orphaned  -- its owner's process on this host is gone (pid and start time: a
                       reused pid is another process), or
          expired   -- lease_expires <= now, and the owner is not another live process
                       (a worker thread of this process, or an owner we cannot check:
                       one on another host, whose liveness only its expiry tells).
        Otherwise ``LeaseHeldError``: a live process is never robbed of its lease just
        because it is slow. ``respect_live_owner=False`` drops that last condition,
        as naive lease code does (the ``steal-expired`` strategy shows the cost).

            worker A  |--claim t=1----------x (expires)
            worker B                           |--claim t=2----|
            A's late write with t=1  ----------------------->  StaleTokenError
        """
        me, started = _this_process()
        if pid is None:
            pid = me
        with Commit(self, sync) as commit:
            item = self._current(key)
            if item is None:
                raise StateConflictError(key, "any", None)
            now = self.clock()
            unowned = item.lease_owner is None
            mine = item.lease_owner == worker
            if not (unowned or mine) and lease_held(item, now, respect_live_owner):
                raise LeaseHeldError(key, item.lease_owner, item.lease_expires)
            lease = {"lease_owner": worker, "lease_host": host or HOST, "lease_pid": pid,
                     "lease_started": started if pid == me else start_ticks(pid),
                     "lease_expires": now + ttl}
            commit(item, "claim", key, item.state, item.state, item.attempt, worker,
                   item.token + 1, lease)
            return item.token + 1

    def renew(self, key: str, token: int, worker: str, ttl: float, *, sync: bool = True) -> None:
        """Extend a held lease to ``now + ttl``, keeping its token; fenced like any write.

        Written (as a ``claim`` event with the same token) only once half the lease is
        spent, so a fast item costs no extra commits; the token is checked every time.

        Raises:
            StaleTokenError: the lease was lost (another owner claimed since ``token``).
        """
        with Commit(self, sync) as commit:
            item = self._guard(key, None, token)
            if item.lease_owner != worker:
                raise StaleTokenError(key, token, item.token)  # released: ours no longer
            now = self.clock()
            if item.lease_expires is not None and item.lease_expires - now > ttl / 2:
                return
            commit(item, "claim", key, item.state, item.state, item.attempt, worker, token,
                   {"lease_expires": now + ttl})

    def release(self, key: str, token: int, worker: str | None = None, *,
                sync: bool = True) -> None:
        """Give the lease back; the token stays, so older tokens remain stale."""
        with Commit(self, sync) as commit:
            item = self._guard(key, None, token)
            commit(item, "release", key, item.state, item.state, item.attempt, worker, token,
                   _RELEASED.copy())

    # -- the one place where changes are made ----------------------------------
    def _guard(self, key: str, frm: State | None, token: int) -> Item:
        item = self._current(key)
        if item is None or (frm is not None and item.state is not frm):
            raise StateConflictError(key, frm, item and item.state)
        if token != item.token:
            raise StaleTokenError(key, token, item.token)
        return item

    def barrier(self) -> None:
        """Make every transition committed so far durable (``DEFERRED SYNC``); ``close()``
        runs it too. Raises StorageError when the fsync fails."""
        if self._group is not None:
            self._group.barrier()

    def _commit(self, sync: bool = True) -> Commit:
        """``with self._commit() as commit:`` -- the one place where changes are made
        (``group.Commit``: lock, transaction, fold and write, group-commit wait, then
        ``on_event``). The base's own methods build the ``Commit`` directly."""
        return Commit(self, sync)

    # -- the order of intents (``runner.other_options``) ---------------------------------
    def first_intents(self, keys) -> dict[str, int]:
        """The seq of each key's first intent (its first event entering ``unknown``), for
        the keys that have one. Seqs of first intents are in commit order on every backend
        (SQLite and JSONL: one writer at a time; PostgreSQL: ``postgres.INTENT_ORDER``), so
        of two intents the one with the smaller seq was visible to every reader that
        committed the other first. This default reads the whole history (JSONL: in memory)."""
        wanted, found = set(keys), {}
        for event in self.events():
            if event.to is _UNKNOWN and event.key in wanted and event.key not in found:
                found[event.key] = event.seq
        return found

    # -- a rerun's one ordered pass (``runner.keying``) -------------------------------
    def item_count(self) -> int:
        """How many items the ledger holds (a backend may count without reading them)."""
        with self._lock:
            return self._item_count()

    def _item_count(self) -> int:
        return len(self._items())

    def scan(self, ordered: bool = True):
        """Every item as a ``records.Light`` row (the skip decision's fields), in key order
        (``ordered=False``: in whatever order the backend reads fastest).

        A backend streams them (SQLite: one ``SELECT``, read in batches); this default
        takes its folded items (JSONL, in memory: they are held already), sorted."""
        with self._lock:
            rows = list(map(light, self._items()))
        if ordered:
            rows.sort()  # keys are unique: ordered by key
        yield from rows


__all__ = ["canonical_path", "State", "TRANSITIONS", "TERMINAL", "TRANSIENT", "PERMANENT", "ARTIFACT_FIELDS",
           "Item", "Event", "Ledger", "apply_event", "open_ledger", "why_illegal", "with_seq",
           "ITEM_FIELDS", "LEASE_FIELDS", "MUTABLE_FIELDS"]
