"""The kill -9 panel: real SIGKILLs in forked children, a crash map, one point replayed.

Small on purpose: a two-document batch, explored at every 12th durable step,
and one crash point replayed; the full sweep is tests/test_explore.py's.
"""

import pytest

from toolkit import widgets
from toolkit.widgets import killnine


@pytest.mark.slow
def test_replayed_kill_at_the_commit_of_submitted_really_kills_and_the_rerun_recovers_by_lookup():
    """SIGKILL right after ``unknown -> submitted`` of doc-000 is committed: the child dies
    of the signal at that step; the rerun looks the job up (no second submit) and both
    documents end done, judged valid. The frames step through kill, restart and rerun."""
    replayed = killnine.replay(killnine.plan_for("safe"), 8)
    assert replayed.killed and replayed.row["step"] == "commit move doc-000 unknown->submitted"
    assert (replayed.row["verdict"], replayed.row["outcome"]) == ("valid", "done=2")
    assert replayed.row["submits"] == replayed.row["executions"] == 2
    frames = killnine.replay_frames(replayed)
    kill = next(i for i, f in enumerate(frames) if "SIGKILL at step 8" in f)
    assert kill == 8 and frames[kill + 1].startswith("restart")
    rerun = frames[kill + 2:-1]
    assert any("lookup doc-000#1 returned job-000001" in f for f in rerun)
    assert not any("submit doc-000" in f for f in rerun)  # recovered by lookup, not resubmit
    assert frames[-1].startswith("judged: valid")


@pytest.mark.slow
def test_kill_nine_panel_sweeps_for_real_draws_the_map_and_steps_through_a_picked_point():
    """Run: a real explore (every 12th step of a two-document batch); the map is drawn, its
    points offered; picking one replays it and the frame slider walks through it."""
    panel = widgets.KillNine(every=12)
    assert panel.describe() == "KillNine: strategy 'safe', every 12"
    panel.run.click()
    explored = panel.state.exploration
    assert explored is not None and {row["point"] for row in explored.rows} == {1, 13}
    assert bytes(panel.chart.value).startswith(b"\x89PNG")
    assert len(panel.pick.options) == len(explored.rows)
    assert "crash points, each a real SIGKILL" in panel.summary.value
    panel.pick.value = panel.pick.options[-1][1]
    first = panel.frame.value
    assert panel.slider.max == len(killnine.replay_frames(panel.state.replayed)) - 1
    panel.slider.value = panel.slider.max
    assert panel.frame.value != first and "judged:" in panel.frame.value
    panel.strategy.value = "blind-retry"  # a new setting drops the map and its counts
    assert "crash points, each" not in panel.summary.value and "blind-retry" in panel.summary.value


def test_kill_nine_refuses_a_point_that_is_not_on_the_map_and_an_unknown_strategy():
    with pytest.raises(ValueError):
        killnine.kill_step(killnine.KillChoice(), ("pick", (3, "kill")))
    with pytest.raises(ValueError):
        killnine.kill_step(killnine.KillChoice(), ("strategy", "yolo"))



def test_kill_nine_setting_change_says_what_run_will_do():
    """Before Run, the strategy and spacing are settings: the summary names them, so a
    student (and the browser test) sees the choice taken; nothing is killed until Run."""
    panel = widgets.KillNine(every=3)
    assert "the safe runner" in panel.summary.value and "one durable step in 3" in panel.summary.value
    panel.strategy.value = "output-exists"
    assert "the output-exists runner" in panel.summary.value
    assert panel.state.exploration is None
