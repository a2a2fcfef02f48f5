"""A torn final line that names a key: the cut is recorded, and that key's next request
is looked up before it is sent.

A crash tears only a line it had not fsynced, so nothing was sent on it and cutting it
is right. A final line damaged by hand (``truncate -s -2``, a cut inside a string, two
events glued) reads the same, and if it was an intent whose request was sent, cutting
it makes the item ``pending`` again: a non-idempotent provider executes it twice. Bytes
cannot tell the two apart, so the writer takes the careful reading for both:

1. On open, the torn tail's bytes are searched for the keys it may name (``tail_keys``,
   the writer's rule and the audit's): a whole ``"key": "<64 hex>"`` field (spaced any
   way: ``"key":"`` too); a key field cut inside its hex at the tail's end, 8 hex or
   more left (a prefix, up to all 64 before the closing quote): every item whose key
   starts with it and is not at rest; an intent line cut before its key has 8 hex (the
   fields are written sorted, so the note ``"intent"`` comes before the key), or a line
   cut before its detail shows it is no intent (from its first byte ``{`` on): every item
   whose lease is held in a state an intent moves from (only the lease holder writes an
   intent). A mark costs a lookup, never a send, so every item the tail can be gets one.
   A tail naming none is cut as before, at the first append.
2. A tail naming a key (of an item not at rest) is cut at once, by one atomic rewrite of
   the file (temp file, fsync, rename, fsync of the folder: ``JsonlLedger._rewrite``, as
   a header upgrade does) whose header carries the mark ``"torn": [{"key": k, "after": s}]`` (``s``: the
   seq of the last whole line). A crash leaves the torn tail (read again next time) or
   the mark: never the cut without the mark.
3. The runner, about to send a request for a marked key, looks it up first
   (``runner.salvaged``): found, adopted; not found, sent.
4. The mark is spent by the key's next intent line (``spends``: a move into ``unknown``
   from ``pending``, ``failed`` or ``partial``, at a seq above ``after``: the line the
   runner writes right before that lookup). Replay drops a spent mark; the header keeps
   it until the next rewrite (a compaction writes the marks still pending). Spending it
   at the intent, not at the lookup's answer, needs no second rewrite and is as safe: a
   crash after the intent leaves the item ``unknown``, which is always looked up.
"""

import json
import re

from toolkit.ledger.header import FORMAT, TORN, torn_words
from toolkit.ledger.transitions import PERMANENT, TERMINAL, State


# The key field as any JSON writer spaces it: the ledger writes ``"key": "`` (json's and
# orjson's respaced bytes alike, ``lines.event_line``); ``jq -c`` or a hand edit ``"key":"``.
_FIELD = rb'"key"[ \t]*:[ \t]*"'
CUT_KEY = re.compile(_FIELD + rb'([0-9a-f]{64})"')
PREFIX = 8  # hex at least: 4 billion keys per prefix; fewer hex name too many items
# cut inside its hex, or after it before the closing quote (64 hex: the whole key)
CUT_PREFIX = re.compile(_FIELD + rb'([0-9a-f]{%d,64})\Z' % PREFIX)
_NAMED = re.compile(_FIELD + rb'[0-9a-f]{%d}' % PREFIX)
# An intent's head: its detail is ``{"note": "intent"}``, the only note starting "int".
_INTENT = re.compile(rb'"detail"[ \t]*:[ \t]*\{[ \t]*"note"[ \t]*:[ \t]*"int')
# The same head cut before "int (any spacing removed, the attempt's digits as 0): every
# non-empty prefix of it may be an intent's (an add's or a claim's head differs only after it)
_HEAD = b'{"attempt":0,"detail":{"note":"int'
_SPACES = re.compile(rb'[ \t]+')
_ATTEMPT = re.compile(rb'(?<=\A\{"attempt":)[0-9]+')
_EVENT = b'{"attempt"'  # an event line's first field (sorted): where a glued one starts
_NEW_REQUEST = frozenset({State.PENDING, State.FAILED, State.PARTIAL})
_STATES = {state.value: state for state in State}


def cut_keys(tail: bytes) -> list[str]:
    """The whole keys a torn tail names (two, when events were glued), in order, once each."""
    return list(dict.fromkeys(k.decode() for k in CUT_KEY.findall(tail)))


def tail_keys(tail: bytes, keys, item) -> list[str]:
    """Rule 1: the keys a torn tail may name, in order, once each; one rule for the writer
    (``ledger_tail_keys``) and the audit. ``keys``: every key of the ledger; ``item(key)``:
    its (state, failure, lease holder), states as ``State`` or their values.

    Whole keys first (kept even at rest: ``record_cut`` drops those). The last event of the
    tail (after its last ``{"attempt"``) cut inside its key's hex: the items not at rest
    whose key starts with what is left; cut before 8 hex of its key, and an intent or
    cut before its note shows whether it is one (``_head_of_an_intent``): the items not at
    rest whose lease is held in a state an intent moves from."""
    named = cut_keys(tail)
    last = tail[max(tail.rfind(_EVENT), 0):]
    prefix = CUT_PREFIX.search(last)
    if prefix is not None:
        start = prefix.group(1).decode()
        named += [key for key in keys if key.startswith(start) and _moves(item(key))]
    elif (_NAMED.search(last) is None and _INTENT.search(last) is not None) \
            or _head_of_an_intent(tail):
        named += [key for key in keys if _moves(item(key), leased=True)]
    return list(dict.fromkeys(named))


def _head_of_an_intent(tail: bytes) -> bool:
    """Does the tail end in an event line cut before its intent's note reads ``"int``
    (``{"attempt": 1, "detail": {"no``, or ``{`` alone)? Its last event starts after the
    tail's last ``}`` (that head holds none; a whole event glued before it ends in one)."""
    head = _SPACES.sub(b"", tail[tail.rfind(b"}") + 1:])
    return bool(head) and _HEAD.startswith(_ATTEMPT.sub(b"0", head, count=1))


def _moves(facts, leased=False) -> bool:
    """An item not at rest (``Item.resting``); with ``leased``, holding a lease in a state
    an intent moves from."""
    if facts is None:
        return False
    state, failure, owner = facts
    state = _STATES.get(state, state)
    if state in TERMINAL or (state is State.FAILED and failure == PERMANENT):
        return False
    return not leased or (owner is not None and state in _NEW_REQUEST)


def ledger_tail_keys(ledger, tail: bytes) -> list[str]:
    """``tail_keys`` over a replayed ledger's items (called at the replay's end). An Item
    and a fold's ItemRow have the same fields: read as they are, none converted."""
    state = ledger._state

    def item(key):
        found = state.get(key)
        return None if found is None else (found.state, found.failure, found.lease_owner)
    return tail_keys(tail, state, item)


def marks_of(header: dict | None) -> dict[str, int]:
    """The pending marks of a header (``{key: after}``); the shape is checked by
    ``header.header_problem``, so a wrong one never gets here on a writer."""
    found = {}
    for mark in (header or {}).get(TORN) or ():
        if isinstance(mark, dict) and type(mark.get("after")) is int \
                and isinstance(mark.get("key"), str):
            found[mark["key"]] = mark["after"]
    return found


def spends(marks: dict, seq: int, key: str, frm, to) -> None:
    """Drop ``key``'s mark if this event is its next intent (rule 4 above)."""
    after = marks.get(key)
    if after is not None and seq > after and to is State.UNKNOWN and frm in _NEW_REQUEST:
        del marks[key]


def pending_marks(header: dict | None, events) -> dict[str, int]:
    """The header's marks not spent by ``events`` ((seq, key, from, to), states as values
    or names: the audit's columns): the audit's reading of rule 4, the replay's own."""
    marks = marks_of(header)
    for seq, key, frm, to in events if marks else ():
        if key in marks and type(seq) is int:
            spends(marks, seq, key, _STATES.get(frm, frm), _STATES.get(to, to))
    return marks


def record_cut(ledger) -> None:
    """Rule 2: cut a torn tail naming keys, with the header's mark, in one rewrite.

    Only a writer on an intact history (a damaged one refuses writes and is salvaged;
    the audit names the tail's keys). Called last by ``adopt.adopt``, so the file has a header
    (an older headerless ledger was just given one) and the tail may already be gone
    (the upgrade leaves it out): the history ends at ``_valid_end``, or at the file's end.
    """
    if ledger.view or ledger.damaged or not ledger.torn_keys or ledger.version is None:
        return
    # A key whose item rests (done, cancelled, ...) sends nothing more: the cut line came
    # after its last request (a release, say). Only if none is left, no rewrite: the first
    # append cuts the tail, as a crash's.
    keys = [key for key in ledger.torn_keys
            if ledger._current(key) is None or not ledger._load(key).resting]
    if not keys:
        return
    marks = {**ledger.torn_marks, **dict.fromkeys(keys, ledger._seq)}
    header = {**(ledger._header or {}), "format": FORMAT, "version": ledger.version,
              TORN: torn_words(marks)}
    data = ledger._read_all()
    end = ledger._valid_end if ledger._valid_end is not None else len(data)
    line = json.dumps(header, sort_keys=True).encode() + b"\n"
    ledger._rewrite(line + data[ledger._history_start:end])
    shift = len(line) - ledger._history_start
    history_end, count = ledger._history_read
    ledger._history_start, ledger._history_read = len(line), (history_end + shift, count)
    ledger._valid_end, ledger.unterminated = None, None  # the tail is cut; no line is owed
    ledger._header, ledger.torn_marks, ledger.torn_keys = header, marks, []
