"""Normalizing foreign records: where other pipelines keep the same facts.

Field names are looked up in order; a value of the wrong JSON type counts as
absent (the checks then say what is missing), never as an error.
"""

import bisect
import json
import os
import posixpath
import re

from toolkit import roots
from toolkit.forensics.lines import MAX_LINE
from toolkit.forensics.model import EVENT_COLUMNS, Raw, Record
from toolkit.ledger.members import loads as loads_unique

PATH_FIELDS = ("artifact_path", "output", "artifact", "path")
SIZE_FIELDS = ("artifact_size", "size")
SHA_FIELDS = ("artifact_sha256", "sha256")
REASON_FIELDS = ("reason", "error", "message")
SOURCE_FIELDS = ("source", "file", "name")
INPUT_DIGEST_FIELDS = ("input_sha256", "digest", "sha256")  # in a payload, sha256 is the input's


def first(obj: dict, names, kind):
    for name in names:
        value = obj.get(name)
        if type(value) is kind and (kind is not str or value):
            return value
    return None


def foreign_key(value):
    """A foreign row's key as text that always encodes as UTF-8, one to one: its bytes
    escaped as ``ledger`` stores an input's name (``roots.escaped_name``: a backslash
    doubled, each byte that is not UTF-8 as ``\\xNN``), so the bytes ``a\\xffb`` and the
    text ``a\\xffb`` stay two keys. Anything else is returned as it is (``key_fault``
    says why it is no key)."""
    if type(value) is bytes:
        return roots.escaped_name(value)
    if type(value) is str and "\\" in value:  # text read as UTF-8: encodes back as it was
        return roots.escaped_name(value.encode("utf-8"))
    return value


def key_fault(value) -> str:
    """Why a foreign row's ``value`` is no key (after ``foreign_key``), in the words of
    its finding."""
    return "is empty" if value == "" else "is not a string"


def failure_class(obj: dict) -> str | None:
    """transient / permanent from ``failure`` or ``retryable``; None when unclassified."""
    failure = obj.get("failure")
    if failure in ("transient", "permanent"):
        return failure
    retryable = obj.get("retryable")
    if type(retryable) is bool:
        return "transient" if retryable else "permanent"
    return None


def foreign_item(key, state, raw_state, info: dict, *, source=None, input_digest=None,
                 updated=None) -> dict:
    """A normalized item record from a foreign record ``info`` (result fields)."""
    return Record(key, state=state, raw_state=raw_state,
                    source=source if type(source) is str else None,
                    input_digest=input_digest if type(input_digest) is str else None,
                    artifact_path=first(info, PATH_FIELDS, str),
                    artifact_size=first(info, SIZE_FIELDS, int),
                    artifact_sha256=first(info, SHA_FIELDS, str),
                    failure=failure_class(info) if state == "failed" else None,
                    reason=first(info, REASON_FIELDS, str), updated=updated)


def same_record(a: dict, b: dict) -> bool:
    """Two records of one key that say the same thing (timestamps aside)."""
    ignore = ("ts", "time", "updated", "updated_at")
    return ({k: v for k, v in a.items() if k not in ignore}
            == {k: v for k, v in b.items() if k not in ignore})


def parse_json_column(value) -> tuple[dict, str | None]:
    """A TEXT/BLOB column holding a JSON object → (object, problem or None)."""
    if value is None or value == "":
        return {}, None
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return {}, "not UTF-8"
    if not isinstance(value, str):
        return {}, f"{type(value).__name__}, not JSON text"
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError):
        return {}, "not JSON"
    if not isinstance(obj, dict):
        return {}, f"JSON {type(obj).__name__}, not an object"
    return obj, None


# -- the {"file", "status"} state file ---------------------------------------------------------

STATE_FILE_STATES = {"pending": "pending", "done": "done", "failed": "failed"}
# A damaged line may still show whose record it was: the "file" member of a line cut short,
# or of a line whose status is not a state. Read from the bytes, never trusted further.
_NAMED = re.compile(rb'"file"\s*:\s*("(?:[^"\\\x00-\x1f]|\\.)*")')


def file_key(name: str) -> str:
    """The one identity of every spelling of a path (``./a.pdf``, ``a.pdf``, ``dir//a.pdf``,
    ``dir/./a.pdf``, ``//a.pdf``): lexical only (posixpath.normpath), the filesystem is
    never asked. normpath keeps a leading ``//`` (POSIX leaves its meaning to the system;
    on Linux it is ``/``, and three or more are collapsed already): it is collapsed too."""
    key = posixpath.normpath(name)
    return key[1:] if key.startswith("//") else key


def named_in(line) -> list[str]:
    """The normalized files a damaged line names readably, in order: every one of them, as
    a line glued to the next (a torn append, then the next append) holds two records."""
    if type(line) is not bytes:
        return []  # unreadable (over the line limit): nothing to name
    try:  # a line naming "file" twice names both (members.py: no one object)
        obj = loads_unique(line)
    except (ValueError, RecursionError):
        obj = None
    names = [obj.get("file")] if type(obj) is dict else []
    for match in _NAMED.finditer(line) if type(obj) is not dict else ():
        try:
            names.append(json.loads(match.group(1)))
        except ValueError:  # a bad escape, or not UTF-8
            pass
    return list(dict.fromkeys(file_key(name) for name in names if type(name) is str and name))


def damaged_lines(path, numbers) -> dict:
    """{line number: bytes} of the damaged lines ``numbers`` (the torn tail included), read
    again: the reader kept none of them, and only a damaged file pays for this second pass."""
    from toolkit.forensics.lines import LineReader

    wanted, found = set(numbers), {}
    reader = LineReader(path)
    for first, lines in reader.batches(decode=False):
        found.update((number, line) for number, line in enumerate(lines, first)
                     if number in wanted)
    if reader.torn is not None and reader.torn[0] in wanted and reader.torn[1] <= MAX_LINE:
        with open(path, "rb") as handle:
            handle.seek(-reader.torn[1], os.SEEK_END)
            found[reader.torn[0]] = handle.read()
    return found


class StateFile:
    """A state file read line by line (``use``), then its damage settled (``finish``).

    Each line is the whole current record of one input ``file``, later lines win; the
    item's key is the file's normalized path (``file_key``). Two spellings of one path are
    a ``duplicate_key`` (the writer kept them as two items: the file may have run twice),
    and so is a record that changes a ``done`` one (another status, another artifact).
    """

    def __init__(self, raw: Raw):
        self.raw = raw
        raw.events = self.columns = {name: [] for name in EVENT_COLUMNS}
        self.done_at: dict[str, tuple[int, dict]] = {}
        self.first: dict[str, tuple[int, str]] = {}  # key -> (line, spelling) first seen
        self.last: dict[str, int] = {}               # key -> line of its last readable record

    def use(self, obj, line):
        name, status = obj.get("file"), obj.get("status")
        if type(name) is not str or not name:
            return "file is not a non-empty string"
        if type(status) is not str or status not in STATE_FILE_STATES:
            return f"status {status!r} is not one of {sorted(STATE_FILE_STATES)}"
        raw, key, state = self.raw, file_key(name), STATE_FILE_STATES[status]
        first = self.first.setdefault(key, (line, name))
        if first[1] != name:
            raw.finding(key, "duplicate_key", f"line {line} spells it {name!r}, line {first[0]} "
                        f"{first[1]!r}: two spellings of one path, kept as two items by the "
                        "writer (it may have run twice)")
        previous = raw.items.get(key)
        done_at = self.done_at
        if key in done_at and not same_record(done_at[key][1], obj):
            raw.finding(key, "duplicate_key", f"line {line} ({status}) overrides the done record "
                        f"of line {done_at[key][0]}")
        if state == "done" and key not in done_at:
            done_at[key] = (line, obj)
        ts = obj.get("ts")
        ts = ts if type(ts) in (int, float) else None
        raw.items[key] = foreign_item(key, state, status, obj, source=name,
                                      input_digest=obj.get("input_sha256"), updated=ts)
        self.last[key] = line
        for column, value in (("seq", line), ("ts", ts), ("op", "record"), ("key", key),
                              ("frm", previous and previous.state), ("to", state),
                              ("attempt", None), ("worker", None), ("token", None),
                              ("line", line)):
            self.columns[column].append(value)
        return None

    def finish(self, path) -> None:
        """A damaged line written after an item's last readable record may have held a newer
        status for it (a done after its pending: running it again would execute it twice).

        A damaged line that names files (``named_in``: two, when a torn append was glued to
        the next) concerns those items alone, whatever their state. One that names none may have been any item's: every item not done whose
        last readable record comes before it is in doubt too. A done keeps its answer (a
        lost line could only have undone it; nothing runs it again). An item whose last
        readable record comes after every damaged line is untouched: later lines win.
        Each doubt is a ``missing_history`` finding naming the line: the plan is review.
        """
        raw = self.raw
        damaged = sorted(set(raw.corrupt_lines))
        if not damaged:
            return
        text, unnamed, named = damaged_lines(path, damaged), [], set()
        for number in damaged:
            keys = named_in(text.get(number))
            if not keys:
                unnamed.append(number)
            for key in keys:
                if key in raw.items and self.last[key] < number and key not in named:
                    named.add(key)  # one finding per item: the first line in doubt names it
                    raw.finding(key, "missing_history", f"line {number} is damaged and names "
                                f"it, after its last readable record (line {self.last[key]}): "
                                "it may have held a newer status")
        if not unnamed:
            return
        for key, item in raw.items.items():
            after = bisect.bisect_right(unnamed, self.last[key])
            if item.state != "done" and after < len(unnamed) and key not in named:
                raw.finding(key, "missing_history", f"line {unnamed[after]} is damaged and "
                            f"names no file, after its last readable record (line "
                            f"{self.last[key]}): it may have held a newer status")
