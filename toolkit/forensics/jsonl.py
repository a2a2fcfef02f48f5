"""JSONL adapters: the toolkit's own event ledger and a per-file state log."""

import codecs
import functools
import json
import json.scanner
import typing
from functools import partial

from toolkit.forensics.columns import OPS, VOCABULARY
from toolkit.forensics.foreign import StateFile
from toolkit.forensics.history import BAD_EVENT, SNAPSHOT, History
from toolkit.forensics import lines as reading
from toolkit.forensics.lines import SHALLOW, LineReader, decode_one, gap_detail, seq_gaps
from toolkit.forensics.model import STATES, Raw, register
from toolkit.ledger.jsonl import FORMAT as JSONL_FORMAT
from toolkit.ledger.gaps import blank
from toolkit.ledger.jsonl import SALVAGED
from toolkit.forensics.jsonl_header import line_one, order_findings, torn_findings, \
    torn_notes
from toolkit.ledger.members import (STRICT, DuplicateMember, batch_named_twice, duplicate,
                                    named_twice)
from toolkit.ledger.replay import MEMBERS, event_parts, whole_line
from toolkit.ledger.salvage import salvaged_note

BOM = codecs.BOM_UTF8


def _slow(text: str):
    """(object, None) or (None, why it is not one JSON value): json.loads with its reasons
    (a member named twice is one: ``members.STRICT``)."""
    try:
        return STRICT.decode(text), None
    except DuplicateMember as exc:  # JSON, but no one object (members.py)
        return None, str(exc)
    except ValueError as exc:  # JSONDecodeError, or an integer over the digit limit
        return None, f"not JSON: {getattr(exc, 'msg', exc)}"
    except RecursionError:
        return None, "JSON nested too deeply"


def _reference(scan, line, number, use):
    """One line the way the standard library reads it: the meaning of every line, and
    the words of every complaint. The fast paths below defer to it whenever they do
    not accept a line outright."""
    text = decode_one(line) if type(line) is bytes else line
    try:
        obj, end = scan(text, 0)
        if end != len(text):
            raise StopIteration  # trailing bytes: let json.loads judge them
    except TypeError:
        obj, why = None, text.why  # not text at all (see lines.Bad)
    except (StopIteration, ValueError, RecursionError):
        obj, why = _slow(text)
    else:
        why = None
    if why is None:
        why = use(obj, number) if type(obj) is dict else \
            f"JSON {type(obj).__name__}, not an object"
    return why


# Lines per ``batch`` call: small enough that a batch's decoded events are still in the
# CPU cache when they are folded, large enough to amortize the call.
# (Measured at 200k lines, CPU time, interleaved: per line 1.52 s median, 256 lines 1.44 s,
# 2 MiB of lines (~7,000) 1.7 s: decoding a whole chunk before folding it loses the cache.)
BATCH = 256


def _slices(batches):
    """The reader's (first line number, lines) batches cut to at most ``BATCH`` lines."""
    for start, block in batches:
        for at in range(0, len(block), BATCH):
            yield start + at, block[at:at + BATCH]


def _corrupt(raw: Raw, number: int, why: str) -> None:
    raw.finding(None, "corrupt_line", f"line {number}: {why}", line=number)


def _with_tail(reader: LineReader, whole):
    """The reader's batches, then its final line without a newline when ``whole`` (the
    ledger's ``replay.whole_line``) says it is a whole record, its newline lost: read as
    any line (``reader.torn`` becomes None, ``reader.unterminated`` its number)."""
    yield from reader.batches(decode=False)
    reader.unterminated = None
    if reader.tail is not None and blank(reader.tail):  # spaces, a CR: no line, no damage
        reader.torn = None  # (``gaps.blank``, the ledger's rule for a final line too)
        return
    if whole is not None and reader.tail is not None and whole(reader.tail):
        reader.unterminated, reader.torn = reader.torn[0], None
        yield reader.unterminated, [reader.tail]


def _read_lines(path, raw: Raw, use, fast=None, batch=None, unparsed=None, whole=None,
                torn=None):
    """Parse every complete line; ``use(obj, line)`` returns None or why it is invalid.

    ``unparsed(line, number)`` (optional) is asked about each line that is not JSON and
    returns more words for its finding ("" for none).

    ``batch(lines, first)`` (optional) tries a whole batch of lines first and returns
    False, having used none of them, when it does not take every one; then each line
    goes its own way. ``fast(line_bytes, number)`` (optional) tries a line first and
    returns ``NOT_MINE`` for any line it does not take whole; those, and every line when
    ``fast`` is None, are parsed as JSON into a dict for ``use``: msgspec's
    decoder when it accepts the line (it agrees with json.loads on what it
    accepts: last duplicate wins, exact integers), else json (``_reference``),
    which also words the complaint. ``torn(number, size, bytes)`` (optional) takes the
    torn final line instead of the ``torn_line`` finding made here.
    """
    import msgspec

    scan = json.scanner.make_scanner(STRICT)  # the C scanner under json.loads (members.py)
    decode, failed = msgspec.json.Decoder().decode, msgspec.DecodeError
    reader = LineReader(path)
    only_reference = not reading.FAST
    for first, lines in _slices(_with_tail(reader, whole)):
        if first == 1 and lines and type(lines[0]) is bytes and lines[0].startswith(BOM) \
                and lines[0] != BOM:  # a BOM alone is no blank line (``gaps.blank``)
            # A UTF-8 BOM before line 1 (an editor's save): the ledger reads it (json.loads
            # of bytes skips it), so the audit does too; anywhere else it is damage.
            lines = [lines[0][len(BOM):], *lines[1:]]
        if batch is not None and not only_reference and batch(lines, first):
            continue
        for number, line in enumerate(lines, first):
            if only_reference:
                why = _reference(scan, line, number, use)
            elif fast is not None and (why := fast(line, number)) is not NOT_MINE:
                pass
            elif type(line) is bytes and line.count(b"{") + line.count(b"[") <= SHALLOW:
                try:
                    obj = decode(line)
                except failed:
                    why = _reference(scan, line, number, use)
                else:  # (a flat object's colons are its members': ``members.duplicate``)
                    why = use(obj, number) if type(obj) is dict and (
                        line.count(b":") == len(obj) or not duplicate(line, obj)) else \
                        _reference(scan, line, number, use)
            else:
                why = _reference(scan, line, number, use)
            if why is not None:
                if type(line) is bytes and blank(line):
                    # no record, no damage: the ledger's own rule (``gaps.blank``), asked
                    # only of a line refused (no path takes a blank one: no side effect)
                    continue
                if unparsed is not None and why.startswith("not JSON"):
                    why += unparsed(line, number)
                _corrupt(raw, number, why)
    if reader.unterminated is not None:  # not damage: the ledger reads it as an event
        raw.notes.append(f"line {reader.unterminated}: unterminated_tail: the last line is "
                         "a whole event without its final newline (an editor, a truncate, a "
                         "CR for the LF); read as an event, the next run's writer adds it")
    if reader.torn is not None and torn is not None:
        torn(*reader.torn, reader.tail)
    elif reader.torn is not None:
        number, size = reader.torn
        raw.finding(None, "torn_line",
                    f"line {number}: {size} bytes without a final newline (write cut; not used)",
                    line=number)


NOT_MINE = object()


def _event_reader(history: History, headed: bool, report):
    """(``fast``, ``batch``) for the toolkit's events: msgspec decodes a line straight into
    typed fields (a struct, no dict per event) and ``History`` folds them. Anything it
    does not take (a wrong type, a missing field, a snapshot, the header, a deep or
    non-UTF-8 line) is ``NOT_MINE``: the reference path reads it."""
    import msgspec

    decode, failed, unset, mine = msgspec.json.Decoder(_worded_event()).decode, \
        msgspec.DecodeError, msgspec.UNSET, NOT_MINE
    apply, fold, push_many = history.apply, history.fold, history.columns.push_many
    items, workers = history.items, history.workers
    _bytes, _int, members = bytes, int, MEMBERS

    def fast(line, number):
        if type(line) is not _bytes or (headed and number == 1):
            return mine
        try:
            e = decode(line)
        except failed:
            return mine
        if e.snapshot is not unset or named_twice(line, e, members):
            return mine  # (a member named twice: the reference way words it)
        return apply(e.seq, e.ts, e.op, e.key, e.frm, e.to, e.attempt, e.worker, e.token,
                     e.detail, number)

    def batch(lines, first):
        """Every line of the batch an event the typed decoder takes, or none used (False).

        Each line is decoded alone (``map``: one C loop, no Python call per line), so a
        line's meaning cannot depend on its neighbours; a batch with any line the decoder
        refuses (or a snapshot, the header, an over-long line) goes line by line, where
        each line finds its own way. The events are then folded in file order, exactly
        as ``fast`` would, and the applied ones pushed to the event table in one go
        (order: a key's later events see its earlier ones; the table is in file order)."""
        if headed and first == 1:
            return False
        try:
            events = list(map(decode, lines))
        except (failed, TypeError):  # TypeError: a Bad marker, not bytes
            return False
        if [e.snapshot for e in events].count(unset) != len(events):
            return False
        # a member named twice (members.py): the batch goes line by line, where the
        # reference way words it; one byte count a line when its colons are its members'
        if batch_named_twice(lines, events, members):
            return False
        codes, dropped = [], []
        applied = codes.append
        for number, e in enumerate(events, first):
            code = fold(e.seq, e.ts, e.op, e.key, e.frm, e.to, e.attempt, e.worker, e.token,
                        e.detail, number)
            if code.__class__ is _int:
                applied(code)
            else:  # why not: a corrupt line, kept out of the event table
                report(number, code)
                dropped.append(number)
        numbers = range(first, first + len(lines))
        if dropped:
            dropped = set(dropped)
            events = [e for number, e in zip(numbers, events) if number not in dropped]
            numbers = [number for number in numbers if number not in dropped]
        push_many([e.seq for e in events], [e.ts for e in events], codes,
                  [items[e.key].key for e in events],  # the item's string, shared
                  [e.attempt for e in events],
                  [None if e.worker is None else workers.setdefault(e.worker, e.worker)
                   for e in events],
                  [e.token for e in events], numbers)
        return True

    return fast, batch


@functools.cache
def _worded_event():
    """The ledger's own typed line (``replay.EventLine``) with op, from and to read as
    words of the vocabulary (``Literal``): msgspec then hands back the vocabulary's own
    string objects, no new string per field, and the fold's (op, from, to) lookup meets
    the very keys it holds. A word outside the vocabulary is refused here, so its line
    goes the reference way, which finds it no event as ``History`` does (measured by
    callgrind over 20k lines: 1.5k of ~26k instructions an event saved)."""
    import msgspec

    from toolkit.ledger.replay import EventLine

    ops = typing.Literal[tuple(dict.fromkeys(op for op, _, _ in VOCABULARY))]
    states = typing.Literal[tuple(STATES)]
    worded = {"op": ops, "frm": states | None, "to": states}
    return msgspec.defstruct("WordedEvent", [
        (f.name, worded.get(f.name, f.type), msgspec.field(
            name=f.encode_name, **({} if f.default is msgspec.NODEFAULT else
                                   {"default": f.default})))
        for f in msgspec.structs.fields(EventLine)], gc=False)


def _is_event(obj):
    return obj.get("format") == JSONL_FORMAT or SNAPSHOT in obj or {"op", "key", "to"} <= obj.keys()


@register("toolkit-jsonl", "jsonl", _is_event,
          "resume-toolkit JSONL ledger: a format header, then one event object per line")
def read_toolkit_jsonl(path) -> Raw:
    """Both versions: with the header line (read, never required) and without it."""
    raw = Raw()
    history = History(raw)
    with open(path, "rb") as handle:
        header, done = line_one(raw, path, handle.readline())  # run refuses what it reports
    if done:
        return raw
    headed = header is not None
    if headed and header.get(SALVAGED) is not None:  # written by ``ledger --salvage``
        raw.notes.append(salvaged_note(header[SALVAGED]))
    # The lines the typed decoder did not take: the ledger's own validator first
    # (``replay.event_parts``: 20.0 is no seq, -1 no attempt), then the fold's checks.
    def event(obj, line, _event=history.event):
        if headed and line == 1:  # the header, not an event
            return None
        if SNAPSHOT not in obj:
            try:
                event_parts(obj)
            except KeyError:
                pass  # the fold words it ("missing field")
            except (TypeError, ValueError, OverflowError):
                return BAD_EVENT
        return _event(obj, line)
    fast, batch = _event_reader(history, headed, partial(_corrupt, raw))
    tail = []  # the torn final line: (number, size, bytes), named once the items are known
    _read_lines(path, raw, event, fast, batch, partial(_glued, history, [FILE_TRIES]),
                whole_line, lambda *torn: tail.append(torn))
    events = history.finish()
    torn_findings(raw, *tail[:1])  # the run's reading of it (ledger.torn)
    torn_notes(raw, header, events)  # a cut's mark not yet spent (ledger.torn)
    gaps = seq_gaps(events["seq"], [*history.apart, *history.snapshot_seqs])
    if gaps:  # an orphaned event's line is unusable but holds its own seq, no missing one
        raw.finding(None, "seq_gap", gap_detail(gaps, len(raw.corrupt_lines) -
                                                 len(history.apart)))
    order_findings(raw, header, history, events)
    return raw


def _glued(history: History, budget: list, line, number: int) -> str:
    """Words for a line that is not JSON but holds whole events glued together: a write
    cut before its newline (torn, or only the newline lost), and the next line written
    right after it. Each whole event found is noted in ``history.glued`` (its key's
    ``missing_history`` then names this line, not intact lines of other keys); none is
    used, as the ledger uses none of a corrupt line. ``budget``: see ``whole_events``."""
    if type(line) is bytes:
        line = line.decode("utf-8", "surrogateescape")
    if type(line) is not str:
        return ""  # not text at all (lines.Bad)
    found = list(whole_events(line, budget))
    for seq, op, key in found:
        history.glued.setdefault(key, []).append((number, seq, op))
    if not found:
        return ""
    named = ", ".join(f"seq {seq} ({op} of key {key!r})" for seq, op, key in found)
    return (f"; whole events inside it (a write cut before its newline, the next line "
            f"glued to it): {named}")


_DECODE = json.JSONDecoder().raw_decode
# An event is a few hundred bytes (a long --note a few KiB): each try parses a window of
# this many characters, and a line gets at most LINE_TRIES tries, a file FILE_TRIES, so
# text made of '{"' (a deep, unclosed nest) costs ~0.1 s in all, never a parse per '{"'.
WINDOW, LINE_TRIES, FILE_TRIES = 1 << 16, 16, 512


def whole_events(text: str, budget: list | None = None):
    """(seq, op, key) of each whole event object in ``text``, in order: tried from its
    start, then from each '{"' after the last object found (or after a start that is no
    object), so a torn head is skipped and nested objects (an event's detail) are never
    taken for events: an event is an object with an integer seq, a known op and a key.
    ``budget`` (``[tries left]``, shared by a file's lines) bounds the work."""
    budget = [FILE_TRIES] if budget is None else budget
    at, end, tries = 0, len(text.rstrip()), LINE_TRIES
    while 0 <= at < end and tries > 0 and budget[0] > 0:
        tries, budget[0] = tries - 1, budget[0] - 1
        try:
            obj, stop = _DECODE(text[at:at + WINDOW]) if end - at > WINDOW else \
                _DECODE(text, at)
            stop += at if end - at > WINDOW else 0
        except (ValueError, RecursionError):
            obj, stop = None, None
        if (type(obj) is dict and type(obj.get("seq")) is int and obj.get("op") in OPS
                and type(obj.get("key")) is str):
            yield obj["seq"], obj["op"], obj["key"]
            at = text.find('{"', stop)
        else:
            at = text.find('{"', at + 1)


@register("jsonl-state", "jsonl", lambda obj: {"file", "status"} <= obj.keys(),
          'JSONL state file: {"file", "status": pending|done|failed} per line, later lines win')
def read_state_file(path) -> Raw:
    """Each line is the whole current record of one input ``file`` (``foreign.StateFile``).

    Optional fields: ``output`` (artifact path), ``size``, ``sha256`` (of the
    artifact), ``input_sha256`` (of the input), ``error``/``reason``,
    ``failure`` (transient|permanent) or ``retryable`` (bool), ``ts``.
    """
    raw = Raw()
    state_file = StateFile(raw)
    _read_lines(path, raw, state_file.use)
    state_file.finish(path)
    return raw
