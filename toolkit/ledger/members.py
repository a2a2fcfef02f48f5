"""Duplicate member names in a JSON line: one verdict (damage) for the ledger and the audit.

``{"to": "done", "to": "pending"}`` is JSON whose meaning no reader can tell: json and
msgspec keep the last value silently, another tool the first. A line that names a member
twice is therefore a corrupt line for every reading of it: the ledger's replay (``run``,
``ledger``), the audit's, and a foreign state file's (``corrupt_line``, never a ``run`` or
``skip`` from a guessed value).

The check costs a byte count on a clean line: every member of a JSON text has exactly one
structural colon, so a line whose count of ``:`` bytes equals the number of members its
decoding produced has no duplicate (a duplicate, like an unknown member, is one more colon
than members): the callers count. A line with more colons (one in a value: a worker
``host:pid``, a time of day) asks ``duplicate``.
"""

import json
from itertools import repeat
from operator import attrgetter

import msgspec

_encode = msgspec.json.Encoder().encode
_detail, _worker = attrgetter("detail"), attrgetter("worker")
# An escape's first byte, as an int: ``BACKSLASH in raw`` is one memchr, where ``b"\\" in
# raw`` first tries the bytes as an int and raises (measured: 14 ns against 141 a line)
BACKSLASH = ord("\\")


class DuplicateMember(ValueError):
    """A JSON object that names one member twice."""


def _unique(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = set()
        for name, _ in pairs:
            if name in seen:
                raise DuplicateMember(f"duplicate member name {name!r} (an object names it "
                                      "twice: which value is meant cannot be told)")
            seen.add(name)
    return obj


# json's own decoder, refusing an object that names a member twice (the C scanner calls
# the hook with every object's pairs, nested ones too)
STRICT = json.JSONDecoder(object_pairs_hook=_unique)


def loads(text):
    """``json.loads`` that raises ``DuplicateMember`` (a ValueError) on a repeated name."""
    if type(text) is not str:
        text = text.decode("utf-8")  # as json.loads would (the callers give UTF-8)
    return STRICT.decode(text)


def named_twice(raw: bytes, event, members: int) -> str | None:
    """``duplicate`` of an event line (``replay.EventLine``'s fields) that ``members``
    fields but its detail's make, behind the byte count that rules most lines out.

    The rule the hot loops (``replay.replay``, ``forensics.jsonl``) inline: the colons
    past the members' must be the worker's (``host:pid``) read literally (no escape in the
    line: ``\\u003a`` decodes to a colon that no byte counted), else ``duplicate``."""
    extra = raw.count(b":") - members - len(event.detail)
    if not extra or (event.worker is not None and extra == event.worker.count(":")
                     and BACKSLASH not in raw):
        return None
    return duplicate(raw, event)


def batch_named_twice(lines: list, events: list, members: int) -> bool:
    """``named_twice`` of any of these event lines (``events``: their decodings), in a few
    C loops: a line's colons are never fewer than its decoding's members (nor, with no
    escape in the line, than those plus its worker's colons), so the sums are equal only
    if every line's are; a line by itself only when they are not."""
    colons = sum(map(bytes.count, lines, repeat(b":")))
    expected = members * len(events) + sum(map(len, map(_detail, events)))
    if colons == expected:
        return False
    if colons == expected + sum(map(str.count, filter(None, map(_worker, events)),
                                    repeat(":"))) and \
            not any(map(bytes.__contains__, lines, repeat(BACKSLASH))):
        return False
    return any(map(named_twice, lines, events, repeat(members)))


def duplicate(raw: bytes, decoded) -> str | None:
    """Why the line ``raw`` names a member twice, None when it does not; ``decoded``: what
    a decoder (msgspec: a struct or a dict) read from it, for a line whose count of colons
    is not its number of members (the caller's byte count: a colon in a value, a member
    named twice, an unknown one).

    Cheap again when the line has no escape: its colons are then its members' and its
    strings' literal ones, exactly the colons of ``decoded`` encoded again (members of
    nested objects too, one colon each) unless a member was dropped (named twice, or not
    a field). An escape (``\\u003a`` is a colon decoded, none read) or a count that differs
    is read the exact way: json with every pair seen."""
    if BACKSLASH not in raw:
        try:
            if raw.count(b":") == _encode(decoded).count(b":"):
                return None
        except (TypeError, ValueError, OverflowError):  # json's: an int past 64 bits
            pass
    try:
        loads(raw)
    except DuplicateMember as exc:
        return str(exc)
    except (ValueError, RecursionError):
        return None  # (the caller's decoder has judged the line)
    return None
