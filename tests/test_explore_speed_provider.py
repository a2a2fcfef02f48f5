"""The provider database's schema check, skipped for a schema seen whole, by content.

A crash point's recovery opens a copy of the batch folder's provider database,
whose schema is, row for row, the one the recording (or an earlier point in the
same process) already checked; ``records.create`` then runs none of its schema
statements. What must hold: the skip is decided by the schema's content and our
schema row, never by the path, so a database changed in any way (an older
schema, a foreign ``meta``, our row gone) is checked in full as before. Real
SQLite files; statements seen through SQLite's own trace callback.
"""

import shutil
import sqlite3

import pytest

from toolkit.errors import ToolkitError
from toolkit.provider import FakeProvider, records


def _statements(path) -> list[str]:
    """The statements ``records.create`` runs on the database at ``path``, in a transaction
    as ``FakeProvider`` runs it."""
    seen = []
    db = sqlite3.connect(path, isolation_level=None)
    db.set_trace_callback(seen.append)
    try:
        db.execute("BEGIN IMMEDIATE")
        records.create(db)
        db.execute("COMMIT")
    finally:
        db.close()
    return [s for s in seen if s not in ("BEGIN IMMEDIATE", "COMMIT")]


def _made(tmp_path, name="p.db"):
    FakeProvider(tmp_path / name, tmp_path / "jobs").close()
    return tmp_path / name


def test_copy_of_a_provider_database_checked_whole_runs_no_schema_statement(tmp_path):
    """A byte copy at another path (a snapshot's) of a database this process made: no
    CREATE, INSERT, PRAGMA or ALTER; the jobs table stays readable, the row there."""
    copy = tmp_path / "copy" / "p.db"
    copy.parent.mkdir()
    shutil.copy(_made(tmp_path), copy)
    ran = _statements(copy)
    assert not [s for s in ran if s.split()[0].upper() in ("CREATE", "INSERT", "PRAGMA",
                                                            "ALTER")], ran
    with FakeProvider(copy, tmp_path / "copy" / "jobs") as provider:
        assert provider.jobs() == [] and provider.stats()["submit_calls"] == 0


def test_older_schema_in_a_copy_is_checked_in_full_and_gains_its_columns(tmp_path):
    """The same tables but the call log of the first schema (no worker, token): another
    schema by content, so the check runs and adds the columns, as on any open."""
    path = _made(tmp_path)
    db = sqlite3.connect(path)
    db.executescript("ALTER TABLE calls DROP COLUMN worker; ALTER TABLE calls DROP COLUMN token;")
    db.close()
    ran = _statements(path)
    assert any(s.upper().startswith("ALTER TABLE CALLS ADD COLUMN WORKER") for s in ran), ran
    db = sqlite3.connect(path)
    assert {"worker", "token"} <= {row[1] for row in db.execute("PRAGMA table_info(calls)")}
    db.close()


@pytest.mark.parametrize("damage", ["DELETE FROM meta WHERE name='schema'",
                                    "UPDATE meta SET value='other/1' WHERE name='schema'"])
def test_database_with_the_same_schema_but_not_our_schema_row_is_refused(tmp_path, damage):
    """Schema rows identical to one seen whole, but the meta row that says ours is gone or
    another's: refused, as before the skip existed."""
    path = _made(tmp_path)
    _statements(path)  # seen whole in this process
    db = sqlite3.connect(path)
    db.execute(damage)
    db.commit()
    db.close()
    with pytest.raises(ToolkitError, match="not a provider database"):
        FakeProvider(path, tmp_path / "jobs")
