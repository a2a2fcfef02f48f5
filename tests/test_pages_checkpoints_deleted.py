"""A long document's checkpoint deleted while a run rebuilds it (outsider o37, finding A).

An operator cleaning ``out/.checkpoints`` while a run rebuilds a lost checkpoint from its
pages' jobs took the run's working file away, and the run died with a traceback of
MuPDF's ``FileNotFoundError`` (a RuntimeError nothing maps). Real processes, real
deletion: the rerun is stopped (SIGSTOP, by itself) as it fetches a page of the rebuild,
the test deletes, then lets it go on.
"""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import run_cli
from toolkit.checker import check, explain
from toolkit.documents import make_corpus
from toolkit.drills import collect_history
from toolkit.ledger import State, open_ledger
from toolkit.provider import FakeProvider, parse_contract, provider_stats

S = State
PAGES = 8
KILLED_AFTER = 5  # pages checkpointed when the first run is killed
CONTRACT = "idempotent"

# The real CLI, killed by itself (SIGKILL) once page KILLED_AFTER is checkpointed, or
# stopped by itself (SIGSTOP) at its STOP_AT_FETCH-th fetch from the provider.
CHILD = """
import os, signal, sys
from toolkit.provider import fake
from toolkit.runner import witness_progress
recording, fetching = witness_progress.Progress.__call__, fake.FakeProvider.fetch
kill_after, stop_at = int(os.environ["KILL_AFTER"]), int(os.environ["STOP_AT_FETCH"])
def call(self, point, key, **context):
    recording(self, point, key, **context)
    if point == "after_checkpoint" and context["page"] == kill_after:
        os.kill(os.getpid(), signal.SIGKILL)
def fetch(self, job_id, dest_path):
    fetch.calls += 1
    if fetch.calls == stop_at:
        os.kill(os.getpid(), signal.SIGSTOP)
    return fetching(self, job_id, dest_path)
fetch.calls = 0
witness_progress.Progress.__call__ = call
fake.FakeProvider.fetch = fetch
from toolkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _args(tmp_path):
    return ["run", "--inputs", tmp_path / "in", "--ledger", tmp_path / "L.sqlite",
            "--provider-db", tmp_path / "p.db", "--out", tmp_path / "out", "--contract",
            CONTRACT, "--no-progress", "--page-by-page-from", "5"]


def _child(tmp_path, kill_after=0, stop_at_fetch=0):
    env = {**os.environ, "KILL_AFTER": str(kill_after), "STOP_AT_FETCH": str(stop_at_fetch)}
    return subprocess.Popen([sys.executable, "-c", CHILD, *map(str, _args(tmp_path))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _stopped(pid) -> bool:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0] == "T"


def _item(tmp_path):
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        (item,) = ledger.items()
    return item


def _verdict(tmp_path):
    contract = dataclasses.replace(parse_contract(CONTRACT), seed=0)
    db = tmp_path / "p.db"
    inputs = sorted((tmp_path / "in").iterdir())
    with FakeProvider(db, db.with_name(db.stem + "-jobs"), contract) as provider:
        verdict = check(collect_history(tmp_path / "L.sqlite", provider, inputs, contract,
                                        page_by_page_from=5, out=tmp_path / "out"))
    return verdict, [explain(a) for found in verdict.anomalies.values() for a in found]


def _delete_pdfs(folder):
    for path in folder.glob("*.pdf"):
        path.unlink(missing_ok=True)


@pytest.mark.parametrize("cleanup", [_delete_pdfs, shutil.rmtree], ids=["pdfs", "folder"])
def test_checkpoints_deleted_during_a_rebuild_never_a_traceback_and_the_next_run_recovers(
        tmp_path, cleanup):
    """Fault: a real run killed after page 5 of 8, its checkpoint removed; the rerun
    rebuilds it from the pages' jobs and, stopped as it fetches page 3 of the rebuild,
    meets a real deletion (``.checkpoints/*.pdf``, or the folder). Must hold: no
    traceback; the item is not parked and keeps its record (partial, 5 pages); a run
    after that finishes the document with every page executed once (the rebuilt pages
    fetched again, never executed again), and the checker finds nothing. Before: the
    rerun died with ``pymupdf.FileNotFoundError`` (or ``FileNotFoundError``)."""
    make_corpus(tmp_path / "in", docs=0, poison=0, seed=3, long_docs=1, long_pages=PAGES)
    killed = _child(tmp_path, kill_after=KILLED_AFTER)
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL
    before = _item(tmp_path)
    assert before.state is S.PARTIAL and before.pages_done == KILLED_AFTER
    folder = tmp_path / "out" / ".checkpoints"
    _delete_pdfs(folder)

    rerun = _child(tmp_path, stop_at_fetch=3)
    try:
        deadline = time.monotonic() + 60
        while not _stopped(rerun.pid):
            assert rerun.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        cleanup(folder)  # the operator, while the run rebuilds the checkpoint
        rerun.send_signal(signal.SIGCONT)
        _, stderr = rerun.communicate(timeout=120)
    finally:
        if rerun.poll() is None:
            rerun.kill()
            rerun.wait()
    assert "Traceback" not in stderr, stderr
    if rerun.returncode != 0:  # the rebuild was cut short: one line, the item as it was
        assert rerun.returncode == 1 and "Error" not in stderr, stderr
        after = _item(tmp_path)
        assert after.state is S.PARTIAL, after
        assert after.pages_done == KILLED_AFTER and after.artifact_sha256 == before.artifact_sha256

    last = run_cli(*_args(tmp_path), "--json")
    assert last.returncode == 0, last.stderr
    assert json.loads(last.stdout)["by_state"]["done"] == 1
    stats = provider_stats(tmp_path / "p.db")
    assert stats["executions"] == PAGES
    assert all(row["executions"] == 1 for row in stats["per_task"].values())
    verdict, said = _verdict(tmp_path)
    assert verdict.valid is True, said + list(verdict.notes)
