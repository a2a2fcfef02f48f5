"""Replay the toolkit's own event history the way the ledger does, noting
everything the ledger's guards would have refused.

Shared by the toolkit's JSONL ledger (the history *is* the file) and its SQLite
ledger (the history is the ``events`` table, checked against ``items``).
"""

import sys

from toolkit.forensics.columns import CODES, VOCABULARY, Columns
from toolkit.forensics.model import ITEM_COLUMNS, STATES, Raw, Record
from toolkit.ledger import LEASE_FIELDS, MUTABLE_FIELDS
from toolkit.ledger.transitions import DONE_WITHOUT_ARTIFACT, why_illegal

STATE_SET = frozenset(STATES)
BAD_EVENT = "fields of the wrong type or value for an event"


def _float_holds(number: int) -> bool:
    """Whether a float holds ``number`` (a ts of 10**400 is valid JSON, but the ledger reads
    every ts as a float: no float, a corrupt line there, and so here)."""
    try:
        float(number)
    except OverflowError:
        return False
    return True
# Event detail fields an item keeps (the ledger's own, as far as Record has them).
DETAIL_FIELDS = (frozenset(MUTABLE_FIELDS) | frozenset(LEASE_FIELDS)) & frozenset(ITEM_COLUMNS)
SNAPSHOT_FIELDS = frozenset(("key", "state", "source", "attempt", "token", "job_id", "updated",
                             *MUTABLE_FIELDS, *LEASE_FIELDS))
NUMBER = (int, float)
# Detail fields whose words repeat across a batch's items (a failure class, an error
# message): kept once each (sys.intern), not once per failed item.
WORDY = frozenset(("failure", "reason"))
SNAPSHOT = "snapshot"  # toolkit.ledger.jsonl.SNAPSHOT


class _Untouchable:
    """An item-after-the-move that ``why_illegal`` must not read (``_plain_moves``)."""

    def get(self, name):
        raise LookupError(name)


def _plain_moves() -> frozenset:
    """The move codes ``why_illegal`` finds legal whatever the item holds: asked once per
    code with a failure no rule accepts and an item it may not read, it answers None. The
    replay then skips the call for them (most moves of a batch: pending -> unknown,
    unknown -> submitted); every other move is judged by ``why_illegal`` itself, so the
    policy stays in one place."""
    plain = set()
    for code, (op, frm, to) in enumerate(VOCABULARY):
        if op != "move" or frm is None:
            continue
        try:
            why = why_illegal(frm, to, object(), _Untouchable())
        except LookupError:
            continue
        if why is None:
            plain.add(code)
    return frozenset(plain)


PLAIN_MOVES = _plain_moves()


def _where(line, seq):
    return f"line {line}" if line is not None else f"event seq={seq}"


class _After:
    """The item's failure and artifact fields after a move, as ``why_illegal`` asks for
    them (``get``): the event's detail first, else the item's. Built per move, read only
    for the moves whose policy depends on them (a dict built per move costs more)."""

    __slots__ = ("detail", "item")

    def __init__(self, detail: dict, item: Record):
        self.detail, self.item = detail, item

    def get(self, name):
        detail = self.detail
        return detail[name] if name in detail else getattr(self.item, name)


class History:
    """Fold events into item records (``raw.items``) and event columns.

    ``event(obj, line)`` returns None when the record was applied, or the
    reason it is not a valid event (the caller decides whether that makes a
    corrupt line). ``check(seq, ts, op, key, frm, to, attempt, worker, token,
    detail, line)`` is the same for the fields of a non-snapshot record (an
    SQLite row: no dict built), and ``apply`` the same again for fields whose
    types are already checked (a typed decoder's). Call ``finish()`` once at the
    end to fill ``raw.events``.

    Memory: the event columns are kept compact while folding (numbers in
    ``array`` buffers, strings shared with the items and a small vocabulary),
    never one object per event: a million events stay tens of megabytes.
    """

    def __init__(self, raw: Raw, numbered: bool = True):
        """``numbered``: events come with line numbers (JSONL); else ``line`` is None."""
        self.raw = raw
        self.items = raw.items
        self.columns = Columns(numbered)
        self.workers: dict = {}  # one string object per worker name, shared by its events
        self.orphaned: set = set()  # keys seen only in events before any add
        # seqs of lines kept out of the event table (forensics.lines.seq_gaps counts them)
        self.apart, self.snapshot_seqs = [], set()  # of orphaned events; of snapshots
        self.snapshot_lines = []  # (line, seq) of each snapshot (gaps.snapshot_damage)
        self.apart_lines: set = set()  # lines of orphaned events (none held a lost add)
        self.unusable, self._scanned = [], 0  # the other unusable lines, read so far
        self.glued: dict = {}  # key -> [(line, seq, op)] whole in a glued line (jsonl._glued)
        self.apply = self._make_apply(self.columns)
        # ``apply`` without the push: returns the event's vocabulary code (an int) when it
        # was applied, else why not; the caller pushes a whole batch (``push_many``)
        self.fold = self._make_apply(None)
        self.check = self._make_check(self.apply)
        self.event = self._make_event(self.check)

    def finish(self) -> dict:
        self.raw.events = self.columns.finish()
        return self.raw.events

    def _make_event(self, check):
        snapshot = self.snapshot

        def event(obj: dict, line: int | None = None) -> str | None:
            if SNAPSHOT in obj:
                return snapshot(obj, line)
            try:
                seq, ts, op, key = obj["seq"], obj["ts"], obj["op"], obj["key"]
                frm, to, attempt, worker = obj["from"], obj["to"], obj["attempt"], obj["worker"]
                token, detail = obj["token"], obj["detail"]
            except KeyError as exc:
                return f"missing field {exc}"
            return check(seq, ts, op, key, frm, to, attempt, worker, token, detail, line)

        return event

    def _make_check(self, apply):
        _type, _int, _str, _dict, _number = type, int, str, dict, NUMBER

        def check(seq, ts, op, key, frm, to, attempt, worker, token, detail, line):
            """``apply`` for fields of any type (an SQLite row's): their types first."""
            if (_type(seq) is not _int or _type(ts) not in _number or _type(op) is not _str
                    or _type(key) is not _str or _type(to) is not _str
                    or _type(attempt) is not _int or _type(token) is not _int
                    or _type(detail) is not _dict
                    or (frm is not None and _type(frm) is not _str)
                    or (worker is not None and _type(worker) is not _str)
                    or (_type(ts) is _int and not _float_holds(ts))):
                return BAD_EVENT
            return apply(seq, ts, op, key, frm, to, attempt, worker, token, detail, line)

        return check

    def _make_apply(self, columns):
        # The hot loop of a million-line audit, so a closure over locals (no
        # attribute lookups) and no object per event beyond what the file holds.
        # ``columns`` None: the fold alone (``fold``), its events pushed by the caller.
        items, illegal = self.items, self._illegal
        finding, get = self.raw.finding, self.items.get
        orphaned, workers, apart = self.orphaned, self.workers, self.apart
        apart_lines = self.apart_lines
        _type, _str = type, str
        code_of, words, fields, plain = CODES.get, VOCABULARY, DETAIL_FIELDS, PLAIN_MOVES
        lost_add = self._lost_add
        wordy, intern = WORDY, sys.intern

        def apply(seq, ts, op, key, frm, to, attempt, worker, token, detail, line):
            """Fields already of the right types; their values are checked here."""
            code = code_of((op, frm, to))  # known op, known states: one lookup
            if code is None:
                return BAD_EVENT
            to = words[code][2]  # the vocabulary's own string: items share it, not the line's
            item = get(key)
            if op == "add":
                orphaned.discard(key)  # from here on its events fold normally
                if item is not None:
                    finding(key, "duplicate_key",
                            f"{_where(line, seq)}: a second add for this key resets it")
                if frm is not None or to != "pending":
                    illegal(key, line, seq, f"add must be None -> pending, not {frm} -> {to}")
                source, digest = detail.get("source"), detail.get("digest")
                items[key] = item = Record(key, "pending", "pending",
                                           source if _type(source) is _str else None,
                                           digest if _type(digest) is _str else None, 0,
                                           updated=ts)
            elif item is None or key in orphaned:
                # Its add line was lost (a corrupt line) or never written: the key is real,
                # its state unprovable. As in JsonlLedger (``orphans``), every such line
                # stays corrupt and is folded apart; the key is planned review.
                # Its fields fold as a normal event's do: a done line keeps the artifact it
                # records (the audit then checks it, rather than say none is recorded).
                if item is None:
                    items[key] = item = Record(key, to, to, attempt=attempt, updated=ts)
                    orphaned.add(key)
                    finding(key, "missing_history", lost_add(line, seq, op, key))
                else:
                    item.state = item.raw_state = to
                    item.attempt, item.updated = attempt, ts
                for name in detail:
                    if name in fields:
                        setattr(item, name, detail[name])
                apart.append(seq)
                if line is not None:
                    apart_lines.add(line)
                return f"{op} of key {key!r} before its add"
            else:
                state = item.state
                if frm != state:
                    illegal(key, line, seq, f"{op} says from {frm} but the item was {state}")
                elif op != "move":
                    if to != frm:
                        illegal(key, line, seq, f"{op} changes the state {frm} -> {to}")
                elif code not in plain:  # the ledger's own policy, on what the event did
                    why = why_illegal(frm, to, item.failure, _After(detail, item))
                    # A done without artifact fields has its own finding and plan
                    # (done_without_artifact: reconcile, the job may still be fetchable).
                    if why is not None and why != DONE_WITHOUT_ARTIFACT:
                        illegal(key, line, seq, why)
                item.state = item.raw_state = to
                item.attempt = attempt
                item.updated = ts
                if detail:
                    for name in detail:
                        if name in fields:
                            value = detail[name]
                            if name in wordy and value.__class__ is _str:
                                value = intern(value)  # one "transient" for every item
                            setattr(item, name, value)
            if columns is None:
                return code
            if worker is not None:
                worker = workers.setdefault(worker, worker)
            columns.push(seq, ts, code, item.key, attempt, worker, token, line)
            return None

        return apply

    def snapshot(self, obj: dict, line: int) -> str | None:
        """A compacted item (``{"snapshot": {...}, "seq": n}``); no history before it."""
        item, seq = obj.get("snapshot"), obj.get("seq")
        if type(item) is not dict or type(seq) is not int:
            return "snapshot line without an item object and an integer seq"
        key, state = item.get("key"), item.get("state")
        if type(key) is not str or type(state) is not str or state not in STATE_SET:
            return "snapshot without a string key and a known state"
        if not item.keys() <= SNAPSHOT_FIELDS:
            return f"snapshot with unknown fields {sorted(item.keys() - SNAPSHOT_FIELDS)}"
        if key in self.items:
            self.raw.finding(key, "duplicate_key", f"line {line}: a second snapshot or a "
                             "snapshot after events replaces this key")
        self.snapshot_seqs.add(seq)
        self.snapshot_lines.append((line, seq))
        fields = {name: item[name] for name in item if name in DETAIL_FIELDS}
        self.items[key] = Record(key, state, state, source=item.get("source"),
                                 attempt=item.get("attempt"), updated=item.get("updated"), **fields)
        return None

    def _lost_add(self, line, seq, op, key) -> str:
        """The ``missing_history`` detail of a key met first by ``op``: its add is missing.

        A JSONL file is read in line order, so every unusable line so far lies before
        ``line``: the add may have been on one of them, or, with none, it was deleted or
        never written. An add found whole inside a glued line is named; other keys'
        orphaned events (whole lines of those keys) never held it. A table has no lines."""
        if line is None:
            return (f"event seq={seq}: its add event is missing (no earlier event adds "
                    f"this key); this {op} is its first event left")
        glued = [(at, at_seq) for at, at_seq, at_op in self.glued.get(key, ())
                 if at_op == "add"]
        # amortized: only the lines found unusable since the last call are looked at
        lines, apart = self.raw.corrupt_lines, self.apart_lines
        self.unusable += [at for at in lines[self._scanned:] if at not in apart]
        self._scanned, earlier = len(lines), self.unusable
        if glued:
            at, at_seq = glued[-1]
            where = (f"its add (seq {at_seq}) is whole inside unusable line {at} (a write "
                     "cut before its newline, with the next line glued to it)")
        elif not earlier:
            where = "no line before it is unusable: the add line was deleted or never written"
        else:  # the nearest ones, in line order; the report lists them all
            shown = ", ".join(map(str, earlier[-3:]))
            more = f" (and {len(earlier) - 3} before them)" if len(earlier) > 3 else ""
            where = (f"unusable line{'s' if len(earlier) > 1 else ''} {shown}{more} before it "
                     "may have held the add")
        return (f"line {line}: its add line is missing (no line before this {op} adds the "
                f"key); {where}")

    def _illegal(self, key, line, seq, text):
        self.raw.finding(key, "illegal_transition", f"{_where(line, seq)}: {text}")
