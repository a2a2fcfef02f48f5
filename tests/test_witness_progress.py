"""The witness learns a run's progress (runner/witness_progress.py): a run killed mid-batch
(SIGKILL: no end recorded), then its ledger restored from a backup taken before that run,
is refused before anything is sent; a run killed before its first intent sent nothing, and
its rerun (on the ledger or on that backup) runs. Real processes, real SIGKILL, a
non-idempotent provider whose counters say whether any document ran twice."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import run_cli, tmpfs_mount
from test_run_signals import checked
from test_witness_ledger import _run_args, doubles
from toolkit.documents import make_corpus
from toolkit.ledger import open_ledger
from toolkit.provider import provider_stats

pytestmark = pytest.mark.slow

# A run of the real CLI whose runner hook SIGKILLs its own process at the run's first
# ``before_intent``: the hook seam the CLI's witness hook sits on, so the kill lands
# exactly before the first intent (a fault injected as the drills inject theirs).
KILL_BEFORE_FIRST_INTENT = """
import os, signal, sys
from toolkit.runner import witness_progress
recording = witness_progress.Progress.__call__
def call(self, point, key, **context):
    if point == "before_intent":
        os.kill(os.getpid(), signal.SIGKILL)
    return recording(self, point, key, **context)
witness_progress.Progress.__call__ = call
from toolkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _batch(tmp_path, ledger, docs):
    """Run 1 on half of a corpus of ``docs``; a backup of the ledger then; all inputs in."""
    make_corpus(tmp_path / "all", docs=docs, poison=0, seed=7)
    (tmp_path / "in").mkdir()
    names = sorted(os.listdir(tmp_path / "all"))
    for name in names[:docs // 2]:
        shutil.copy(tmp_path / "all" / name, tmp_path / "in" / name)
    first = run_cli(*_run_args(tmp_path, ledger))
    assert first.returncode == 0, first.stderr
    backup = tmp_path / f"backup{ledger.suffix}"
    shutil.copy(ledger, backup)
    for name in names[docs // 2:]:
        shutil.copy(tmp_path / "all" / name, tmp_path / "in" / name)
    return backup


def _restored_and_rerun(tmp_path, ledger, backup):
    """The restore (the backup's file alone, as copied: no WAL), then the rerun, which must
    be refused before any send: exit 2, one line naming salvage."""
    for extra in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{ledger}{extra}")
    shutil.copy(backup, ledger)
    rerun = run_cli(*_run_args(tmp_path, ledger))
    assert rerun.returncode == 2, rerun.stderr
    assert len(rerun.stderr.strip().splitlines()) == 1 and "--salvage" in rerun.stderr
    return rerun


def _outputs(tmp_path) -> int:
    return sum(name.endswith(".pdf") for _, _, names in os.walk(tmp_path / "out")
               for name in names)


@pytest.mark.parametrize("suffix,workers", [(".jsonl", ()), (".sqlite", ()),
                                             (".sqlite", ("--workers", "2"))])
def test_sigkill_mid_batch_then_backup_restored_is_refused_with_no_double(tmp_path, suffix,
                                                                          workers):
    """Fault: a run (or a pool of 2 workers) SIGKILLed mid-batch (outputs written, no end
    recorded), the ledger then restored from a backup taken before that run. Property: the
    rerun is refused before any send (exit 2, one line naming salvage) and no document ran
    twice."""
    ledger = tmp_path / f"L{suffix}"
    backup = _batch(tmp_path, ledger, docs=24)
    before = _outputs(tmp_path)
    child = subprocess.Popen([sys.executable, "-m", "toolkit", *map(str, _run_args(
        tmp_path, ledger)), *workers], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True)  # the pool's processes: one group, killed together
    deadline = time.monotonic() + 120
    while _outputs(tmp_path) < before + 3 and child.poll() is None and \
            time.monotonic() < deadline:
        time.sleep(0.002)
    assert child.poll() is None, "the run ended before the kill: too few documents"
    os.killpg(child.pid, signal.SIGKILL)  # the run and its workers (kill -9 of the group)
    child.communicate(timeout=60)
    assert _outputs(tmp_path) > before  # some of this run's documents were executed
    rerun = _restored_and_rerun(tmp_path, ledger, backup)
    assert "older copy" in rerun.stderr
    assert doubles(tmp_path) == 0


def _killed_before_first_intent(tmp_path, ledger):
    child = subprocess.run([sys.executable, "-c", KILL_BEFORE_FIRST_INTENT,
                            *map(str, _run_args(tmp_path, ledger))],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stderr


@pytest.mark.parametrize("restore", [False, True])
def test_sigkill_before_first_intent_rerun_runs_normally(tmp_path, restore):
    """Fault: a run SIGKILLed before its first intent (nothing sent), then rerun as it is or
    on the backup taken before it. Property: the rerun is not refused (exit 0), every
    document ends done, none ran twice: the witness never claims more than was sent."""
    ledger = tmp_path / "L.jsonl"
    backup = _batch(tmp_path, ledger, docs=8)
    seen = json.loads((tmp_path / "out" / ".witness.json").read_text())
    _killed_before_first_intent(tmp_path, ledger)
    after = json.loads((tmp_path / "out" / ".witness.json").read_text())
    assert after == seen or after["ledgers"].keys() == seen["ledgers"].keys()
    if restore:
        shutil.copy(backup, ledger)

    rerun = run_cli(*_run_args(tmp_path, ledger), "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["by_state"]["done"] == 8
    assert doubles(tmp_path) == 0


@pytest.mark.parametrize("suffix", [".jsonl", ".sqlite"])
def test_backup_taken_during_a_run_restored_after_a_kill_is_refused_with_no_double(
        tmp_path, suffix):
    """Outsider o34 R1. Fault: a copy of the ledger taken WHILE a run writes it (a backup job,
    a VM snapshot of the file), then more documents sent, the run SIGKILLed, the copy
    restored. Property: refused before any send, no document twice. With progress recorded
    every ~2 s, a copy taken within the last 2 s of intents read as the newest (17 of 30
    documents ran twice); the witness now records at every intent, before its request."""
    ledger = tmp_path / f"L{suffix}"
    _batch(tmp_path, ledger, docs=24)
    before = _outputs(tmp_path)
    child = subprocess.Popen([sys.executable, "-m", "toolkit", *map(str, _run_args(
        tmp_path, ledger))], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True)
    deadline = time.monotonic() + 120

    def wait_for(outputs):
        while _outputs(tmp_path) < outputs and child.poll() is None and \
                time.monotonic() < deadline:
            time.sleep(0.002)
        assert child.poll() is None, "the run ended first: too few documents"

    wait_for(before + 1)
    backup = tmp_path / f"mid{suffix}"
    shutil.copy(ledger, backup)  # the file as a copy finds it mid-run (a WAL not included)
    wait_for(before + 4)  # three more documents sent after the copy
    os.killpg(child.pid, signal.SIGKILL)
    child.communicate(timeout=60)
    _restored_and_rerun(tmp_path, ledger, backup)
    assert doubles(tmp_path) == 0


# The real CLI, whose witness hook first fills the file system of --out (a real ENOSPC on a
# real tmpfs) at the run's first after_intent, then records as it always does.
FILL_AT_FIRST_RECORD = """
import sys
from toolkit.runner import witness_progress
recording, filled, FILLER = witness_progress.Progress.__call__, [], sys.argv.pop(1)
def call(self, point, key, **context):
    if point == "after_intent" and not filled:
        filled.append(key)
        try:
            with open(FILLER, "wb") as filler:
                while True:
                    filler.write(b"x" * 4096)
                    filler.flush()
        except OSError:
            pass
    return recording(self, point, key, **context)
witness_progress.Progress.__call__ = call
from toolkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("suffix", [".jsonl", ".sqlite"])
def test_witness_that_cannot_record_an_intent_halts_before_its_send_and_rerun_sends_it(
        tmp_path, suffix):
    """Outsider o35 S1. Fault: --out's file system full (a real tmpfs, really filled) when the
    witness would record the run's first intent (the ledger elsewhere, writable). Property:
    that request is not sent (the provider executed nothing; a copy of the ledger restored
    later could not run it twice), the run halts with exit 1 and records that intent as
    never sent (failed, transient, its lease released); with space freed and health
    cleared, the rerun sends it as a new attempt, no person needed: all 4 documents done,
    none sent twice. Before: it stayed unknown and the rerun parked it (needs_review)."""
    make_corpus(tmp_path / "in", docs=4, poison=0, seed=3)
    out, ledger_path = tmp_path / "out", tmp_path / f"L{suffix}"
    with tmpfs_mount(out, "size=256k"):
        filler = out / "filler"
        halted = subprocess.run([sys.executable, "-c", FILL_AT_FIRST_RECORD, str(filler),
                                 *map(str, _run_args(tmp_path, ledger_path))],
                                capture_output=True, text=True, timeout=300)
        assert halted.returncode == 1, halted.stderr
        assert "cannot record the ledger's witness" in halted.stderr
        assert provider_stats(tmp_path / "p.db")["executions"] == 0  # on main: 1
        with open_ledger(ledger_path) as ledger:
            unsent = [item for item in ledger.items() if item.attempt]
        assert [(item.state.value, item.failure, item.lease_owner) for item in unsent] == \
            [("failed", "transient", None)]
        assert unsent[0].reason.startswith("not sent")
        filler.unlink()
        assert run_cli("health", "--ledger", ledger_path, "--clear").returncode == 0
        rerun = run_cli(*_run_args(tmp_path, ledger_path), "--json")
        assert rerun.returncode == 0, rerun.stderr
        by_state = json.loads(rerun.stdout)["by_state"]
        assert (by_state["done"], by_state["needs_review"]) == (4, 0)
        assert all(row["submit_calls"] == 1 for row in
                   provider_stats(tmp_path / "p.db")["per_task"].values())
        assert doubles(tmp_path) == 0
        verdict = checked(tmp_path, ledger_path, "non-idempotent")
        assert verdict.valid is True, verdict


def test_not_sent_record_on_the_full_disk_of_the_ledger_never_crashes_nor_sends_twice(
        tmp_path):
    """Fault: the ledger and --out on one full file system (a real tmpfs, really filled)
    when the witness would record the run's first intent. Property: the run halts before
    the send (exit 1, no traceback); the "not sent" record lands only if the ledger can
    take it (a JSONL append may fit in its last page's slack), else the intent stays
    unknown; either way the rerun (space freed, health cleared) sends no request twice and
    every document ends done or parked. (A property that held before this record too.)"""
    make_corpus(tmp_path / "in", docs=3, poison=0, seed=4)
    batch = tmp_path / "batch"
    with tmpfs_mount(batch, "size=512k"):
        args = _run_args(tmp_path, batch / "L.jsonl", out="batch/out")
        filler = batch / "filler"
        halted = subprocess.run([sys.executable, "-c", FILL_AT_FIRST_RECORD, str(filler),
                                 *map(str, args)], capture_output=True, text=True, timeout=300)
        assert halted.returncode == 1, halted.stderr
        assert "Traceback" not in halted.stderr
        assert provider_stats(tmp_path / "p.db")["executions"] == 0
        filler.unlink()
        assert run_cli("health", "--ledger", batch / "L.jsonl", "--clear").returncode == 0
        rerun = run_cli(*args, "--json")
        assert rerun.returncode == 0, rerun.stderr
        by_state = json.loads(rerun.stdout)["by_state"]
        assert by_state["done"] + by_state["needs_review"] == 3
        assert all(row["submit_calls"] == 1 for row in
                   provider_stats(tmp_path / "p.db")["per_task"].values())
