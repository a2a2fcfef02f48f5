"""``Table``: rows shown as text (tests, plain output) and as HTML (notebooks, widgets).

The same object is a notebook cell's output and a widget's content, so what
strict nbval compares (``text/plain`` and ``text/html``) is exactly what a
reader sees, and carries nothing that varies between runs: no timestamps,
no temporary paths, no pids, no pandas dtypes.
"""

import html
import re

from toolkit.viz.style import STATE_COLOURS

_LONG_KEY = re.compile(r"\b([0-9a-f]{8})[0-9a-f]{56}\b")
_AT_TIME = re.compile(r" at t=[0-9.]+(?:e[+-]?[0-9]+)?")


def short(text) -> str:
    """Text for people: 64-hex task keys cut to 8 digits, wall-clock stamps dropped."""
    return _AT_TIME.sub("", _LONG_KEY.sub(r"\1…", "-" if text is None else str(text)))


class Table:
    """Rows (dicts) under ``columns``; ``marked`` rows are highlighted.

    ``repr()`` is an aligned text table, ``_repr_html_()`` an HTML table
    whose ``state`` column is coloured like the charts.
    """

    def __init__(self, rows, columns=None, marked=(), title=None):
        self.rows = [dict(row) for row in rows]
        self.columns = list(columns or (self.rows[0] if self.rows else ()))
        self.marked = frozenset(marked)  # row indexes
        self.title = title

    def __len__(self):
        return len(self.rows)

    def cells(self, row) -> list[str]:
        return [short(row.get(column)) for column in self.columns]

    def __repr__(self):
        body = [self.cells(row) for row in self.rows]
        widths = [max([len(column)] + [len(cells[i]) for cells in body])
                  for i, column in enumerate(self.columns)]

        def line(cells, mark=" "):
            return (mark + " " + "  ".join(c.ljust(w) for c, w in zip(cells, widths))).rstrip()

        out = [self.title] if self.title else []
        out += [line(self.columns), line(["-" * w for w in widths])]
        out += [line(cells, ">" if i in self.marked else " ") for i, cells in enumerate(body)]
        if not self.rows:
            out.append("  (none)")
        return "\n".join(out)

    __str__ = __repr__

    def _repr_html_(self):
        head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in self.columns)
        body = []
        for i, row in enumerate(self.rows):
            cells = []
            for column, text in zip(self.columns, self.cells(row)):
                colour = STATE_COLOURS.get(text) if column == "state" else None
                background = f";background:{colour}" if colour else ""
                cells.append(f"<td style='text-align:left{background}'>{html.escape(text)}</td>")
            mark = " style='outline:2px solid #d62728;font-weight:bold'" if i in self.marked else ""
            body.append(f"<tr{mark}>{''.join(cells)}</tr>")
        if not self.rows:
            body.append(f"<tr><td colspan='{len(self.columns) or 1}'>(none)</td></tr>")
        caption = f"<caption style='text-align:left'>{html.escape(self.title)}</caption>" \
            if self.title else ""
        return (f"<table style='font-family:monospace;font-size:12px'>{caption}"
                f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
