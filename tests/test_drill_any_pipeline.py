"""Drill any in-process pipeline: the whole catalogue, n/a rows, inconclusive rows, run and pools."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.documents import make_corpus
from toolkit.drills import DRILLS, run_drill
from toolkit.errors import ToolkitError
from toolkit.ledger import State, open_ledger
from toolkit.provider import Contract, FakeProvider
from toolkit.runner import Pipeline
from toolkit.runner.ops import mark_unhealthy
from toolkit.runner.registry import open_strategy

ROOT = Path(__file__).resolve().parents[1]
HOPEFUL = "examples.my_pipeline:HopefulPipeline"
CAREFUL = "examples.my_pipeline:CarefulPipeline"
S = State


@pytest.fixture(autouse=True)
def repo_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def cli(*args):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True,
                          text=True, cwd=ROOT)


class Hookless(Pipeline):
    """Submits blindly again on a timeout, like HopefulPipeline, but never calls ``self.hook``."""

    processed: list = []

    def process(self, key):
        from toolkit.identity import idem_key

        Hookless.processed.append(key)
        item = self.ledger.get(key)
        if item.state is S.PENDING:
            item = self.ledger.move(key, S.PENDING, S.UNKNOWN, worker=self.worker)
        if item.state is not S.UNKNOWN:
            return item
        job = self.provider.submit(idem_key(key, item.attempt), self._paths[key], self.options)
        while job.status in ("queued", "running"):
            job = self.provider.poll(job.job_id)
        out = self.out_dir / f"{key[:16]}.pdf"
        out.parent.mkdir(parents=True, exist_ok=True)
        self.provider.fetch(job.job_id, out)
        self.ledger.move(key, S.UNKNOWN, S.SUBMITTED, worker=self.worker, job_id=job.job_id)
        return self.ledger.move(key, S.SUBMITTED, S.DONE, worker=self.worker,
                                artifact_path=str(out), artifact_size=job.artifact_size,
                                artifact_sha256=job.artifact_sha256)


@pytest.mark.slow
def test_drill_all_on_the_hopeful_example_prints_every_row_and_exits_one():
    """The README's own command: every scenario is a row (none aborts the table); the
    page-by-page drill is n/a with its reason; the lost reply shows the double execution."""
    result = cli("drill", "all", "--strategy", HOPEFUL, "--json")
    assert result.returncode == 1, result.stderr
    rows = {row["drill"]: row for row in json.loads(result.stdout)}
    safe_rows = [name for name, drill in DRILLS.items() if drill.strategy == "safe"]
    assert list(rows) == safe_rows
    assert rows["partial-resume"]["status"] == "n/a"
    assert "sends whole documents" in rows["partial-resume"]["reason"]
    assert rows["lost-reply"]["status"] == "UNEXPECTED"
    assert "double_execution" in rows["lost-reply"]["anomalies"]
    assert "fake_done" in rows["half-download"]["anomalies"]
    assert "double_execution" in rows["http-lost-reply"]["anomalies"]


def test_a_lost_reply_that_never_fired_is_inconclusive_not_passed(tmp_path):
    """A pipeline with no ``self.hook`` calls cannot lose a reply at ``after_submit``: its
    'valid' proves nothing, so the row is inconclusive, names the fault, and is not passed."""
    result = run_drill(DRILLS["lost-reply"], tmp_path, strategy=Hookless)
    assert result.verdict.valid is True  # nothing went wrong because nothing was injected
    assert result.status == "inconclusive" and not result.passed and result.failing
    assert result.missing == ("lost_reply",)
    assert "lost_reply" in result.reason


def test_cancel_between_runs_is_na_not_inconclusive_for_a_pipeline_that_settles_within_a_run():
    """Fault: the operator cancels an item in flight between runs. ``CarefulPipeline`` waits
    for every job within its run, so nothing is in flight then: the scenario cannot be
    entered. Property: the row is ``n/a`` with that reason, and ``drill cancel`` exits 0
    (a correct pipeline is never a permanent exit 1)."""
    result = cli("drill", "cancel", "--strategy", CAREFUL, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    (row,) = json.loads(result.stdout)
    assert row["status"] == "n/a" and "nothing in flight" in row["reason"]


@pytest.mark.slow
def test_http_lost_reply_reruns_and_catches_the_double_execution_of_the_next_run(tmp_path):
    """Over real HTTP the socket times out while the job runs on; this pipeline lets the
    TimeoutError escape (the process dies). Only the rerun resubmits blindly: a drill that
    ran once would have called it valid."""
    result = run_drill(DRILLS["http-lost-reply"], tmp_path, strategy=Hookless)
    assert any(name == "slow_submit" for _, name, _ in result.fired)
    assert any(step.label == "end of run 2" for step in result.steps)
    assert result.status == "UNEXPECTED" and "double_execution" in result.verdict.anomalies


def test_quarantined_poison_never_reaches_process(tmp_path):
    """Poison found by preflight is failed(permanent) before any submit, and ``process()`` is
    never called for it, in the run that finds it nor in a rerun."""
    inputs = make_corpus(tmp_path / "in", docs=2, poison=2, seed=3)
    Hookless.processed = []
    with FakeProvider(tmp_path / "p.db", tmp_path / "jobs", Contract()) as provider:
        for _ in range(2):
            runner = open_strategy(Hookless, tmp_path / "l.sqlite", provider, tmp_path / "out")
            counts = runner.run(inputs)
            poison = set(runner.quarantined)
            runner.close()
    assert counts["failed"] == 2 and counts["done"] == 2 and len(poison) == 2
    assert not poison & set(Hookless.processed) and len(Hookless.processed) == 4


def test_a_pipeline_that_overrides_run_cannot_skip_the_health_check(tmp_path):
    """After a run failed closed (health marker beside the ledger), opening any strategy,
    even one whose ``run()`` never checks health, refuses with a one-line ToolkitError."""
    ledger_path = tmp_path / "l.sqlite"
    open_ledger(ledger_path).close()
    mark_unhealthy(ledger_path, "No space left on device")

    class OwnLoop(Hookless):
        def run(self, inputs):
            return {}

    with FakeProvider(tmp_path / "p.db", tmp_path / "jobs", Contract()) as provider:
        with pytest.raises(ToolkitError, match="not ready"):
            open_strategy(OwnLoop, ledger_path, provider, tmp_path / "out")


@pytest.mark.slow
def test_run_takes_a_user_pipeline_and_a_pool_of_workers(tmp_path):
    """``run --strategy module:Class --workers 2``: the toolkit builds the pool (no run()
    override needed); the batch rests done, and a rerun executes nothing again."""
    make_corpus(tmp_path / "in", docs=4, poison=1, seed=1)
    args = ["run", "--inputs", str(tmp_path / "in"), "--ledger", str(tmp_path / "l.sqlite"),
            "--provider-db", str(tmp_path / "p.db"), "--out", str(tmp_path / "out"),
            "--strategy", CAREFUL, "--json"]
    first = cli(*args, "--workers", "2")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["by_state"] == {**json.loads(first.stdout)["by_state"],
                                                    "done": 4, "failed": 1}
    again = cli(*args)
    assert again.returncode == 0, again.stderr
    stats = json.loads(cli("provider-stats", "--provider-db", str(tmp_path / "p.db"),
                           "--json").stdout)
    assert stats["executions"] == 4


def test_run_refuses_a_bad_strategy_reference_in_one_line(tmp_path):
    result = cli("run", "--inputs", str(tmp_path), "--ledger", str(tmp_path / "l.sqlite"),
                 "--provider-db", str(tmp_path / "p.db"), "--out", str(tmp_path / "o"),
                 "--strategy", "examples.my_pipeline:Nope")
    assert result.returncode == 2 and result.stderr.count("\n") == 1


def test_a_module_that_exits_and_prints_at_import_is_one_line_and_keeps_json_clean():
    """Fault: the strategy's module runs its batch at import (prints, then ``sys.exit(0)``).
    Property: the loader turns the SystemExit into a one-line error and exit 2; the module's
    print goes to stderr, so stdout (``--json``) carries nothing of it."""
    result = subprocess.run([sys.executable, "-m", "toolkit", "drill", "all", "--strategy",
                             "exits_at_import:MyPipeline", "--json"], capture_output=True,
                            text=True, cwd=ROOT / "tests" / "fixtures",
                            env={**__import__("os").environ,
                                 "PYTHONPATH": f"{ROOT}:{ROOT / 'tests' / 'fixtures'}"})
    assert result.returncode == 2, result
    assert "processing batch" not in result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith("error: cannot import")
    assert "SystemExit" in result.stderr and "Traceback" not in result.stderr


def test_the_http_client_does_not_import_the_server():
    """One-way: the client and the service share ``provider.wire``; the client never loads
    the service module (nor werkzeug)."""
    code = ("import sys, toolkit.provider.client\n"
            "print('toolkit.provider.service' in sys.modules, 'werkzeug' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]
