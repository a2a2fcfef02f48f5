"""``Stepper``: Play, slider, Prev and Next over a drill's steps (a thin ipywidgets view).

All logic is in ``scenario.step`` and ``scenario.frame``; this module only
wires them to widgets. Content is set through widget values (HTML, Image),
never printed inside ``with output:``, so a notebook that shows a stepper
stays reproducible under strict nbval.
"""

import ipywidgets as w

from toolkit import viz
from toolkit.widgets.scenario import Cursor, frame, frames, step


class View:
    """A panel made of widgets; ``widget`` is its root box.

    Displayed, it is that box; its ``text/plain`` form (what strict nbval
    compares, and what a static viewer prints) is ``describe()``.
    """

    widget: w.Box

    def describe(self) -> str:
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs):
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.describe()
        return bundle

    def __repr__(self):
        return self.describe()


def _button(description, tooltip):
    return w.Button(description=description, tooltip=tooltip, layout=w.Layout(width="90px"))


class Stepper(View):
    """Step through ``result`` (a DrillResult): the event, counters, both tables, the graph.

    ``graph=False`` leaves the state graph out (faster; tests that look at tables).
    """

    def __init__(self, result, graph: bool = True, interval: int = 800):
        self.result = result
        self.moments = frames(result)  # ledger events, faults, provider events, restarts
        self.cursor = Cursor(0, len(self.moments))
        last = max(self.cursor.count - 1, 0)
        self.play = w.Play(value=0, min=0, max=last, step=1, interval=interval,
                           description="Play", show_repeat=False)
        self.slider = w.IntSlider(value=0, min=0, max=last, description="step",
                                  continuous_update=False, readout=False)
        w.link((self.play, "value"), (self.slider, "value"))  # kernel-side: works without a browser
        self.first = _button("\u00ab First", "first step")
        self.prev = _button("\u25c0 Prev", "previous step")
        self.next = _button("Next \u25b6", "next step")
        self.last = _button("Last \u00bb", "last step")
        for button, action in ((self.first, "first"), (self.prev, "prev"), (self.next, "next"),
                               (self.last, "last")):
            button.on_click(lambda _, action=action: self.apply(action))
        self.slider.observe(self._moved, names="value")
        self.headline = w.HTML().add_class("toolkit-step-headline")
        self.counters = w.HTML().add_class("toolkit-step-counters")
        self.ledger = w.HTML(layout=w.Layout(margin="0 24px 0 0"))
        self.jobs = w.HTML()
        self.graph = w.Image(format="png", layout=w.Layout(max_width="720px")) if graph else None
        self._pngs = {}
        tables = w.HBox([self.ledger, self.jobs])
        self.widget = w.VBox([
            w.HTML(f"<b>{result.drill.name}</b>: {result.drill.summary}"),
            w.HBox([self.play, self.slider, self.first, self.prev, self.next, self.last]),
            self.headline, self.counters, tables] + ([self.graph] if graph else []))
        self._render()

    @property
    def frame(self):
        return frame(self.result, self.cursor.index, self.moments)

    def apply(self, action) -> None:
        """Move by ``action`` (first, prev, next, last or an index); the slider follows."""
        target = step(self.cursor, action).index
        if target != self.slider.value:
            self.slider.value = target  # -> _moved -> render
        else:
            self.cursor = Cursor(target, self.cursor.count)

    def _moved(self, change) -> None:
        self.cursor = step(self.cursor, int(change["new"]))
        self._render()

    def _render(self) -> None:
        if not self.cursor.count:
            self.headline.value = "<i>this drill recorded no steps</i>"
            return
        f = self.frame
        # Everything is computed before any widget changes (the graph takes longest): the
        # browser then gets headline, tables and graph of one step together. Drawing the
        # graph last let Play show a new table under the previous step's graph.
        png = None
        if self.graph is not None:
            if f.index not in self._pngs:
                self._pngs[f.index] = viz.to_png(viz.state_graph, f.events, current=f.current,
                                                 occupancy=f.occupancy, figsize=(8, 4.2),
                                                 title=f.graph_title)
            png = self._pngs[f.index]
        if png is not None:
            self.graph.value = png
        self.shown = f.index  # the step every part of the view shows now
        style = {"fault": "color:#d62728", "provider": "color:#3182bd",
                 "restart": "color:#9467bd", "end": "color:#555555"}.get(f.kind, "")
        self.headline.value = f"<b{f' style={style!r}' if style else ''}>{_escape(f.headline)}</b>"
        colour = "#d62728" if f.doubles else "#333333"
        self.counters.value = f"<span style='color:{colour};font-weight:bold'>" \
                              f"{_escape(f.counters())}</span>"
        self.ledger.value = f.ledger._repr_html_()
        self.jobs.value = f.jobs._repr_html_()
        self.first.disabled = self.prev.disabled = f.index == 0
        self.next.disabled = self.last.disabled = f.index == f.count - 1

    def describe(self) -> str:
        return (f"Stepper over {self.result.drill.name!r}: {self.cursor.count} steps "
                "(Play, the slider, First/Prev/Next/Last)")


def _escape(text: str) -> str:
    import html

    return html.escape(text)
