"""Counts per drill, per-item timelines, crash-point maps and audit summaries."""

import re

from toolkit.viz.harm import draw_marks, headroom
from toolkit.viz.style import (
    ACTION_COLOURS,
    DOUBLE,
    STATE_COLOURS,
    VERDICT_COLOURS,
    axes,
    field,
    name,
    records,
)


def submit_counts(rows, ax=None, title="Submit calls and executions at the provider"):
    """Grouped bars per row: submit calls, and executions with the doubles in red.

    ``rows``: dicts with ``label`` (or ``drill``), ``submit_calls``,
    ``executions`` and optionally ``doubles`` (executions beyond one success
    per document: drawn red, hatched and annotated), ``parked`` (items left
    in needs_review: a dotted segment on top, so executions plus parked meet
    the line) and ``docs`` (a black tick: one execution per document is the
    most a correct run needs).
    Returns ``ax``.
    """
    ax = axes(ax, (max(5.0, 1.3 * len(rows) + 2), 4))
    width = 0.38
    top = 1
    for i, row in enumerate(rows):
        submits, executions = row["submit_calls"], row["executions"]
        doubles = row.get("doubles") or 0
        ax.bar(i - width / 2, submits, width, color="#9ecae1", edgecolor="#3182bd",
               label="submit calls" if i == 0 else None)
        ax.bar(i + width / 2, executions - doubles, width, color="#a1d99b", edgecolor="#31a354",
               label="executions" if i == 0 else None)
        ax.text(i - width / 2, submits, str(submits), ha="center", va="bottom", fontsize=8)
        if doubles:
            ax.bar(i + width / 2, doubles, width, bottom=executions - doubles, color=DOUBLE,
                   hatch="//", edgecolor="black", label="double executions")
            ax.text(i + width / 2, executions, f"{executions}\n+{doubles} double", ha="center",
                    va="bottom", fontsize=9, color=DOUBLE, fontweight="bold")
        else:
            ax.text(i + width / 2, executions, str(executions), ha="center", va="bottom",
                    fontsize=8)
        parked = row.get("parked") or 0
        if parked:  # items set aside for a person: never executed, they count up to the line
            ax.bar(i + width / 2, parked, width, bottom=executions, color="white",
                   edgecolor=STATE_COLOURS["needs_review"], hatch="..",
                   label="parked (needs_review)")
            ax.text(i + width * 1.05, executions + parked / 2, f"+{parked} parked", ha="left",
                    va="center", fontsize=8, color=STATE_COLOURS["needs_review"],
                    fontweight="bold")
        if row.get("docs") is not None:
            ax.hlines(row["docs"], i - width, i + width, colors="black", linewidth=2,
                      label="documents" if i == 0 else None)
        top = max(top, submits, executions + parked, row.get("docs") or 0)
    # "scenario/naive-twin" labels break after the slash, "contract[...]" before its bracket:
    # side by side, whole, two of them ran into each other
    ax.set_xticks(range(len(rows)), [_tick(row.get("label", row.get("drill", "")))
                                     for row in rows], rotation=20 if len(rows) > 3 else 0,
                  ha="right" if len(rows) > 3 else "center", fontsize=8)
    ax.set_ylim(0, top * 1.3 + 0.5)
    ax.set_ylabel("count")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    # Outside the bars, right of the axes: inside it covered the "+1 double" label.
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))
    if title:
        ax.set_title(title, fontsize=11)
    return ax


def _tick(label) -> str:
    """A bar's label on short lines: after each "/", before a "[" that follows a name."""
    text = str(label).replace("/", "/\n")
    return re.sub(r"(?<=\w)\[", "\n[", text)


def _changes(events):
    """``{key: [(seq, state), ...]}`` in first-seen order, and lane labels."""
    lanes, labels = {}, {}
    for event in sorted(records(events), key=lambda e: field(e, "seq", default=0)):
        key, op = field(event, "key"), field(event, "op", default="move")
        if op == "add":
            detail = field(event, "detail") or {}
            labels.setdefault(key, detail.get("source") if isinstance(detail, dict) else None)
        if op in ("add", "move"):
            lanes.setdefault(key, []).append((field(event, "seq"), name(field(event, "to"))))
    return lanes, {key: labels.get(key) or _short(key) for key in lanes}


def _short(key) -> str:
    """A task key (hex digits) by its first 8; a readable key whole, up to 28 characters."""
    key = str(key)
    if len(key) > 16 and all(c in "0123456789abcdef" for c in key):
        return key[:8]
    return key if len(key) <= 28 else key[:27] + "\u2026"


def timeline(events, ax=None, title="Items over time (one lane per item)", marks=()):
    """One swimlane per item, coloured by its state from event to event.

    ``events``: a History, a list of events (or their JSON dicts) or a
    forensics events DataFrame. x is the event sequence number (not wall
    time: the picture is the same on every run). ``marks``: faults, crashes
    and restarts as ``{"x", "label", "kind"}`` (``widgets.run_marks``), drawn
    as vertical lines. Returns ``ax``.
    """
    lanes, labels = _changes(events)
    ax = axes(ax, (8, 0.32 * len(lanes) + 1.6))
    end = max((seq for changes in lanes.values() for seq, _ in changes), default=0) + 1
    seen = []
    for row, (key, changes) in enumerate(lanes.items()):
        bounds = [seq for seq, _ in changes[1:]] + [end]
        for (seq, state), stop in zip(changes, bounds):
            ax.barh(row, stop - seq, left=seq, height=0.6, color=STATE_COLOURS.get(state, "white"),
                    edgecolor="white", label=None if state in seen else state)
            seen.append(state)
        ax.plot([seq for seq, _ in changes], [row] * len(changes), "|", color="#333333",
                markersize=9)
    ax.set_yticks(range(len(lanes)), [labels[key] for key in lanes], fontsize=8)
    ax.invert_yaxis()
    from matplotlib.ticker import MaxNLocator

    ax.set_xlim(0, max([end] + [mark["x"] + 0.5 for mark in marks]))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if marks:  # headroom above the first lane for the marks' labels
        span = len(lanes)
        ax.set_ylim(len(lanes) - 0.5, len(lanes) - 0.5 - span / (1 - headroom(marks)))
        draw_marks(ax, marks)
    ax.set_xlabel("event seq")
    if seen:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        ax.set_title(title, fontsize=11)
    return ax


def crash_map(rows, ax=None, title="Where the process died, and what the checker said"):
    """A strip per lane: x = crash point, colour = verdict.

    ``rows``: dicts ``{"step": int, "point": str, "verdict": "valid" |
    "violation" | "parked" | "undecided"}``, optionally with ``lane`` (e.g.
    the strategy; one strip each). ``step`` orders the points along an item's
    path; ``point`` names the tick. Returns ``ax``.
    """
    lanes = list(dict.fromkeys(row.get("lane", "") for row in rows))
    ax = axes(ax, (8, 0.32 * len(lanes) + 1.8))
    ticks = {}
    for row in rows:
        ticks.setdefault(row["step"], row["point"])
        colour = VERDICT_COLOURS.get(row["verdict"], "white")
        ax.scatter(row["step"], lanes.index(row.get("lane", "")), s=150, marker="s", color=colour,
                   edgecolor="black", linewidth=0.6, zorder=2)
    steps = sorted(ticks)
    ax.set_xticks(steps, [ticks[step] for step in steps], rotation=30 if len(steps) > 4 else 0,
                  ha="right" if len(steps) > 4 else "center", fontsize=8)
    ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    if steps:
        ax.set_xlim(steps[0] - 0.7, steps[-1] + 0.7)
    ax.grid(axis="x", color="#eeeeee", zorder=0)
    for verdict, colour in VERDICT_COLOURS.items():
        if any(row["verdict"] == verdict for row in rows):
            ax.scatter([], [], s=80, marker="s", color=colour, edgecolor="black", label=verdict)
    if rows:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_xlabel("crash point (in the order an item meets them)")
    if title:
        ax.set_title(title, fontsize=11)
    return ax


def audit_summary(summary, ax=None, title=None):
    """Three panels, each on its own axis: items by state, findings by kind, items by next
    action (states and actions count items, findings count anomalies: never one scale).

    ``summary``: ``Report.to_json()`` (or a Report: its ``to_json()`` is
    used). Returns ``ax``, which holds the three panels (``ax.child_axes``).
    """
    if hasattr(summary, "to_json"):
        summary = summary.to_json()
    kinds = {}
    for anomaly in summary.get("anomalies", ()):
        kinds[anomaly["kind"]] = kinds.get(anomaly["kind"], 0) + 1
    blocks = [
        ("items by state", [(state, n, STATE_COLOURS.get(state, "grey"))
                            for state, n in summary.get("by_state", {}).items() if n]),
        ("findings by kind", [(kind, n, DOUBLE) for kind, n in kinds.items()]),
        ("items by next action", [(action, n, ACTION_COLOURS.get(action, "grey"))
                                  for action, n in summary.get("plan", {}).items() if n])]
    from matplotlib.ticker import MaxNLocator

    # Heights in units of one bar row: each panel has its rows, and above it room for its
    # title (0.9) and below it for its x tick labels (1.3), so a few-bar panel's "0" tick
    # never runs into the next panel's title.
    above, below = 0.9, 1.3
    sizes = [max(len(bars), 1) + above + below for _, bars in blocks]
    ax = axes(ax, (8, 0.3 * sum(sizes) + 0.8))
    ax.axis("off")
    top, unit = 1.0, 1.0 / sum(sizes)
    for (label, bars), size in zip(blocks, sizes):
        rows = max(len(bars), 1)
        panel = ax.inset_axes([0.0, top - (above + rows) * unit, 1.0, rows * unit])
        top -= size * unit
        for row, (what, count, colour) in enumerate(bars):
            panel.barh(row, count, color=colour, edgecolor="#333333", linewidth=0.5)
            panel.text(count, row, f" {count}", va="center", fontsize=8)
        panel.set_yticks(range(len(bars)), [what for what, _, _ in bars], fontsize=8)
        panel.set_ylim(max(len(bars), 1) - 0.5, -0.5)
        panel.set_xlim(0, max([count for _, count, _ in bars], default=1) * 1.15 + 0.5)
        panel.tick_params(axis="x", labelsize=7)
        panel.xaxis.set_major_locator(MaxNLocator(integer=True))
        panel.set_title(label if bars else f"{label}: none", fontsize=9, loc="left")
    ax.set_title(title or f"{summary.get('format', '?')}: {summary.get('items', 0)} items, "
                 f"{len(summary.get('anomalies', ()))} findings", fontsize=11)
    return ax
