"""The judge's read-only read of an SQLite ledger gives what opening the ledger gives.

``judge._ledger_records`` reads a crash point's ledger (its events in order, its
items by key) through one read-only connection, decoded by the ledger's own
readers, instead of ``open_ledger`` (schema check, journal mode, checkpoint on
close). A batch is really SIGKILLed at several steps (the ledger left with its
WAL and shared-memory files as the kill leaves them) and run to the end; at each,
the read-only answer must equal the opened ledger's, and leave every byte of the
ledger and its WAL as it found them. No timer.
"""

import pytest

from toolkit.drills import collect_history
from test_explore_speed_judge import killed_batch
from toolkit.explore.judge import _ledger_records, _ProviderLogs
from toolkit.ledger import open_ledger


def _files(ledger):
    wal = ledger.with_name(ledger.name + "-wal")
    return ledger.read_bytes(), wal.read_bytes() if wal.exists() else b""


@pytest.mark.parametrize("kill_at", [1, 4, 9, 15, None])
def test_sigkilled_batch_ledger_read_only_equals_the_opened_ledger(tmp_path, kill_at):
    plan, paths, inputs = killed_batch(tmp_path, kill_at)
    before = _files(paths.ledger)
    events, items = _ledger_records(paths.ledger)
    assert _files(paths.ledger) == before  # read-only: no frame added, none checkpointed
    with open_ledger(paths.ledger) as ledger:
        assert events == tuple(ledger.events())
        assert list(items.items()) == [(item.key, item) for item in ledger.items()]
    assert events and items
    contract = plan.contract_object()
    provider = _ProviderLogs(paths, contract)
    assert collect_history(paths.ledger, provider, inputs, contract,
                           records=(events, items)) == \
        collect_history(paths.ledger, provider, inputs, contract)


def test_no_sqlite_ledger_file_reads_as_none_so_the_judge_opens_it(tmp_path):
    """No file (or a JSONL ledger, a naive state file): None, and ``collect_history``
    reads the ledger itself as before."""
    assert _ledger_records(tmp_path / "ledger.sqlite") is None
    (tmp_path / "ledger.jsonl").write_text("")
    assert _ledger_records(tmp_path / "ledger.jsonl") is None
