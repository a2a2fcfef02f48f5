"""The audit's per-item answer: one row per item for programs (JSON) and spreadsheets (CSV).

Built from the report's columns at once (``Series.tolist`` and ``zip``), never row by
row through pandas: a 250,000-item audit is one pass over plain Python lists. JSON goes
out through orjson when it is installed (several times faster than ``json`` on a large
document, same shape), else through ``json``.
"""

import csv
import gc
import itertools
import operator

from toolkit.forensics.csvout import write_atomic
from toolkit.forensics.model import ACTIONS

PER_ITEM = ("key", "source", "state", "raw_state", "action", "why")
_KEY, _KIND = operator.attrgetter("key"), operator.attrgetter("kind")
CSV_EXTRA = ("attempt", "failure", "reason", "job_id", "artifact_path", "artifact_size",
             "artifact_sha256")


def _findings_by_key(anomalies) -> dict:
    found: dict = {}
    for key, kind in zip(map(_KEY, anomalies), map(_KIND, anomalies)):
        if key is not None:
            got = found.get(key)
            if got is None:
                found[key] = [kind]
            else:
                got.append(kind)
    return found


def per_item(report, action: str | None = None) -> list[dict]:
    """One object per item, ordered by key: ``PER_ITEM`` fields and its ``findings``
    (the kinds found on it, in report order); only the items planned ``action`` if given.

    Hundreds of thousands of new dicts would set off the cyclic GC over and over, for
    nothing (they hold no cycles): it is paused while they are built, then restored.
    """
    items = report.items
    if not len(items):
        return []
    enabled = gc.isenabled()
    gc.disable()
    try:
        findings = _findings_by_key(report.anomalies)
        columns = [items[name].tolist() for name in PER_ITEM]
        found = list(map(findings.get, columns[0], itertools.repeat(())))  # one C-level pass
        rows = zip(*columns, found)
        if action is not None:
            rows = (row for row in rows if row[4] == action)
        return [{"key": key, "source": source, "state": state, "raw_state": raw, "action": act,
                 "why": why, "findings": kinds}
                for key, source, state, raw, act, why, kinds in rows]
    finally:
        if enabled:
            gc.enable()


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
    return orjson.dumps(doc, default=_plain, option=options)


def write_json(doc, stream) -> None:
    """``dumps(doc)`` and a newline to a text ``stream`` (its bytes buffer when it has one:
    no decode and re-encode of a document of many megabytes)."""
    data = dumps(doc) + b"\n"
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        stream.write(data.decode("utf-8"))
        return
    stream.flush()
    buffer.write(data)
    buffer.flush()


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


__all__ = ["ACTIONS", "PER_ITEM", "document", "dumps", "per_item", "write_csv", "write_json"]
