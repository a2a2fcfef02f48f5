"""The provider's own records: schema, counters, call log, execution log, readers.

Every writer here runs inside the caller's ``BEGIN IMMEDIATE`` transaction,
the one that records the fact being counted, so a counter or a log row can
never disagree with the jobs table. Readers take any connection, including a
read-only one (``provider_stats``, ``provider_records``: post-mortems of a
provider database without a live ``FakeProvider``).

The call and execution rows use the field names of ``checker.Call`` and
``checker.Execution``, so ``Call(**row)`` rebuilds them.
"""

import sqlite3
from contextlib import closing
from pathlib import Path

from ..errors import StorageError, ToolkitError

SCHEMA = "toolkit-provider/1"
SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, job_id TEXT NOT NULL UNIQUE,
    idem_key TEXT NOT NULL, claim TEXT UNIQUE,  -- = idem_key while the job answers for its key
    task_key TEXT NOT NULL, payload_hash TEXT NOT NULL, upload TEXT NOT NULL, options TEXT NOT NULL,
    status TEXT NOT NULL, failure TEXT, reason TEXT, artifact_path TEXT, artifact_size INTEGER,
    artifact_sha256 TEXT, created REAL NOT NULL, updated REAL NOT NULL, lookups INTEGER DEFAULT 0,
    polls INTEGER DEFAULT 0, exec_no INTEGER DEFAULT 0, executor_pid INTEGER, executor_started REAL);
CREATE INDEX IF NOT EXISTS jobs_by_key ON jobs (idem_key, id);
CREATE TABLE IF NOT EXISTS counters (scope TEXT NOT NULL, name TEXT NOT NULL,
    counter TEXT NOT NULL, value INTEGER NOT NULL, PRIMARY KEY (scope, name, counter));
CREATE TABLE IF NOT EXISTS calls (seq INTEGER PRIMARY KEY, ts REAL NOT NULL, op TEXT NOT NULL,
    idem_key TEXT, task_key TEXT, job_id TEXT, outcome TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS executions (seq INTEGER PRIMARY KEY, ts REAL NOT NULL,
    job_id TEXT NOT NULL, idem_key TEXT NOT NULL, task_key TEXT NOT NULL, status TEXT NOT NULL,
    artifact_size INTEGER, artifact_sha256 TEXT)
"""
_CALL_FIELDS = ("seq", "ts", "op", "idem_key", "task_key", "job_id", "outcome", "worker", "token")
# Added after the first schema: the caller of a submit (its worker and fencing token).
_ADDED_CALL_COLUMNS = {"worker": "TEXT", "token": "INTEGER"}
_EXECUTION_FIELDS = ("seq", "ts", "job_id", "idem_key", "task_key", "status", "artifact_size",
                     "artifact_sha256")


_MASTER = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
_WHOLE: set = set()  # schemas (``_MASTER``'s rows) this process saw ``create`` leave whole


def create(db) -> None:
    """Create the tables in an empty database, or check an existing one is ours.

    A database whose schema is, row for row, one this process has already seen
    this function leave whole (a crash exploration opens a copy of the same
    batch folder at every point), and which holds our schema row, is ours as it
    is: every statement below would be a no-op (the same tables, the same
    columns, the row there), so none runs. Known by content, never by path: a
    database changed in any way is checked in full.

    Raises:
        ToolkitError: the database holds something else.
    """
    master = _schema(db)
    if master in _WHOLE and _meta(db, "schema") == SCHEMA:
        return
    tables = {row[1] for row in master if row[0] == "table"}
    if tables and "meta" not in tables:
        raise ToolkitError("not a provider database")
    # Checked before any write: a database of ours has its schema row from its first commit.
    # A toolkit ledger keeps a ``meta`` table too, with its ``format`` row instead (a
    # ``--ledger`` and ``--provider-db`` swapped): refused, never given our tables.
    if tables and _meta(db, "schema") is None:
        raise ToolkitError("not a provider database" + (
            ": it is a resume-toolkit ledger (--ledger and --provider-db swapped?)"
            if _meta(db, "format") is not None else ""))
    for statement in SCHEMA_SQL.split(";"):
        db.execute(statement)
    db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (SCHEMA,))
    if db.execute("SELECT value FROM meta WHERE name='schema'").fetchone()[0] != SCHEMA:
        raise ToolkitError("not a provider database")
    have = {row[1] for row in db.execute("PRAGMA table_info(calls)")}
    for name, kind in _ADDED_CALL_COLUMNS.items():
        if name not in have:  # NULL for every older call: its caller was not recorded
            db.execute(f"ALTER TABLE calls ADD COLUMN {name} {kind}")
    # Whole now, inside the caller's transaction: if it rolls back, the file keeps its old
    # schema, whose rows are not these (the set only ever says "seen whole").
    _WHOLE.add(_schema(db))


def _schema(db) -> tuple:
    """The database's schema rows as plain tuples (whatever the connection's row factory)."""
    return tuple(tuple(row) for row in db.execute(_MASTER))


def _meta(db, name: str):
    try:
        row = db.execute("SELECT value FROM meta WHERE name=?", (name,)).fetchone()
    except sqlite3.OperationalError:  # a foreign ``meta`` of other columns
        return None
    return None if row is None else row[0]


def bump(db, key: str, task: str, *counters: str) -> int:
    """Add 1 to each counter for the key, its task and the total; return the key's first."""
    for counter in counters:
        for scope, name in (("all", ""), ("key", key), ("task", task)):
            db.execute("INSERT INTO counters VALUES (?, ?, ?, 1) ON CONFLICT (scope, name, counter) "
                       "DO UPDATE SET value = value + 1", (scope, name, counter))
    return db.execute("SELECT value FROM counters WHERE scope='key' AND name=? AND counter=?",
                      (key, counters[0])).fetchone()[0]


def log_call(db, ts, op, idem_key, task_key, job_id, outcome, worker=None, token=None) -> None:
    """Append one call (submit, lookup, poll, fetch, cancel) with its outcome and caller."""
    db.execute("INSERT INTO calls (ts, op, idem_key, task_key, job_id, outcome, worker, token)"
               " VALUES (?,?,?,?,?,?,?,?)", (ts, op, idem_key, task_key, job_id, outcome, worker,
                                             token))


def log_execution(db, ts, row, status, size, sha256) -> None:
    """Append one finished execution of job ``row`` (succeeded, failed, or cancelled meanwhile)."""
    db.execute("INSERT INTO executions (ts, job_id, idem_key, task_key, status, artifact_size,"
               " artifact_sha256) VALUES (?,?,?,?,?,?,?)",
               (ts, row["job_id"], row["idem_key"], row["task_key"], status, size, sha256))


def stats(db) -> dict:
    """``{"submit_calls", "executions", "succeeded", "failed", "per_task": {task: {...}}}``."""
    totals = dict.fromkeys(("submit_calls", "executions", "succeeded", "failed"), 0)
    per_task: dict = {}
    for scope, name, counter, value in db.execute(
            "SELECT scope, name, counter, value FROM counters WHERE scope IN ('all', 'task') "
            "ORDER BY scope, name, counter"):
        if scope == "all":
            totals[counter] = value
        elif counter != "failed":
            per_task.setdefault(name, dict.fromkeys(("submit_calls", "executions", "succeeded"), 0))
            per_task[name][counter] = value
    return {**totals, "per_task": per_task}


def key_stats(db) -> dict:
    """Counters per idempotency key: ``{key: {counter: n}}`` (only counters that moved)."""
    out: dict = {}
    for name, counter, value in db.execute(
            "SELECT name, counter, value FROM counters WHERE scope='key' ORDER BY name, counter"):
        out.setdefault(name, {})[counter] = value
    return out


def calls(db) -> list[dict]:
    """The call log in order (``checker.Call`` fields)."""
    return [dict(zip(_CALL_FIELDS, row))
            for row in db.execute(f"SELECT {', '.join(_CALL_FIELDS)} FROM calls ORDER BY seq")]


def executions(db) -> list[dict]:
    """The execution log in order (``checker.Execution`` fields)."""
    return [dict(zip(_EXECUTION_FIELDS, row)) for row in db.execute(
        f"SELECT {', '.join(_EXECUTION_FIELDS)} FROM executions ORDER BY seq")]


# SQLite's words for a storage that fails, not a file that is not a provider database (a
# missing file, SQLITE_CANTOPEN under mode=ro, is bad input: a wrong --provider-db)
_STORAGE = ("SQLITE_IOERR", "SQLITE_FULL", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_NOMEM",
            "SQLITE_READONLY")


def _read_only(db_path, reader):
    try:
        with closing(sqlite3.connect(Path(db_path).resolve().as_uri() + "?mode=ro", uri=True)) as db:
            row = db.execute("SELECT value FROM meta WHERE name='schema'").fetchone()
            if row is None or row[0] != SCHEMA:
                raise ToolkitError(f"{db_path} is not a provider database")
            return reader(db)
    except sqlite3.Error as exc:  # the storage's (a full TMPDIR under a copy); else bad input
        if str(getattr(exc, "sqlite_errorname", "")).startswith(_STORAGE):
            raise StorageError(f"{db_path}: cannot be read ({exc})") from exc
        raise ToolkitError(f"{db_path} is not a provider database ({exc})") from exc


def provider_stats(db_path) -> dict:
    """``stats`` of a provider database opened read-only (nothing is created or changed).

    Raises:
        ToolkitError: missing file, or not a provider database.
    """
    return _read_only(db_path, stats)


def provider_records(db_path) -> dict:
    """``{"calls": [...], "executions": [...]}`` of a provider database, read-only.

    Raises:
        ToolkitError: missing file, or not a provider database.
    """
    return _read_only(db_path, lambda db: {"calls": calls(db), "executions": executions(db)})
