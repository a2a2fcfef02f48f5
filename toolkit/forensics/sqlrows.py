"""The toolkit SQLite ledger's rows as the audit reads them: each event's detail (``detail_reader``,
one row or a batch at a time) and the items table against the state each key's events
fold to (``fold_items``; ``sqlfold.scan`` folds them)."""

import itertools
import operator
import typing

from toolkit.forensics import sqlfold
from toolkit.forensics.foreign import parse_json_column
from toolkit.forensics.history import STATE_SET
from toolkit.forensics.lines import SHALLOW
from toolkit.forensics.model import Record


# each state's one string: the items rows' words, shared (and checked: KeyError)
_WORD = {state: state for state in STATE_SET}


def fold_items(raw, rows, state, digests, replayed) -> bool:
    """``items_one_by_one`` in a few C loops (one Record call per row), when every items
    row has a text key and one of our states: else False, nothing done. Only the rows
    whose state is not the one their events fold to (the fold's states are ``_WORD``'s
    strings: ``is not`` finds them) are looked at one by one."""
    if not rows:
        return True
    columns = tuple(zip(*rows))
    keys = columns[0]
    if set(map(type, keys)) != {str}:
        return False
    try:
        states = list(map(_WORD.__getitem__, columns[1]))
    except (KeyError, TypeError):  # a state not ours (or no text): said row by row
        return False
    if isinstance(state, sqlfold.Folded) and state.numbered == len(keys):
        # the fold numbered these rows' keys first, in this order: read by position
        lasts, found = state.states[:len(keys)], state.digests[:len(keys)]
    elif isinstance(state, sqlfold.Folded):
        lasts, found = state.lookup(keys)
    else:
        lasts, found = list(map(state.get, keys)), map(digests.get, keys)
    records = list(map(Record, keys, states, states, columns[2], found, *columns[3:]))
    finding, slow = raw.finding, sqlfold.SLOW
    for at in itertools.compress(range(len(keys)), map(operator.is_not, lasts, states)):
        key, now, last = keys[at], states[at], lasts[at]
        if last is slow:
            item = replayed.get(key)
            last, records[at].input_digest = (None, None) if item is None else \
                (item.state, item.input_digest)
        if last is None:
            finding(key, "history_mismatch", "item row has no add event")
        elif last != now:
            finding(key, "history_mismatch", f"items table says {now}, its events end in {last}")
    raw.items.update(zip(keys, records))
    return True


def items_one_by_one(raw, rows, state, digests, replayed):
    """One Record per items row, each checked against the state its events fold to
    (``state``: the fold's, SLOW for a key the replay holds in ``replayed``)."""
    slow = sqlfold.SLOW
    for row in rows:
        key, now = row[0], row[1]
        if type(key) is not str:
            raw.finding(None, "corrupt_record", f"items row with key {key!r}: not a string")
            continue
        if type(now) is not str or now not in STATE_SET:
            raw.finding(key, "corrupt_record", f"items row {key!r}: state {now!r} is not ours")
            continue
        last, digest = state.get(key), None
        if last is slow:
            item = replayed.get(key)
            last, digest = (None, None) if item is None else (item.state, item.input_digest)
        elif last is not None:
            digest = digests.get(key)
        # Record's fields in order: key, state, raw_state, source, input_digest, then the
        # rest of ITEM_FIELDS (attempt ... updated) as they stand
        raw.items[key] = Record(key, now, now, row[2], digest, *row[3:])
        if last is None:
            raw.finding(key, "history_mismatch", "item row has no add event")
        elif last != now:
            raw.finding(key, "history_mismatch",
                        f"items table says {now}, its events end in {last}")


def numbered(rows) -> dict:
    """{key: its place} of the items ``rows`` (key first) when every key is a text, each
    once: the ids ``sqlfold.scan`` gives these keys (``Folded.numbered``). Else {}: the fold
    numbers its keys itself and the items rows are matched to it by key."""
    keys = list(map(operator.itemgetter(0), rows))
    if set(map(type, keys)) - {str}:
        return {}
    index = dict(zip(keys, range(len(keys))))
    return index if len(index) == len(keys) else {}


def item_rows(db, quoted):
    """The items rows ordered by key as SQLite orders them: read in table order (a walk
    of the key index would seek for every row) and sorted here; Python orders strings,
    bytes or numbers as SQLite's BINARY collation does, anything mixed goes to SQLite."""
    rows = db.execute(f"SELECT {quoted} FROM items").fetchall()
    try:
        rows.sort(key=operator.itemgetter(0))
    except TypeError:
        rows = db.execute(f"SELECT {quoted} FROM items ORDER BY key").fetchall()
    return rows


def detail_reader():
    """``parse_json_column`` for the detail column, fast on what a ledger holds: ``{}``
    (most events), else msgspec's decoder when it accepts the text as an object; the
    rest (and every complaint) goes the reference way. Nothing folds into a detail, so
    the empty ones can share one dict."""
    import msgspec

    decode, failed, empty, _str, _dict = msgspec.json.decode, msgspec.DecodeError, {}, str, dict

    def detail_of(text):
        if text == "{}":
            return empty, None
        if type(text) is _str and text.count("{") + text.count("[") <= SHALLOW:
            try:
                obj = decode(text)
            except failed:
                pass
            else:
                if type(obj) is _dict:
                    return obj, None
        return parse_json_column(text)

    one_by_one = sqlfold.one_by_one(detail_of)

    class FoldFields(msgspec.Struct):
        """The members of a detail the fold reads (``sqlfold.scan``)."""
        failure: typing.Any = sqlfold.ABSENT
        digest: typing.Any = None

    fields = msgspec.json.Decoder(FoldFields).decode
    repeat = itertools.repeat

    def many(texts: list) -> tuple[list, list]:
        """``detail_of`` of each text as ``sqlfold.scan`` takes them (their failures, their
        digests): one C loop of msgspec calls when every text is text that decodes to an
        object with at most SHALLOW brackets, decoded into the two fields alone (the other
        members are checked, never made into objects; msgspec skips a member by the same
        grammar it decodes one with, so a text it takes this way decodes to a dict too, or
        only the reference reader takes it, and then with the same two fields), else text by
        text. Each such text holds a "{" of its own, so none holds more than all of theirs
        less one per other text: counted once over the batch, and text by text only when
        that bound is above SHALLOW."""
        if texts and set(map(type, texts)) == {_str}:
            try:
                objs = list(map(fields, texts))
            except (failed, RecursionError):  # (a deep text: detail_of never asks msgspec)
                objs = None
            if objs is not None:
                joined = "".join(texts)
                if joined.count("{") + joined.count("[") - (len(texts) - 1) <= SHALLOW or \
                        max(map(_str.count, texts, repeat("{"))) + \
                        max(map(_str.count, texts, repeat("["))) <= SHALLOW:
                    return (list(map(operator.attrgetter("failure"), objs)),
                            list(map(operator.attrgetter("digest"), objs)))
        return one_by_one(texts)

    detail_of.many = many
    return detail_of

