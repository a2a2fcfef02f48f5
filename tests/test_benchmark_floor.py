"""The benchmark's "same SQL, no Python" floor binds what the SQLite ledger binds.

Section 1's ratio "SQLite ledger / same SQL, no Python" is fair only when the floor writes
the ledger's rows: a floor of smaller rows writes fewer WAL frames a commit and checkpoints
less often, and the ledger's gap to it is then partly pages, not Python (no timing here).
"""

import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _workloads():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module("workloads")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


class _Recorder:
    """An ``sqlite3.Connection`` stand-in that notes every ``execute`` and runs it."""

    def __init__(self, db):
        self.db, self.statements = db, []

    def execute(self, sql, args=()):
        self.statements.append((sql, tuple(args)))
        return self.db.execute(sql, args)

    def __getattr__(self, name):
        return getattr(self.db, name)


def _shape(statements, key):
    """Each statement's SQL and, per bound value, its type and the length of its text with
    each number as one digit (the key as KEY): what decides the bytes a row takes, whatever
    the clock read (a lease's expiry in the detail JSON is a float of 16 or 17 digits)."""
    return [(sql, [("KEY",) if value == key else
                   (str, len(re.sub(r"\d+", "9", value.replace(key, "K"))))
                   if isinstance(value, str) else (type(value),) for value in values])
            for sql, values in statements]


def test_same_sql_floor_binds_the_ledgers_own_values_not_smaller_rows(tmp_path):
    w = _workloads()
    ledger = w.open_ledger(tmp_path / "ledger.sqlite", durable=False)
    try:
        w.lifecycle(ledger, w.keys(1, "warm"))  # the row cache in its steady state
        recorder = ledger._db = _Recorder(ledger._db)
        key = w.keys(1, "measured")[0]
        w.lifecycle(ledger, [key], first=1)
        ledger._db = recorder.db
    finally:
        ledger.close()
    floor = w.SqlFloor(tmp_path, "NORMAL")
    try:
        floor.step(1)  # its first item, as the ledger's warm one
        floor.db = _Recorder(floor.db)
        floor.step(1)
        floor_key = w.keys(1, "floor1")[0]  # the key of the floor's second step
        got = _shape(floor.db.statements, floor_key)
        floor.db = floor.db.db
    finally:
        floor.close()
    assert got == _shape(recorder.statements, key)
    assert sum(sql == "COMMIT" for sql, _ in got) == w.LIFECYCLE
