"""The audit as text for people: summary, findings, and the items that need action."""


def _safe(value, width: int | None = None) -> str:
    """Printable text: control characters and lone surrogates escaped, cut to ``width``."""
    text = "-" if value is None else str(value)
    if not text.isprintable():
        text = text.encode("unicode_escape", "backslashreplace").decode("ascii")
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if width is not None and len(text) > width:
        text = text[:width - 1] + "…"
    return text


def _table(headers, rows, widths) -> list[str]:
    def line(cells):
        return "  ".join(_safe(cell, width).ljust(width) for cell, width in zip(cells, widths)).rstrip()

    return [line(headers), line("-" * width for width in widths)] + [line(row) for row in rows]


def _counts(counts: dict) -> str:
    shown = [f"{name} {count}" for name, count in counts.items() if count]
    return ", ".join(shown) or "none"


def render_text(report, limit: int = 40) -> str:
    """A readable summary of ``report``; at most ``limit`` rows per table."""
    items = report.items
    out = [f"ledger   {_safe(report.path)}",
           f"format   {report.format}",
           f"items    {len(items)}   ({_counts(report.by_state)})",
           f"plan     {_counts(report.plan)}"]
    if report.corrupt_lines:
        lines = report.corrupt_lines
        shown = ", ".join(map(str, lines[:20])) + (" …" if len(lines) > 20 else "")
        out.append(f"unusable lines  {len(lines)}: {shown}")
    anomalies = report.anomalies
    out += ["", f"findings ({len(anomalies)})"]
    if anomalies:
        rows = [(a.kind, a.key, a.detail) for a in anomalies[:limit]]
        out += _table(("kind", "key", "detail"), rows, (21, 16, 70))
        if len(anomalies) > limit:
            out.append(f"… and {len(anomalies) - limit} more (use --json for all)")
    else:
        out.append("none")
    todo = [row for row in zip(items["key"], items["state"], items["raw_state"], items["action"],
                               items["why"]) if row[3] != "skip"] if len(items) else []
    out += ["", f"items needing action ({len(todo)})"]
    if todo:
        out += _table(("key", "state", "raw", "next", "why"), todo[:limit], (16, 12, 10, 9, 60))
        if len(todo) > limit:
            out.append(f"… and {len(todo) - limit} more (use --json for counts)")
    else:
        out.append("none")
    return "\n".join(out) + "\n"
