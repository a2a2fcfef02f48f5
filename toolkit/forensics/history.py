"""Replay the toolkit's own event history the way the ledger does, noting
everything the ledger's guards would have refused.

Shared by the toolkit's JSONL ledger (the history *is* the file) and its SQLite
ledger (the history is the ``events`` table, checked against ``items``).
"""

from toolkit.forensics.model import EVENT_COLUMNS, ITEM_COLUMNS, STATES, Raw, Record
from toolkit.ledger import LEASE_FIELDS, MUTABLE_FIELDS
from toolkit.ledger.transitions import ARTIFACT_FIELDS, DONE_WITHOUT_ARTIFACT, why_illegal

OPS = frozenset({"add", "move", "claim", "release"})
STATE_SET = frozenset(STATES)
# Event detail fields an item keeps (the ledger's own, as far as Record has them).
DETAIL_FIELDS = (frozenset(MUTABLE_FIELDS) | frozenset(LEASE_FIELDS)) & frozenset(ITEM_COLUMNS)
SNAPSHOT_FIELDS = frozenset(("key", "state", "source", "attempt", "token", "job_id", "updated",
                             *MUTABLE_FIELDS, *LEASE_FIELDS))
NUMBER = (int, float)
SNAPSHOT = "snapshot"  # toolkit.ledger.jsonl.SNAPSHOT


def _where(line, seq):
    return f"line {line}" if line is not None else f"event seq={seq}"


class History:
    """Fold events into item records (``raw.items``) and event rows.

    ``event(obj, line)`` returns None when the record was applied, or the
    reason it is not a valid event (the caller decides whether that makes a
    corrupt line). Call ``finish()`` once at the end to fill ``raw.events``.
    """

    def __init__(self, raw: Raw):
        self.raw = raw
        self.items = raw.items
        self.rows: list[tuple] = []
        self.event = self._make_event()

    def finish(self) -> dict[str, list]:
        columns = map(list, zip(*self.rows)) if self.rows else ([] for _ in EVENT_COLUMNS)
        self.raw.events = dict(zip(EVENT_COLUMNS, columns))
        return self.raw.events

    def _make_event(self):
        # The hot loop of a million-line audit, so a closure over locals (no
        # attribute lookups), plain type checks, and one tuple per event.
        items, append, snapshot, illegal = self.items, self.rows.append, self.snapshot, self._illegal
        finding, get = self.raw.finding, self.items.get
        orphaned = set()  # keys seen only in events before any add
        _type, _int, _str, _dict, _number = type, int, str, dict, NUMBER
        ops, states, fields = OPS, STATE_SET, DETAIL_FIELDS

        def event(obj: dict, line: int | None = None) -> str | None:
            if SNAPSHOT in obj:
                return snapshot(obj, line)
            try:
                seq, ts, op, key = obj["seq"], obj["ts"], obj["op"], obj["key"]
                frm, to, attempt, worker = obj["from"], obj["to"], obj["attempt"], obj["worker"]
                token, detail = obj["token"], obj["detail"]
            except KeyError as exc:
                return f"missing field {exc}"
            if (_type(seq) is not _int or _type(ts) not in _number or _type(op) is not _str
                    or op not in ops or _type(key) is not _str or _type(to) is not _str
                    or to not in states or _type(attempt) is not _int or _type(token) is not _int
                    or _type(detail) is not _dict
                    or (frm is not None and (_type(frm) is not _str or frm not in states))
                    or (worker is not None and _type(worker) is not _str)):
                return "fields of the wrong type or value for an event"
            item = get(key)
            if op == "add":
                orphaned.discard(key)  # from here on its events fold normally
                if item is not None:
                    finding(key, "duplicate_key",
                            f"{_where(line, seq)}: a second add for this key resets it")
                if frm is not None or to != "pending":
                    illegal(key, line, seq, f"add must be None -> pending, not {frm} -> {to}")
                source, digest = detail.get("source"), detail.get("digest")
                items[key] = Record(key, "pending", "pending",
                                    source if _type(source) is _str else None,
                                    digest if _type(digest) is _str else None, 0, updated=ts)
            elif item is None or key in orphaned:
                # Its add line was lost (a corrupt line) or never written: the key is real,
                # its state unprovable. As in JsonlLedger (``orphans``), every such line
                # stays corrupt and is folded apart; the key is planned review.
                if item is None:
                    items[key] = Record(key, to, to, attempt=attempt, updated=ts)
                    orphaned.add(key)
                    finding(key, "missing_history",
                            f"{_where(line, seq)}: {op} of a key whose add is missing")
                else:
                    item.state = item.raw_state = to
                    item.attempt, item.updated = attempt, ts
                return f"{op} of key {key!r} before its add"
            else:
                state = item.state
                if frm != state:
                    illegal(key, line, seq, f"{op} says from {frm} but the item was {state}")
                elif op != "move":
                    if to != frm:
                        illegal(key, line, seq, f"{op} changes the state {frm} -> {to}")
                else:  # the ledger's own policy, applied to what the event did
                    after = {name: detail[name] if type(detail) is _dict and name in detail
                             else getattr(item, name) for name in ("failure", *ARTIFACT_FIELDS)}
                    why = why_illegal(frm, to, item.failure, after)
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
                            setattr(item, name, detail[name])
            append((seq, ts, op, key, frm, to, attempt, worker, token, line))
            return None

        return event

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
        fields = {name: item[name] for name in item if name in DETAIL_FIELDS}
        self.items[key] = Record(key, state, state, source=item.get("source"),
                                 attempt=item.get("attempt"), updated=item.get("updated"), **fields)
        return None

    def _illegal(self, key, line, seq, text):
        self.raw.finding(key, "illegal_transition", f"{_where(line, seq)}: {text}")
