"""The drill catalogue: every safe row valid, every naive twin invalid with its anomaly."""

import json
import subprocess
import sys

import pytest

from toolkit.drills import CATALOGUE, DRILLS, run_drill
from toolkit.ledger import State

SAFE = [drill for drill in CATALOGUE if drill.strategy == "safe"]
NAIVE = [drill for drill in CATALOGUE if drill.strategy != "safe"]


@pytest.mark.parametrize("drill", CATALOGUE, ids=lambda drill: drill.name)
def test_drill_verdict_is_the_expected_one(drill, tmp_path):
    result = run_drill(drill, tmp_path)
    assert result.verdict.valid is drill.expect_valid, result.verdict.anomalies
    assert set(drill.expect) <= {*result.verdict.anomalies, *result.verdict.costly}
    assert result.passed


def test_every_fault_drilled_with_safe_also_breaks_a_naive_twin():
    twins = {drill.name.split("/")[0] for drill in NAIVE if not drill.expect_valid}
    faulted = {drill.name for drill in SAFE if (drill.faults or drill.service_faults
                                                or drill.workers > 1 or drill.poison)
               and not drill.name.startswith("contract[")}
    # crash-after-intent sends nothing, so no design can double-execute there;
    # its naive counterpart is crash-after-submit, which blind retry cannot tell apart.
    # A cut HTTP body is refused by any client that checks Content-Length: its naive
    # counterpart is a crash mid-write, half-download/output-exists.
    assert faulted - twins == {"crash-after-intent", "crash-after-intent/idempotent",
                               "http-cut-download"}
    assert all(drill.expect for drill in NAIVE if not drill.expect_valid)


def test_contract_matrix_shows_blind_retry_harmless_only_with_idempotent_retained_keys():
    harmless = {drill.contract for drill in NAIVE
                if drill.name.startswith("contract[") and drill.expect_valid}
    assert harmless == {"idempotent", "idempotent,lag=2"}


def test_lost_reply_drill_follows_the_two_ledger_article(tmp_path):
    result = run_drill(DRILLS["lost-reply"], tmp_path)
    lost_key = next(key for run, fault, key in result.fired if fault == "lost_reply")
    ends = [step for step in result.steps if step.event is None]
    state_after = [{item.key: item.state for item in step.items}[lost_key] for step in ends]
    assert state_after == [State.UNKNOWN, State.DONE, State.DONE]  # unknown, recovered, cached
    submits = [call for call in result.history.calls
               if call.op == "submit" and call.task_key == lost_key]
    assert len(submits) == 1
    lookups = [call for call in result.history.calls
               if call.op == "lookup" and call.idem_key.startswith(lost_key)]
    assert [call.outcome for call in lookups][-1] == "found"


def test_intent_with_nothing_at_the_provider_is_parked_without_a_submit(tmp_path):
    result = run_drill(DRILLS["crash-after-intent"], tmp_path)
    parked = [item for item in result.history.items.values() if item.state is State.NEEDS_REVIEW]
    assert len(parked) == 1
    assert not [call for call in result.history.calls
                if call.op == "submit" and call.task_key == parked[0].key]


def test_drill_steps_snapshot_both_ledgers_after_every_event(tmp_path):
    result = run_drill(DRILLS["lost-reply"], tmp_path)
    event_steps = [step for step in result.steps if step.event is not None]
    assert len(event_steps) == len(result.history.events)
    assert [step.event.seq for step in event_steps] == [event.seq for event in
                                                        result.history.events]
    assert event_steps[-1].submit_calls == result.submit_calls
    assert any(step.jobs for step in event_steps)


def test_cli_drill_json_is_one_list_and_exit_zero_when_all_as_expected():
    result = subprocess.run([sys.executable, "-m", "toolkit", "drill", "half-download/output-exists",
                             "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    findings = rows[0].pop("findings")
    assert [(f["kind"], f["file"]) for f in findings] == [("fake_done", "doc-000.pdf")]
    assert rows[0].pop("headline") == "fake_done" and rows[0].pop("costly") == []
    assert rows == [{"drill": "half-download/output-exists", "strategy": "output-exists",
                     "contract": "idempotent", "submit_calls": 4, "executions": 4, "valid": False,
                     "expected_valid": False, "anomalies": ["fake_done"], "status": "as expected",
                     "reason": ""}]


def test_cli_unknown_drill_is_a_one_line_error():
    result = subprocess.run([sys.executable, "-m", "toolkit", "drill", "no-such-drill"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1


def test_http_lost_reply_is_a_real_read_timeout_recovered_by_lookup_without_second_job(tmp_path):
    result = run_drill(DRILLS["http-lost-reply"], tmp_path)
    found = [e for e in result.history.events if e.detail.get("note") == "found by lookup"]
    assert len(found) == 1  # the timed-out submit's job, attached to
    assert [c.outcome for c in result.history.calls if c.op == "submit"] == ["created"] * 3
    assert result.executions == 3 and result.by_state["done"] == 3


def test_http_cut_download_is_refused_then_fetched_again_and_verified(tmp_path):
    result = run_drill(DRILLS["http-cut-download"], tmp_path)
    fetches = [c for c in result.history.calls if c.op == "fetch"]
    assert len(fetches) == 4  # three documents, one of them fetched twice
    assert result.by_state["done"] == 3 and result.verdict.valid is True
    assert all(art.exists and art.sha256 == result.history.items[key].artifact_sha256
               for key, art in result.history.artifacts.items())
