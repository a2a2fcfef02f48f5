"""The course's evidence: harm counted per kind, ledger bytes around a torn write and a
power cut, tables that join both ledgers. Each test names its fault and what must hold."""

import os

import pytest

from toolkit.drills import DRILLS, run_drill
from toolkit.widgets.course import audit_target, fixture
from toolkit.widgets.disk import bytes_table, power_cut, torn_write
from toolkit.widgets.evidence import ledger_and_jobs, page_bills, provider_calls
from toolkit.viz import HARMS
from toolkit.widgets import harm_row


def test_torn_write_leaves_half_a_line_that_the_next_open_reports_and_the_next_append_cuts(
        tmp_path):
    """Fault: ``tear_jsonl_writes`` writes half an event line, then the process dies.
    Must hold: the bytes before are whole lines; after, one unterminated tail; the reopened
    ledger reports that line, keeps the item at its last whole state, and the next append
    leaves only whole lines (the tail cut, never glued onto)."""
    story = torn_write(tmp_path)
    assert story.before.torn == 0 and story.before.data.endswith(b"\n")
    assert story.torn.data.startswith(story.before.data)
    assert story.torn.whole == story.before.whole and story.torn.torn > 0
    assert story.torn_tail == {"line": story.before.whole + 1, "bytes": story.torn.torn}
    assert story.states_after_open == {"doc-000": "unknown", "doc-001": "pending",
                                       "doc-002": "pending"}
    assert story.repaired.torn == 0 and story.repaired.whole == story.before.whole + 1
    table = bytes_table(story.torn)
    assert [row["ends"] for row in table.rows][-1].startswith("TORN") and table.marked == {5}


def test_torn_write_story_bytes_are_the_same_on_every_run(tmp_path):
    """The notebook prints byte counts: the seeded clock makes them reproducible."""
    first, second = torn_write(tmp_path / "a"), torn_write(tmp_path / "b")
    assert first.torn.data == second.torn.data and first.repaired.data == second.repaired.data


@pytest.mark.slow
def test_power_cut_without_fsync_loses_acknowledged_commits_and_the_rerun_executes_twice(
        tmp_path):
    """Fault: a real SIGKILL after the first ``done`` commit, then the ledger cut back to its
    last fsync (power loss). Must hold: with fsync nothing acknowledged is lost and the rerun
    is valid; without fsync every acknowledged transition is gone and the rerun pays a
    document twice."""
    durable, loose = (power_cut(name, tmp_path / name) for name in ("jsonl", "jsonl-no-fsync"))
    for cut in (durable, loose):
        assert "->done" in cut.killed_at and cut.before.whole > 1
    assert durable.after.data == durable.before.data and durable.lost == []
    assert durable.rerun["verdict"] == "valid"
    assert loose.after.whole == 0 and len(loose.lost) == loose.acknowledged > 0
    assert "double_execution" in loose.rerun["anomalies"]
    assert loose.rerun["executions"] > durable.rerun["executions"]


def test_harm_row_counts_every_poison_file_the_state_file_sent():
    """Fault: two poison files among six, transient submit errors. Must hold: the state
    file's poison_sent equals the poison count (the safe runner's zeros: notebook 04)."""
    naive = harm_row(run_drill(DRILLS["poison-storm/rewrite-state"]))
    assert naive["poison_sent"] == naive["poison"] == 2 and naive["verdict"] == "INVALID"
    assert {kind for kind, _, _ in HARMS} <= set(naive)


def test_steal_expired_twin_shows_its_harm_as_parked_but_paid():
    """Fault: a slow live owner past its lease. Must hold: the thief's harm row counts one
    item parked although its job succeeded (costly ``parked_after_success``)."""
    row = harm_row(run_drill(DRILLS["owner-recovery/steal-expired"]))
    assert row["parked_paid"] == 1


def test_cancel_evidence_shows_the_submitted_items_jobs_still_running_at_the_provider():
    """Fault: an operator cancels one in-flight item. Must hold: the cancelled item's job is
    cancelled; every item the drill ends ``submitted`` has a job still running."""
    rows = ledger_and_jobs(run_drill(DRILLS["cancel"])).rows
    assert [row["provider jobs"] for row in rows if row["ledger"] == "cancelled"] == ["cancelled"]
    submitted = [row for row in rows if row["ledger"] == "submitted"]
    assert submitted and all(row["provider jobs"].endswith("running") for row in submitted)


def test_page_bills_and_calls_show_the_resume_at_page_three_after_a_crash_after_page_two():
    """Fault: a crash after page 2 of a long document is checkpointed. Must hold: the safe
    run bills every page once and its second run's first submit is page 3 (the restart
    twin's pages billed twice: asserted in notebook 08)."""
    result = run_drill(DRILLS["partial-resume"])
    bills = page_bills([result], labels=["safe"])
    assert len(bills.rows) > 2 and all(row["safe"] == 1 for row in bills.rows)
    calls = provider_calls(result, ops=("submit",)).rows
    second_run = [row["unit"] for row in calls if row["run"] == 2]
    assert second_run[0] == "long-000.pdf page 3"


def test_audit_target_uses_the_fixture_only_when_no_ledger_is_given(tmp_path, monkeypatch):
    """A user's ledger is never audited against the course fixture's folders."""
    assert audit_target("my.sqlite") == ("my.sqlite", None, None)
    monkeypatch.chdir(tmp_path)
    ledger, artifacts, inputs = audit_target()
    assert os.path.exists(ledger) and os.path.isdir(artifacts) and os.path.isdir(inputs)
    assert not os.path.isabs(fixture("toolkit.jsonl"))
