"""A drill's verdict, explained: each finding with its document, witnesses and remedy.

A witness is a record that proves the finding: a provider call or execution
(with its idempotency key and attempt) or a ledger event, placed by run and
by seconds since the batch started. ``explain_result`` is the prose of
``drill NAME --explain``; ``findings_json`` the same as data for ``--json``.
"""

import bisect

from toolkit.checker.findings import findings
from toolkit.identity import document_of


def _attempt(idem_key):
    tail = str(idem_key or "").rpartition(":")[2]
    return int(tail) if tail.isdigit() else None


def witness_json(witness, result) -> dict:
    """One witness as data: what it is, run (1-based), attempt, key, seconds since start."""
    ts = getattr(witness, "ts", None)
    starts = result.run_starts
    t0 = starts[0] if starts else None
    row = {"what": type(witness).__name__.lower(), "run": None, "seconds": None,
           "attempt": None, "idem_key": getattr(witness, "idem_key", None)}
    if isinstance(ts, (int, float)):
        row["run"] = max(1, bisect.bisect_right(starts, ts)) if starts else None
        row["seconds"] = round(ts - t0, 3) if t0 is not None else None
    name = type(witness).__name__
    if name == "Call":
        row["what"] = f"{witness.op} ({witness.outcome})"
        row["attempt"] = _attempt(witness.idem_key)
    elif name == "Execution":
        row["what"] = f"execution {witness.status}, job {witness.job_id}"
        row["attempt"] = _attempt(witness.idem_key)
    elif name == "Event":
        frm = getattr(witness.frm, "value", witness.frm)
        to = getattr(witness.to, "value", witness.to)
        row["what"] = f"ledger {witness.op} {frm or '-'} -> {to} by {witness.worker}"
        row["attempt"] = witness.attempt
    elif name == "ArtifactOnDisk":
        row["what"] = f"on disk: {witness.path} ({witness.size} bytes)" if witness.exists \
            else f"missing on disk: {witness.path}"
    elif name == "Item":
        row["what"] = f"ledger item {getattr(witness.state, 'value', witness.state)}"
        row["attempt"] = witness.attempt
    return row


def _anomaly_json(anomaly, result) -> dict:
    info = result.history.inputs.get(document_of(str(anomaly.key))) or {}
    return {"kind": anomaly.kind, "key": anomaly.key, "file": info.get("source"),
            "detail": anomaly.detail,
            "witnesses": [witness_json(w, result) for w in anomaly.witnesses if w is not None]}


def findings_json(result) -> list[dict]:
    """Every finding of a drill result, headline first, as data."""
    rows = []
    for found in findings(result.verdict):
        rows.append({**_anomaly_json(found.headline, result), "remedy": found.remedy,
                     "costly": found.costly,
                     "consequences": [_anomaly_json(a, result) for a in found.consequences]})
    return rows


def _witness_line(w) -> str:
    where = f"run {w['run']}, " if w["run"] else ""
    when = f" at {w['seconds']:.2f} s" if w["seconds"] is not None else ""
    attempt = f" attempt {w['attempt']}" if w["attempt"] is not None else ""
    key = f" key {w['idem_key'][:12]}…{w['idem_key'][-2:]}" if w["idem_key"] else ""
    return f"{where}{w['what']}{attempt}{key}{when}"


def explain_result(result) -> str:
    """Prose for one drill row: status, the faults that fired, each finding with its witnesses."""
    lines = [f"{result.drill.name} [{result.status}]: {result.drill.summary}"]
    if result.reason:
        lines.append(f"  {result.reason}")
    shots = [f"run {run + 1}: {name}" + (f" ({str(detail)[:60]})" if detail else "")
             for run, name, detail in result.fired]
    if shots:
        lines.append("  faults and events: " + "; ".join(dict.fromkeys(shots)))
    found = findings_json(result)
    if not found and not result.not_applicable:
        lines.append("  no anomaly")
    for row in found:
        label = "costly" if row["costly"] else "unsafe"
        lines.append(f"  {row['kind']} ({label}) {row['file'] or '?'} "
                     f"[task {str(row['key'])[:12]}…]: {row['detail']}")
        lines.extend(f"      witness: {_witness_line(w)}" for w in row["witnesses"])
        lines.append(f"      remedy: {row['remedy']}")
        for sub in row["consequences"]:
            lines.append(f"      consequence: {sub['kind']}")
            lines.extend(f"          witness: {_witness_line(w)}" for w in sub["witnesses"])
    return "\n".join(lines)
