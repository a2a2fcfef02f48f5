"""The audit's per-item answer: one row per item for programs (JSON) and spreadsheets (CSV).

Built from the report's columns at once (``Series.tolist`` and ``zip``), never row by
row through pandas: a 250,000-item audit is one pass over plain Python lists. JSON goes
out through orjson when it is installed (several times faster than ``json`` on a large
document, same shape), else through ``json``.
"""

from toolkit.forensics.model import ACTIONS

PER_ITEM = ("key", "source", "state", "raw_state", "action", "why")
CSV_EXTRA = ("attempt", "failure", "reason", "job_id", "artifact_path", "artifact_size",
             "artifact_sha256")


def _findings_by_key(report) -> dict:
    found: dict = {}
    for anomaly in report.anomalies:
        if anomaly.key is not None:
            found.setdefault(anomaly.key, []).append(anomaly.kind)
    return found


def per_item(report, action: str | None = None) -> list[dict]:
    """One object per item, ordered by key: ``PER_ITEM`` fields and its ``findings``
    (the kinds found on it, in report order); only the items planned ``action`` if given."""
    items = report.items
    if not len(items):
        return []
    findings = _findings_by_key(report)
    columns = [items[name].tolist() for name in PER_ITEM]
    none = ()
    rows = [{"key": key, "source": source, "state": state, "raw_state": raw, "action": act,
             "why": why, "findings": findings.get(key, none)}
            for key, source, state, raw, act, why in zip(*columns)
            if action is None or act == action]
    return rows


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


def dumps(doc) -> str:
    """The document as indented JSON text with sorted keys."""
    try:
        import orjson
    except ImportError:
        import json

        return json.dumps(doc, indent=2, sort_keys=True, default=_plain)
    options = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
    return orjson.dumps(doc, default=_plain, option=options).decode("utf-8")


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
    table.to_csv(path, index=False)
    return len(table)


__all__ = ["ACTIONS", "PER_ITEM", "document", "dumps", "per_item", "write_csv"]
