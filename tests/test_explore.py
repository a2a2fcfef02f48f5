"""Crash exploration with real SIGKILLs: every durable step, pairs, power loss, naive designs.

Each crash point is a forked child that sends itself SIGKILL at step k, then
fresh processes rerun the batch until it rests, and the checker judges the
whole history. Batches are kept small (1-3 documents) so the module stays
within CI's budget; ``python -m toolkit explore --docs 10`` is the full run.
Where a property is proven under two contracts, one of them runs in snapshot
mode (recoveries from copies taken at each step, proven to give the real
mode's verdicts in test_explore_snapshot.py), the other with real SIGKILLs.
"""

import json
import subprocess
import sys

import pytest

from toolkit.explore import KILL, TEAR, Plan, explore
from toolkit.explore.child import Tracer, fork, killed_by_sigkill

pytestmark = pytest.mark.slow


def test_tracer_dies_by_a_real_sigkill_at_exactly_step_k_and_names_it():
    """The child reports step 2 and is then killed by SIGKILL: step 3 never runs."""
    def body(fd):
        tracer = Tracer(fd, {}, kill_at=2, record=True)
        for n in range(1, 5):
            tracer.step("ledger", f"step {n}")
        return {"survived": True}

    messages, status = fork(body)
    assert killed_by_sigkill(status)
    assert [(m["t"], m["n"]) for m in messages] == [("step", 1), ("step", 2), ("kill", 2)]
    assert messages[-1]["label"] == "step 2"


@pytest.mark.parametrize("contract, mode", [("idempotent", "snapshot"),
                                            ("non-idempotent", "real")])
def test_sigkill_at_every_durable_step_of_safe_batch_recovers_without_violation(contract, mode):
    """Kill -9 at each durable step of a 3-document safe batch, rerun until it rests.

    Every point must really die at the step the uncrashed run had there, and
    recover with no anomaly. Under the non-idempotent contract the only
    parked items are those whose intent was committed with nothing sent:
    exactly one crash point per document, never a blind resubmit.
    """
    result = explore(Plan(contract=contract, docs=3, mode=mode))
    assert result.mode == mode
    assert len(result.steps) > 30
    assert {row["point"] for row in result.rows} == {step["n"] for step in result.steps}
    assert sum(row["how"] == TEAR for row in result.rows) == 3  # one download per document
    assert {row["verdict"] for row in result.rows} <= {"valid", "parked"}, [
        row for row in result.rows if row["verdict"] not in ("valid", "parked")]
    assert all(row["errors"] == [] and row["runs"] >= 1 for row in result.rows)
    assert all(row["executions"] == 3 - row["parked"] for row in result.rows)  # never twice
    parked = [row for row in result.rows if row["verdict"] == "parked"]
    if contract == "idempotent":
        assert parked == []
    else:
        assert len(parked) == 3
        assert all(row["step"].endswith("pending->unknown") and row["parked"] == 1
                   and row["submits"] == 2 for row in parked)
    assert result.total()["violations"] == 0


# One named witness per naive design: the step where a kill makes it fail, and how; and the
# mode snapshot mode runs in (real: its ledger records absolute paths, copies cannot move).
NAIVE_WITNESSES = {
    "blind-retry": (KILL, "submit doc-000#1 returned", "double_execution", "snapshot"),
    "output-exists": (TEAR, "fetch job-000001 returned", "fake_done", "real"),
    "batch-commit": (KILL, "fetch job-000001 returned", "double_execution", "real"),
    "rewrite-state": (KILL, "state file truncated", "double_execution", "snapshot"),
    "no-lease": (KILL, "submit doc-000#1 returned", "double_execution", "snapshot"),
}


@pytest.mark.parametrize("strategy", sorted(NAIVE_WITNESSES))
def test_sigkill_exploration_names_the_step_where_each_naive_strategy_breaks(strategy):
    """The same exploration over a naive design finds and names a crash-caused violation.

    Snapshot mode finds the very same rows at every crash point (or, for a
    design whose ledger names its own folder, falls back to real kills).
    """
    result = explore(Plan(strategy=strategy, docs=1))
    how, step, anomaly, mode = NAIVE_WITNESSES[strategy]
    snapshot = explore(Plan(strategy=strategy, docs=1, mode="snapshot"))
    assert snapshot.mode == mode, snapshot.note
    assert same_rows(snapshot) == same_rows(result)
    witnesses = [row for row in result.rows
                 if row["how"] == how and row["step"].startswith(step) and anomaly in row["new"]]
    assert witnesses, [(row["how"], row["step"], row["new"]) for row in result.rows]
    assert witnesses[0]["verdict"] == "violation"
    assert result.total()["caused_by_crash"] >= 1


def test_sigkill_during_the_recovery_run_too_still_recovers_without_violation():
    """Pairs: kill at step k, then kill the rerun at its step j, rerun again; bounded."""
    result = explore(Plan(docs=1, pairs=True, max_pairs=16))
    pairs = [row for row in result.rows if row["recovery_point"] is not None]
    assert len(pairs) == 16
    assert all(row["recovery_step"] and row["runs"] >= 2 for row in pairs)
    assert {row["verdict"] for row in result.rows} <= {"valid", "parked"}, [
        row for row in result.rows if row["verdict"] not in ("valid", "parked")]


def test_power_loss_drops_acknowledged_transitions_only_from_the_jsonl_writer_without_fsync():
    """SIGKILL plus loss of unsynced bytes: without fsync, committed transitions vanish.

    The no-fsync writer loses acknowledged transitions at every crash point
    after its first commit, and the rerun then executes a document twice;
    the real writer, cut back to its last fsync, loses none and recovers.
    """
    lossy = explore(Plan(docs=1, ledger="jsonl-no-fsync", power_loss=True))
    assert lossy.baseline["verdict"] == "valid"  # without the power cut the variant looks fine
    assert all(row["lost_acked"] == row["acked"] > 0 for row in lossy.rows)
    assert any("double_execution" in row["new"] for row in lossy.rows)

    real = explore(Plan(docs=1, ledger="jsonl", power_loss=True))
    assert sum(row["acked"] for row in real.rows) > 0
    assert real.total()["lost_acknowledged"] == 0
    assert {row["verdict"] for row in real.rows} <= {"valid", "parked"}
    assert any(row["step"] == "ledger line written, fsync pending" for row in real.rows)


def same_rows(result) -> dict:
    """What must not depend on the mode: each point's step, verdict, anomalies, counts."""
    fields = ("step", "kind", "verdict", "anomalies", "new", "outcome", "submits",
              "executions", "parked", "runs", "errors", "detail")
    return {(row["point"], row["how"]): {field: row[field] for field in fields}
            for row in result.rows}


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "toolkit", *map(str, args)],
                          capture_output=True, text=True, check=False)


def test_explore_json_is_rows_and_total_alone_on_stdout():
    result = run_cli("explore", "--docs", "1", "--strategy", "blind-retry", "--json")
    assert result.returncode == 1  # blind retry double-executes after some kills
    document = json.loads(result.stdout)
    assert set(document) == {"rows", "total"}
    total = document["total"]
    assert total["points"] == len(document["rows"]) > 0
    assert total["violations"] == sum(row["verdict"] == "violation" for row in document["rows"])
    assert total["parked"] == 0 and total["points_per_s"] > 0


@pytest.mark.parametrize("args", [["--docs", "0"], ["--strategy", "nope"],
                                  ["--contract", "bogus"],
                                  ["--power-loss", "--strategy", "rewrite-state"],
                                  ["--ledger", "csv"], ["--every", "0"]])
def test_explore_bad_input_is_a_one_line_error(args):
    result = run_cli("explore", *args)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_every_child_killed_by_the_exploration_is_reaped():
    """No zombie and no survivor: the children of this process are the same before and after."""
    import psutil

    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    result = explore(Plan(docs=1, every=4))
    assert result.rows
    after = me.children(recursive=True)
    assert {child.pid for child in after} == before


@pytest.mark.parametrize("contract, mode", [("idempotent", "snapshot"),
                                            ("non-idempotent", "real")])
def test_sigkill_at_every_step_of_a_page_by_page_document_resumes_without_violation(contract,
                                                                                      mode):
    """A 5-page document sent page by page, killed at each durable step, then rerun.

    Steps include every page's checkpoint rename and ``partial`` commit. No
    crash point executes a page twice; under the non-idempotent contract the
    only parked points are an intent (document or next page) with nothing sent.
    """
    result = explore(Plan(contract=contract, docs=1, long_docs=1, long_pages=5, mode=mode))
    assert result.mode == mode
    labels = [step["label"] for step in result.steps]
    assert sum(label.startswith("checkpoint of long-000") for label in labels) == 4
    assert sum(label.endswith("submitted->partial") for label in labels) == 4
    assert {row["verdict"] for row in result.rows} <= {"valid", "parked"}, result.violations()
    assert all(row["errors"] == [] for row in result.rows)
    parked = [row for row in result.rows if row["verdict"] == "parked"]
    if contract == "idempotent":
        assert parked == [] and {row["executions"] for row in result.rows} == {1 + 5}
    else:
        assert len(parked) == 1 + 5  # one intent of the short document, one per page
        assert all(row["step"].endswith(("pending->unknown", "partial->unknown"))
                   for row in parked)


def test_restart_from_page_one_is_caught_at_crash_points_inside_a_long_document():
    """The same exploration of the naive restart: uncrashed it is valid, crashed it bills twice.

    From snapshots (the real kills of a long document run in the test above).
    """
    result = explore(Plan(strategy="restart-long-docs", contract="non-idempotent", docs=1,
                          long_docs=1, long_pages=5, mode="snapshot"))
    assert result.baseline["verdict"] == "valid"
    bad = result.violations()
    assert len(bad) >= 10
    assert all("double_execution" in row["new"] for row in bad
               if "partial" in row["step"] or "checkpoint" in row["step"])
