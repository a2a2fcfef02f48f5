"""Verdicts that explain themselves: costly vs unsafe, the headline finding, witnesses, remedies."""

import json
import subprocess
import sys

from toolkit.checker.findings import REMEDY, SPECIFICITY, findings
from toolkit.drills import DRILLS, run_drill


def test_stolen_lease_parks_a_document_that_succeeded_remotely_which_is_costly_not_unsafe(tmp_path):
    """A live slow owner's lease expires; the thief parks the item; the owner (naive: it
    never checks its lease) submits anyway and its job succeeds. The submit by the lease
    loser is the unsafe headline; the paid-for document in needs_review is the costly
    finding parked_after_success beside it (the safe twin has neither)."""
    thief = run_drill(DRILLS["owner-recovery/steal-expired"], tmp_path / "thief")
    assert thief.verdict.valid is False
    (parked,) = thief.verdict.costly["parked_after_success"]
    assert parked.key in {k for k, i in thief.history.items.items() if i.state.value ==
                          "needs_review"}
    assert thief.passed and thief.row()["headline"] == "execution_by_lease_loser"
    safe = run_drill(DRILLS["owner-recovery"], tmp_path / "safe")
    assert safe.verdict.costly == {} and safe.passed


def test_parking_after_a_crash_before_any_submit_costs_nothing(tmp_path):
    """The safe design parks an intent with no job (non-idempotent contract): nothing
    succeeded remotely, so the parking is legitimate and not reported as costly."""
    result = run_drill(DRILLS["crash-after-intent"], tmp_path)
    assert result.by_state["needs_review"] == 1
    assert result.verdict.valid is True and result.verdict.costly == {}


def test_double_execution_is_the_headline_with_its_unrecorded_execution_under_it(tmp_path):
    """batch-commit dies before committing: the rerun executes again. The unrecorded
    execution and blind resubmit of that document are consequences listed under the double
    execution, never beside it; every finding carries its kind's remedy."""
    result = run_drill(DRILLS["crash-before-commit/batch-commit"], tmp_path)
    found = findings(result.verdict)
    assert found[0].headline.kind == "double_execution"
    doubled = {f.headline.key for f in found if f.headline.kind == "double_execution"}
    assert any(c.kind == "unrecorded_execution" for f in found for c in f.consequences)
    assert not [f for f in found if f.headline.kind == "unrecorded_execution"
                and f.headline.key in doubled]
    assert all(f.remedy == REMEDY[f.headline.kind] for f in found)
    kinds = [f.headline.kind for f in found]
    assert kinds == sorted(kinds, key=SPECIFICITY.index)


def test_explain_names_the_file_the_witness_calls_and_the_remedy():
    """``drill lost-reply/blind-retry --explain``: the document's file name, the two
    executions of attempt 1 of the same key in run 1 with their seconds, the fault that
    fired, and the one-line remedy; ``--json`` carries the same per finding."""
    text = subprocess.run([sys.executable, "-m", "toolkit", "drill", "lost-reply/blind-retry",
                           "--explain"], capture_output=True, text=True)
    assert text.returncode == 0, text.stderr
    assert "double_execution (unsafe) doc-" in text.stdout
    assert text.stdout.count("witness: run 1, execution succeeded") == 2
    assert "run 1: lost_reply" in text.stdout
    assert "remedy: look the idempotency key up before resubmitting" in text.stdout
    out = subprocess.run([sys.executable, "-m", "toolkit", "drill", "lost-reply/blind-retry",
                          "--json"], capture_output=True, text=True)
    (row,) = json.loads(out.stdout)
    (finding,) = row["findings"]
    assert finding["file"].startswith("doc-") and finding["remedy"]
    assert finding["consequences"][0]["kind"] == "blind_resubmit"
    first, second = finding["witnesses"]
    assert first["run"] == second["run"] == 1 and first["attempt"] == second["attempt"] == 1
    assert first["idem_key"] == second["idem_key"] and 0 <= first["seconds"] <= second["seconds"]


def test_contract_rows_where_a_blind_retry_is_harmless_say_so():
    harmless = [d for d in DRILLS.values() if d.strategy == "blind-retry" and d.expect_valid]
    assert {d.name for d in harmless} == {"contract[idempotent]/blind-retry",
                                          "contract[idempotent,lag=2]/blind-retry"}
    assert all("harmless" in d.note for d in harmless)
    twins = [d for d in DRILLS.values() if d.strategy != "safe" and not d.note]
    assert all(d.expect for d in twins)  # every other naive twin shows its harm
