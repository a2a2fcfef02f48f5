"""Batches as users keep them: moved, rerun from elsewhere, inputs changing under a run.

Paths in the ledger and the provider's database are relative to the batch's
roots; the bytes sent are the bytes hashed; ``--out`` never inside ``--inputs``.
"""

import hashlib
import os
import random
import shutil
import threading

import pytest

from toolkit import documents, roots
from toolkit.cli import main
from toolkit.forensics import audit
from toolkit.identity import canonical_json
from toolkit.ledger import State, open_ledger
from toolkit.provider import FakeProvider
from toolkit.provider.records import provider_records
from toolkit.runner import Runner

S = State


def _state(batch):
    """Everything a rerun could change: the ledger's events and items, the provider's calls."""
    with open_ledger(batch / "l.sqlite") as ledger:
        events, items = len(ledger.events()), {i.key: i for i in ledger.items()}
    records = provider_records(batch / "p.sqlite")
    return events, items, len(records["calls"]), len(records["executions"])


def _run(*args):
    return main(["run", *map(str, args), "--no-progress"])


@pytest.fixture
def batch(tmp_path, small_corpus, monkeypatch):
    """A finished batch in ``tmp_path/batch``, run with paths relative to that folder."""
    folder = tmp_path / "batch"
    shutil.copytree(small_corpus[0].parent, folder / "in")
    monkeypatch.chdir(folder)
    assert _run("--inputs", "in", "--ledger", "l.sqlite", "--provider-db", "p.sqlite",
                "--out", "out") == 0
    return folder


def test_moved_batch_rerun_from_another_directory_changes_no_state_and_calls_no_provider(
        batch, tmp_path, monkeypatch):
    """Fault: the batch folder is moved (``mv batch batch2``) and rerun with absolute paths
    from another working directory; then with another ``--out``. Property: 0 state changes,
    0 provider calls, 0 executions; the new ``--out`` holds every verified artifact; audit
    (default root: the recorded one) finds every artifact, from any directory."""
    before = _state(batch)
    moved = tmp_path / "batch2"
    os.rename(batch, moved)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    common = ["--inputs", moved / "in", "--ledger", moved / "l.sqlite",
              "--provider-db", moved / "p.sqlite"]
    assert _run(*common, "--out", moved / "out") == 0
    assert _state(moved) == before
    assert _run(*common, "--out", moved / "out2") == 0
    assert _state(moved) == before  # materialized from the recorded root: no fetch, no event
    _, items, _, _ = before
    done = [item for item in items.values() if item.state is S.DONE]
    assert len(done) == 4
    for item in done:
        assert documents.verify(moved / "out2" / item.artifact_path, item.artifact_size,
                                item.artifact_sha256)
    report = audit(moved / "l.sqlite")
    assert not [a for a in report.anomalies if a.kind.startswith("artifact")]
    actions = dict(zip(report.items["key"], report.items["action"]))
    assert {actions[item.key] for item in done} == {"skip"}


def test_rerun_with_a_new_out_after_the_old_one_is_gone_fetches_without_executing(
        batch, tmp_path):
    """Fault: the recorded outputs are deleted and the batch is rerun with another --out.
    Property: the artifacts are fetched again from the provider into the new folder and
    verified; nothing executes twice, no item leaves ``done``."""
    _, items, _, executed = _state(batch)
    shutil.rmtree(batch / "out")
    assert _run("--inputs", batch / "in", "--ledger", batch / "l.sqlite", "--provider-db",
                batch / "p.sqlite", "--out", tmp_path / "new") == 0
    events, after, _, executions = _state(batch)
    assert executions == executed
    for item in items.values():
        assert after[item.key].state is item.state
        if item.state is S.DONE:
            assert documents.verify(tmp_path / "new" / item.artifact_path, item.artifact_size,
                                    item.artifact_sha256)


@pytest.mark.parametrize("out", ["in", "in/out"])
def test_out_inside_or_equal_to_inputs_is_refused_before_anything_is_written(
        batch, out, capsys):
    """Fault: ``--out`` equals or is inside ``--inputs`` (outputs become the next run's
    inputs: 3 -> 6 -> 9 executions). Property: refused with one line and exit 2; the
    ledger, the provider and the inputs folder are unchanged."""
    before, listing = _state(batch), sorted(os.listdir(batch / "in"))
    capsys.readouterr()
    assert _run("--inputs", "in", "--ledger", "l.sqlite", "--provider-db", "p.sqlite",
                "--out", out) == 2
    err = capsys.readouterr().err.strip()
    assert "inside --inputs" in err and len(err.splitlines()) == 1
    assert _state(batch) == before and sorted(os.listdir(batch / "in")) == listing


def _swap_run(tmp_path, seed, originals, alternates):
    """One batch whose inputs a second thread replaces at seeded moments of the run."""
    folder = tmp_path / f"seed{seed}"
    inputs = folder / "in"
    inputs.mkdir(parents=True)
    for path in originals:
        shutil.copyfile(path, inputs / path.name)
    rng = random.Random(seed)
    wanted, done_swapping = threading.Event(), threading.Event()
    stop = False

    def swapper():  # the other actor: replaces a file whenever the run reaches a seeded moment
        while True:
            wanted.wait()
            wanted.clear()
            if stop:
                return
            victim = rng.choice(sorted(inputs.iterdir()))
            tmp = inputs / f".{victim.name}.new"
            shutil.copyfile(rng.choice(alternates), tmp)
            os.replace(tmp, victim)
            done_swapping.set()

    def hook(point, key, **context):
        if rng.random() < 0.5:
            wanted.set()
            done_swapping.wait()
            done_swapping.clear()

    thread = threading.Thread(target=swapper)
    thread.start()
    provider = FakeProvider(folder / "p.sqlite", folder / "jobs")
    try:
        for hooked in (hook, None):  # the second run sees the files as they are now
            runner = Runner(open_ledger(folder / "l.sqlite"), provider, folder / "out",
                            hook=hooked, sleep=lambda s: None)
            try:
                runner.run(sorted(inputs.iterdir()))
            finally:
                runner.close()
    finally:
        stop = True
        wanted.set()
        thread.join()
    return folder, provider


def test_inputs_replaced_during_a_run_are_never_executed_twice_nor_recorded_under_another_key(
        tmp_path):
    """Fault: a thread replaces input files at seeded moments of a run (between hashing
    and submitting among them), 20 seeds. Property: no task executes twice across the run
    and its rerun; every ``done`` artifact is the provider's result for the digest the
    ledger recorded for that key (the payload it executed is that digest's)."""
    originals = documents.make_corpus(tmp_path / "orig", docs=3, poison=0, seed=3)
    alternates = documents.make_corpus(tmp_path / "alt", docs=3, poison=0, seed=4)
    options = canonical_json({})
    for seed in range(20):
        folder, provider = _swap_run(tmp_path, seed, originals, alternates)
        per_task = provider.stats()["per_task"]
        assert all(counters.get("executions", 0) <= 1 for counters in per_task.values()), seed
        jobs = {job.job_id: job for job in provider.jobs()}
        with open_ledger(folder / "l.sqlite") as ledger:
            digests = {e.key: e.detail.get("digest") for e in ledger.events() if e.op == "add"}
            done = [item for item in ledger.items() if item.state is S.DONE]
        assert done
        for item in done:
            job = jobs[item.job_id]
            expected = hashlib.sha256(f"{digests[item.key]}\n{options}".encode()).hexdigest()
            assert job.payload_hash == expected, (seed, item.source)
            assert job.artifact_sha256 == item.artifact_sha256
            assert documents.verify(folder / "out" / item.artifact_path, item.artifact_size,
                                    item.artifact_sha256)
        provider.close()


def _actions(report):
    return dict(zip(report.items["key"], report.items["action"]))


@pytest.mark.parametrize("how", ["out-deleted", "out-moved-away"])
def test_audit_with_the_recorded_out_gone_reports_artifacts_missing_never_skip(batch, how):
    """Fault: the recorded outputs root is deleted, or moved apart from the ledger (its
    relative root no longer resolves). Property: ``audit`` does not call the done items
    verified: each is ``artifact_missing`` and planned ``reconcile``, none ``skip``."""
    _, items, _, _ = _state(batch)
    if how == "out-deleted":
        shutil.rmtree(batch / "out")
    else:
        os.rename(batch / "out", batch.parent / "elsewhere")
    report = audit(batch / "l.sqlite")
    done = {key for key, item in items.items() if item.state is S.DONE}
    missing = {a.key for a in report.anomalies if a.kind == "artifact_missing"}
    assert done and done <= missing
    assert {_actions(report)[key] for key in done} == {"reconcile"}


def test_rerun_with_another_out_records_it_once_it_holds_every_artifact(batch, tmp_path):
    """Fault: a batch is rerun with another ``--out``, then the old one is deleted.
    Property: the roots file now names the new folder (it holds every verified artifact),
    so ``audit`` verifies there: no artifact finding, every done item ``skip``."""
    _, items, _, _ = _state(batch)
    assert _run("--inputs", batch / "in", "--ledger", batch / "l.sqlite", "--provider-db",
                batch / "p.sqlite", "--out", tmp_path / "o2") == 0
    assert roots.recorded(batch / "l.sqlite")["out"].resolve() == (tmp_path / "o2").resolve()
    shutil.rmtree(batch / "out")
    report = audit(batch / "l.sqlite")
    assert not [a for a in report.anomalies if a.kind.startswith("artifact")]
    done = {key for key, item in items.items() if item.state is S.DONE}
    assert {_actions(report)[key] for key in done} == {"skip"}


def test_roots_temp_of_a_run_sigkilled_mid_write_is_removed_by_the_next_run(tmp_path):
    """Fault: a run killed by a real SIGKILL at the rename that records its roots (strace
    injects it at the run's 3rd ``rename``: the witness's, the batch registry's, then the
    roots'), its temp file written and left beside the ledger (SIGKILL runs no cleanup).
    Property: the next run removes that temp (its writer is gone) and finishes the batch,
    the roots recorded; a temp of a live writer (this test's) stays. Before: the dead
    run's ``.tmp-*.tmp`` stayed beside the ledger for good."""
    import subprocess
    import sys

    from toolkit import liveness

    documents.make_corpus(tmp_path / "in", docs=2, poison=0, seed=3)
    args = ["run", "--inputs", tmp_path / "in", "--ledger", tmp_path / "l.sqlite",
            "--provider-db", tmp_path / "p.sqlite", "--out", tmp_path / "out", "--no-progress"]
    killed = subprocess.run(
        ["strace", "-f", "-qq", "-o", os.devnull, "-e", "trace=rename,renameat,renameat2",
         "-e", "inject=rename,renameat,renameat2:signal=SIGKILL:when=3",
         sys.executable, "-m", "toolkit", *map(str, args)], capture_output=True, text=True,
        timeout=180)
    assert killed.returncode in (-9, 137), killed.stderr
    left = [path for path in tmp_path.iterdir() if path.name.endswith(".tmp")
            and not path.name.startswith("l.sqlite.inputs.")]  # the input index's: its own test
    assert not roots.roots_file(tmp_path / "l.sqlite").exists()
    assert len(left) == 1 and '"out"' in left[0].read_text(), left  # the roots, unnamed
    live = tmp_path / f"l.sqlite.roots.json.{os.getpid()}-{liveness.my_start()}.x.tmp"
    live.write_text("{}")
    assert _run(*args[1:]) == 0
    assert not left[0].exists() and live.exists()
    assert roots.recorded(tmp_path / "l.sqlite")["out"] == tmp_path / "out"
