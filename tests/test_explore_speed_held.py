"""Snapshot mode holds read-only connections to a point's databases until it is judged.

``judge.Held`` opens a read-only connection (with one read) to the point's
SQLite ledger and provider database as its copy is put in place. The recovery
run's own connections are then not the last ones when they close, so SQLite does
not checkpoint their WAL into the database and delete it (~0.4 ms per point for
the ledger), and the judge reads through the held connections instead of opening
two more. What must hold: the recovery really leaves its WAL (the shortcut is
taken), and the judge's row is the row it gives reading the databases afresh once
the held connections are gone, after a real SIGKILL at several steps; a database
not in WAL mode, a JSONL ledger or a missing file is never held. Real forks, a
real SIGKILL, real SQLite files; no timer.
"""

import sqlite3

import pytest

from toolkit.explore import Plan, batch_inputs
from toolkit.explore.child import Paths, fork, killed_by_sigkill, run_batch, run_here
from toolkit.explore.judge import Held, _judge, _rested


@pytest.mark.parametrize("kill_at", [3, 8, 14, 21])
def test_recovery_beside_held_readers_keeps_its_wal_and_the_judge_reads_the_same_row(
        tmp_path, kill_at):
    plan = Plan(docs=2, contract="non-idempotent")
    inputs, names = batch_inputs(plan, tmp_path / "in")
    paths = Paths(tmp_path / "batch", tmp_path / "batch" / plan.ledger_file())
    paths.root.mkdir()
    messages, status = fork(run_batch, plan, paths, inputs, names, run=0, kill_at=kill_at)
    assert killed_by_sigkill(status)
    held = Held(paths)
    assert held.ledger is not None and held.provider is not None
    messages, status = run_here(run_batch, plan, paths, inputs, names, run=1)
    assert status == 0 and _rested(messages)
    for db in (paths.ledger, paths.provider_db):  # closed beside a reader: not checkpointed
        assert db.with_name(db.name + "-wal").stat().st_size > 0
    with_held = _judge(plan, paths, inputs, True, [], True, held)
    held.close()
    afresh = _judge(plan, paths, inputs, True, [], True)
    assert with_held == afresh
    assert with_held["verdict"] in ("valid", "parked") and with_held["submits"] >= 1


def test_database_not_in_wal_mode_a_jsonl_ledger_or_no_file_is_never_held(tmp_path):
    rollback = tmp_path / "ledger.sqlite"
    db = sqlite3.connect(rollback)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    (tmp_path / "provider.db").write_bytes(b"")  # empty: not a database yet
    held = Held(Paths(tmp_path, rollback))
    assert (held.ledger, held.provider) == (None, None)
    (tmp_path / "ledger.jsonl").write_text("{}\n")
    assert Held(Paths(tmp_path / "none", tmp_path / "ledger.jsonl")).ledger is None
