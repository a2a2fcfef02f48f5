"""Harm per drill, every kind on its own bar; pages done per long document; run marks.

``harm_counts(rows)``: one group of bars per drill, one bar per kind of harm
a drill can do (double executions, fake done, lost items, poison sent,
parked but paid). A design that did none of it shows "no harm" in words, so
an empty group is never mistaken for a missing one.

``page_progress(events, marks)``: pages checkpointed over time for each
document sent page by page, with the crash and the restart marked: the safe
runner resumes at the next page, a naive one falls back to page 1.

``draw_marks(ax, marks)``: vertical lines for faults, crashes and restarts
(``{"x", "label", "kind"}``), shared by ``timeline`` and ``page_progress``.
"""

from toolkit.viz.style import DOUBLE, axes, field, name, records

HARMS = (  # (row field, label, colour): the order of the bars in each group
    ("double_execution", "double executions", DOUBLE),
    ("fake_done", "fake done", "#ff7f0e"),
    ("lost_item", "lost items", "#8c564b"),
    ("poison_submitted", "poison sent", "#bcbd22"),
    ("parked_after_success", "parked but paid", "#9467bd"),
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
    ax.set_xticks(range(len(rows)), [str(row.get("label", "")).replace("/", "/\n") for row in rows],
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


# harm_bars (notebooks 04, 05, 07, 08, 09): the same harms with submits and executions
# under each label and the blind resubmit as a kind of its own.
KINDS = (("doubles", "double executions", DOUBLE),
         ("poison_sent", "poison sent", "#6a3d9a"),
         ("lost", "items lost", "#ff7f00"),
         ("fake_done", "fake done", "#8c564b"),
         ("parked_paid", "parked but paid", "#e7298a"),
         ("blind", "resubmitted blind", "#7f7f7f"))


def harm_bars(rows, ax=None, title="Harm per run: what the batch broke or paid twice"):
    """Grouped bars per row, one per harm kind; returns ``ax``."""
    ax = axes(ax, (max(7.5, 2.0 * len(rows) + 1.5), 4.4))
    width = 0.8 / len(KINDS)
    top = 1
    for i, row in enumerate(rows):
        for j, (field, label, colour) in enumerate(KINDS):
            x = i - 0.4 + width * (j + 0.5)
            value = row.get(field) or 0
            ax.bar(x, value, width, color=colour, edgecolor="black", linewidth=0.5,
                   label=label if i == 0 else None)
            ax.text(x, value, str(value), ha="center", va="bottom", fontsize=8,
                    color="black" if value == 0 else colour,
                    fontweight="normal" if value == 0 else "bold")
            top = max(top, value)
    wrapped = [str(row["label"]).replace("/", "/\n") for row in rows]  # drill/naive-twin
    ticks = [f"{label}\n{row['submit_calls']} submits · {row['executions']} execs"
             for label, row in zip(wrapped, rows)]
    ax.set_xticks(range(len(rows)), ticks, fontsize=8)
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_ylabel("items")
    ax.legend(fontsize=8, loc="upper left", ncols=3 if len(rows) < 4 else len(KINDS),
              frameon=False)
    ax.set_ylim(0, top * 1.45 + 1.5)  # room above the bars for the legend row
    if title:
        ax.set_title(title, fontsize=11)
    return ax
