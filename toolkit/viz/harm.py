"""The harm a run did, one bar per kind: what a submits-only chart cannot show.

``harm_bars(rows)``: per row (a drill run), one bar per harm kind (double
executions, poison sent, items lost, fake ``done``, parked but paid, and
resubmitted blind: a risk taken even where this provider did not bill it), each
labelled with its count; a zero is written as ``0`` on the axis, so "no
harm" is shown, not left out. The row's submit calls and executions go under
its label. Rows come from ``toolkit.widgets.experiment.harm_rows``.
"""

from toolkit.viz.style import DOUBLE, axes

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
