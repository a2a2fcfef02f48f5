"""The witness across --out folders (runner/witness.py): a ledger run with two --out
folders in turn is checked against the witness of each, by real runs (processes) on real
files, against a non-idempotent provider whose counters say whether a document ran twice."""

import json
import shutil

import pytest

from conftest import run_cli
from test_witness_ledger import _run_args, doubles, two_runs
from toolkit.provider import provider_stats

pytestmark = pytest.mark.slow


def _run(tmp_path, ledger, out):
    return run_cli(*_run_args(tmp_path, ledger, out=out))


def _two_outs(tmp_path):
    """Run 1 --out A (3 documents), a copy of the ledger (``backup.jsonl``), run 2 --out B
    (3 more)."""
    ledger = tmp_path / "L.jsonl"
    two_runs(tmp_path, ledger, docs=6, seed=7, outs=("A", "B"))
    return ledger


@pytest.mark.parametrize("roots", ["kept", "restored"])
def test_backup_restored_after_a_run_with_another_out_is_refused_before_any_send(tmp_path,
                                                                                 roots):
    """Fault: one ledger run with --out A, then --out B (more transitions), then restored
    from the copy taken after the run with A (``roots``: its ``.roots.json`` kept, naming
    B, or restored too, naming A). Property: the run with --out A refuses it before any
    send (exit 2, one line naming the salvage), though A's own witness agrees with the
    copy; its salvage given --out A is marked with the loss: no document executes twice."""
    ledger = _two_outs(tmp_path)
    marker = tmp_path / "L.jsonl.roots.json"
    assert json.loads(marker.read_text())["out"] == "B"  # run 2 verified every artifact in B
    if roots == "restored":
        marker.write_text(json.dumps({"out": "A"}))  # as it was after run 1
    executed = provider_stats(tmp_path / "p.db")["executions"]
    shutil.copy(tmp_path / "backup.jsonl", ledger)

    refused = _run(tmp_path, ledger, "A")
    assert refused.returncode == 2, refused.stderr
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1 and "older copy" in line and "--salvage" in line, line
    assert provider_stats(tmp_path / "p.db")["executions"] == executed
    assert doubles(tmp_path) == 0

    # the salvage given --out A reads B's witness too, and marks what the copy lost
    salvaged = run_cli("ledger", ledger, "--salvage", tmp_path / "S.jsonl", "--out",
                       tmp_path / "A")
    assert salvaged.returncode == 0, salvaged.stderr
    mark = json.loads((tmp_path / "S.jsonl").read_bytes().split(b"\n", 1)[0])["salvaged"]
    assert mark["lost"].startswith("the events after seq"), mark
    rerun = _run(tmp_path, tmp_path / "S.jsonl", "A")
    assert rerun.returncode == 0, rerun.stderr
    assert doubles(tmp_path) == 0


@pytest.mark.parametrize("out", ["A", "B"])
def test_two_outs_legitimate_rerun_with_either_out_still_runs(tmp_path, out):
    """Fault: none (the control): a ledger run with --out A, then --out B. Property: a
    rerun with either folder is let in (exit 0) and sends nothing again."""
    ledger = _two_outs(tmp_path)
    rerun = _run(tmp_path, ledger, out)
    assert rerun.returncode == 0, rerun.stderr
    assert doubles(tmp_path) == 0


def test_other_out_removed_rerun_with_the_first_still_runs(tmp_path):
    """Fault: the second --out folder (B) removed as a whole (``rm -r``) after the runs
    with A and B. Property: a rerun with --out A is let in (exit 0): a folder gone is
    skipped, never made anew by the witness; nothing is sent again."""
    ledger = _two_outs(tmp_path)
    shutil.rmtree(tmp_path / "B")
    rerun = _run(tmp_path, ledger, "A")
    assert rerun.returncode == 0, rerun.stderr
    assert not (tmp_path / "B").exists() and doubles(tmp_path) == 0
