"""The SQLite ledger's smaller transaction: its schema, its row cache, and old ledgers.

New ledgers keep items WITHOUT ROWID and number events without AUTOINCREMENT, so a
transition's commit writes two WAL pages, not three or four; a transition reads no
item row when ``PRAGMA data_version`` says nobody else committed since this
connection wrote it. Ledgers written by the schema of earlier versions (copied
below, as main wrote it) must open, work and audit as before.
"""

import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from toolkit.errors import StaleTokenError, StateConflictError
from toolkit.forensics import audit
from toolkit.ledger import State, open_ledger

S = State

# The schema every ledger was created with before items went WITHOUT ROWID and events
# lost AUTOINCREMENT (main at a3952d6, toolkit/ledger/sqlite.py): kept here verbatim.
OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    key TEXT PRIMARY KEY, state TEXT NOT NULL, source TEXT, attempt INTEGER NOT NULL,
    token INTEGER NOT NULL, job_id TEXT, failure TEXT, reason TEXT, artifact_path TEXT,
    artifact_size INTEGER, artifact_sha256 TEXT, pages_done INTEGER, lease_owner TEXT,
    lease_host TEXT, lease_pid INTEGER, lease_started REAL, lease_expires REAL,
    artifact_mtime_ns INTEGER, artifact_ctime_ns INTEGER, artifact_ino INTEGER,
    updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, op TEXT NOT NULL,
    key TEXT NOT NULL, frm TEXT, "to" TEXT NOT NULL, attempt INTEGER NOT NULL,
    worker TEXT, token INTEGER NOT NULL, detail TEXT NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('format', 'resume-toolkit-ledger/1');
"""
SHA = "ab" * 32


def _old_ledger(path):
    db = sqlite3.connect(path, isolation_level=None)
    for statement in OLD_SCHEMA.strip().split(";"):
        if statement.strip():
            db.execute(statement)
    db.close()


def _life(ledger, key, worker="w"):
    ledger.add(key, source=f"{key}.pdf")
    token = ledger.claim(key, worker, 60.0)
    ledger.move(key, S.PENDING, S.UNKNOWN, token=token, worker=worker)
    ledger.move(key, S.UNKNOWN, S.SUBMITTED, token=token, worker=worker, job_id=f"job-{key}")
    ledger.move(key, S.SUBMITTED, S.DONE, token=token, worker=worker, artifact_path=f"{key}.pdf",
                artifact_size=3, artifact_sha256=SHA)
    ledger.release(key, token, worker)


def _tables(path):
    db = sqlite3.connect(path)
    try:
        return {name: sql for name, sql in db.execute("SELECT name, sql FROM sqlite_master")}
    finally:
        db.close()


def test_ledger_written_by_the_old_schema_opens_records_and_audits_unchanged(tmp_path):
    """Fault: none -- a format-1 ledger from before (AUTOINCREMENT events, rowid items)
    meets the new code. Must hold: its tables are left as they were, transitions append
    events numbered after the old ones, and the audit reads it clean."""
    path = tmp_path / "old.sqlite"
    _old_ledger(path)
    with open_ledger(path, durable=False) as ledger:
        _life(ledger, "a")
    before = _tables(path)
    assert "sqlite_sequence" in before and "AUTOINCREMENT" in before["events"]
    assert "WITHOUT ROWID" not in before["items"]
    with open_ledger(path, durable=True) as ledger:
        _life(ledger, "b")
        assert [e.seq for e in ledger.events()] == list(range(1, 13))
        assert ledger.get("b").state is S.DONE and ledger.get("a").job_id == "job-a"
    assert _tables(path) == before
    (tmp_path / "a.pdf").write_bytes(b"abc")
    (tmp_path / "b.pdf").write_bytes(b"abc")
    report = audit(path, artifacts=tmp_path)  # without a folder, a done is only "verify"
    assert report.by_state.get("done") == 2
    assert [a for a in report.anomalies if a.kind != "artifact_mismatch"] == []


def _wal_frames_per_commit(path, transitions):
    """WAL frames appended by each of ``transitions`` (callables), one commit each."""
    page = sqlite3.connect(path).execute("PRAGMA page_size").fetchone()[0]
    frames = []
    for transition in transitions:
        before = os.path.getsize(f"{path}-wal")
        transition()
        frames.append((os.path.getsize(f"{path}-wal") - before) // (page + 24))
    return frames


@pytest.mark.parametrize("old", [False, True], ids=["new", "old"])
def test_each_transition_commits_two_wal_pages_on_a_new_ledger_and_more_on_an_old_one(
        tmp_path, old):
    """Fault: none -- what a durable commit has to write and fsync. Must hold: on a new
    ledger the add writes the items page and the events page, every later transition the
    same two; on an old one the add writes the autoindex too and every event the
    sqlite_sequence page (the pages this change removes)."""
    path = tmp_path / "l.sqlite"
    if old:
        _old_ledger(path)
    with open_ledger(path, durable=False) as ledger:
        ledger.add("warm")  # the WAL exists, its first commit behind us
        token = []
        frames = _wal_frames_per_commit(path, [
            lambda: ledger.add("k"),
            lambda: token.append(ledger.claim("k", "w", 60.0)),
            lambda: ledger.move("k", S.PENDING, S.UNKNOWN, token=token[0]),
            lambda: ledger.release("k", token[0])])
    assert frames == ([4, 3, 3, 3] if old else [2, 2, 2, 2])


def test_another_connections_commit_between_two_transitions_is_read_not_the_cached_row(tmp_path):
    """Fault: a second writer (another connection) changes the item between two transitions
    of the first -- a claim that advances the token, a release that keeps state and token
    but drops the lease, a column changed by plain SQL. Must hold: the first ledger's next
    transition judges the row as it now is, never the row it last wrote (a guard on state
    and token alone would let the renew below bring a released lease back)."""
    path, now = tmp_path / "l.sqlite", [1000.0]
    with open_ledger(path, durable=False, clock=lambda: now[0]) as first, \
            open_ledger(path, durable=False, clock=lambda: now[0]) as second:
        first.add("k")
        token = first.claim("k", "w1", 60.0)
        now[0] = 2000.0  # w1's lease has expired: w2 takes it
        assert second.claim("k", "w2", 60.0) == token + 1
        with pytest.raises(StaleTokenError):
            first.move("k", S.PENDING, S.UNKNOWN, token=token, worker="w1")
        now[0] = 3000.0
        token = first.claim("k", "w1", 60.0)
        second.release("k", token, "w2")  # same state, same token: only the lease changes
        with pytest.raises(StaleTokenError):  # the lease is no longer w1's to renew
            first.renew("k", token, "w1", 1e6)
        assert second.get("k").lease_owner is None
        token = first.claim("k", "w1", 60.0)
        first.move("k", S.PENDING, S.UNKNOWN, token=token)
        plain = sqlite3.connect(path, isolation_level=None)
        plain.execute("UPDATE items SET job_id='from-elsewhere' WHERE key='k'")
        plain.close()
        after = first.move("k", S.UNKNOWN, S.SUBMITTED, token=token)
        assert after.job_id == "from-elsewhere"


def test_values_sqlite_would_convert_are_read_back_not_kept(tmp_path):
    """Fault: none -- values whose stored form differs from the Python value given (an int
    in a REAL column, a clock that returns ints). Must hold: the item a later transition
    sees and returns is exactly what a fresh read of the file gives."""
    path = tmp_path / "l.sqlite"
    ticks = iter(range(1000, 2000))
    with open_ledger(path, durable=False, clock=lambda: next(ticks)) as ledger:
        ledger.add("k")
        token = ledger.claim("k", "w", 60)  # lease_expires and updated: ints, stored as REAL
        item = ledger.move("k", S.PENDING, S.UNKNOWN, token=token, worker="w")
        stored = ledger.get("k")
        assert item == stored
        assert type(item.lease_expires) is float and type(item.updated) is int  # as folded
        after = ledger.move("k", S.UNKNOWN, S.SUBMITTED, token=token, job_id="j")
        assert type(after.lease_expires) is float and after.lease_expires == stored.lease_expires
        assert type(after.lease_started) is type(stored.lease_started)


CHILD = textwrap.dedent("""
    import os, resource, signal, sys
    from toolkit.errors import StorageError
    from toolkit.ledger import State, open_ledger
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    path = sys.argv[1]
    with open_ledger(path, durable=False) as ledger:
        ledger.add("k")
        token = ledger.claim("k", "w", 60.0)
        size = os.path.getsize(path + "-wal")
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
        try:
            ledger.move("k", State.PENDING, State.UNKNOWN, token=token, worker="w")
        except StorageError as exc:
            print("failed:", exc, file=sys.stderr)
        else:
            raise SystemExit("the commit past the size limit did not fail")
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
        print(ledger.get("k").state.value)
        print(ledger.move("k", State.PENDING, State.UNKNOWN, token=token, worker="w").state.value)
""")


@pytest.mark.slow
def test_commit_failing_on_the_file_size_limit_is_retried_from_the_state_the_file_holds(tmp_path):
    """Fault: a real EFBIG (RLIMIT_FSIZE at the WAL's size) makes the COMMIT of a move fail
    after its UPDATE ran. Must hold: the transaction rolls back, the row it wrote is never
    kept as the item, and the same move, retried once the disk has room, succeeds from the
    state the file really holds (pending), not from the lost one (unknown)."""
    path = tmp_path / "l.sqlite"
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))})
    assert done.returncode == 0, done.stderr
    assert "failed:" in done.stderr
    assert done.stdout.split() == ["pending", "unknown"]
    with open_ledger(path, durable=False) as ledger:
        assert [(e.op, e.to) for e in ledger.events()][-1] == ("move", S.UNKNOWN)
        assert len(ledger.events()) == 3
    with pytest.raises(StateConflictError):  # and the test process's own view agrees
        with open_ledger(path, durable=False) as ledger:
            ledger.move("k", S.PENDING, S.UNKNOWN, token=1)
