"""Harm per drill, every kind on its own bar; pages done per long document; run marks.

``harm_counts(rows)``: one group of bars per drill, one bar per kind of harm
a drill can do (double executions, fake done, lost items, poison sent,
parked but paid, resubmitted blind), its submits and executions written
under its label. A design that did none of it shows "no harm" in words, so
an empty group is never mistaken for a missing one. The rows come from
``toolkit.widgets.harm_rows`` (the one row builder).

``page_progress(events, marks)``: pages checkpointed over time for each
document sent page by page, with the crash and the restart marked: the safe
runner resumes at the next page, a naive one falls back to page 1.

``draw_marks(ax, marks)``: vertical lines for faults, crashes and restarts
(``{"x", "label", "kind"}``), shared by ``timeline`` and ``page_progress``.
"""

from toolkit.viz.style import DOUBLE, axes, field, name, records

HARMS = (  # (row field, label, colour): the order of the bars in each group
    ("doubles", "double executions", DOUBLE),
    ("fake_done", "fake done", "#ff7f0e"),
    ("lost", "lost items", "#8c564b"),
    ("poison_sent", "poison sent", "#bcbd22"),
    ("parked_paid", "parked but paid", "#9467bd"),
    ("blind", "resubmitted blind", "#7f7f7f"),
)
MARK_ROOM = 0.075  # axes fraction per mark label
MARK_STYLES = {"fault": (DOUBLE, "--"), "crash": ("#000000", "-"), "restart": ("#9467bd", ":")}


def harm_counts(rows, ax=None, title="Harm done, by kind"):
    """Grouped bars: for each row (``label`` and a count per ``HARMS`` field), one bar per
    kind of harm, its count written above it; a row with none says "no harm". Returns ``ax``."""
    ax = axes(ax, (max(6.0, 1.6 * len(rows) + 2.5), 3.8))
    width = 0.8 / len(HARMS)
    top = 1
    for i, row in enumerate(rows):
        total = 0
        for j, (field_name, label, colour) in enumerate(HARMS):
            count = row.get(field_name) or 0
            total += count
            x = i - 0.4 + width * (j + 0.5)
            ax.bar(x, count, width, color=colour, edgecolor="black", linewidth=0.5,
                   label=label if i == 0 else None)
            if count:
                ax.text(x, count, str(count), ha="center", va="bottom", fontsize=8,
                        fontweight="bold", color=colour)
            top = max(top, count)
        if not total:
            ax.text(i, 0.15, "no harm", ha="center", va="bottom", fontsize=9, color="#2e7d32")
    ax.set_xticks(range(len(rows)), [tick(row) for row in rows],
                  rotation=15 if len(rows) > 3 else 0, ha="right" if len(rows) > 3 else "center",
                  fontsize=8)
    from matplotlib.ticker import MaxNLocator

    ax.set_ylim(0, top * 1.25 + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_ylabel("count")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        ax.set_title(title, fontsize=11)
    return ax


def tick(row) -> str:
    """A group's label: the drill (``drill/naive-twin`` on two lines), then what it cost."""
    label = str(row.get("label", "")).replace("/", "/\n")
    if "submit_calls" in row:
        label += f"\n{row['submit_calls']} submits \u00b7 {row['executions']} execs"
    return label


def draw_marks(ax, marks):
    """A vertical line per mark; the labels written level, one under the other, from the
    top of the axes (callers leave headroom: ``MARK_ROOM`` per mark, in axes fraction)."""
    low, high = ax.get_xlim()
    for n, mark in enumerate(marks):
        colour, style = MARK_STYLES.get(mark.get("kind"), ("#555555", "-."))
        ax.axvline(mark["x"], color=colour, linestyle=style, linewidth=1.4, zorder=3)
        right = mark["x"] > (low + high) / 2  # a label in the right half reads leftwards
        ax.annotate(mark["label"], xy=(mark["x"], 1.0 - MARK_ROOM * (n + 0.5)),
                    xycoords=("data", "axes fraction"), xytext=(-3 if right else 3, 0),
                    textcoords="offset points", va="center", ha="right" if right else "left",
                    fontsize=8,
                    color=colour, zorder=4,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))


def headroom(marks) -> float:
    """The fraction of the axes height the labels of ``marks`` take at its top."""
    return min(MARK_ROOM * len(marks) + 0.02, 0.6) if marks else 0.0


def page_progress(events, marks=(), ax=None, title="Pages checkpointed, page by page"):
    """For each document sent page by page: pages done after each event (a step line);
    ``marks`` (fault, crash, restart) as vertical lines; where a document picks up again
    after a restart, "resumes at page N" is written. Returns ``ax``."""
    lanes = {}
    for event in sorted(records(events), key=lambda e: field(e, "seq", default=0)):
        detail = field(event, "detail") or {}
        if isinstance(detail, dict) and "pages_done" in detail:
            lanes.setdefault(field(event, "key"), []).append(
                (field(event, "seq"), int(detail["pages_done"]), name(field(event, "to"))))
    ax = axes(ax, (8, 3.6))
    restarts = sorted(mark["x"] for mark in marks if mark.get("kind") == "restart")
    pages = 1
    for n, (key, points) in enumerate(lanes.items()):
        xs = [seq for seq, _, _ in points]
        ys = [done for _, done, _ in points]
        pages = max(pages, *ys)
        line, = ax.step(xs, ys, where="post", linewidth=2, label=f"document {n + 1}")
        ax.plot(xs, ys, "o", color=line.get_color(), markersize=3)
        for x in restarts:
            after = [(seq, done) for seq, done, _ in points if seq > x]
            if after and any(seq < x for seq, _, _ in points):
                seq, done = after[0]
                ax.annotate(f"resumes at page {done + 1}", xy=(seq, done), xytext=(6, 10),
                            textcoords="offset points", fontsize=9, fontweight="bold",
                            color=line.get_color(), arrowprops=dict(arrowstyle="->",
                                                                    color=line.get_color()))
    draw_marks(ax, marks)
    span = pages + 1.5
    ax.set_ylim(-0.3, -0.3 + span / (1 - headroom(marks)))
    ax.set_yticks(range(pages + 1))
    ax.set_ylabel("pages done (checkpointed)")
    ax.set_xlabel("event seq")
    if lanes:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        ax.set_title(title, fontsize=11)
    return ax
