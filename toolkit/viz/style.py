"""Colours, field access on plain records, and the lazy matplotlib entry points."""

import io

STATE_COLOURS = {
    "pending": "#c7c7c7",
    "unknown": "#f0ad4e",
    "submitted": "#5b9bd5",
    "done": "#4caf50",
    "failed": "#d9534f",
    "needs_review": "#9467bd",
    "cancelled": "#7f7f7f",
    "partial": "#a6d96a",
}
VERDICT_COLOURS = {"valid": "#4caf50", "parked": "#9467bd", "violation": "#d9534f",
                   "undecided": "#c7c7c7"}
DOUBLE = "#d62728"  # double executions: the one colour nothing else uses
ACTION_COLOURS = {"skip": "#4caf50", "verify": "#17becf", "reconcile": "#f0ad4e", "retry": "#5b9bd5",
                  "review": "#9467bd", "run": "#c7c7c7"}


def name(value) -> str | None:
    """A state (``State`` enum or string) as its plain name; None stays None."""
    if value is None:
        return None
    return str(getattr(value, "value", value))


def field(record, *names, default=None):
    """The first of ``names`` that ``record`` has, as attribute or mapping key."""
    for each in names:
        if isinstance(record, dict):
            if each in record:
                return record[each]
        elif hasattr(record, each):
            return getattr(record, each)
    return default


def records(events) -> list:
    """Events from a ``History``, a DataFrame (forensics) or any iterable of records."""
    if hasattr(events, "events") and not callable(events.events):
        events = events.events  # a History
    if events is None:
        return []
    if hasattr(events, "to_dict"):
        return events.to_dict("records")  # a pandas DataFrame
    return list(events)


def axes(ax, figsize):
    """``ax`` itself, or the axes of a new pyplot figure (shown inline by Jupyter)."""
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize, layout="constrained")[1]


def to_png(draw, *args, figsize=(8, 4), dpi=80, **kwargs) -> bytes:
    """Draw ``draw(*args, ax=..., **kwargs)`` on a pyplot-free figure; return PNG bytes.

    For widgets: no figure is registered with pyplot, so nothing leaks or is
    displayed twice.
    """
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    draw(*args, ax=figure.add_subplot(), **kwargs)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
