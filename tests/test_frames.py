"""Stepper frames for everything that happens, and harm shown for every naive twin.

Pure ``frame``/``moments`` level (no browser): each scenario of the course is
run once and its frames read: the injected fault is a frame of its own
(named, with where it struck), the provider's accepts and executions are
frames, every restart is a frame. The catalogue test checks that no naive
twin is without a finding unless its row says why it is harmless.
"""

import pytest
from matplotlib.figure import Figure

from toolkit import viz, widgets
from toolkit.drills import CATALOGUE, DRILLS, run_drill
from toolkit.faults import FAULTS
from toolkit.widgets.moments import LEDGER_FAULT_WORDS, SERVICE_FAULT_WORDS

# scan-batch runs Tesseract on three documents (over a minute on the CI machine); its verdict
# is drilled in tests/test_drills.py. Its fault frame is placed by the same Shot as the others.
COSTLY = {"scan-batch"}
SLOW = {"http-lost-reply", "http-cut-download", "partial-resume"}


def _params() -> list:
    out = []
    for name in widgets.SCENARIOS:
        if name in COSTLY:
            continue
        out.append(pytest.param(name, id=name, marks=[pytest.mark.slow] if name in SLOW else []))
    return out


_RUNS = {}


def drilled(name):
    """Each catalogue drill run at most once per test session here (they are seeded)."""
    if name not in _RUNS:
        _RUNS[name] = run_drill(DRILLS[name])
    return _RUNS[name]


def where(name):
    if name in FAULTS:
        return FAULTS[name].point
    return (LEDGER_FAULT_WORDS.get(name) or SERVICE_FAULT_WORDS[name])[0]


@pytest.mark.parametrize("scenario", _params())
def test_each_scenario_has_a_frame_for_its_fault_its_provider_events_and_each_restart(scenario):
    """Drill ``scenario`` for real; its stepper frames must name each injected fault where it
    struck, before the run ends; show the provider accepting and executing jobs; and mark
    every restart between runs. Frames, counters and the graph history must agree."""
    result = drilled(scenario)
    shown = widgets.frames(result)
    frames = [widgets.frame(result, i, shown) for i in range(len(shown))]
    kinds = [f.kind for f in frames]
    for fault in (*result.drill.faults, *result.drill.service_faults):
        hits = [f for f in frames if f.kind == "fault" and f"FAULT {fault} " in f.headline]
        assert hits, f"no frame for {fault}"
        assert f"at {where(fault)}" in hits[0].headline or where(fault) in hits[0].headline
        first_end = kinds.index("end", hits[0].index)
        assert frames[first_end].run == hits[0].run  # named in the run where it fired
    accepted = [f for f in frames if f.kind == "provider" and "accepts" in f.headline]
    executed = [f for f in frames if f.kind == "provider" and "executes" in f.headline]
    jobs = result.steps[-1].jobs
    assert len(accepted) == len(jobs)
    assert len(executed) == sum(str(job.status) == "succeeded" for job in jobs)
    assert all(f.side == "provider" for f in accepted + executed)
    assert kinds.count("restart") == result.drill.runs - 1 == kinds.count("end") - 1
    assert all(kinds[i - 1] == "end" for i, kind in enumerate(kinds) if kind == "restart")
    assert len(frames[-1].events) == len(result.history.events)
    assert (frames[-1].submit_calls, frames[-1].executions) == \
        (result.steps[-1].submit_calls, result.steps[-1].executions)


@pytest.fixture(scope="module")
def lost():
    return drilled("lost-reply")


def test_lost_reply_is_a_frame_after_the_provider_ran_the_job_and_before_any_lookup(lost):
    """The lost reply: the provider accepts and executes the job, then the reply is lost; the
    frames show that order, then one frame per failed lookup (the status API is down)."""
    texts = [m.text for m in widgets.frames(lost)]
    accept = next(i for i, t in enumerate(texts) if "accepts job-000001" in t)
    execute = next(i for i, t in enumerate(texts) if "executes job-000001" in t)
    lost_at = next(i for i, t in enumerate(texts) if t.startswith("FAULT lost_reply"))
    lookups = [i for i, t in enumerate(texts) if t.startswith("FAULT lookup_unavailable")]
    assert accept < execute < lost_at < lookups[0]
    assert len(lookups) == sum(1 for _, name, _ in lost.fired if name == "lookup_unavailable")


def test_the_graph_is_titled_with_the_step_the_headline_and_tables_show(lost):
    """Play race: the graph once showed the previous step. Every frame's graph title names
    its own step, and the stepper draws the graph before it changes any other part."""
    stepper = widgets.Stepper(lost, graph=False)
    for index in (3, 8, 9, len(stepper.moments) - 1):
        stepper.play.value = index
        frame = stepper.frame
        assert stepper.shown == frame.index == index
        assert frame.graph_title.startswith(f"step {index + 1}/")
        assert f"step {index + 1}/" in stepper.headline.value


def test_no_lease_frames_show_two_accepted_jobs_per_raced_item_and_no_lease_at_submit():
    """Two workers without leases race: each raced document is accepted twice by the
    provider, and the leases the fetch takes are not shown as if the submit had one."""
    result = run_drill(DRILLS["concurrent-workers/no-lease"])
    moments = widgets.frames(result)
    races = [m for m in moments if m.kind == "actor" and "race window" in m.text]
    assert races
    for race in races:
        key = race.key
        accepted = [m for m in moments if m.kind == "provider" and "accepts" in m.text
                    and m.key == key]
        assert len(accepted) == 2
    claims = [m.text for m in moments if m.event is not None and m.event.op == "claim"]
    assert claims and all("submit went out with none" in text for text in claims)


# -- harm made visible ----------------------------------------------------------------------
NAIVE = [drill for drill in CATALOGUE if drill.strategy != "safe"]


@pytest.mark.parametrize("drill", NAIVE, ids=lambda drill: drill.name)
def test_no_naive_twin_is_without_a_finding_unless_its_row_says_why_it_is_harmless(drill):
    """A naive twin that passes proves nothing unless the contract makes it harmless: it
    must expect a finding (checked against a real run in test_drills), or say so."""
    if drill.expect:
        assert not drill.expect_valid and not drill.note
    else:
        assert drill.expect_valid and drill.note.startswith("harmless here")
        assert drill.note in drill.summary  # the caption says it too
    assert "recover by lookup" not in drill.summary and "never resubmit" not in drill.summary


def test_steal_expired_twin_shows_the_paid_but_parked_item_on_the_harm_chart():
    """owner-recovery/steal-expired: the owner's job succeeds and the thief parks the item;
    the harm row and chart show one parked-but-paid item, the safe row none."""
    safe, steal = drilled("owner-recovery"), drilled("owner-recovery/steal-expired")
    rows = widgets.harm_rows([safe, steal])
    assert rows[0]["label"] == "owner-recovery"
    assert [rows[0][kind] for kind, _, _ in viz.HARMS] == [0] * len(viz.HARMS)
    assert rows[1]["parked_paid"] == 1
    ax = viz.harm_counts(rows, ax=Figure().add_subplot())
    assert "no harm" in [t.get_text() for t in ax.texts]
    heights = [p.get_height() for p in ax.patches]
    assert heights[len(viz.HARMS):] == [rows[1][kind] for kind, _, _ in viz.HARMS]


def test_cancel_caption_says_why_three_items_stay_submitted():
    drill = DRILLS["cancel"]
    assert "three stay submitted" in drill.summary and "50 polls" in drill.summary


def test_a_twin_run_from_the_comparer_is_captioned_with_what_the_naive_design_does():
    drill = widgets.scenario_drill("lost-reply", "timeout-as-failed")
    assert "recover by lookup" not in drill.summary and "timeout-as-failed" in drill.summary
    assert "blind retry" in DRILLS["lost-reply/blind-retry"].summary


def test_torn_write_marks_show_the_torn_line_the_crash_and_the_restart():
    """A torn JSONL write: the timeline's marks name the torn half line and the process
    dying at one place, and the restart just after, before run 2's first event."""
    torn = drilled("torn-write")
    marks = widgets.run_marks(torn)
    assert [m["kind"] for m in marks] == ["crash", "restart"]
    assert "torn_jsonl_write" in marks[0]["label"] and "half a line" in marks[0]["label"]
    assert "dies" in marks[0]["label"]
    first_of_run_2 = next(m.event.seq for m in widgets.frames(torn)
                          if m.run == 1 and m.event is not None)
    assert marks[0]["x"] < marks[1]["x"] < first_of_run_2
    ax = viz.timeline(torn.history, ax=Figure().add_subplot(), marks=marks)
    assert [t.get_text() for t in ax.texts] == [m["label"] for m in marks]


def test_page_progress_shows_the_resume_at_page_three_after_the_crash():
    """partial-resume: the process dies after page 2 is checkpointed; the chart writes
    where the document picks up after the restart: page 3 (the naive one: page 1)."""
    pages = drilled("partial-resume")
    ax = viz.page_progress(pages.history, widgets.run_marks(pages), ax=Figure().add_subplot())
    assert "resumes at page 3" in [t.get_text() for t in ax.texts]


def test_crash_map_rows_include_the_safe_half_download_at_during_fetch():
    half, exists = drilled("half-download"), drilled("half-download/output-exists")
    rows = widgets.crash_rows([half, exists])
    assert [(r["point"], r["verdict"]) for r in rows] == [("during_fetch", "valid"),
                                                          ("during_fetch", "violation")]
