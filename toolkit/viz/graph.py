"""The state-transition graph of a history: fixed nodes, edges labelled with counts.

The layout is the one of DESIGN.md's diagram, fixed so that two graphs
(safe next to naive, or step 3 next to step 4) can be compared by eye: the
happy path runs left to right along the top, the resting states sit below.
Every legal edge of ``TRANSITIONS`` is drawn faintly; the edges the history
took are drawn dark with their count; a move the table forbids is drawn red
and dashed; the ``current`` transition (when stepping) is drawn thick red.
"""

import collections

from toolkit.ledger import TRANSITIONS
from toolkit.viz.style import STATE_COLOURS, axes, field, name, records

POSITIONS = {
    "cancelled": (2.55, 3.4),
    "pending": (0.0, 2.0),
    "unknown": (1.7, 2.0),
    "submitted": (3.4, 2.0),
    "done": (5.1, 2.0),
    "failed": (1.7, 0.5),
    "needs_review": (3.4, 0.5),
    "partial": (2.55, 1.2),  # between the pages of a long document: back to unknown for the next
}
# Edges that would run straight through a node bend further out.
BEND = {("unknown", "done"): 0.24, ("needs_review", "cancelled"): -0.3,
        ("pending", "cancelled"): -0.12, ("partial", "cancelled"): 0.25}
CURRENT = "#d62728"


def transition_counts(events) -> tuple[collections.Counter, int]:
    """``(Counter((from, to) -> n) of moves, number of adds)`` of an event list or History.

    Claims and releases change the lease, not the state: they are not counted.
    """
    moves, adds = collections.Counter(), 0
    for event in records(events):
        op = field(event, "op", default="move")
        if op == "add":
            adds += 1
        elif op == "move":
            moves[name(field(event, "frm", "from")), name(field(event, "to"))] += 1
    return moves, adds


def _current(current):
    """``(from, to)``, from a pair or an event; None when nothing is highlighted."""
    if current is None:
        return None
    if isinstance(current, tuple):
        return name(current[0]), name(current[1])
    op = field(current, "op", default="move")
    frm, to = name(field(current, "frm", "from")), name(field(current, "to"))
    return ("add", to) if op == "add" else (frm, to) if op == "move" else (to, to)


def _label_at(start, end, bend):
    """Where the middle of an ``arc3`` curve lies (its control point's half-way)."""
    (x1, y1), (x2, y2) = start, end
    dx, dy = x2 - x1, y2 - y1
    return (x1 + x2) / 2 + 0.5 * bend * dy, (y1 + y2) / 2 - 0.5 * bend * dx


def state_graph(events, ax=None, current=None, occupancy=None, title=None):
    """Draw the states and the transitions of ``events`` (a History or a list of events).

    ``current``: an event or a ``(from, to)`` pair to highlight. ``occupancy``:
    state -> number of items there now, written under each node. Returns ``ax``.
    """
    ax = axes(ax, (8, 4.2))
    moves, adds = transition_counts(events)
    now = _current(current)
    legal = {(frm.value, to.value) for frm, tos in TRANSITIONS.items() for to in tos}
    for frm, to in sorted(legal | set(moves)):
        count = moves.get((frm, to), 0)
        if frm not in POSITIONS or to not in POSITIONS:
            continue
        hot = now == (frm, to)
        if frm == to:
            _loop(ax, frm, count, hot)
            continue
        bend = BEND.get((frm, to), BEND.get((to, frm), 0.18))  # a reverse edge bends the other way
        illegal = (frm, to) not in legal
        colour = CURRENT if hot or illegal else "#333333" if count else "#d4d4d4"
        ax.annotate("", xy=POSITIONS[to], xytext=POSITIONS[frm], zorder=1,
                    arrowprops=dict(arrowstyle="-|>", color=colour, shrinkA=26, shrinkB=26,
                                    lw=3.2 if hot else 1.6 if count else 0.7,
                                    linestyle="--" if illegal or not count else "-",
                                    connectionstyle=f"arc3,rad={bend}"))
        if count:
            x, y = _label_at(POSITIONS[frm], POSITIONS[to], bend)
            ax.text(x, y, f"{count}{' !' if illegal else ''}", ha="center", va="center",
                    fontsize=9, color=colour, zorder=3,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none"))
    _entry(ax, adds, now is not None and now[0] == "add")
    for state, (x, y) in POSITIONS.items():
        hot = now is not None and now[1] == state
        ax.text(x, y, state, ha="center", va="center", fontsize=10, zorder=4,
                fontweight="bold" if hot else "normal",
                bbox=dict(boxstyle="round,pad=0.45", fc=STATE_COLOURS[state],
                          ec=CURRENT if hot else "#555555", lw=2.5 if hot else 0.8))
        if occupancy and occupancy.get(state):
            ax.text(x, y - 0.36, f"{occupancy[state]} item{'s' * (occupancy[state] != 1)}",
                    ha="center", va="center", fontsize=8, color="#333333", zorder=4)
    ax.set_xlim(-1.25, 5.75)
    ax.set_ylim(0.05, 3.75)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=11)
    return ax


def _loop(ax, state, count, hot):
    """A self-transition (done -> done: a damaged artifact re-fetched) as a label above."""
    if not count and not hot:
        return
    x, y = POSITIONS[state]
    ax.text(x, y + 0.42, f"\u21bb {count}", ha="center", va="center", fontsize=9,
            color=CURRENT if hot else "#333333", zorder=3)


def _entry(ax, adds, hot):
    """The arrow into ``pending`` from the left: items added to the ledger."""
    x, y = POSITIONS["pending"]
    colour = CURRENT if hot else "#333333" if adds else "#d4d4d4"
    ax.annotate("", xy=(x, y), xytext=(x - 1.0, y), zorder=1,
                arrowprops=dict(arrowstyle="-|>", color=colour, shrinkA=0, shrinkB=24,
                                lw=3.2 if hot else 1.6))
    ax.text(x - 1.0, y + 0.1, f"add {adds}" if adds else "add", ha="left", va="bottom",
            fontsize=9, color=colour)
