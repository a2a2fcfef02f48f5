"""Black-box drills: unmodified programs (Python, bash + curl) against the provider service.

The faults are the service's own (a connection dropped after the job was
accepted, a download cut halfway, 503s, lagging or unavailable lookups, a 409
on an active key); the oracle reads only the provider's execution log and the
files in TOOLKIT_OUT.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.blackbox import SCENARIOS, run_all, run_scenario

ROOT = Path(__file__).resolve().parents[1]
NAIVE = f"{sys.executable} {ROOT / 'examples/blackbox/naive_batch.py'}"
CAREFUL = f"{sys.executable} {ROOT / 'examples/blackbox/careful_batch.py'}"
BASH = f"bash {ROOT / 'examples/blackbox/batch.sh'}"

pytestmark = pytest.mark.slow


def kinds(result):
    return {finding.kind for finding in result.findings}


def test_naive_batch_executes_twice_when_the_reply_to_an_accepted_submit_is_dropped(inputs):
    """The service accepts and runs the first job, then drops the connection. tenacity
    retries the whole document with a fresh request id: the provider's log shows the same
    content and options executed twice, whatever keys were sent; both witnesses are named."""
    result = run_scenario(NAIVE, inputs, SCENARIOS["lost-reply"])
    assert result.faults_fired["drop_submits"] == 1 and result.rested
    (double,) = [f for f in result.findings if f.kind == "double_execution"]
    assert double.file == "doc-000.pdf" and len(double.witnesses) == 2
    first, second = double.witnesses
    assert first["idem_key"] != second["idem_key"] and first["run"] == 1
    assert result.status == "INVALID"


def test_naive_batch_resends_the_document_when_its_download_is_cut(inputs):
    """The first artifact response stops halfway; the naive retry covers submit and
    download together, so the cut download costs a second execution."""
    result = run_scenario(NAIVE, inputs, SCENARIOS["cut-download"])
    assert result.faults_fired["cut_fetches"] == 1
    assert "double_execution" in kinds(result)


def test_careful_twin_is_valid_under_every_service_fault(inputs):
    """Lost reply, cut download, 503 storm, lookup lag and a 409 on an active key: the
    careful batch rests with every output verified and nothing executed twice. With
    lookups down for good it never guesses: its document stays unresolved, not resent."""
    results = {r.scenario.name: r for r in run_all(CAREFUL, inputs)}
    assert all(r.status == "valid" for r in results.values()), \
        {n: (r.status, kinds(r)) for n, r in results.items()}
    assert all(r.rested for n, r in results.items() if n != "lookup-unavailable")
    stuck = results["lookup-unavailable"]
    assert not stuck.rested and kinds(stuck) == {"unresolved"} and stuck.executions == 1


def test_bash_curl_batch_is_drilled_the_same_way_and_gives_up_too_early_on_a_lagging_lookup(
        inputs):
    """Any language: the bash + curl batch survives a dropped reply (it looks its key up),
    but after one 'not found' from a lagging lookup it resubmits on the next run: a
    double execution the oracle finds from the provider's log alone."""
    lost = run_scenario(BASH, inputs, SCENARIOS["lost-reply"])
    assert lost.status == "valid" and lost.rested
    lag = run_scenario(BASH, inputs, SCENARIOS["lookup-lag"])
    assert "double_execution" in kinds(lag)


def test_drill_command_json_is_one_document_and_exits_one_on_a_finding(inputs):
    result = subprocess.run([sys.executable, "-m", "toolkit", "drill", "lost-reply",
                             "--command", NAIVE, "--inputs", str(inputs), "--json"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 1, result.stderr
    (row,) = json.loads(result.stdout)
    assert row["scenario"] == "lost-reply" and row["status"] == "INVALID"
    assert row["findings"][0]["kind"] == "double_execution"


def test_drill_command_without_inputs_is_a_one_line_error():
    result = subprocess.run([sys.executable, "-m", "toolkit", "drill", "--command", "true"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2 and result.stderr.count("\n") == 1


def test_503_storm_always_refuses_a_submit_so_a_pipeline_that_drops_refused_documents_fails(
        inputs, tmp_path):
    """Outsider o32 P3: with one document the seeded 503 rate refused no submit, and a
    pipeline that gives a refused document up for good was called ``valid``. The storm now
    refuses the first submit for sure (counted in ``faults_fired``); the pipeline that
    drops the refused document never delivers it and fails."""
    careful = (ROOT / "examples/blackbox/careful_batch.py").read_text()
    retry = """            time.sleep(0.02 * 2 ** n)  # nothing was accepted: the same key again is safe
            continue"""
    assert retry in careful
    gives_up = tmp_path / "gives_up_on_503.py"
    gives_up.write_text(careful.replace(retry, '            return {"status": "failed"}'))
    result = run_scenario(f"{sys.executable} {gives_up}", inputs, SCENARIOS["503-storm"])
    assert result.faults_fired["refuse_submits"] == 1
    assert result.status == "INVALID" and "never_processed" in kinds(result)
    careful_result = run_scenario(CAREFUL, inputs, SCENARIOS["503-storm"])
    assert careful_result.faults_fired["refuse_submits"] == 1 and careful_result.status == "valid"


def test_program_that_cleans_its_parent_folder_cannot_reach_the_drills_own_records(inputs):
    """Outsider o32 P4. Fault: the drilled program removes everything it can reach beside
    its work folder (``rm -rf ../*``, a careless cleanup). Must hold: the provider's records
    that judge it live elsewhere, so the verdict stands (the careful batch stays valid: its
    outputs and the provider's log are intact), never a traceback."""
    cleanup = f"{CAREFUL} && rm -rf ../provider.db* ../provider-jobs ../run-*.log.none"
    result = run_scenario(cleanup, inputs, SCENARIOS["clean"])
    assert result.status == "valid" and result.executions == 1


def test_the_toolkits_own_run_drilled_as_a_black_box_passes_every_service_fault(inputs):
    """Outsider o44 F9. Fault: each of the service's faults, against ``python -m toolkit run``
    drilled as any program is (its ledger in the work folder, outputs in TOOLKIT_OUT).
    Must hold: the toolkit's own pipeline passes its own drill. Its ``.witness.json`` (and
    lock, temp files) in ``--out`` are hidden bookkeeping, never a 'fake done'; under
    lookups down for good it never guesses (unresolved, one execution, not resent)."""
    own = (f"{sys.executable} -m toolkit run --provider-url \"$TOOLKIT_PROVIDER_URL\" "
           "--inputs \"$TOOLKIT_INPUTS\" --out \"$TOOLKIT_OUT\" --ledger ledger.sqlite")
    results = {r.scenario.name: r for r in run_all(own, inputs)}
    assert all(r.status == "valid" for r in results.values()), \
        {n: (r.status, [(f.kind, f.detail) for f in r.findings]) for n, r in results.items()}
    assert all(r.rested for n, r in results.items() if n != "lookup-unavailable")
    stuck = results["lookup-unavailable"]
    assert kinds(stuck) == {"unresolved"} and stuck.executions == 1


def test_the_toolkits_own_run_delivers_a_hidden_inputs_output_under_its_hidden_name(
        inputs, tmp_path):
    """Outsider o46 M6. Fault: an input named with a leading dot (``.doc-000.pdf``), so
    ``run`` names its output ``.doc-000.<key8>.pdf``, hidden too. Must hold: a hidden file
    with an artifact's bytes is a delivery (the rule that hidden files are no fake done
    must not make this one lost): the toolkit's own run is valid. Before: ``lost_item``."""
    dotted = tmp_path / "dotted"
    dotted.mkdir()
    for path in inputs.glob("*.pdf"):
        (dotted / f".{path.name}").write_bytes(path.read_bytes())
    own = (f"{sys.executable} -m toolkit run --provider-url \"$TOOLKIT_PROVIDER_URL\" "
           "--inputs \"$TOOLKIT_INPUTS\" --out \"$TOOLKIT_OUT\" --ledger ledger.sqlite")
    result = run_scenario(own, dotted, SCENARIOS["clean"])
    assert result.executions == 1 and result.rested
    assert result.status == "valid", [(f.kind, f.detail) for f in result.findings]
