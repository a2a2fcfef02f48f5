"""The comparer, the contract explorer and the audit explorer (thin ipywidgets views).

Each holds a state from ``choices`` and replaces it with ``*_step(state,
action)`` on every click or change; rendering sets widget values only.
"""

import html

import ipywidgets as w

from toolkit import viz
from toolkit.widgets import choices
from toolkit.widgets.results import count_row
from toolkit.widgets.stepper import Stepper, View


def _show_chart(image, outcomes) -> None:
    """The counts chart of ``outcomes`` in ``image``; hidden while there is nothing to draw."""
    rows = [count_row(o.result, o.drill.strategy) for o in outcomes if o.result is not None]
    image.value = viz.to_png(viz.submit_counts, rows, figsize=(
        max(5.0, 1.3 * len(rows) + 2), 3.6)) if rows else b""
    image.layout.display = None if rows else "none"


class Comparer(View):
    """Pick a fault scenario and strategies, press Run: counts chart and verdicts side by side,
    and a ``Stepper`` over the run picked in "step through"."""

    def __init__(self, scenario: str = "lost-reply", strategies=None, run=None):
        self.state = choices.comparison(scenario, strategies)
        self._run = run or choices.run_drill
        self.scenario = w.Dropdown(options=choices.SCENARIOS, value=self.state.scenario,
                                   description="fault")
        self.strategies = w.SelectMultiple(options=list(choices.STRATEGIES),
                                           value=self.state.strategies, rows=5,
                                           description="strategies")
        self.run = w.Button(description="Run", button_style="primary", icon="play")
        self.summary = w.HTML()
        self.table = w.HTML()
        self.chart = w.Image(format="png", layout=w.Layout(max_width="720px"))
        self.pick = w.Dropdown(options=[], description="step through")
        self.stepping = w.VBox()  # the Stepper of the picked run
        self.stepper = None
        self._shown = None
        self.pick.observe(lambda c: self._step_through(c["new"]), names="value")
        self.scenario.observe(lambda c: self.apply(("scenario", c["new"])), names="value")
        self.strategies.observe(lambda c: self.apply(("strategies", tuple(c["new"]))),
                                names="value")
        self.run.on_click(lambda _: self.apply(("run",)))
        self.widget = w.VBox([w.HBox([self.scenario, self.strategies, self.run]), self.summary,
                              self.table, self.chart, self.pick, self.stepping])
        self._render()

    def apply(self, action) -> None:
        self.state = choices.compare_step(self.state, action, run=self._run)
        if action[0] == "scenario" and tuple(self.strategies.value) != self.state.strategies:
            self.strategies.value = self.state.strategies  # -> apply(("strategies", ...))
        self._render()

    def _render(self) -> None:
        drill = choices.DRILLS[self.state.scenario]
        self.summary.value = f"<b>{html.escape(drill.name)}</b>: {html.escape(drill.summary)}"
        self.table.value = choices.outcome_table(self.state.outcomes)._repr_html_() \
            if self.state.outcomes else "<i>press Run</i>"
        _show_chart(self.chart, self.state.outcomes)
        ran = [(o.drill.name, i) for i, o in enumerate(self.state.outcomes) if o.result is not None]
        self.pick.options = ran
        self.pick.value = ran[0][1] if ran else None  # options alone select nothing
        self.pick.layout.display = None if ran else "none"
        self._step_through(self.pick.value)

    def _step_through(self, index) -> None:
        """Show a Stepper over outcome ``index`` (None: none); built once per outcome."""
        if (self.state.outcomes, index) == self._shown:
            return
        self._shown = (self.state.outcomes, index)
        result = None if index is None else self.state.outcomes[index].result
        self.stepper = None if result is None else Stepper(result)
        self.stepping.children = () if self.stepper is None else (self.stepper.widget,)

    def describe(self) -> str:
        ran = f", ran {len(self.state.outcomes)}" if self.state.outcomes else ""
        return (f"Comparer: fault {self.state.scenario!r}, strategies "
                f"{', '.join(self.state.strategies) or '-'}{ran}")


class ContractExplorer(View):
    """The provider's promise as knobs; Run drills a lost reply plus a crash under it."""

    def __init__(self, run=None):
        self.state = choices.ContractChoice()
        self._run = run or choices.run_drill
        self.idempotent = w.ToggleButtons(
            options=[("idempotent keys", True), ("no promise", False)], value=True,
            description="keys")
        self.lookup = w.ToggleButtons(options=list(choices.LOOKUP_CHOICES), value="consistent",
                                      description="lookup")
        self.expiring = w.ToggleButtons(options=[("kept", False), ("forgotten after 1 h", True)],
                                        value=False, description="retention")
        self.run = w.Button(description="Run", button_style="primary", icon="play")
        self.promise = w.HTML()
        self.table = w.HTML()
        self.chart = w.Image(format="png", layout=w.Layout(max_width="720px"))
        for knob in ("idempotent", "lookup", "expiring"):
            getattr(self, knob).observe(lambda c, knob=knob: self.apply((knob, c["new"])),
                                        names="value")
        self.run.on_click(lambda _: self.apply(("run",)))
        self.widget = w.VBox([self.idempotent, self.lookup, self.expiring, self.run, self.promise,
                              self.table, self.chart])
        self._render()

    def apply(self, action) -> None:
        self.state = choices.contract_step(self.state, action, run=self._run)
        self._render()

    def _render(self) -> None:
        self.promise.value = f"<b>contract</b> {html.escape(choices.promise(self.state.spec))}"
        self.table.value = choices.outcome_table(self.state.outcomes)._repr_html_() \
            if self.state.outcomes else "<i>press Run</i>"
        _show_chart(self.chart, self.state.outcomes)

    def describe(self) -> str:
        return f"ContractExplorer: {choices.promise(self.state.spec)}"


class RetryExperiment(View):
    """The 30-document experiment: a failure-rate slider, strategies, Run; counts, verdicts
    and the first run's timeline (every retry is a band of colour in its lane)."""

    def __init__(self, run=None):
        self.state = choices.RetryChoice()
        self._run = run or choices.run_drill
        self.rate = w.FloatSlider(value=self.state.rate, min=0.0, max=0.9, step=0.1,
                                  description="transient", readout_format=".0%",
                                  continuous_update=False)
        self.strategies = w.SelectMultiple(options=list(choices.STRATEGIES),
                                           value=self.state.strategies, rows=4,
                                           description="strategies")
        self.run = w.Button(description="Run", button_style="primary", icon="play")
        self.table = w.HTML()
        self.chart = w.Image(format="png", layout=w.Layout(max_width="720px"))
        self.timeline = w.Image(format="png", layout=w.Layout(max_width="720px"))
        self.rate.observe(lambda c: self.apply(("rate", c["new"])), names="value")
        self.strategies.observe(lambda c: self.apply(("strategies", tuple(c["new"]))),
                                names="value")
        self.run.on_click(lambda _: self.apply(("run",)))
        self.widget = w.VBox([w.HBox([self.rate, self.strategies, self.run]), self.table,
                              self.chart, self.timeline])
        self._render()

    def apply(self, action) -> None:
        self.state = choices.retry_step(self.state, action, run=self._run)
        self._render()

    def _render(self) -> None:
        self.table.value = choices.outcome_table(self.state.outcomes)._repr_html_() \
            if self.state.outcomes else "<i>press Run</i>"
        _show_chart(self.chart, self.state.outcomes)
        first = next((o.result for o in self.state.outcomes if o.result is not None), None)
        self.timeline.value = b"" if first is None else viz.to_png(
            viz.timeline, first.history, title=f"{first.drill.name}: one lane per document",
            figsize=(8, 0.32 * len(first.history.items) + 1.6))
        self.timeline.layout.display = "none" if first is None else None

    def describe(self) -> str:
        return (f"RetryExperiment: transient rate {self.state.rate:.0%}, strategies "
                f"{', '.join(self.state.strategies) or '-'}")


class AuditExplorer(View):
    """An audit's summary chart, its findings filtered by kind, and the items to act on."""

    def __init__(self, report):
        self.state = choices.audit_view(report)
        counts = self.state.kinds
        self.kind = w.Dropdown(
            options=[(f"all kinds ({sum(counts.values())})", None)]
            + [(f"{kind} ({n})", kind) for kind, n in counts.items()], value=None,
            description="finding")
        self.findings = w.HTML()
        self.todo = w.HTML()
        self.chart = w.Image(format="png", value=viz.to_png(viz.audit_summary, self.state.summary,
                                                            figsize=(7, 5)),
                             layout=w.Layout(max_width="640px"))
        self.kind.observe(lambda c: self.apply(("kind", c["new"])), names="value")
        self.widget = w.VBox([self.chart, self.kind, self.findings, self.todo])
        self._render()

    def apply(self, action) -> None:
        self.state = choices.audit_step(self.state, action)
        self._render()

    def _render(self) -> None:
        self.findings.value = choices.findings_table(self.state)._repr_html_()
        self.todo.value = choices.todo_table(self.state)._repr_html_()

    def describe(self) -> str:
        summary = self.state.summary
        return (f"AuditExplorer: {summary['format']}, {summary['items']} items, "
                f"{len(summary['anomalies'])} findings; showing {self.state.kind or 'all kinds'}")


class KillNine(View):
    """Kill -9 for real: Run kills a two-document batch at every durable step (forked
    children, real SIGKILL), draws the crash map; pick a crash point to replay it and step
    through the killed run, the kill, the restart and the rerun."""

    def __init__(self, strategy: str = "safe", every: int = 1, sweep=None, replay=None):
        from toolkit.widgets import killnine

        self._k = killnine
        self._sweep, self._replay = sweep or killnine.sweep, replay or killnine.replay
        self.state = killnine.KillChoice(strategy, every)
        self.strategy = w.Dropdown(options=killnine.STRATEGIES, value=strategy,
                                   description="strategy")
        self.every = w.BoundedIntText(value=every, min=1, max=12, description="every k-th",
                                      layout=w.Layout(width="180px"))
        self.run = w.Button(description="Run", button_style="primary", icon="play")
        self.summary = w.HTML()
        self.chart = w.Image(format="png", layout=w.Layout(max_width="760px", display="none"))
        self.pick = w.Dropdown(options=[], description="replay")
        self.slider = w.IntSlider(value=0, min=0, max=0, description="frame",
                                  continuous_update=False)
        self.frame = w.HTML()
        self.strategy.observe(lambda c: self.apply(("strategy", c["new"])), names="value")
        self.every.observe(lambda c: self.apply(("every", c["new"])), names="value")
        self.run.on_click(lambda _: self.apply(("run",)))
        self.pick.observe(lambda c: c["new"] is not None and self.apply(("pick", c["new"])),
                          names="value")
        self.slider.observe(lambda c: self.apply(("frame", c["new"])), names="value")
        self.widget = w.VBox([w.HBox([self.strategy, self.every, self.run]), self.summary,
                              self.chart, self.pick, self.slider, self.frame])
        self._render()

    def apply(self, action) -> None:
        self.state = self._k.kill_step(self.state, action, sweep=self._sweep,
                                       replay=self._replay)
        self._render(action[0])

    def _render(self, verb=None) -> None:
        state, k = self.state, self._k
        explored = state.exploration
        if verb in (None, "strategy", "every", "run"):
            rows = k.map_rows(explored) if explored is not None else []
            self.chart.value = viz.to_png(viz.crash_map, rows, figsize=(
                8, 0.32 * len({r["lane"] for r in rows}) + 3.2)) if rows else b""
            self.chart.layout.display = None if rows else "none"
            self.pick.options = [(f"{row['point']} {row['how']}: {row['step']} "
                                  f"({row['verdict']})", (row["point"], row["how"]))
                                 for row in (explored.rows if explored else [])]
            self.pick.value = None
            if explored is not None:
                total = explored.total()
                self.summary.value = html.escape(
                    f"{total['points']} crash points, each a real SIGKILL: "
                    f"{total['violations']} violations, {total['parked']} parked")
            else:  # a new setting drops the map: say what Run will do, never the old counts
                self.summary.value = html.escape(
                    f"press Run: the {state.strategy} runner on two documents, killed at "
                    + ("every durable step" if state.every == 1 else
                       f"one durable step in {state.every}")
                    + ", each crash point a forked batch killed with SIGKILL")
        frames = k.replay_frames(state.replayed) if state.replayed else ()
        for part in (self.pick, self.slider, self.frame):
            part.layout.display = None if (frames or part is self.pick and explored) else "none"
        if verb == "pick":
            self.slider.max = max(len(frames) - 1, 0)
            self.slider.value = 0
        if frames:
            text = html.escape(frames[state.index])
            colour = "#d62728" if "SIGKILL" in text else "#9467bd" if "restart" in text else ""
            style = f" style='color:{colour}'" if colour else ""
            self.frame.value = f"<b{style}>{state.index + 1}/{len(frames)} · {text}</b>"

    def describe(self) -> str:
        ran = "" if self.state.exploration is None else \
            f", {len(self.state.exploration.rows)} crash points explored"
        return f"KillNine: strategy {self.state.strategy!r}, every {self.state.every}{ran}"
