"""A JSONL ledger's replay on open: its lines folded into items, its damage measured.

``replay(ledger, fd)`` reads the file in blocks (never whole: the file and its list of
lines were two copies of it) and folds each event into its item as an ``ItemRow``
(``records.fold``), building no ``Event`` and no ``Item``: the items are built when read,
the events when ``events()`` asks for them (``history``, which reads the lines again).

Each line is decoded by msgspec into a typed struct (``EventLine``: one C call, no dict per
event) when it takes the line whole: every field of the type an event written by this
toolkit has, ``from``/``to`` a state's value, no ``snapshot``. Any other line -- the header,
a snapshot, a wrong type, a NaN, a lone surrogate, a BOM, a line not UTF-8, an integer past
the digit limit -- goes the reference way (``parse_line``: ``json.loads``), which gives the
verdict it always gave. A line that names a member twice is corrupt either way
(``members.py``). Where both accept a line they read the same values (exact integers,
correctly rounded floats: tests/test_jsonl_replay_paths.py feeds odd lines to both and
compares the ledgers' verdicts); ``FAST = False`` takes the reference way for every line.
"""

import codecs
import itertools
import json
import os
import re
import typing

import msgspec

from toolkit.errors import LedgerError
from toolkit.ledger.gaps import (LINE_LIMIT, blank, missing_ranges, out_of_order, snapshot_base,
                                 snapshot_damage)
from toolkit.ledger.header import read_header
from toolkit.ledger.members import BACKSLASH, DuplicateMember, duplicate, named_twice
from toolkit.ledger.records import Event, Item, apply_event, fold
from toolkit.ledger.torn import ledger_tail_keys, marks_of, spends
from toolkit.ledger.transitions import State

SNAPSHOT = "snapshot"
KEY_PATTERN = re.compile(rb'"key": "([^"\\]{1,200})"')
SEQ_PATTERN = re.compile(rb'"seq": (\d{1,30})[,}]')
FAST = True  # False: every line the reference way (the tests compare the two)
BLOCK = 1 << 22  # bytes read at a time: the lines of one block are alive at once
_STATES = {state.value: state for state in State}
BOM = codecs.BOM_UTF8
# What a line no reading holds raises: besides the usual, a number no float holds (a ts of
# 10**400: OverflowError) and nesting past the parser's depth (RecursionError).
_MALFORMED = (ValueError, KeyError, TypeError, OverflowError, RecursionError)


def item_from_json(obj: dict) -> Item:
    return Item(**{**obj, "state": State(obj["state"])})


def parse_line(raw: bytes) -> tuple[Event | None, Item | None, int]:
    """One line → (event, snapshot item, seq); raises ValueError/KeyError/TypeError if
    malformed. The reference reading of a line: what every line means.

    Text first (``decode``): ``json.loads`` of bytes would skip a BOM, which before any
    line but line 1 is damage (the caller strips line 1's), as the audit reads it."""
    obj = json.loads(raw.decode("utf-8"))
    if not isinstance(obj, dict):
        raise TypeError("line is not a JSON object")
    if why := duplicate(raw, obj):  # (members.py: json with a hook costs 2.5x json)
        raise DuplicateMember(why)
    if SNAPSHOT in obj:
        if type(obj["seq"]) is not int:  # 20.0 is no seq (the audit's rule too)
            raise TypeError("a snapshot's seq is not an integer")
        return None, item_from_json(obj[SNAPSHOT]), obj["seq"]
    return Event(*event_parts(obj)), None, obj["seq"]


# A ts past 64 bits goes the reference way: msgspec would take 10**400 as a Python int,
# which no float holds (``parse_line``: a corrupt line; the audit's ``History.check`` too).
_STAMP = typing.Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | float


# An attempt or a token counts up from 0: a negative one is no line this toolkit wrote
# (a typed decoder of event lines elsewhere takes this type for both, to agree).
COUNT = typing.Annotated[int, msgspec.Meta(ge=0)]
# The four ops a ledger writes: any other word is no line of ours (the audit's rule too).
OP = typing.Literal["add", "move", "claim", "release"]


class EventLine(msgspec.Struct, gc=False):
    """An event line as this toolkit writes it (``lines.event_line``): the typed decoding
    of the replay here and of the audit (``forensics.jsonl``), and through ``event_parts``
    the one validator of an event read any other way. Strict: ``20.0`` is no seq, ``true``
    no attempt."""
    seq: int
    ts: _STAMP
    op: OP
    key: str
    frm: str | None = msgspec.field(name="from")
    to: str
    attempt: COUNT
    worker: str | None
    token: COUNT
    detail: dict[str, str | int | float | bool | None]  # nested: the reference way
    snapshot: object = msgspec.UNSET  # present: a snapshot line, the reference way


_decode, _refused = msgspec.json.Decoder(EventLine).decode, msgspec.DecodeError
# The members of an event line but its detail's: the colons of a line that names none
# twice and holds none in a value (``members.named_twice``)
MEMBERS = len(msgspec.structs.fields(EventLine)) - 1  # all but ``snapshot``


def event_parts(obj: dict) -> tuple:
    """(seq, ts, op, key, frm, to, attempt, worker, token, detail) of an event object
    (not a snapshot) that ``json.loads`` read, by the rules of ``EventLine`` (the typed
    decoder's); raises KeyError, TypeError or ValueError otherwise. Only ``ts`` (any int a
    float holds, a NaN) and ``detail`` (nested values) are checked apart, as the typed
    decoder sends them this way. The ledger (``parse_line``) and the audit
    (``forensics.jsonl``) both ask it: one verdict on a line."""
    ts, detail = obj["ts"], obj["detail"]
    if type(ts) not in (int, float) or type(detail) is not dict:
        raise TypeError("ts is not a number or detail is not an object")
    try:
        e = msgspec.convert({**obj, "ts": 0, "detail": {}}, EventLine)
    except msgspec.ValidationError as exc:
        raise ValueError(f"not an event: {exc}") from None
    frm, to = e.frm, _STATES.get(e.to)
    if to is None or (frm is not None and (frm := _STATES.get(frm)) is None):
        raise ValueError("not an event: an unknown state")
    return e.seq, float(ts), e.op, e.key, frm, to, e.attempt, e.worker, e.token, detail


def whole_line(raw: bytes) -> bool:
    """The rule for a final line without its newline, the ledger's (``replay``) and the
    audit's (``forensics.jsonl``): a line that reads whole as an event or snapshot line IS
    that line (its newline lost: ``truncate -s -1``, an editor's save, a CR for the LF); the
    writer puts the newline before its next line. Only a line that does not read whole is
    a torn write (cut). Safe after a crash too: a write torn exactly before its newline was
    never fsynced, so nothing was sent on it; its intent kept makes the item ``unknown``
    (looked up, never sent twice), where dropping it sent the document again."""
    if blank(raw):
        return False
    try:
        parse_line(raw)
    except _MALFORMED:
        return False
    return True


def _parts(raw: bytes):
    """(seq, ts, op, key, frm, to, attempt, worker, token, detail) of an event line the
    typed decoder takes whole, else None (the line goes the reference way)."""
    try:
        e = _decode(raw)
    except _refused:
        return None
    frm, to = e.frm, _STATES.get(e.to)
    if to is None or e.snapshot is not msgspec.UNSET or (
            frm is not None and (frm := _STATES.get(frm)) is None):
        return None
    try:
        ts = float(e.ts)
    except OverflowError:  # no float holds it: the reference way says corrupt
        return None
    if named_twice(raw, e, MEMBERS):
        return None  # the reference way says corrupt (a member named twice)
    return e.seq, ts, e.op, e.key, frm, to, e.attempt, e.worker, e.token, e.detail


class TooLong(bytes):
    """A line over ``gaps.LINE_LIMIT`` in place of its bytes (never held whole): not UTF-8,
    so every reading calls it corrupt; ``size`` its length, for the words (``too_long``)."""

    size = 0


def _too_long(size: int) -> TooLong:
    line = TooLong(b"\xff")
    line.size = size
    return line


def _lines(fd: int, start: int, end: int | None):
    """(line bytes, the offset after its newline) of the whole lines from ``start``, then
    (tail, None): the bytes after the last newline (b"" when the file ends with one).
    ``end``: stop there (None: at the size the file has now). A line over ``LINE_LIMIT``
    comes as a ``TooLong``, read through to its newline and dropped (bounded memory)."""
    if end is None:
        end = os.fstat(fd).st_size  # a writer may append meanwhile: its lines are not read
    offset, rest, over = start, b"", 0  # over: the size so far of a line over the limit
    while offset < end:
        block = os.pread(fd, min(BLOCK, end - offset), offset)
        if not block:  # shorter now (a writer cut its torn tail): what was read is all
            break
        if over:  # inside a line over the limit: on to its newline, then read from there
            newline = block.find(b"\n")
            offset += len(block) if newline < 0 else newline + 1
            over += len(block) if newline < 0 else newline
            if newline >= 0:
                yield _too_long(over), offset
                over = 0
            continue
        at = offset - len(rest)  # where ``rest + block`` starts in the file
        offset += len(block)
        long = len(rest) + len(block) > LINE_LIMIT  # per block, not per line: rare
        lines = (rest + block).split(b"\n")
        rest = lines.pop()
        for line in lines:
            at += len(line) + 1
            yield (_too_long(len(line)) if long and len(line) > LINE_LIMIT else line), at
        if len(rest) > LINE_LIMIT:
            over, rest = len(rest), b""
    yield (_too_long(over) if over else rest), None


def replay(ledger, fd: int) -> None:
    """Fold the file into ``ledger``'s state and set its damage attributes (jsonl.py)."""
    state: dict = {}  # key -> Item (a snapshot line's) or ItemRow (an event's fold)
    ledger._state = state
    ledger._current = state.get  # what a transaction reads: no Python call per read
    ledger._history = []  # (seq, *parts) of our writes; the file's events: ``history``
    ledger.version = None  # the header's; None: no header (yet)
    ledger.salvaged = None  # the header's mark of a salvage (salvage.py)
    ledger._header = None  # line 1 as an object (None: no header)
    ledger.torn_marks = marks = {}  # {key: after} of cuts not yet spent (torn.py)
    ledger.torn_keys = []  # the keys the torn tail names (torn.py records its cut)
    ledger.affected_keys = set()  # keys a corrupt line may belong to
    ledger.orphans = {}  # the fold of events whose add line was lost
    ledger.unattributed_lines = []  # corrupt lines with no key readable at all
    ledger.unterminated = None  # the number of a final event line without its newline
    ledger.long_lines = []  # (line, size) of the corrupt lines over the limit (gaps.too_long)
    corrupt, affected, orphans = ledger.corrupt_lines, ledger.affected_keys, ledger.orphans
    get, states, unset = state.get, _STATES, msgspec.UNSET
    fast, members = FAST, MEMBERS
    header, base = None, 0
    expected, regular, unfolded, unreadable = 1, True, [], 0
    snapshots, moved, trail, before = [], None, None, None
    runs = []  # the history's seqs as [first, last] runs (one run when regular)
    events_read = kept = top = 0
    number, valid_end, tail = 0, 0, b""
    ledger._history_start = 0  # the offset of the first event line (after the header)
    for raw, at in _lines(fd, 0, None):
        if at is None:  # the bytes after the last newline
            if not whole_line(raw):
                tail = raw  # a torn write (or nothing): cut before the next append
                break
            at = valid_end + len(raw)  # an event whose newline was lost: it is read
            ledger.unterminated = number + 1  # the writer owes it its newline (jsonl.py)
        number += 1
        valid_end = at  # a blank line too: the next append goes after it
        if number == 1:
            header = read_header(raw)  # (it skips one BOM: a second is damage)
            if raw.startswith(BOM) and raw != BOM:  # an editor's BOM before line 1 only:
                raw = raw[len(BOM):]  # the audit skips it too (a BOM alone is no blank)
            # Seqs (gaps.py): the usual history is base+1, base+2, ... in file order, checked
            # line by line; anything else is measured exactly once the file is read: from
            # the first event off that path on, ``trail`` keeps (line, seq) for the order
            # rule. A header that counts its snapshot lines names their seq even when
            # there are none.
            base = top = snapshot_base(header, ())
            expected = base + 1
            if header is not None:
                ledger.version, ledger.salvaged = header["version"], header.get("salvaged")
                ledger._header = header
                marks.update(marks_of(header))
                ledger._history_start = at
                continue
        parts = None
        if fast:  # ``_parts``, inline: a call per line is a tenth of the replay
            try:  # OverflowError: a ts no float holds (the reference way says corrupt)
                e = _decode(raw)
                frm, to = e.frm, states.get(e.to)
                if to is not None and e.snapshot is unset and (
                        frm is None or (frm := states.get(frm)) is not None):
                    parts = (e.seq, float(e.ts), e.op, e.key, frm, to, e.attempt, e.worker,
                             e.token, e.detail)
                    # a member named twice: the reference way says corrupt (members.py
                    # ``named_twice``, inline: a byte count when the colons past the
                    # members' are none, or the worker's read literally)
                    extra = raw.count(b":") - members - len(e.detail)
                    if extra and (e.worker is None or extra != e.worker.count(":")
                                  or BACKSLASH in raw) and duplicate(raw, e):
                        parts = None
            except (_refused, OverflowError):
                parts = None
        try:
            if parts is None:
                event, snapshot, seq = parse_line(raw)
                if event is not None:
                    parts = (seq, event.ts, event.op, event.key, event.frm, event.to,
                             event.attempt, event.worker, event.token, event.detail)
            else:
                snapshot, seq = None, parts[0]
            if snapshot is not None:  # a compaction's or salvage's lines, all at one seq
                regular = regular and (seq + 1 == expected or not events_read)
                base = max(base, seq)
                snapshots.append((number, seq))
                moved = moved or (number if kept else None)
            elif seq != expected or trail is not None:
                if trail is None:
                    regular, trail, before = False, [], expected - 1
                trail.append((number, seq))
            expected = seq + 1
            if snapshot is not None:
                state[snapshot.key] = snapshot
            else:
                key = parts[3]
                item = get(key)
                if item is None and parts[2] != "add":
                    raise AssertionError(key)
                state[key] = fold(item, parts[2], key, parts[5], parts[6], parts[8],
                                  parts[1], parts[9])
                if marks and key in marks:  # spent by the key's next intent (torn.py)
                    spends(marks, seq, key, parts[4], parts[5])
                kept += 1
                if runs and runs[-1][1] + 1 == seq:
                    runs[-1][1] = seq
                else:
                    runs.append([seq, seq])
        except AssertionError:  # an event of a key whose add was lost: kept apart
            corrupt.append(number)
            unfolded.append(seq)
            key = parts[3]
            affected.add(key)
            orphans[key] = apply_event(orphans.get(key) or Item(key=key), Event(*parts))
            continue
        except _MALFORMED:
            if blank(raw):  # no event, no damage (gaps.blank); its number still counts.
                continue  # Asked only here: no line JSON reads is blank (no cost per line)
            corrupt.append(number)
            if raw.__class__ is TooLong:
                ledger.long_lines.append((number, raw.size))
            regular = False
            found = SEQ_PATTERN.findall(raw)  # two, when a torn line was glued on
            unfolded.extend(map(int, found))
            unreadable += not found
            keys = [k.decode("utf-8", "replace") for k in KEY_PATTERN.findall(raw)]
            affected.update(keys)
            if not keys:
                ledger.unattributed_lines.append(number)  # no key readable at all
            continue
        events_read += 1
        if seq > top:
            top = seq
    size = tail.size if tail.__class__ is TooLong else len(tail)
    ledger._seq, ledger._events_read, ledger._size = top, events_read, valid_end + size
    ledger._valid_end = valid_end
    ledger._history_read = (valid_end, kept)  # where the file's history ends, its count
    if tail and (tail.__class__ is TooLong or not blank(tail)):  # spaces, a CR: no line
        ledger.torn_tail = {"line": number + 1, "bytes": size}  # (still cut, as any tail)
        ledger.torn_keys = [] if tail.__class__ is TooLong else ledger_tail_keys(ledger, tail)
    # the snapshot lines against the header's count (a header deleted, a line deleted)
    ledger.snapshot_damage = snapshot_damage(header, snapshots, moved)
    ledger.disorder = out_of_order(trail, before) if trail else []  # lines copied, moved
    if not regular:  # ``unfolded``: seqs of lines kept out of the history
        seqs = itertools.chain.from_iterable(range(a, b + 1) for a, b in runs)
        ledger.missing_seqs = missing_ranges([*seqs, *unfolded], base, unreadable)


def history(ledger, fd: int) -> list[Event]:
    """The events the replay folded, read again from the file: every line from
    ``_history_start`` to the end it read but the corrupt ones and the snapshots.

    The bytes are the ones replayed: a writer holds the lock, so only its own appends
    (after them), a cut of the torn tail (after them) or a rewrite that prepends a header
    (``_history_start`` moves with it) changed the file; a view reads its own descriptor,
    which a compaction's or upgrade's rename leaves on the file it opened. A count that
    differs all the same (the file edited in place) is refused, never guessed at."""
    end, count = ledger._history_read
    start = ledger._history_start
    number = 0 if start == 0 else 1
    skip = set(ledger.corrupt_lines)
    events = []
    for raw, at in _lines(fd, start, end):
        if at is None and not raw:  # ``end`` is a line's end, or a final line's own end:
            break  # the unterminated event the replay read (``whole_line``) comes as a tail
        number += 1
        if number in skip:
            continue
        parts = _parts(raw) if FAST else None
        if parts is None:
            if blank(raw):  # skipped by the replay too
                continue
            event = parse_line(raw)[0]
            if event is not None:
                events.append(event)
        else:
            events.append(Event(*parts))
    if len(events) != count:
        raise LedgerError(f"JSONL ledger {str(ledger.path)!r} changed under this process "
                          f"since it was opened ({len(events)} events where {count} were "
                          "read): open it again")
    return events
