"""The JSONL ledger's event line: ``event_line``, byte for byte what the reference
``json.dumps(event.to_json(), sort_keys=True)`` writes (the format is the contract: the
audit and the forensic tools read it), built for the cost of one transition.
"""

import json

import orjson

from toolkit.ledger import Event, State

_LINE = json.JSONEncoder(sort_keys=True).encode  # one encoder, not one per event
_TEXT = json.encoder.encode_basestring_ascii  # the C function behind _LINE's strings


def _detail_encoder():
    """``_LINE`` for a detail dict without its per-call Python: the C encoder that
    ``JSONEncoder.iterencode`` builds on every call, built once here with _LINE's own
    settings (sorted keys, ASCII, NaN allowed, circular check), called as
    ``"".join(encode(detail, 0))``. Only the writer calls it, under the ledger's lock
    (the circular check's dict is shared). Without the C speedups, None."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    reference = json.JSONEncoder(sort_keys=True)
    return make({}, reference.default, _TEXT, None, reference.key_separator,
                reference.item_separator, True, False, True)


_ENCODE = _detail_encoder()
# The quoted text of each state and op, looked up instead of escaped per event (a State
# hashes by its name: a plain string is not found here and takes _TEXT).
_QUOTED = {name: _TEXT(name) for name in (*State, "add", "move", "claim", "release")}


_DUMPS = orjson.dumps
_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE
# The types both encoders write alike, floats aside (orjson writes them alike only in
# ``_plain_float``'s range): orjson also writes enums, dates, UUIDs and dataclasses, where
# _LINE refuses them: those take _LINE, which raises as before. A bool or a State is
# written alike too, wherever it stands (true/false; a State's text).
_ALIKE = frozenset({str, int, bool, type(None), State})
_TEXTS = frozenset({str, State})  # what a from- or to-state may be (``Event.to_json``)
_BACKSLASH, _DEL = ord("\\"), 0x7F  # an int operand: ``in`` on bytes then takes memchr,
# where a bytes operand is first tried as an int (a TypeError raised and cleared each time)


def _plain_float(value: float) -> bool:
    """Does orjson write this float as ``repr`` does? Zero and 1e-4 <= |x| < 1e16, where
    both write the shortest round-trip digits without an exponent (checked on random
    floats in tests/test_ledger_jsonl.py); NaN and infinity fail both comparisons."""
    return value == 0 or 1e-4 <= abs(value) < 1e16


def _alike(values) -> bool:
    """Are all ``values`` written alike by both encoders? (``_ALIKE``, or a float in
    ``_plain_float``'s range: a lease's expiry, say)."""
    for value in values:
        if type(value) is float:
            if not (value == 0 or 1e-4 <= abs(value) < 1e16):  # _plain_float, inline
                return False
        elif type(value) not in _ALIKE:
            return False
    return True


def _respaced(seq, ts, op, key, frm, to, attempt, worker, token, detail) -> bytes | None:
    """The event's line from one orjson call, respaced as ``_LINE`` writes it (``": "``,
    ``", "``), or None when the two encoders could differ.

    orjson writes compact UTF-8; ``_LINE`` ASCII with spaces after separators. They agree,
    once respaced, on what this accepts: states as ``Event.to_json`` reads them, the
    other parts of the types the ledger gives (int seq, attempt and token; text op, key
    and worker, or no worker; a float ts in ``_plain_float``'s positive range, or an int:
    each a ``type(x) is`` test, cheaper than a set's over a ``map``; anything else takes
    the other path, which writes the same bytes), every value of a flat ``detail`` of a
    type both write alike (``_ALIKE``, floats in ``_plain_float``'s range), ASCII text
    without escapes (no backslash; no DEL, which ``_LINE`` escapes), no ``:`` or ``,``
    inside a string. The last is checked on the respaced line's length: orjson
    writes exactly the separators' 10 + n colons and 8 + n commas (9 when n is 0), so a
    longer line has one inside a string. What orjson refuses (a lone surrogate, an int
    beyond 64 bits) or would alter (NaN, written null) takes the other path.

    The checks cost less than the encoding: a ``type`` test per part and one C pass over
    the detail's types (``frozenset.issuperset`` iterates a ``map`` without building a
    set); only a detail holding a float (a claim's expiry) or a stranger is looked at
    value by value (``_alike``).
    """
    if not (type(detail) is dict and type(seq) is int and type(op) is str
            and type(key) is str and type(attempt) is int and type(token) is int
            and (worker is None or type(worker) is str)
            and type(to) in _TEXTS and (frm is None or type(frm) in _TEXTS)  # as to_json
            and (type(ts) is float and 1e-4 <= ts < 1e16  # _plain_float, for a clock's ts
                 or type(ts) is int)
            and (_ALIKE.issuperset(map(type, detail.values())) or _alike(detail.values()))):
        return None
    try:
        text = _DUMPS({"attempt": attempt, "detail": detail, "from": frm, "key": key, "op": op,
                       "seq": seq, "to": to, "token": token, "ts": ts, "worker": worker},
                      option=_OPTIONS)
    except orjson.JSONEncodeError:
        return None
    if not text.isascii() or _BACKSLASH in text or _DEL in text:
        return None
    line = text.replace(b":", b": ").replace(b",", b", ")
    fields = len(detail)  # one space after each separator: (10 + n) + (8 + n), or 10 + 9
    if len(line) - len(text) != (18 + 2 * fields if fields else 19):
        return None  # a ':' or ',' inside a string was respaced too
    return line


def event_line(seq, ts, op, key, frm, to, attempt, worker, token, detail) -> bytes:
    """The event's line: ``_LINE(event.to_json())`` and a newline, byte for byte.

    Most lines are orjson's, respaced (``_respaced``: one C call where the path below
    makes six); the rest are built as follows.

    The keys, in sorted order, and their separators are constants; the values are
    encoded as ``_LINE`` encodes them (the same C string escaper, ``repr`` of ints
    and finite floats, ``_LINE`` itself for the detail), which saves building the
    event's dict and sorting it per transition. Values of any other type (a NaN,
    a bool, an int subclass) take ``_LINE`` whole.
    """
    line = _respaced(seq, ts, op, key, frm, to, attempt, worker, token, detail)
    if line is not None:
        return line
    if (type(seq) is int and type(attempt) is int and type(token) is int and type(op) is str
            and type(key) is str and (worker is None or type(worker) is str)
            and (type(ts) is int or (type(ts) is float and ts - ts == 0))
            and _ENCODE is not None):
        quoted = _QUOTED.get
        return (f'{{"attempt": {attempt}, "detail": {"".join(_ENCODE(detail, 0))}, "from": '
                f'{"null" if frm is None else quoted(frm) or _TEXT(frm)}, "key": {_TEXT(key)}, '
                f'"op": {quoted(op) or _TEXT(op)}, "seq": {seq}, '
                f'"to": {quoted(to) or _TEXT(to)}, "token": {token}, "ts": {ts!r}, '
                f'"worker": {"null" if worker is None else _TEXT(worker)}}}\n').encode()
    return (_LINE(Event(seq, ts, op, key, frm, to, attempt, worker, token, detail).to_json())
            + "\n").encode()
