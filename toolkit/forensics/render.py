"""The audit as text for people: summary, findings, and the items that need action."""

import itertools
import textwrap

from toolkit.roots import shown


def _safe(value, width: int | None = None) -> str:
    """Printable text (``roots.shown``: what does not print escaped, a backslash as it is,
    never twice), cut to ``width``."""
    # None, and pandas' missing text (a NaN in a str column): what JSON writes as null
    text = "-" if value is None or (type(value) is float and value != value) else str(value)
    text = shown(text)
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


def render_text(report, limit: int = 40, action: str | None = None) -> str:
    """A readable summary of ``report``; at most ``limit`` rows per table.

    The items table lists every item not planned ``skip`` with its full key and source,
    wrapped over lines, never cut: the first ``limit`` of them, or all of them when
    ``action`` is given (only the items planned so: the list the user asked for)."""
    items = report.items
    out = [f"ledger   {_safe(report.path)}",
           f"format   {report.format}",
           f"items    {len(items)}   ({_counts(report.by_state)})",
           f"plan     {_counts(report.plan)}"]
    out += [f"note     {note}" for note in report.notes]
    if report.corrupt_lines:
        lines = report.corrupt_lines
        shown = ", ".join(map(str, lines[:20])) + (" …" if len(lines) > 20 else "")
        out.append(f"unusable lines  {len(lines)}: {shown}")
    anomalies = report.anomalies
    out += ["", f"findings ({len(anomalies)})"]
    if anomalies:
        # keys in full, details in full (both wrapped): a cut detail lost its advice
        rows = [(a.kind, a.key, a.detail) for a in anomalies[:limit]]
        out += _wrapped(("kind", "key", "detail"), rows, (21, 24, 66))
        if len(anomalies) > limit:
            out.append(f"… and {len(anomalies) - limit} more (use --json for all)")
    else:
        out.append("none")
    todo = [row for row in zip(items["key"], items["source"], items["state"], items["raw_state"],
                               items["action"], items["why"])
            if (row[4] == action if action else row[4] != "skip")] if len(items) else []
    title = f"items planned {action}" if action else "items needing action"
    out += ["", f"{title} ({len(todo)})"]
    if todo:
        shown = todo if action else todo[:limit]
        out += _wrapped(("key", "source", "state", "raw", "next", "why"), shown,
                        (24, 30, 12, 12, 9, 44))
        if len(todo) > len(shown):
            out.append(f"… and {len(todo) - limit} more (--action ACTION lists every item "
                       "planned so; --csv FILE or --json for all)")
    else:
        out.append("none")
    return "\n".join(out) + "\n"


def _chunks(text: str, width: int) -> list[str]:
    """``text`` in pieces of ``width``: every character kept (a name is never cut short,
    never has its spaces collapsed), so two long names stay apart."""
    return [text[at:at + width] for at in range(0, len(text), width)] or [""]


def _wrapped(headers, rows, widths) -> list[str]:
    """A table whose cells wrap onto further lines instead of being cut (the last column
    is prose and wraps at spaces; the others are names and wrap character by character)."""
    out = _table(headers, [], widths)
    for row in rows:
        cells = [_chunks(_safe(cell), width) for cell, width in zip(row[:-1], widths)]
        cells.append(textwrap.wrap(_safe(row[-1]), widths[-1]) or [""])  # prose: by words
        for parts in itertools.zip_longest(*cells, fillvalue=""):
            out.append("  ".join(part.ljust(width) for part, width in zip(parts, widths)).rstrip())
    return out
