"""The judge's cheaper read of the provider gives what the provider object gives.

``judge._ProviderLogs`` reads the fake provider's call log, execution log and
counters through one read-only connection instead of opening the provider (which
creates tables, switches the journal mode and checkpoints on close). A batch is
really SIGKILLed at several steps (its provider database left with its WAL and
shared-memory files as the kill leaves them) and run to the end; at each, the
read-only answer must equal the provider object's, and leave every byte of the
database and its WAL as it found them (no frame added, none checkpointed). No timer.
"""

import pytest

from toolkit.explore import Plan, batch_inputs
from toolkit.explore.child import Paths, fork, killed_by_sigkill, run_batch
from toolkit.explore.judge import _ledger_records, _ProviderLogs
from toolkit.provider import FakeProvider


def _files(paths):
    """The database's bytes and its WAL's (none: empty). Not the -shm file: SQLite's
    shared-memory index, which any reader may rebuild after a crash and marks its reads in;
    a reader may also leave an empty WAL where there was none."""
    wal = paths.provider_db.with_name("provider.db-wal")
    return paths.provider_db.read_bytes(), wal.read_bytes() if wal.exists() else b""


def killed_batch(tmp_path, kill_at):
    """A two-document batch really SIGKILLed at step ``kill_at`` (None: run to its end)."""
    plan = Plan(docs=2, contract="non-idempotent")
    inputs, names = batch_inputs(plan, tmp_path / "in")
    paths = Paths(tmp_path / "batch", tmp_path / "batch" / plan.ledger_file())
    paths.root.mkdir()
    messages, status = fork(run_batch, plan, paths, inputs, names, run=0, kill_at=kill_at)
    assert killed_by_sigkill(status) if kill_at else status == 0
    return plan, paths, inputs


@pytest.mark.parametrize("kill_at", [5, 6, 7, 10, 17, None])
def test_sigkilled_batch_provider_logs_read_only_equal_the_provider_objects(tmp_path, kill_at):
    plan, paths, _ = killed_batch(tmp_path, kill_at)
    before = _files(paths)
    logs = _ProviderLogs(paths, plan.contract_object())
    assert _files(paths) == before  # read-only: no byte of the database or its log changed
    with FakeProvider(paths.provider_db, paths.provider_out, plan.contract_object()) as provider:
        assert logs.calls() == provider.calls()
        assert logs.executions() == provider.executions()
        assert logs.counters == provider.stats()
    assert logs.calls()  # the batch called the provider before any of these kills


def test_missing_provider_database_reads_as_the_provider_objects_empty_answer(tmp_path):
    """No database (no run made one): the provider object's answer, empty logs."""
    paths = Paths(tmp_path, tmp_path / "ledger.sqlite")
    logs = _ProviderLogs(paths, Plan().contract_object())
    assert (logs.calls(), logs.executions()) == ([], [])
    assert logs.counters["submit_calls"] == 0


def test_closed_batch_judge_reads_leave_no_wal_or_shm_beside_the_databases(tmp_path):
    """Fault: none; the batch ran to its end and closed both databases (no -wal, no -shm).
    Property: the judge's reads of the ledger and of the provider leave the folder as they
    found it: with no -wal they read the file as it is (``immutable=1``), where a
    ``mode=ro`` reader made a -wal and a -shm beside each database and left them."""
    plan, paths, _ = killed_batch(tmp_path, None)
    names = sorted(path.name for path in paths.root.iterdir())
    assert "provider.db" in names and not [name for name in names if name.endswith(("-wal",
                                                                                    "-shm"))]
    logs = _ProviderLogs(paths, plan.contract_object())
    events, _ = _ledger_records(paths.ledger)
    assert sorted(path.name for path in paths.root.iterdir()) == names
    assert logs.calls() and events
