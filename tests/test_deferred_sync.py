"""Deferred sync (Ledger "DEFERRED SYNC"): one ledger fsync per document, before its submit.

A sequential batch used to pay an fsync for every transition (add, claim,
intent, submitted, done, release: six per document). Only the intent must be
durable before its side effect; the others commit without their own fsync and
ride on the next one (SQLite's WAL is one ordered log). These tests count the
real fsync/fdatasync syscalls of a real batch process with strace, and check
their order against the provider's: every submit (the provider's upload) is
preceded by a ledger fsync made after the previous submit.
"""

import re
import shutil
import sqlite3
import subprocess
import sys

import pytest

from toolkit.ledger import State, open_ledger

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")

BATCH = """
import sys
from pathlib import Path
from toolkit.documents import make_corpus
from toolkit.ledger import open_ledger
from toolkit.provider import FakeProvider
from toolkit.runner import Runner
root, n = Path(sys.argv[1]), int(sys.argv[2])
inputs = make_corpus(root / "corpus", docs=n, poison=0, seed=0)
provider = FakeProvider(root / "provider.sqlite", root / "provider")
runner = Runner(open_ledger(root / "ledger.sqlite"), provider, root / "out",
                sleep=lambda seconds: None)
assert runner.run(inputs)["done"] == n
runner.close()
provider.close()
"""
SYNC = re.compile(r"^\d+\s+f(?:data)?sync\(\d+<([^>]*)>\) = 0")


def _traced_batch(root, documents: int) -> list[str]:
    """Run a batch of ``documents`` in a fresh process under strace; the synced paths, in order."""
    root.mkdir()
    trace = root / "syncs.txt"
    subprocess.run(["strace", "-f", "-qq", "-y", "-e", "trace=fsync,fdatasync", "-o", str(trace),
                    sys.executable, "-c", BATCH, str(root), str(documents)], check=True,
                   timeout=300)
    return [m.group(1) for m in map(SYNC.match, trace.read_text().splitlines()) if m]


def _ledger_syncs(paths) -> int:
    """The ledger's fsyncs: its file, its -wal, its -journal, its input index (not its roots
    file, whose temp is named after the ledger too: ``ledger.sqlite.roots.json.<owner>``)."""
    return sum("/ledger.sqlite" in path and ".roots.json" not in path for path in paths)


@pytest.mark.slow
def test_sequential_batch_fsyncs_the_ledger_once_per_document_before_each_submit(tmp_path):
    """Fault guarded against: a power cut after a submit whose intent was not yet on disk
    (the rerun would submit again). Counted on real syscalls of a real batch: the ledger
    is fsynced once per document more (the intent), not six times, plus a fixed cost per
    run (creating the ledger, the closing barrier); and every upload to the provider (a
    submit) comes after a ledger fsync that came after the previous upload."""
    small = _traced_batch(tmp_path / "two", 2)
    large = _traced_batch(tmp_path / "five", 5)
    assert _ledger_syncs(large) - _ledger_syncs(small) == 3  # one per added document
    assert _ledger_syncs(small) <= 2 + 8, small  # a fixed cost per run, whatever its size
    uploads = 0
    synced_since_upload = False
    for path in large:
        if "/ledger.sqlite-wal" in path:
            synced_since_upload = True
        elif "/provider/uploads/" in path:  # the fake provider stores a submitted document
            assert synced_since_upload, f"submit #{uploads + 1} with no ledger fsync before it"
            synced_since_upload = False
            uploads += 1
    assert uploads == 5
    # What the run deferred is durable once it returned: every item done, in the file.
    with sqlite3.connect(tmp_path / "five" / "ledger.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM items WHERE state='done'").fetchone()[0] == 5


def test_deferred_transition_is_visible_at_once_and_durable_after_the_barrier(tmp_path):
    """Fault guarded against: a deferred commit that readers cannot see, or one the barrier
    forgets. A ``sync=False`` claim is visible to another connection at once (it guards the
    lease), runs no fsync of its own, and ``barrier()`` runs exactly one; a barrier with
    nothing deferred runs none."""
    ledger = open_ledger(tmp_path / "l.sqlite")
    ledger.add("k", sync=False)
    ledger.claim("k", "w", 60.0, sync=False)
    flushes = ledger._group.flushes
    assert flushes == 0
    other = open_ledger(tmp_path / "l.sqlite")
    assert other.get("k").lease_owner == "w"
    other.close()
    ledger.barrier()
    assert ledger._group.flushes == 1
    ledger.barrier()
    assert ledger._group.flushes == 1  # nothing deferred since: no fsync
    ledger.move("k", State.PENDING, State.UNKNOWN, token=1, worker="w", note="intent")
    assert ledger._group.flushes == 2  # a synced transition waits for its own fsync
    ledger.close()


@pytest.mark.slow
def test_power_cut_at_every_step_of_the_default_ledger_loses_no_synced_ack_nor_executes_twice():
    """Fault: a real SIGKILL at every durable step, then a power cut: SQLite's WAL is cut
    back to its last fdatasync and its shared-memory index dropped. What must hold: no
    synced (acknowledged) transition is lost, deferred ones are lost only as a suffix, and
    the reruns bring the batch to rest with the checker finding nothing -- in particular
    the points that lost a deferred ``submitted``/``done`` recover by lookup and re-fetch,
    with one execution."""
    from toolkit.explore import Plan, explore

    result = explore(Plan(docs=1, ledger="sqlite", power_loss=True))
    assert result.total()["lost_acknowledged"] == 0
    assert {row["verdict"] for row in result.rows} <= {"valid", "parked"}
    took_deferred = [row for row in result.rows if row["lost_deferred"]]
    assert took_deferred, "no crash point lost a deferred transition: nothing was tested"
    assert all(row["verdict"] == "valid" and row["executions"] == 1 for row in took_deferred)
    assert any(row["step"] == "commit move doc-000 submitted->done" for row in took_deferred)


@pytest.mark.slow
def test_power_cut_after_a_deferred_intent_is_caught_as_double_execution(monkeypatch):
    """The same power cut, with the rule broken on purpose: the runner defers its intent
    (``sync=False`` on the move to ``unknown``). Then a cut after the submit loses the
    intent, the rerun submits again, and the checker must say so (the power-loss mode of
    the default ledger has teeth). Every third step, to keep it short."""
    from toolkit import runner
    from toolkit.explore import Plan, explore
    from toolkit.ledger import State

    move = runner.Runner._move

    def deferred_intent(self, item, to, token, **fields):
        if to is State.UNKNOWN:
            fields["sync"] = False
        return move(self, item, to, token, **fields)
    monkeypatch.setattr(runner.Runner, "_move", deferred_intent)  # inherited by the forks
    result = explore(Plan(docs=1, ledger="sqlite", power_loss=True, every=3))
    broken = [row for row in result.rows if row["verdict"] == "violation"]
    assert broken and all("double_execution" in row["anomalies"] or
                          "blind_resubmit" in row["anomalies"] for row in broken)
