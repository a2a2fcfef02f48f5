"""The audit's per-item answer: one row per item for programs (JSON) and spreadsheets (CSV).

Built by walking ``Report.rows`` (``model.Rows``: the audit's own (Record, action, why)
rows, ordered by key, each worded as it is read, with the kinds found on it), never
through the items DataFrame: ``audit --json`` imports no pandas. The JSON
goes out streamed (``stream_json``): the document without its two long lists
(``anomalies``, ``per_item``) once, then each list in chunks through orjson, so a
250,000-item audit never holds a list of a quarter-million dicts nor one document of
many megabytes. Without orjson, ``json``
writes the same shape in one piece.
"""

import csv
import dataclasses

from toolkit.forensics.csvout import write_atomic
from toolkit.forensics.model import ACTIONS, gc_paused

PER_ITEM = ("key", "source", "state", "raw_state", "action", "why")
CSV_EXTRA = ("attempt", "failure", "reason", "job_id", "artifact_path", "artifact_size",
             "artifact_sha256")
CHUNK = 4096  # items per orjson call: big enough to amortize the call, small in memory
WRAPPED, UNWRAPPED = b'{\n  "": [', b"\n  ]\n}"  # around a chunk dumped as {"": [...]}


def _rows(report, action):
    """The ``Rows`` of the items planned ``action`` (all if None), by key."""
    if action is None:
        return report.rows
    return report.rows.only(action)


def _objects(rows, start: int = 0, stop: int | None = None):
    """One per_item dict per row from ``start`` to ``stop``, its findings ``[]`` when none
    (the shared empty tuple)."""
    return [{"key": record.key, "source": record.source, "state": record.state,
             "raw_state": record.raw_state, "action": act, "why": why, "findings": kinds}
            for record, act, why, kinds in rows.read(start, stop)]


def per_item(report, action: str | None = None) -> list[dict]:
    """One object per item, ordered by key: ``PER_ITEM`` fields and its ``findings``
    (the kinds found on it, in report order); only the items planned ``action`` if given.
    """
    with gc_paused():
        return _objects(_rows(report, action))


def document(report, action: str | None = None) -> dict:
    """``Report.to_json()`` (items, plan, ... unchanged) plus ``per_item``."""
    out = report.to_json()
    out["per_item"] = per_item(report, action)
    return out


def _plain(value):
    """What JSON cannot hold as such (bytes from a BLOB column, numpy scalars): as text."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def dumps(doc) -> bytes:
    """The document as indented UTF-8 JSON with sorted keys (no final newline)."""
    try:
        import orjson
    except ImportError:
        import json

        return json.dumps(doc, indent=2, sort_keys=True, default=_plain).encode("utf-8")
    options = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
    return _orjson(orjson, doc, options)


def _orjson(orjson, doc, options) -> bytes:
    """``orjson.dumps``, or the json module's same layout where orjson refuses a text: a
    lone surrogate (a ledger's JSON "\\ud800" decodes to one) is not UTF-8. Written back
    as its JSON escape (``backslashreplace`` gives exactly ``\\ud800``), it reads back
    as the same text."""
    try:
        return orjson.dumps(doc, default=_plain, option=options)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        import json

        return json.dumps(doc, indent=2, sort_keys=True, default=_plain,
                          ensure_ascii=False).encode("utf-8", "backslashreplace")


def write_json(doc, stream) -> None:
    """``dumps(doc)`` and a newline to a text ``stream`` (its bytes buffer when it has one:
    no decode and re-encode of a document of many megabytes)."""
    _byte_writer(stream)(dumps(doc) + b"\n")
    getattr(stream, "buffer", stream).flush()


def stream_json(report, stream, action: str | None = None) -> None:
    """``write_json(document(report, action), stream)`` without ever holding the document:
    the rest of it is dumped once with ``anomalies`` and ``per_item`` empty (the same bytes
    around them, keys sorted), then each list goes out ``CHUNK`` entries at a time, each
    chunk dumped as the value of a top-level key (``WRAPPED``): its entries come out at
    their depth in the document and go out as a slice, with no re-indented copy (callgrind,
    100,000 lines: ~80 M of the JSON's ~575 M instructions). JSON strings hold no raw
    newline, so an empty list's slot (at the top level, after a newline) is found once
    and only there."""
    try:
        import orjson
    except ImportError:
        write_json(document(report, action), stream)
        return
    with gc_paused():  # paused throughout: a collection between chunks walks the whole audit
        _stream(report, stream, action, orjson)


def _stream(report, stream, action, orjson) -> None:
    rows = _rows(report, action)
    head = dataclasses.replace(report, anomalies=[]).to_json()  # both lists go out in chunks
    head["per_item"] = []
    text = dumps(head)
    anomalies = report.anomalies
    lists = ((b'\n  "anomalies": [', len(anomalies),
              lambda start, stop: [anomaly.to_json() for anomaly in anomalies[start:stop]]),
             (b'\n  "per_item": [', len(rows), lambda start, stop: _objects(rows, start, stop)))
    options = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
    write, done = _byte_writer(stream), 0
    for opening, count, objects in lists:  # in the document's (sorted) key order
        slot = opening + b"],"
        at = text.index(slot, done)
        if not count:  # an empty list stays as dumps writes it
            continue
        write(text[done:at] + opening)
        for start in range(0, count, CHUNK):
            # the chunk as the value of a top-level key sits one level deep, as in the
            # document: b'{\n  "": [' entries b'\n  ]\n}', written between the two
            data = _orjson(orjson, {"": objects(start, start + CHUNK)}, options)
            if start:
                write(b",")
            write(memoryview(data)[len(WRAPPED):-len(UNWRAPPED)])
        write(b"\n  ],")
        done = at + len(slot)
    write(text[done:] + b"\n")
    getattr(stream, "buffer", stream).flush()


def _byte_writer(stream):
    """Write bytes to a text ``stream`` (to its bytes buffer when it has one: no decode
    and re-encode of many megabytes; what was written as text goes out first)."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        return lambda data: stream.write(str(data, "utf-8"))
    stream.flush()
    return buffer.write


def write_csv(report, path, action: str | None = None) -> int:
    """The per-item table (plus attempt, failure, reason, job and artifact) as CSV at
    ``path`` for a spreadsheet; findings joined by ``"; "``. Returns the rows written."""
    import pandas as pd

    rows = per_item(report, action)
    items = report.items
    keep = [name for name in CSV_EXTRA if name in items]
    extra = items[["key", *keep]]
    if action is not None:
        extra = extra[items["action"] == action]
    # pandas' own string storage: a lone surrogate in a key (a JSON "\ud800") is no Arrow text
    with pd.option_context("mode.string_storage", "python"):
        table = pd.DataFrame(rows, columns=[*PER_ITEM, "findings"])
    table["findings"] = ["; ".join(kinds) for kinds in table["findings"]]
    for name in keep:
        table[name] = extra[name].tolist()
    for name in ("attempt", "artifact_size"):  # counts stay integers (no 2914.0) beside blanks
        if name in keep:
            try:
                table[name] = table[name].astype("Int64")
            except (TypeError, ValueError):  # a foreign ledger's text: written as it is
                pass
    # every cell quoted: a \r or \n in a name stays inside its cell for any reader
    write_atomic(table, path, quoting=csv.QUOTE_ALL)
    return len(table)


__all__ = ["ACTIONS", "PER_ITEM", "document", "dumps", "per_item", "stream_json", "write_csv",
           "write_json"]
