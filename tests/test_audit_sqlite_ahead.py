"""The SQLite ledger's audit with a forked child reading the later events
(``forensics/sqlparts.py``) against one process reading them all, and the reference replay."""

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from unittest import mock

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
import pytest

from toolkit import pool
from toolkit.forensics import audit, lines, sqlfold, sqlparts
from toolkit.forensics.report import stream_json
from toolkit.ledger.sqlite import SCHEMA

from test_audit_sqlite_sql import write_ledger
from test_forensics_fast import _same


def _wal_ledger(path, seed):
    """``write_ledger``'s damaged ledger, then in WAL mode as the toolkit keeps it (closed:
    no -wal beside it, so the audit reads it ``immutable=1``, the case a child may help)."""
    write_ledger(path, seed)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    db.close()
    assert not os.path.exists(f"{path}-wal")


def _document(report) -> bytes:
    """What ``audit --json`` prints (``per_item`` included)."""
    out = io.BytesIO()
    text = io.TextIOWrapper(out, encoding="utf-8")
    stream_json(report, text)
    text.flush()
    return out.getvalue()


def _ahead(path, took=None):
    """The audit with a child for any number of events, a few rows per fetch (so that both
    ranges span batches) → (report, the children's pids); asserts one was forked, and with
    ``took`` whether its rows were taken (False: it failed, its range read here)."""
    pids, taken, start, take = [], [], pool.start, sqlparts.Ahead.take

    def recorded(task):
        pid, fd = start(task)
        pids.append(pid)
        return pid, fd

    def kept(self):
        taken.append(take(self))
        return taken[-1]

    with mock.patch.object(sqlparts, "AHEAD_ROWS", 0), mock.patch.object(sqlparts, "BATCH", 3), \
            mock.patch.object(pool, "start", recorded), \
            mock.patch.object(sqlparts.Ahead, "take", kept):
        report = audit(path, now=0.0)
    assert pids
    if took is not None:
        assert [part is not None for part in taken] == [took]
    return report, pids


def _folded(audit_it):
    """(``audit_it()``, what the fold was given (``sqlchains.verdicts``' arguments): each
    row's key id, code, failure and whether a type is refused). A failure by its value
    (its id is a batch's own: a set's order): "BAD" for one the fold does not judge,
    "ABSENT" for none set, but only for the very ``ABSENT`` the fold knows."""
    with mock.patch.object(sqlfold, "verdicts", wraps=sqlfold.verdicts) as verdicts:
        report = audit_it()
    (_, key_ids, codes, fids, off, values), _ = verdicts.call_args
    named = ["ABSENT" if value is sqlparts.ABSENT else value for value in values]
    failures = ["BAD" if fid < 0 else named[fid] for fid in fids.tolist()]
    return report, (key_ids.tolist(), codes.tolist(), failures, off.tolist())


def _one_process(path):
    with mock.patch.object(sqlparts, "AHEAD_ROWS", 1 << 62):
        return audit(path, now=0.0)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**32 - 1))
def test_events_split_between_two_processes_audit_as_one_process_on_damaged_histories(
        tmp_path, seed):
    """Fault: the seeded damaged histories of test_audit_sqlite_sql (a missing add, an
    illegal move, a second add, details json refuses or SQLite misreads, an unknown op, an
    attempt or token no packed integer holds, items rows that disagree or are missing),
    read by two processes, the later events by a forked child. Property: the fold is given
    row for row what one process gives it (key ids in order of first sight across both
    ranges; each failure, the "none set" that comes through the pipe included); the
    ``audit --json`` bytes, the items and the events frames are exactly one process's, and
    the anomalies, plan, items and events the full Python replay's."""
    path = tmp_path / f"{seed}.sqlite"
    path.unlink(missing_ok=True)  # (hypothesis replays a failing seed)
    _wal_ledger(path, seed)
    with closing(sqlite3.connect(path)) as db:  # a seed may leave no event: nothing to split
        assume(db.execute("SELECT count(*) FROM events").fetchone()[0] > 0)
    (split, _), given = _folded(lambda: _ahead(path))
    one, expected = _folded(lambda: _one_process(path))
    assert given == expected  # row for row
    assert _document(split) == _document(one)
    _same(split, one)
    with mock.patch.object(lines, "FAST", False):
        _same(split, audit(path, now=0.0))


def test_a_child_killed_mid_read_leaves_its_events_to_the_parent_same_audit(tmp_path):
    """Fault: the forked child reading the later events is SIGKILLed (by itself, as it
    starts reading). Property: the parent reads that range itself: the ``audit --json``
    bytes are one process's, and the child is reaped (no zombie left)."""
    path = tmp_path / "ledger.sqlite"
    _wal_ledger(path, 7)
    parent, read = os.getpid(), sqlparts.read

    def killed_in_the_child(*args):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return read(*args)

    with mock.patch.object(sqlparts, "read", killed_in_the_child):
        split, pids = _ahead(path, took=False)
    for pid in pids:  # reaped: no such child of ours any more
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    assert _document(split) == _document(_one_process(path))


def _failures_ledger(path):
    """Four keys, 13 events: "a" fails permanent; "b" and "c" transient, "d" permanent, then
    retried (illegal). With 4 items rows the child reads from seq 5 on: its first failure
    is "transient", the parent's "permanent"."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    for statement in SCHEMA.strip().split(";"):
        if statement.strip():
            db.execute(statement)
    failed = ("move", "unknown", "failed")
    stories = {"a": [failed + ("permanent",)], "b": [failed + ("transient",)],
               "c": [failed + ("transient",)],
               "d": [failed + ("permanent",), ("move", "failed", "unknown", None)]}
    for key, moves in stories.items():
        for op, frm, to, failure in [("add", None, "pending", None),
                                     ("move", "pending", "unknown", None), *moves]:
            detail = json.dumps({"failure": failure} if to == "failed" else {})
            db.execute('INSERT INTO events (ts, op, key, frm, "to", attempt, worker, token, '
                       "detail) VALUES (1.0, ?, ?, ?, ?, 1, NULL, 0, ?)",
                       (op, key, frm, to, detail))
        db.execute("INSERT INTO items (key, state, failure, attempt, token, updated) "
                   "VALUES (?, ?, ?, 1, 0, 1.0)", (key, moves[-1][2], moves[-1][3]))
    db.execute("COMMIT")
    db.close()


def test_failures_first_seen_in_another_order_by_the_child_are_judged_as_one_process(
        tmp_path):
    """Fault: the child's events set the failures in another order than the parent's (its
    first is "transient", the parent's "permanent"), and then retry a permanent failure
    (failed -> unknown, which the policy refuses). Property: the child's failure ids are
    renumbered as one process numbers them (the "no failure set" of its rows too, which
    comes through the pipe as a copy): the retry is found illegal, no other key is
    replayed, and the ``audit --json`` bytes are one process's."""
    path = tmp_path / "ledger.sqlite"
    _failures_ledger(path)
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.close()
    with mock.patch.object(sqlfold, "slow_rows", wraps=sqlfold.slow_rows) as slow_rows:
        split, _ = _ahead(path, took=True)
    (_, _, state, _), _ = slow_rows.call_args
    assert {key for key, last in state.items() if last is sqlfold.SLOW} == {"d"}  # no other
    assert [(a.key, a.kind) for a in split.anomalies if a.kind == "illegal_transition"] == \
        [("d", "illegal_transition")]
    assert _document(split) == _document(_one_process(path))


_DIE_WRITING = """
import os, signal, sqlite3, sys
from toolkit.ledger.sqlite import SCHEMA
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("PRAGMA wal_autocheckpoint=0")  # every page stays in the -wal
db.execute("BEGIN")
for statement in SCHEMA.strip().split(";"):
    if statement.strip():
        db.execute(statement)
db.execute("ATTACH ? AS source", (sys.argv[2],))
for table in ("events", "items"):
    db.execute(f"INSERT INTO main.{table} SELECT * FROM source.{table}")
db.execute("COMMIT")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writer_killed_with_its_history_in_the_wal_audits_in_two_processes_as_one(tmp_path):
    """Fault: the writer is SIGKILLed after committing a whole ledger (a permanent failure
    retried among them) into its -wal (no checkpoint: the main file holds nothing of it).
    Property: the audit reads a private copy with a child reading the later events
    (through the copy's WAL too: its rows taken, not read again here): the ``audit --json``
    bytes are one process's; nothing is left beside the ledger."""
    source, path = tmp_path / "source.sqlite", tmp_path / "ledger.sqlite"
    _failures_ledger(source)
    died = subprocess.run([sys.executable, "-c", _DIE_WRITING, str(path), str(source)])
    assert died.returncode == -signal.SIGKILL
    assert os.path.getsize(f"{path}-wal") > os.path.getsize(path)
    beside = sorted(os.listdir(tmp_path))
    split, _ = _ahead(path, took=True)
    assert len(split.rows) == 4 and ("d", "illegal_transition") in \
        [(a.key, a.kind) for a in split.anomalies]
    assert _document(split) == _document(_one_process(path))
    assert sorted(os.listdir(tmp_path)) == beside
