"""Two runner faults an outsider found with README alone (outsider findings O8, O6).

* O8: a full disk under ``--out`` (a real tmpfs, too small for the batch's artifacts)
  used to leave the batch going: every document was still executed (billed) at the
  provider and each then failed to write. An artifact's storage error halts the batch
  like a ledger's: one line, exit 1, health not-ready; the item whose artifact could
  not be written stays ``submitted`` and a rerun fetches it, never executes it again.
* O6: ``run --ledger p.db --provider-db l.sqlite`` (the two swapped) used to be
  accepted and executed everything again. Each database is refused where it is the
  other's: one line, exit 2, nothing modified.
"""

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tmpfs_mount
from toolkit.documents import make_corpus
from toolkit.ledger import open_ledger
from toolkit.provider import provider_at

DOCS = 16


def toolkit(cwd, *args):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def run_args(corpus, out, ledger="l.sqlite", provider_db="p.sqlite"):
    return ("run", "--inputs", str(corpus), "--ledger", ledger, "--provider-db", provider_db,
            "--out", str(out), "--no-progress", "--contract", "non-idempotent")


@pytest.fixture
def small_out(tmp_path):
    """A real tmpfs of 24 KiB at ``tmp_path / "out"``: room for a few artifacts, not a batch's.
    Unmounted in cleanup; skipped where mount is refused (not root)."""
    with tmpfs_mount(tmp_path / "out", "size=24k") as folder:
        yield folder


def _states(ledger_path) -> dict[str, int]:
    counts: dict[str, int] = {}
    with open_ledger(ledger_path) as ledger:
        for item in ledger.items():
            counts[item.state.value] = counts.get(item.state.value, 0) + 1
    return counts


def test_full_disk_under_out_halts_the_batch_at_the_first_artifact_and_a_rerun_never_executes_twice(
        tmp_path, small_out):
    """What breaks: ``--out`` is a tmpfs that fills up after a few artifacts (the kernel's
    ENOSPC while the provider's artifact is copied in). What must hold: the run halts at
    the first write it cannot make (an artifact, or the witness's record of an intent
    before its send: exit 1, one line "halted, no new work taken"), so the provider
    executed exactly the documents started before the fault (those done, plus one left
    ``submitted`` if an artifact met it), not the whole batch; once space is freed and health
    cleared, a rerun fetches the submitted job again and executes each document once."""
    corpus = tmp_path / "in"
    make_corpus(corpus, docs=DOCS, poison=0, seed=5)
    first = toolkit(tmp_path, *run_args(corpus, small_out))
    assert first.returncode == 1, first.stderr
    lines = first.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("halted, no new work taken: "), lines
    assert "Traceback" not in first.stderr
    states = _states(tmp_path / "l.sqlite")
    # The one that met the full disk: its artifact (left submitted, executed) or, first, the
    # witness's record of its intent (never sent: a run fails closed there, and records it
    # failed(transient), "not sent", the ledger being elsewhere).
    assert states.get("submitted", 0) + states.get("failed", 0) == 1, states
    with provider_at(tmp_path / "p.sqlite") as provider:
        executed = provider.stats()["executions"]
    assert executed == states.get("done", 0) + states.get("submitted", 0) < DOCS, \
        (executed, states)
    assert not [p for p in small_out.rglob("*.part")]  # no half artifact left behind
    assert toolkit(tmp_path, "health", "--ledger", "l.sqlite").returncode == 1  # not ready

    subprocess.run(["mount", "-o", "remount,size=8m", str(small_out)], check=True)
    assert toolkit(tmp_path, "health", "--ledger", "l.sqlite", "--clear").returncode == 0
    again = toolkit(tmp_path, *run_args(corpus, small_out))
    assert again.returncode == 0, again.stderr
    # a submitted one is fetched, not executed again; one recorded as never sent is sent
    # as a new attempt (no person needed, keys not idempotent or not)
    assert _states(tmp_path / "l.sqlite") == {"done": DOCS}
    with provider_at(tmp_path / "p.sqlite") as provider:
        stats = provider.stats()
    assert stats["executions"] == DOCS
    assert all(task["succeeded"] == 1 and task["submit_calls"] == 1
               for task in stats["per_task"].values())


@pytest.fixture
def batch(tmp_path):
    """A finished batch: ledger ``l.sqlite``, the fake provider's ``p.db``, outputs ``out``."""
    make_corpus(tmp_path / "in", docs=3, poison=0, seed=1)
    done = toolkit(tmp_path, *run_args(tmp_path / "in", tmp_path / "out", "l.sqlite", "p.db"))
    assert done.returncode == 0, done.stderr
    return tmp_path


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("ledger, provider_db", [("p.db", "l.sqlite"), ("p.db", "p2.db"),
                                                 ("l2.sqlite", "l.sqlite")],
                         ids=["swapped", "provider-db-as-ledger", "ledger-as-provider-db"])
def test_swapped_databases_are_refused_exit_2_and_nothing_is_modified(batch, ledger,
                                                                      provider_db):
    """What breaks: the fake provider's database given as ``--ledger``, or a toolkit ledger
    as ``--provider-db`` (the two arguments swapped). What must hold: one line on stderr,
    exit 2, no file of the folder changed or created, no document executed again."""
    before = _digests(batch)
    # --new-batch: a new ledger (l2.sqlite) for the batch's inputs is refused anyway (the
    # registry of batches); the swap must be refused on its own
    wrong = toolkit(batch, *run_args(batch / "in", batch / "out", ledger, provider_db),
                    "--new-batch")
    assert wrong.returncode == 2, wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
    assert "Traceback" not in wrong.stderr
    assert _digests(batch) == before
    with sqlite3.connect(f"file:{batch / 'p.db'}?mode=ro", uri=True) as db:
        assert db.execute("SELECT value FROM counters WHERE scope='all' "
                          "AND counter='executions'").fetchone() == (3,)


def test_provider_db_in_a_missing_folder_is_refused_exit_2_and_nothing_is_created(tmp_path):
    """What breaks: ``--provider-db nodir/p.db`` (a typo in the folder) silently created the
    folder and a new, empty provider: every document executed again there. What must hold:
    one line, exit 2, as for a ledger in a missing folder; no folder, ledger or database
    created."""
    corpus = tmp_path / "in"
    make_corpus(corpus, docs=1, poison=0, seed=0)
    before = sorted(path.name for path in tmp_path.iterdir())
    refused = toolkit(tmp_path, *run_args(corpus, tmp_path / "out", "l.sqlite", "nodir/p.db"))
    assert refused.returncode == 2, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "nodir" in refused.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == before
