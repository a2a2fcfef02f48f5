"""Outsider o40 MEDIUM 1: a page-by-page document under a lagging lookup (``lag=N``: a job
is invisible to its first N lookups), its output or checkpoint damaged.

The rebuild from the pages' jobs looked each page up once and took "not visible yet" for
"no such job": the document was parked "page 1 has no finished job to fetch", and parked
again after every release (under ``non-idempotent`` as "intent recorded, provider has no
job", with ``--resend`` offered for a document the provider holds whole). Every test runs
the real CLI on real files; the oracle is the fake provider's execution log.
"""

import dataclasses
import sys

import pytest

from conftest import run_cli, sigkill_at_executions
from toolkit.checker import check, explain
from toolkit.documents import make_corpus
from toolkit.drills import collect_history
from toolkit.ledger import State, open_ledger
from toolkit.provider import FakeProvider, parse_contract, provider_stats

pytestmark = pytest.mark.slow

S = State
PAGES = 8
LAGGING = ["idempotent,lag=2", "non-idempotent,lag=1"]  # the report's two variants


def _run_args(tmp_path, contract):
    return ["run", "--inputs", tmp_path / "in", "--ledger", tmp_path / "L.sqlite",
            "--provider-db", tmp_path / "p.sqlite", "--out", tmp_path / "out",
            "--no-progress", "--page-by-page-from", "5", "--contract", contract]


def _item(tmp_path):
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        (item,) = ledger.items()
        return item


def _damage(path):
    """One byte overwritten in place (``dd conv=notrunc``): same size, other bytes."""
    with open(path, "r+b") as handle:
        handle.seek(80)
        handle.write(b"#")


def _assert_done_once_never_resent(tmp_path, contract, pages, recorded):
    item = _item(tmp_path)
    assert item.state is S.DONE, (item.state, item.reason)
    assert item.artifact_sha256 == recorded
    assert (tmp_path / "out" / item.artifact_path).read_bytes()[80:81] != b"#"
    stats = provider_stats(tmp_path / "p.sqlite")
    assert stats["executions"] == stats["submit_calls"] == pages  # fetched, never sent again
    assert all(row["executions"] == 1 for row in stats["per_task"].values())
    spec = dataclasses.replace(parse_contract(contract), seed=0)
    db = tmp_path / "p.sqlite"
    with FakeProvider(db, db.with_name(db.stem + "-jobs"), spec) as provider:
        verdict = check(collect_history(tmp_path / "L.sqlite", provider,
                                        sorted((tmp_path / "in").iterdir()), spec,
                                        page_by_page_from=5, out=tmp_path / "out"))
    assert verdict.valid is True, [explain(a) for found in verdict.anomalies.values()
                                   for a in found]


@pytest.mark.parametrize("contract", LAGGING)
def test_damaged_page_by_page_output_under_lagging_lookup_is_fetched_again_not_parked(
        tmp_path, contract):
    """Fault: a finished 8-page document's output overwritten by one byte; the provider's
    lookups lag. Property: the rerun looks each page's job up until the lag is used up,
    fetches the pages again and joins them to the recorded SHA-256: done, exit 0, each page
    executed once, nothing sent again. Before: needs_review, "page 1 has no finished job"."""
    make_corpus(tmp_path / "in", docs=0, poison=0, long_docs=1, long_pages=PAGES)
    args = _run_args(tmp_path, contract)
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    item = _item(tmp_path)
    _damage(tmp_path / "out" / item.artifact_path)
    rerun = run_cli(*args)
    assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stderr
    _assert_done_once_never_resent(tmp_path, contract, PAGES, item.artifact_sha256)


@pytest.mark.parametrize("contract", LAGGING)
def test_page_by_page_done_parked_then_released_is_assembled_again_never_offered_a_resend(
        tmp_path, contract):
    """Fault: a finished page-by-page document parked as the toolkit before this fix
    parked it (done -> needs_review, "assembled artifact damaged: page 1 has no finished
    job to fetch"), its output damaged, then ``resolve --release``. Property: the run
    assembles it again from its pages' jobs (no page past the last is looked up or sent):
    done, nothing sent again, ``review`` offers no ``--resend``. Before: parked again every
    time, "checkpoint ... could not be fetched again" (idempotent) or "intent recorded,
    provider has no job" with ``--resend`` offered (non-idempotent)."""
    make_corpus(tmp_path / "in", docs=0, poison=0, long_docs=1, long_pages=PAGES)
    args = _run_args(tmp_path, contract)
    assert run_cli(*args).returncode == 0
    item = _item(tmp_path)
    _damage(tmp_path / "out" / item.artifact_path)
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        ledger.move(item.key, S.DONE, S.NEEDS_REVIEW, token=item.token,
                    reason="assembled artifact damaged: page 1 has no finished job to fetch")
    released = run_cli("resolve", "--ledger", tmp_path / "L.sqlite", "--all", "--reason",
                       "assembled", "--release", "--note", "pages are at the provider")
    assert released.returncode == 0, released.stderr
    rerun = run_cli(*args)
    assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stderr
    _assert_done_once_never_resent(tmp_path, contract, PAGES, item.artifact_sha256)
    review = run_cli("review", "--ledger", tmp_path / "L.sqlite")
    assert "--resend" not in review.stdout + review.stderr


def test_damaged_checkpoint_after_sigkill_under_lagging_lookup_is_rebuilt_not_parked(tmp_path):
    """Fault: a real SIGKILL of a run mid long document (pages checkpointed), then its
    checkpoint overwritten by one byte; the provider's lookups lag by 2. Property: the
    rerun rebuilds the checkpoint from the finished pages' jobs (each looked up until the
    lag is used up), goes on and finishes: done, every page executed once. Before:
    needs_review, "checkpoint ... could not be fetched again: page 1 has no finished job"."""
    pages = 30  # the kill lands after page 4's execution with pages to spare (as o36 4's)
    contract = "idempotent,lag=2"
    make_corpus(tmp_path / "in", docs=0, poison=0, seed=3, long_docs=1, long_pages=pages)
    args = _run_args(tmp_path, contract)
    killed = sigkill_at_executions([sys.executable, "-m", "toolkit", *map(str, args)],
                                   tmp_path / "p.sqlite", [4])
    item = _item(tmp_path)
    assert killed == 1 and item.state is not S.DONE and item.pages_done >= 3, item
    _damage(tmp_path / "out" / item.artifact_path)
    rerun = run_cli(*args)
    assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stderr
    item = _item(tmp_path)
    assert item.state is S.DONE, (item.state, item.reason)
    stats = provider_stats(tmp_path / "p.sqlite")
    assert stats["executions"] == pages
    assert all(row["executions"] == 1 for row in stats["per_task"].values())
