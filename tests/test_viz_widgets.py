"""Charts and widgets, driven without a browser: the models after clicks and values.

Charts are checked through what they drew (artists, labels, colours), not
pixels; widgets through their state and the values of their child widgets.
"""

import html
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from toolkit import viz, widgets
from toolkit.checker import load_history
from toolkit.drills import DRILLS, run_drill
from toolkit.ledger import Event, State
from toolkit.viz.graph import CURRENT, POSITIONS
from toolkit.viz.style import DOUBLE, STATE_COLOURS, VERDICT_COLOURS
from toolkit.widgets import choices

ROOT = Path(__file__).resolve().parents[1]
HISTORIES = ROOT / "fixtures" / "histories"
LEDGERS = ROOT / "fixtures" / "ledgers"
S = State


def ev(seq, op, key, frm, to, **detail):
    return Event(seq, float(seq), op, key, frm, to, 1, "w1", 1, detail)


@pytest.fixture
def ax():
    return Figure().add_subplot()


@pytest.fixture(scope="module")
def blind():
    """A lost reply under a blind retry: the same document executes twice."""
    return run_drill(DRILLS["lost-reply/blind-retry"])


@pytest.fixture(scope="module")
def safe():
    return run_drill(DRILLS["lost-reply"])


def texts(ax):
    return [t.get_text() for t in ax.texts]


# -- import cost --------------------------------------------------------------------
@pytest.mark.parametrize("module", ["toolkit.viz", "toolkit.widgets"])
def test_importing_charts_or_widgets_does_not_import_matplotlib(module):
    code = f"import sys, {module}; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- state graph --------------------------------------------------------------------
def test_state_graph_counts_moves_and_adds_but_not_lease_claims_or_releases():
    events = [ev(1, "add", "a", None, S.PENDING), ev(2, "claim", "a", S.PENDING, S.PENDING),
              ev(3, "move", "a", S.PENDING, S.UNKNOWN), ev(4, "move", "a", S.UNKNOWN, S.SUBMITTED),
              ev(5, "move", "a", S.SUBMITTED, S.UNKNOWN),
              ev(6, "move", "a", S.UNKNOWN, S.SUBMITTED),
              ev(7, "release", "a", S.SUBMITTED, S.SUBMITTED)]
    moves, adds = viz.transition_counts(events)
    assert adds == 1
    assert moves == {("pending", "unknown"): 1, ("unknown", "submitted"): 2,
                     ("submitted", "unknown"): 1}


def test_state_graph_reads_json_events_and_histories_alike():
    history = load_history(HISTORIES / "double-execution.jsonl")
    as_json = [event.to_json() for event in history.events]
    assert viz.transition_counts(history) == viz.transition_counts(as_json)
    assert viz.transition_counts(history)[0][("submitted", "done")] == 1


def test_state_graph_draws_on_the_given_axes_with_a_label_per_used_edge(ax):
    events = [ev(1, "add", "a", None, S.PENDING), ev(2, "move", "a", S.PENDING, S.UNKNOWN),
              ev(3, "add", "b", None, S.PENDING), ev(4, "move", "b", S.PENDING, S.UNKNOWN)]
    assert viz.state_graph(events, ax=ax) is ax
    assert "2" in texts(ax) and "add 2" in texts(ax)
    assert set(POSITIONS) <= set(texts(ax))  # every state is a node, used or not


def test_state_graph_highlights_the_current_transition_and_only_it(ax):
    current = ev(2, "move", "a", S.UNKNOWN, S.SUBMITTED)
    viz.state_graph([ev(1, "move", "a", S.PENDING, S.UNKNOWN), current], ax=ax, current=current)
    red = [(a.xyann, a.xy) for a in ax.texts
           if getattr(a, "arrow_patch", None) is not None
           and to_hex(a.arrow_patch.get_edgecolor()) == CURRENT]
    assert red == [(POSITIONS["unknown"], POSITIONS["submitted"])]


def test_state_graph_marks_a_move_the_transition_table_forbids(ax):
    viz.state_graph([ev(1, "move", "a", S.PENDING, S.DONE)], ax=ax)
    assert "1 !" in texts(ax)


def test_state_graph_without_axes_makes_a_pyplot_figure():
    import matplotlib.pyplot as plt

    ax = viz.state_graph([])
    try:
        assert ax.figure.number in plt.get_fignums()
    finally:
        plt.close(ax.figure)


# -- counts -------------------------------------------------------------------------
def red_bars(ax):
    return [p for p in ax.patches if to_hex(p.get_facecolor()) == DOUBLE]


def test_submit_counts_paints_double_executions_red_and_names_them(ax):
    rows = [{"label": "safe", "submit_calls": 4, "executions": 4, "doubles": 0, "docs": 4},
            {"label": "naive", "submit_calls": 5, "executions": 6, "doubles": 2, "docs": 4}]
    viz.submit_counts(rows, ax=ax)
    (bar,) = red_bars(ax)
    assert (bar.get_y(), bar.get_height()) == (4, 2)  # the two executions above one per document
    assert any("+2 double" in text for text in texts(ax))


def test_submit_counts_without_doubles_has_nothing_red(ax):
    viz.submit_counts([{"label": "safe", "submit_calls": 21, "executions": 6, "docs": 6}], ax=ax)
    assert red_bars(ax) == [] and not any("double" in text for text in texts(ax))


def test_count_rows_of_a_blind_retry_count_the_second_execution_as_a_double(blind, safe):
    rows = widgets.count_rows([safe, blind])
    assert [row["doubles"] for row in rows] == [0, 1]
    assert rows[1]["executions"] == blind.executions and rows[1]["docs"] == 4


# -- timeline, crash map, audit summary ---------------------------------------------
def test_timeline_has_one_lane_per_item_coloured_by_its_states_in_order(ax):
    history = load_history(HISTORIES / "clean-safe-run.jsonl")
    viz.timeline(history, ax=ax)
    lanes = [label.get_text() for label in ax.get_yticklabels()]
    assert len(lanes) == len(history.items)
    first = min(history.items, key=lambda k: min(e.seq for e in history.events if e.key == k))
    states = [e.to.value for e in sorted(history.events, key=lambda e: e.seq)
              if e.key == first and e.op in ("add", "move")]
    y0 = [p for p in ax.patches if abs(p.get_y() + p.get_height() / 2) < 1e-9]
    assert [to_hex(p.get_facecolor()) for p in sorted(y0, key=lambda p: p.get_x())] == \
        [STATE_COLOURS[s] for s in states]


def test_crash_map_puts_each_row_at_its_point_in_its_verdict_colour(ax):
    rows = [{"step": 0, "point": "after_intent", "verdict": "parked", "lane": "safe"},
            {"step": 1, "point": "after_submit", "verdict": "valid", "lane": "safe"},
            {"step": 1, "point": "after_submit", "verdict": "violation", "lane": "blind-retry"}]
    viz.crash_map(rows, ax=ax)
    drawn = [(tuple(c.get_offsets()[0]), to_hex(c.get_facecolor()[0])) for c in ax.collections
             if len(c.get_offsets())]
    assert drawn == [((0, 0), VERDICT_COLOURS["parked"]), ((1, 0), VERDICT_COLOURS["valid"]),
                     ((1, 1), VERDICT_COLOURS["violation"])]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["after_intent", "after_submit"]


def test_audit_summary_shows_states_findings_and_plan_each_on_its_own_axis(ax):
    """States and actions count items, findings count anomalies: three panels, three
    scales, never one axis mixing them."""
    summary = {"format": "toolkit-jsonl", "items": 3, "by_state": {"done": 2, "unknown": 1},
               "anomalies": [{"key": "a", "kind": "stuck_unknown", "detail": "x"}],
               "plan": {"skip": 2, "reconcile": 1, "run": 0}}
    viz.audit_summary(summary, ax=ax)
    panels = ax.child_axes
    assert [p.get_title(loc="left") for p in panels] == [
        "items by state", "findings by kind", "items by next action"]
    assert [[t.get_text() for t in p.get_yticklabels()] for p in panels] == [
        ["done", "unknown"], ["stuck_unknown"], ["skip", "reconcile"]]
    assert [[b.get_width() for b in p.patches] for p in panels] == [[2, 1], [1], [2, 1]]


def test_to_png_renders_without_registering_a_pyplot_figure():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    png = viz.to_png(viz.state_graph, [])
    assert png.startswith(b"\x89PNG") and plt.get_fignums() == before


# -- the stepper, as pure functions ---------------------------------------------------
def test_stepper_next_at_last_step_stays_at_last_step():
    assert widgets.step(widgets.Cursor(4, 5), "next") == widgets.Cursor(4, 5)


def test_stepper_prev_at_first_step_stays_at_first_step():
    assert widgets.step(widgets.Cursor(0, 5), "prev") == widgets.Cursor(0, 5)


@pytest.mark.parametrize("action, index", [(-3, 0), (2, 2), (99, 4), ("first", 0), ("last", 4)])
def test_stepper_jumps_are_clamped_into_the_steps(action, index):
    assert widgets.step(widgets.Cursor(1, 5), action).index == index


@pytest.mark.parametrize("action", ["forward", 1.5, None, True])
def test_stepper_rejects_an_unknown_action(action):
    with pytest.raises(ValueError):
        widgets.step(widgets.Cursor(1, 5), action)


def test_frames_count_the_provider_as_it_was_at_that_step(blind):
    """Each ledger-event frame shows the provider's counters of the step recorded with it;
    the last frame shows the drill's totals and the doubled execution."""
    shown = widgets.frames(blind)
    frames = [widgets.frame(blind, i, shown) for i in range(len(shown))]
    at_events = [(f.submit_calls, f.executions) for f in frames if f.kind == "event"]
    assert at_events == [(s.submit_calls, s.executions) for s in blind.steps
                         if s.event is not None]
    assert frames[0].doubles == 0 and frames[-1].doubles == 1
    last = frames[-1]
    assert (last.submit_calls, last.executions) == (blind.submit_calls, blind.executions)


def test_frames_history_grows_by_exactly_the_events_stepped_over(blind):
    """The graph's history grows by one at each ledger-event frame and never otherwise."""
    shown = widgets.frames(blind)
    sizes = [len(widgets.frame(blind, i, shown).events) for i in range(len(shown))]
    with_event = [int(m.event is not None) for m in shown]
    assert sizes == [sum(with_event[:i + 1]) for i in range(len(sizes))]
    assert sizes[-1] == len(blind.history.events)


def test_frame_outside_the_steps_is_an_index_error(blind):
    with pytest.raises(IndexError):
        widgets.frame(blind, len(widgets.frames(blind)))


def test_frame_at_the_end_of_a_blind_retry_shows_two_jobs_for_one_document(blind):
    jobs = widgets.frame(blind, len(widgets.frames(blind)) - 1).jobs
    doubled = [row for row in jobs.rows if row["twice"] == "DOUBLE"]
    assert len(doubled) == 2 and len({row["task"] for row in doubled}) == 1


# -- the stepper widget ---------------------------------------------------------------
def test_stepper_next_button_moves_headline_slider_and_play_together(blind):
    stepper = widgets.Stepper(blind, graph=False)
    assert stepper.headline.value.startswith("<b>step 1/")
    stepper.next.click()
    stepper.next.click()
    assert stepper.cursor.index == stepper.slider.value == stepper.play.value == 2
    assert "step 3/" in stepper.headline.value


def test_stepper_play_value_drives_the_view_as_the_browser_would(blind):
    stepper = widgets.Stepper(blind, graph=False)
    stepper.play.value = 6  # what the Play widget's frontend sends at its 7th tick
    assert stepper.cursor.index == 6
    assert stepper.moments[6].text in html.unescape(stepper.headline.value)


def test_stepper_last_button_shows_the_double_execution_in_red(blind):
    stepper = widgets.Stepper(blind, graph=False)
    stepper.last.click()
    assert "DOUBLE EXECUTIONS 1" in stepper.counters.value and "#d62728" in stepper.counters.value
    assert stepper.next.disabled and not stepper.prev.disabled


def test_stepper_next_button_at_last_step_stays_at_last_step(blind):
    stepper = widgets.Stepper(blind, graph=False)
    stepper.last.click()
    shown = stepper.headline.value
    stepper.next.click()
    assert stepper.cursor.index == len(stepper.moments) - 1 and stepper.headline.value == shown


def test_stepper_graph_image_changes_with_the_step(safe):
    stepper = widgets.Stepper(safe)
    first = bytes(stepper.graph.value)
    stepper.apply(7)
    assert first.startswith(b"\x89PNG") and bytes(stepper.graph.value) != first


def test_stepper_marks_the_ledger_row_of_the_current_event(safe):
    stepper = widgets.Stepper(safe, graph=False)
    stepper.apply(5)
    frame = stepper.frame
    (marked,) = frame.ledger.marked
    assert frame.ledger.rows[marked]["key"] == frame.current.key[:8]


def test_stepper_text_form_is_stable_and_the_widget_view_is_kept(blind):
    bundle = widgets.Stepper(blind, graph=False)._repr_mimebundle_()
    assert bundle["text/plain"] == (f"Stepper over 'lost-reply/blind-retry': "
                                    f"{len(widgets.frames(blind))} "
                                    "steps (Play, the slider, First/Prev/Next/Last)")
    assert "application/vnd.jupyter.widget-view+json" in bundle


# -- comparer, contract explorer --------------------------------------------------------
class CountingRun:
    def __init__(self, fail=()):
        self.drills, self.fail = [], set(fail)

    def __call__(self, drill):
        self.drills.append(drill)
        if drill.strategy in self.fail:
            raise RuntimeError("boom")
        return run_drill(drill)


def test_comparer_run_button_runs_one_drill_per_chosen_strategy():
    run = CountingRun()
    comparer = widgets.Comparer("lost-reply", run=run)
    comparer.strategies.value = ("safe", "blind-retry", "timeout-as-failed")
    assert comparer.chart.layout.display == "none" and comparer.stepper is None
    comparer.run.click()
    assert [d.strategy for d in run.drills] == ["safe", "blind-retry", "timeout-as-failed"]
    table = widgets.outcome_table(comparer.state.outcomes)
    assert [row["verdict"] for row in table.rows] == ["valid", "INVALID", "INVALID"]
    assert bytes(comparer.chart.value).startswith(b"\x89PNG")
    assert comparer.chart.layout.display is None


def test_comparer_steps_through_the_run_picked_after_run():
    comparer = widgets.Comparer("lost-reply")
    comparer.run.click()
    assert comparer.stepper.result.drill.name == "lost-reply"
    comparer.pick.value = 1
    assert comparer.stepper.result.drill.name == "lost-reply/blind-retry"
    assert comparer.stepping.children == (comparer.stepper.widget,)
    comparer.stepper.next.click()
    assert comparer.stepper.cursor.index == 1


def test_comparer_new_fault_resets_strategies_to_safe_and_its_twin_and_drops_results():
    state = widgets.compare_step(widgets.comparison("lost-reply", ["safe"]), ("run",),
                                 run=lambda drill: "result")
    assert state.outcomes
    state = widgets.compare_step(state, ("scenario", "half-download"))
    assert state.strategies == ("safe", "output-exists") and state.outcomes == ()


def test_comparer_runs_the_catalogued_twin_where_it_moves_the_fault():
    twin = DRILLS["torn-write/rewrite-state"]
    assert choices.scenario_drill("torn-write", "rewrite-state") is twin
    assert choices.scenario_drill("torn-write", "safe") is DRILLS["torn-write"]
    other = choices.scenario_drill("torn-write", "blind-retry")
    assert (other.strategy, other.faults) == ("blind-retry", DRILLS["torn-write"].faults)


def test_comparer_shows_a_failing_drill_as_an_error_row_not_a_traceback():
    comparer = widgets.Comparer("lost-reply", run=CountingRun(fail={"blind-retry"}))
    comparer.run.click()
    rows = widgets.outcome_table(comparer.state.outcomes).rows
    assert [row["verdict"] for row in rows] == ["valid", "error"]
    assert "RuntimeError: boom" in rows[1]["findings"]


def test_a_worker_thread_that_dies_is_reported_not_printed(capsys):
    import threading

    def run(drill):
        thread = threading.Thread(target=lambda: 1 / 0)
        thread.start()
        thread.join()
        return "result"

    outcome = choices.run_quietly(DRILLS["lost-reply"], run)
    assert outcome.result == "result" and "ZeroDivisionError" in outcome.errors[0]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("knobs, spec", [
    ({}, "idempotent"),
    ({"idempotent": False, "lookup": "lagging"}, "non-idempotent,lag=2"),
    ({"lookup": "unavailable", "expiring": True}, "idempotent,unavailable,retention=3600"),
])
def test_contract_explorer_spec_follows_the_knobs(knobs, spec):
    explorer = widgets.ContractExplorer(run=CountingRun())
    for knob, value in knobs.items():
        getattr(explorer, knob).value = value
    assert explorer.state.spec == spec and spec in explorer.promise.value


def test_contract_without_promise_blind_retry_executes_twice_and_safe_does_not():
    run = CountingRun()
    explorer = widgets.ContractExplorer(run=run)
    explorer.idempotent.value = False
    explorer.run.click()
    assert [d.contract for d in run.drills] == ["non-idempotent", "non-idempotent"]
    by_strategy = {o.drill.strategy: o.result for o in explorer.state.outcomes}
    assert widgets.doubles(by_strategy["safe"].history.executions) == 0
    assert widgets.doubles(by_strategy["blind-retry"].history.executions) == 1


def test_contract_step_rejects_an_unknown_lookup():
    with pytest.raises(ValueError):
        widgets.contract_step(widgets.ContractChoice(), ("lookup", "eventually"))


# -- audit explorer ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def report():
    forensics = pytest.importorskip("toolkit.forensics")
    return forensics.audit(LEDGERS / "toolkit.jsonl", artifacts=LEDGERS / "artifacts",
                           inputs=LEDGERS / "inputs")


def test_audit_explorer_filter_shows_only_findings_of_that_kind(report):
    explorer = widgets.AuditExplorer(report)
    every = widgets.findings_table(explorer.state)
    explorer.kind.value = "stale_input"
    shown = widgets.findings_table(explorer.state)
    assert 0 < len(shown) < len(every)
    assert {row["kind"] for row in shown.rows} == {"stale_input"}
    assert "findings: stale_input" in explorer.findings.value


def test_audit_explorer_lists_only_items_to_act_on_named_by_the_filtered_findings(report):
    state = widgets.audit_step(widgets.audit_view(report), ("kind", "stuck_unknown"))
    keys = {a["key"] for a in state.summary["anomalies"] if a["kind"] == "stuck_unknown"}
    rows = widgets.todo_table(state).rows
    assert rows and {row["key"] for row in rows} <= keys
    assert all(row["next"] != "skip" for row in rows)


def test_audit_step_rejects_a_kind_the_audit_did_not_find(report):
    with pytest.raises(ValueError):
        widgets.audit_step(widgets.audit_view(report), ("kind", "no_such_kind"))


# -- tables, crash rows, checklist ------------------------------------------------------
def test_table_text_drops_wall_clock_stamps_and_cuts_task_keys():
    key = "ab" * 32
    text = repr(widgets.Table([{"what": f"submit of {key}:1 at t=1.79604e+09 after x"}]))
    assert "ababab…:1 after x" in text and "t=" not in text and key not in text


def test_table_html_escapes_what_a_ledger_recorded():
    html = widgets.Table([{"source": "<script>x</script>"}])._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_crash_rows_place_each_crash_drill_at_its_point_and_skip_the_others(blind, safe):
    crashed = run_drill(DRILLS["crash-after-intent"])
    rows = widgets.crash_rows([crashed, safe, blind])
    assert [(r["point"], r["verdict"], r["lane"]) for r in rows] == [
        ("after_intent", "parked", "crash-after-intent")]  # one item waits for a person


class FakeResult:
    def __init__(self, name, passed):
        self.drill, self.passed = DRILLS[name], passed


def test_checklist_fails_a_drill_that_did_not_go_as_expected_and_never_passes_a_missing_one():
    table = widgets.checklist([FakeResult("lost-reply", False), FakeResult("torn-write", True)])
    by_drill = {row["drill"]: row["result"] for row in table.rows}
    assert by_drill["lost-reply"] == "FAIL" and by_drill["torn-write"] == "PASS"
    assert by_drill["disk-full"] == "not run"
    assert len(table.marked) == len(table.rows) - 1


# -- the 30-document experiment ----------------------------------------------------------
def test_retry_slider_value_becomes_the_contracts_transient_rate():
    run = CountingRun()
    experiment = widgets.RetryExperiment(run=run)
    experiment.rate.value = 0.6000000000000001  # what a float slider really sends
    experiment.strategies.value = ("safe",)
    experiment.run.click()
    (drill,) = run.drills
    assert (drill.contract, drill.docs, drill.poison) == ("idempotent,transient=0.6", 27, 3)
    assert "transient=0.6" in drill.name and bytes(experiment.timeline.value).startswith(b"\x89PNG")


def test_retry_experiment_transient_errors_cost_submits_never_executions():
    calm = run_drill(widgets.retry_drill(0.0, docs=6, poison=1))
    storm = run_drill(widgets.retry_drill(0.6, docs=6, poison=1))
    assert calm.verdict.valid and storm.verdict.valid
    assert storm.submit_calls > calm.submit_calls
    assert storm.executions == calm.executions == 6


@pytest.mark.parametrize("rate", [-0.1, 1.0])
def test_retry_rate_outside_zero_to_one_is_refused(rate):
    with pytest.raises(ValueError):
        widgets.retry_step(widgets.RetryChoice(), ("rate", rate))
