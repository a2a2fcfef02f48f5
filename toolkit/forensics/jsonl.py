"""JSONL adapters: the toolkit's own event ledger and a per-file state log."""

import json
import json.scanner

from toolkit.forensics.foreign import foreign_item, same_record
from toolkit.forensics.history import SNAPSHOT, History
from toolkit.forensics.lines import LineReader
from toolkit.forensics.model import EVENT_COLUMNS, Raw, register
from toolkit.ledger.jsonl import FORMAT as JSONL_FORMAT
from toolkit.ledger.jsonl import header_version


def _slow(text: str):
    """(object, None) or (None, why it is not one JSON value): json.loads with its reasons."""
    try:
        return json.loads(text), None
    except ValueError as exc:  # JSONDecodeError, or an integer over the digit limit
        return None, f"not JSON: {getattr(exc, 'msg', exc)}"
    except RecursionError:
        return None, "JSON nested too deeply"


def _read_lines(path, raw: Raw, use):
    """Parse every complete line; ``use(obj, line)`` returns None or why it is invalid."""
    scan = json.scanner.make_scanner(json.JSONDecoder())  # the C scanner under json.loads
    reader = LineReader(path)
    for first, lines in reader.batches():
        for number, text in enumerate(lines, first):
            # Hot loop: the scanner directly; json.loads only to explain a bad line.
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
            if why is not None:
                raw.finding(None, "corrupt_line", f"line {number}: {why}", line=number)
    if reader.torn is not None:
        number, size = reader.torn
        raw.finding(None, "torn_line",
                    f"line {number}: {size} bytes without a final newline (write cut; not used)",
                    line=number)


def _is_event(obj):
    return obj.get("format") == JSONL_FORMAT or SNAPSHOT in obj or {"op", "key", "to"} <= obj.keys()


@register("toolkit-jsonl", "jsonl", _is_event,
          "resume-toolkit JSONL ledger: a format header, then one event object per line")
def read_toolkit_jsonl(path) -> Raw:
    """Both versions: with the header line (read, never required) and without it."""
    raw = Raw()
    history = History(raw)
    with open(path, "rb") as handle:
        headed = header_version(handle.readline()) is not None
    event = history.event
    if headed:  # line 1 is the header, not an event; the hot loop stays a plain call
        def event(obj, line, _event=history.event):
            return None if line == 1 else _event(obj, line)
    _read_lines(path, raw, event)
    history.finish()
    return raw


STATE_FILE_STATES = {"pending": "pending", "done": "done", "failed": "failed"}


@register("jsonl-state", "jsonl", lambda obj: {"file", "status"} <= obj.keys(),
          'JSONL state file: {"file", "status": pending|done|failed} per line, later lines win')
def read_state_file(path) -> Raw:
    """Each line is the whole current record of one input ``file``.

    Optional fields: ``output`` (artifact path), ``size``, ``sha256`` (of the
    artifact), ``input_sha256`` (of the input), ``error``/``reason``,
    ``failure`` (transient|permanent) or ``retryable`` (bool), ``ts``. A record
    that changes a ``done`` one (another status, another artifact) is a
    ``duplicate_key``: the item was redone or its result overwritten.
    """
    raw = Raw()
    raw.events = columns = {name: [] for name in EVENT_COLUMNS}
    done_at: dict[str, tuple[int, dict]] = {}

    def use(obj, line):
        key, status = obj.get("file"), obj.get("status")
        if type(key) is not str or not key:
            return "file is not a non-empty string"
        if type(status) is not str or status not in STATE_FILE_STATES:
            return f"status {status!r} is not one of {sorted(STATE_FILE_STATES)}"
        state = STATE_FILE_STATES[status]
        previous = raw.items.get(key)
        if key in done_at and not same_record(done_at[key][1], obj):
            raw.finding(key, "duplicate_key", f"line {line} ({status}) overrides the done record "
                        f"of line {done_at[key][0]}")
        if state == "done" and key not in done_at:
            done_at[key] = (line, obj)
        digest = obj.get("input_sha256")
        ts = obj.get("ts")
        raw.items[key] = foreign_item(key, state, status, obj, source=key, input_digest=digest,
                                      updated=ts if type(ts) in (int, float) else None)
        for name, value in (("seq", line), ("ts", ts if type(ts) in (int, float) else None),
                            ("op", "record"), ("key", key),
                            ("frm", previous and previous.state), ("to", state),
                            ("attempt", None), ("worker", None), ("token", None), ("line", line)):
            columns[name].append(value)
        return None

    _read_lines(path, raw, use)
    return raw
