"""The whole-file fold of an undamaged toolkit JSONL ledger, in a few C loops.

``fold(path, start, first_line, raw)`` reads the event lines of ``path`` from byte
``start`` (after the header line, if any) in blocks, decodes each block with one msgspec
call into typed events, and folds the items with numpy: no Python call per event. It
fills ``raw.items`` and returns the event columns, exactly as ``History`` would have
folded the same lines one by one; or it returns None, having changed nothing, the moment
anything is not the common case, and the caller reads the file the exact way
(``jsonl._read_lines``), which words every finding. What it takes:

- every line one event object a typed decoder takes whole (``_Event``: the fields of
  ``replay.EventLine`` and no other, a detail of known scalar fields), no blank line, no
  line over ``lines.MAX_LINE``, no snapshot line; an integer ts (which the event table
  keeps as an integer, ``Columns``) or an integer beyond 64 bits is left to the exact way;
- every key's first event its add (None -> pending), no second add, each later event
  from the state the one before left, over an edge ``why_illegal`` finds legal for the
  failure the item held (derived from ``why_illegal`` itself: ``_legal``).

Seq gaps and disorder are judged afterwards on the event table (``jsonl``), as for the
exact way; a final line without its newline is returned as ``torn`` (its finding is
worded by the caller), never folded.
"""

import functools
import itertools
import operator
import typing
from array import array
from itertools import compress

from toolkit.forensics.columns import CODES, VOCABULARY, Columns
from toolkit.forensics.history import DETAIL_FIELDS
from toolkit.forensics.lines import MAX_LINE
from toolkit.forensics.model import STATES, Record
from toolkit.ledger.transitions import DONE_WITHOUT_ARTIFACT, why_illegal

# Bytes per read: a line longer than this needs a newline in two reads (``_blocks``).
BLOCK = 1 << 20
# False: every ledger is folded line by line (tests compare the two ways).
ENABLED = True

# The failure an item holds, as classes of the values ``why_illegal`` tells apart; an
# event's detail without "failure" is ABSENT (the item keeps its own).
ABSENT, TRANSIENT, PERMANENT, NONE, OTHER = range(5)
_PROBES = {TRANSIENT: "transient", PERMANENT: "permanent", NONE: None, OTHER: "other"}
_STATE_INDEX = {state: index for index, state in enumerate((None, *STATES))}


@functools.cache
def _legal():
    """``_legal()[code, failure before, failure after]``: True where ``why_illegal`` (the one
    policy) lets the event's move pass, whatever the artifact fields hold (a done without
    them has its own finding, not an illegal one); False where it refuses it, or where
    its answer depends on the artifact fields (then the exact way decides)."""
    import numpy as np

    table = np.zeros((len(VOCABULARY), 5, 5), dtype=bool)
    passes = (None, DONE_WITHOUT_ARTIFACT)
    for code, (op, frm, to) in enumerate(VOCABULARY):
        for before, failure_before in _PROBES.items():
            for after, failure_after in _PROBES.items():
                if op == "add":
                    legal = frm is None and to == "pending"
                elif op != "move":
                    legal = frm is not None and frm == to
                elif frm is None:
                    legal = False
                else:
                    answers = {why_illegal(frm, to, failure_before, {
                        "failure": failure_after, **dict.fromkeys(
                            ("artifact_path", "artifact_size", "artifact_sha256"), value)})
                        in passes for value in (None, "x")}
                    legal = answers == {True}
                table[code, before, after] = legal
    return table


V = str | int | float | bool | None  # a detail value (``replay.EventLine``'s)
# Detail fields the fold reads: the add's source and digest, and what an item keeps.
_NAMES = ("source", "digest", *sorted(DETAIL_FIELDS))


@functools.cache
def _decoder():
    """``decode_lines`` of ``replay.EventLine``'s fields, and no other (a snapshot line, or
    any unknown name, goes the exact way)."""
    import msgspec

    stamp = typing.Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | float
    # op and states as literals: msgspec hands back the vocabulary's own strings (no new
    # string per event), and a word outside it is a line the exact way words
    op = typing.Literal[tuple(dict.fromkeys(op for op, _, _ in VOCABULARY))]
    state = typing.Literal[tuple(STATES)]
    event = msgspec.defstruct("Event", [
        ("seq", int), ("ts", stamp), ("op", op), ("key", str),
        ("frm", state | None, msgspec.field(name="from")), ("to", state), ("attempt", int),
        ("worker", str | None), ("token", int), ("detail", dict[str, V])],
        forbid_unknown_fields=True, gc=False)
    return msgspec.json.Decoder(event).decode_lines


class _Decline(Exception):
    """Not the common case: the exact way reads the file."""


def _blocks(path, start: int, first_line: int, torn: list):
    """(first line number, block of whole lines, their count); at the end, ``torn`` gets
    (line number, bytes) of a final line without its newline.

    Each block is checked to hold one object per line, so msgspec's ``decode_lines``
    (which takes any whitespace between values) cannot read two lines as one value or
    one line as two: every line starts with '{' and ends with '}' (a value cannot span
    lines: '}' then '{' is never inside one, and a string holds no raw newline)."""
    import numpy as np

    number, carry = first_line, b""
    with open(path, "rb") as handle:
        handle.seek(start)
        while chunk := handle.read(BLOCK):
            cut = chunk.rfind(b"\n")
            if cut < 0:  # the end of a line, or of a torn tail, longer than a block
                carry += chunk
                if len(carry) > MAX_LINE:
                    raise _Decline
                continue
            # each line inside a block is shorter than BLOCK; the first may go on from carry
            if len(carry) + chunk.find(b"\n") > MAX_LINE:
                raise _Decline  # a line over the limit: a corrupt line, the exact way
            block, carry = carry + chunk[:cut + 1], chunk[cut + 1:]
            text = np.frombuffer(block, dtype=np.uint8)
            ends = np.flatnonzero(text == 10)  # b"\n"
            if text[0] != 123 or not (text[ends - 1] == 125).all() or \
                    not (text[ends[:-1] + 1] == 123).all():  # b"{", b"}"
                raise _Decline  # a blank line, a line not one object: the exact way
            yield number, block, len(ends)
            number += len(ends)
            del text, ends
    if carry:
        if len(carry) > MAX_LINE:
            raise _Decline
        torn.append((number, len(carry)))


def fold(path, start: int, first_line: int, items: dict):
    """(event columns, torn) of the event lines from byte ``start`` (line ``first_line``),
    with ``items`` filled; or None, ``items`` untouched, when the exact way must read them.
    ``torn``: (line number, bytes) of a final line without its newline, or None."""
    if not ENABLED:
        return None
    import msgspec

    torn = []
    try:
        read = _read(_blocks(path, start, first_line, torn))
        if read is None:
            return None
        return _fold(*read, items), (torn[0] if torn else None)
    except (_Decline, msgspec.DecodeError, OverflowError):
        return None


_GET = {name: operator.attrgetter(name) for name in
        ("seq", "ts", "op", "frm", "to", "key", "attempt", "worker", "token", "detail")}


# One C call per event takes all its fields (the struct is read once, while in cache);
# ``zip`` then turns the rows into columns.
_FIELDS = operator.attrgetter("seq", "ts", "op", "frm", "to", "key", "attempt", "worker",
                              "token", "detail")


def _read(blocks):
    """Decode and column every block; None when there is no event line."""
    import numpy as np

    import numpy as np

    decode = _decoder()
    firsts: dict = {}  # key -> index of its first event (a group id, in first-seen order)
    parts = {name: [] for name in ("seq", "attempt", "token", "code", "group", "ts")}
    workers, named = [], False
    present = {name: ([], []) for name in _NAMES}  # name -> (event indexes, values)
    first_line, total = None, 0
    for number, block, count in blocks:
        events = decode(block)
        del block
        if len(events) != count:
            raise _Decline
        first_line = number if first_line is None else first_line
        seq, ts, op, frm, to, key, attempt, worker, token, detail = zip(*map(_FIELDS, events))
        del events
        codes = list(map(CODES.get, zip(op, frm, to)))
        if None in codes:
            raise _Decline  # an unknown op or state: a corrupt line
        if set(map(type, ts)) != {float}:
            raise _Decline  # an integer ts: the event table keeps it exactly, as a list
        at = range(total, total + count)
        parts["ts"].append(np.array(ts, dtype=np.float64))
        parts["code"].append(np.array(codes, dtype=np.int64))
        parts["group"].append(np.array(list(map(firsts.setdefault, key, at)), dtype=np.int64))
        parts["seq"].append(np.array(seq, dtype=np.int64))
        parts["attempt"].append(np.array(attempt, dtype=np.int64))
        parts["token"].append(np.array(token, dtype=np.int64))
        if named or worker.count(None) != count:
            named = True
            workers.append(worker)
        else:
            workers.append(count)
        _details(detail, at, present)
        total += count
    if not total:
        return None
    cols = {name: np.concatenate(arrays) for name, arrays in parts.items()}
    present = {name: (np.array(indexes, dtype=np.int64), values)
               for name, (indexes, values) in present.items()}
    return firsts, cols, workers if named else None, present, first_line, total


_MISSING = object()


def _details(details, at: range, present: dict) -> None:
    """Add to ``present`` (name -> (event indexes, values), in file order) the fold's
    names in the details of one block: only from the details not empty (most events
    carry none), and only the names some detail of the block holds."""
    keep = list(map(len, details))
    details, where = list(compress(details, keep)), list(compress(at, keep))
    if not details:
        return
    repeat, missing = itertools.repeat, _MISSING
    for name in set().union(*details).intersection(present):
        values = list(map(dict.get, details, repeat(name), repeat(missing)))
        held = list(map(operator.is_not, values, repeat(missing)))
        indexes, kept = present[name]
        indexes.extend(compress(where, held))
        kept.extend(compress(values, held))


def _fold(firsts, cols, workers, present, first_line, total, items):
    """Check what the exact way would find (``_Decline`` if anything), then fill ``items``
    and return the event table."""
    import numpy as np

    group, code = cols["group"], cols["code"]
    order = np.argsort(group, kind="stable")  # by key (first seen first), then file order
    sorted_group, sorted_code = group[order], code[order]
    starts = np.empty(total, dtype=bool)  # a key's first event, in sorted order
    starts[0] = True
    np.not_equal(sorted_group[1:], sorted_group[:-1], out=starts[1:])
    adds, frms, tos = (table[sorted_code] for table in _words())
    if not adds[starts].all() or adds[~starts].any():
        raise _Decline  # a key met first by anything but its add, or added twice
    if not (starts[1:] | (frms[1:] == tos[:-1])).all():
        raise _Decline  # an event not from the state the one before left
    # The failure the item holds before each event: that of the last event of its key,
    # after its add (an add's detail sets none), whose detail names "failure"; else None.
    failure = np.zeros(total, dtype=np.int8)
    indexes, values = present["failure"]
    failure[indexes] = [_failure_class(value) for value in values]
    failure = failure[order]
    failure[starts] = ABSENT
    position = np.arange(total)
    last = np.maximum.accumulate(np.where(failure != ABSENT, position, -1))
    group_start = np.maximum.accumulate(np.where(starts, position, 0))
    before_at = np.concatenate(([-1], last[:-1]))
    before = np.where(before_at >= group_start, failure[np.maximum(before_at, 0)], NONE)
    after = np.where(failure != ABSENT, failure, before)
    if not _legal()[sorted_code, before, after].all():
        raise _Decline  # an illegal transition: its finding is the exact way's
    del sorted_group, adds, frms, tos, failure, position, last, group_start, before_at, \
        before, after
    ends = np.empty(total, dtype=bool)
    ends[-1] = True
    ends[:-1] = starts[1:]
    first_event, last_event = order[starts], order[ends]  # file indexes, keys first-seen
    del order, starts, ends
    _items(items, list(firsts), first_event, last_event, cols, present, np)
    return _table(firsts, cols, workers, first_line, total, np)


def _failure_class(value) -> int:
    if type(value) is str and value in ("transient", "permanent"):
        return TRANSIENT if value == "transient" else PERMANENT
    return NONE if value is None else OTHER


@functools.cache
def _words():
    """(is an add, from-state index, to-state index) per vocabulary code, as arrays."""
    import numpy as np

    return (np.array([op == "add" for op, _, _ in VOCABULARY]),
            np.array([_STATE_INDEX[frm] for _, frm, _ in VOCABULARY]),
            np.array([_STATE_INDEX[to] for _, _, to in VOCABULARY]))


def _items(items, keys, first_event, last_event, cols, present, np):
    """One ``Record`` per key, as ``History`` leaves it: state and attempt of its last
    event (0 while its add is its only one), its ts, source and digest of its add
    (strings only), each folded detail field from the last later event naming it."""
    to = np.array([triple[2] for triple in VOCABULARY], dtype=object)
    states = to[cols["code"][last_event]].tolist()
    attempts = np.where(last_event == first_event, 0, cols["attempt"][last_event]).tolist()
    updated = cols["ts"][last_event].tolist()
    group = cols["group"]
    fields = {}
    for name, (at, values) in present.items():
        if not values:
            continue
        owner = group[at]  # the index of its key's add: which item
        if name in ("source", "digest"):  # the add's own, a string or nothing
            chosen = np.flatnonzero(at == owner)
            values = [value if type(value) is str else None for value in values]
        else:  # the last event after the add naming it: later ones overwrite earlier
            later = np.flatnonzero(at != owner)
            by_item = later[np.argsort(owner[later], kind="stable")]
            runs = owner[by_item]
            chosen = by_item[np.append(runs[1:] != runs[:-1], True)] if len(runs) else by_item
        column = np.full(len(keys), None, dtype=object)
        column[np.searchsorted(first_event, owner[chosen])] = \
            np.array(values, dtype=object)[chosen]
        fields[name] = column.tolist()
    none = itertools.repeat(None)
    records = map(Record, keys, states, states, *(fields.get(name, none) for name in (
        "source", "digest")), attempts, *(fields.get(name, none) for name in (
            "job_id", "failure", "reason", "artifact_path", "artifact_size",
            "artifact_sha256", "lease_owner", "lease_expires")), updated)
    items.update(zip(keys, records))


def _table(firsts, cols, workers, first_line, total, np):
    """The event table ``Columns`` would have packed from the same events."""
    numbers = array("q", [0]) * (5 * total)
    rows = np.frombuffer(numbers, dtype=np.int64).reshape(total, 5)
    for index, name in enumerate(("seq", "attempt", "token")):
        rows[:, index] = cols[name]
    rows[:, 3] = np.arange(first_line, first_line + total)
    rows[:, 4] = cols["code"]
    del rows
    times = array("d")
    times.frombytes(cols["ts"].tobytes())
    keys = np.array(list(firsts), dtype=object)
    starts = np.fromiter(firsts.values(), dtype=np.int64, count=len(firsts))
    key_column = keys[np.searchsorted(starts, cols["group"])].tolist()
    names = None
    if workers is not None:  # one string object per worker name, as ``History`` shares
        shared: dict = {}
        names = []
        for part in workers:
            part = [None] * part if type(part) is int else part
            names.extend(None if w is None else shared.setdefault(w, w) for w in part)
    return Columns.packed(numbers, times, key_column, names)
