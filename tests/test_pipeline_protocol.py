"""Drill your own pipeline: any `Pipeline` runs under the catalogue's faults and checker."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.drills import DRILLS, run_drill
from toolkit.errors import ToolkitError
from toolkit.runner import Pipeline
from toolkit.runner.registry import STRATEGIES, resolve_strategy

ROOT = Path(__file__).resolve().parents[1]
HOPEFUL = "examples.my_pipeline:HopefulPipeline"
CAREFUL = "examples.my_pipeline:CarefulPipeline"
TEAM = "examples.team_adapter:TeamAdapter"


@pytest.fixture(autouse=True)
def repo_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def cli(*args):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True,
                          text=True, cwd=ROOT)


def test_every_builtin_strategy_is_written_against_the_same_protocol():
    assert all(issubclass(cls, Pipeline) for cls in STRATEGIES.values())


def test_lost_reply_makes_the_hopeful_user_pipeline_execute_twice(tmp_path):
    result = run_drill(DRILLS["lost-reply"], tmp_path, strategy=HOPEFUL)
    assert result.verdict.valid is False
    assert "double_execution" in result.verdict.anomalies


def test_careful_user_pipeline_recovers_a_lost_reply_by_lookup(tmp_path):
    result = run_drill(DRILLS["lost-reply"], tmp_path, strategy=CAREFUL)
    assert result.verdict.valid is True and result.executions == 4


def test_crash_after_submit_is_caught_in_the_hopeful_pipeline_through_the_cli():
    result = cli("drill", "crash-after-submit", "--strategy", HOPEFUL, "--json")
    assert result.returncode == 1  # a verdict differs from what the safe design achieves
    (row,) = json.loads(result.stdout)
    assert row["strategy"] == HOPEFUL and row["valid"] is False
    assert "double_execution" in row["anomalies"]


@pytest.mark.parametrize("reference, message", [
    ("examples.no_such_module:Thing", "cannot import"),
    ("examples.my_pipeline:NoSuchClass", "has no"),
    ("json:dumps", "is not a pipeline"),
    ("no-such-strategy", "unknown strategy"),
])
def test_bad_pipeline_reference_is_a_one_line_error(reference, message):
    with pytest.raises(ToolkitError, match=message):
        resolve_strategy(reference)
    result = cli("drill", "all", "--strategy", reference)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert message in result.stderr


def test_team_batch_drilled_through_its_adapter_shows_its_double_execution_and_fake_done(tmp_path):
    lost = run_drill(DRILLS["lost-reply"], tmp_path / "lost", strategy=TEAM)
    assert {"double_execution", "unrecorded_execution"} <= set(lost.verdict.anomalies)
    cut = run_drill(DRILLS["half-download"], tmp_path / "cut", strategy=TEAM)
    assert "fake_done" in cut.verdict.anomalies
