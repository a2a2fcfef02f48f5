"""SQLite adapters: the toolkit's own ledger, a ``task_items`` table, a ``jobs`` table.

Every database is opened read-only (``mode=ro``) and read in one transaction. A WAL database whose ``-wal``
file is absent is opened ``immutable=1`` instead: a ``mode=ro`` connection
would create ``-wal`` and ``-shm`` files next to it and leave them behind. If
the file changes while it is read that way, the read is repeated with
``mode=ro``. A database with a ``-wal`` (a live writer, or one that died) is
read from a private copy (``private.py``): ``mode=ro`` would create or rebuild
its ``-shm``. Only real tables are read, never views.
"""

import os
import shutil
import sqlite3
import tempfile
import urllib.parse

from toolkit.errors import ToolkitError
from toolkit.forensics.foreign import (
    INPUT_DIGEST_FIELDS,
    SOURCE_FIELDS,
    first,
    foreign_item,
    foreign_key,
    key_fault,
    parse_json_column,
)
from toolkit.forensics.history import History
from toolkit.forensics import lines, sqlfold
from toolkit.forensics.private import live_wal_connection, private_copy, refuse_stale
from toolkit.forensics.sqlparts import Snapshot
from toolkit.forensics.sqlrows import (
    detail_reader,
    fold_items,
    item_rows,
    items_one_by_one,
    numbered,
)
from toolkit.forensics.model import Raw, register
from toolkit.ledger.salvage import salvaged_note
from toolkit.ledger.sqlite import salvage_mark

TOOLKIT_FORMAT = "resume-toolkit-ledger/1"  # toolkit.ledger.sqlite.FORMAT
ITEM_FIELDS = ("key", "state", "source", "attempt", "job_id", "failure", "reason", "artifact_path",
               "artifact_size", "artifact_sha256", "lease_owner", "lease_expires", "updated")
EVENT_FIELDS = ("seq", "ts", "op", "key", "frm", "to", "attempt", "worker", "token", "detail")


def _fingerprint(path):
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns, os.path.exists(f"{path}-wal")


def connect(path, immutable: bool, private: bool = False) -> sqlite3.Connection:
    """``private``: the file is a private copy (no one else writes it)."""
    mode = "immutable=1" if immutable else "mode=ro"
    uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?{mode}"
    db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=5.0, factory=Snapshot)
    db.execute("PRAGMA query_only=1")
    # no one writes it: another connection reads the same snapshot (sqlparts.Ahead)
    db.again = uri if immutable or private else None
    return db


def tables(db) -> dict[str, set[str]]:
    names = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {name: {row[0] for row in db.execute("SELECT name FROM pragma_table_info(?)", (name,))}
            for name in names}


def read_database(path, adapters):
    """Detect and read the database at ``path`` → (adapter name, Raw).

    A hot rollback journal (a writer died mid-transaction) cannot be rolled
    back through a read-only connection; then a private copy of the database
    and its journal is rolled back and read instead, and the report says so.
    """
    path = os.path.realpath(path)  # a symlink's -wal/-journal are beside its target, not it
    if os.path.exists(f"{path}-wal") and not live_wal_connection(path):
        # a dead writer's WAL: even mode=ro would create or rebuild -shm beside it
        with private_copy(path) as copy:  # (which refuses a stale view itself)
            return _read_database(copy, adapters, private=True)
    refuse_stale(path)  # read in place: a -wal deleted or cut under a live process
    try:
        return _read_database(path, adapters)
    except sqlite3.OperationalError as exc:
        journal = f"{path}-journal"
        if "readonly" not in str(exc) or not os.path.isfile(journal):
            raise
    with tempfile.TemporaryDirectory(prefix="audit-") as tmp:
        copy = os.path.join(tmp, "ledger.db")
        shutil.copyfile(path, copy)
        shutil.copyfile(journal, f"{copy}-journal")
        db = sqlite3.connect(copy)
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchall()  # rolls the copy back
        finally:
            db.close()
        name, raw = _read_database(copy, adapters, private=True)
    raw.finding(None, "hot_journal", f"{os.path.basename(journal)}: a writer died mid-transaction; "
                "audited the last committed state (rolled back on a private copy)")
    return name, raw


def _read_database(path, adapters, private: bool = False):
    """Read with sqlite3's own UTF-8 decoding (the fast path); a text cell that is not
    UTF-8 fails that read as a whole, and then the database is read again decoding every
    text with its odd bytes escaped, each damaged cell a corrupt_record naming its row."""
    try:
        return _read_snapshot(path, adapters, None, private=private)
    except sqlite3.OperationalError as exc:
        if "Could not decode to UTF-8" not in str(exc):
            raise
    bad = set()

    def lenient(data: bytes) -> str:
        try:
            return data.decode()
        except UnicodeDecodeError:
            bad.add(data)
            return data.decode("utf-8", "backslashreplace")

    return _read_snapshot(path, adapters, lenient, bad)


def _undecodable(db, schema, raw, bad):
    """One corrupt_record per text cell holding bytes of ``bad``, named by its row's key
    (its rowid when the table has no key column); ``db`` decodes text leniently already."""
    blobs = sorted(bad)
    marks = ", ".join("?" * len(blobs))
    for table, columns in sorted(schema.items()):
        name = "key" if "key" in columns else "rowid"
        for column in sorted(columns):
            query = (f'SELECT {name} FROM "{table}" WHERE typeof("{column}")=\'text\' '
                     f'AND CAST("{column}" AS BLOB) IN ({marks})')
            for (key,) in db.execute(query, blobs):
                raw.finding(key if name == "key" and type(key) is str else None,
                            "corrupt_record",
                            f"{table} row {name}={key!r}: column {column} is not UTF-8 "
                            "(kept with odd bytes escaped)")


def _read_snapshot(path, adapters, text_factory, bad=(), private: bool = False):
    with open(path, "rb") as handle:
        header = handle.read(100)
    immutable = header[18:20] == b"\x02\x02" and not os.path.exists(f"{path}-wal")
    for _ in range(2):
        before = _fingerprint(path)
        db = connect(path, immutable, private)
        if text_factory is not None:
            db.text_factory = text_factory
        try:
            db.execute("BEGIN")  # one snapshot for every query below
            schema = tables(db)
            adapter = EMPTY if no_schema(db) else next(
                (a for a in adapters if a.sniff(db, schema)), None)
            if adapter is None:
                listed = ", ".join(sorted(schema)) or "none"
                raise ToolkitError(f"SQLite database with unexpected tables ({listed})")
            raw = adapter.read(db, schema)
            if bad:
                _undecodable(db, schema, raw, bad)
        finally:
            db.close()
        if not immutable or _fingerprint(path) == before:
            return adapter.name, raw
        immutable = False  # a writer appeared: read again through the WAL
    raise AssertionError("unreachable")


def no_schema(db) -> bool:
    """Nothing at all in the schema of the database ``db`` reads: what a writer killed as it
    created its ledger leaves (a WAL header, no table). An empty ledger, 0 items, as a 0-byte
    file is, to ``audit``, ``ledger``, ``review`` and ``health``; ``run`` creates its tables
    in it. Only with nothing in it: a view or an index alone is someone else's."""
    return db.execute("SELECT 1 FROM sqlite_master").fetchone() is None


def blank_file(path) -> bool:
    """Whether the SQLite file at ``path`` has ``no_schema``: asked of a private copy
    (nothing written beside the original), and only when the file's own header says its
    schema never changed (schema cookie 0, bytes 40-43): its ``-wal`` may still hold the
    tables. A file that is no SQLite database is not blank (opening it says what it is)."""
    with open(path, "rb") as handle:
        header = handle.read(100)
    if not header.startswith(b"SQLite format 3\0") or header[40:44] != bytes(4):
        return False
    with private_copy(path) as copy:
        db = sqlite3.connect(copy)
        try:
            return no_schema(db)
        except sqlite3.Error:  # not a database after all: opening it says so
            return False
        finally:
            db.close()


class _Empty:
    """The reading of a database with no table: format ``empty``, no items."""
    name = "empty"

    @staticmethod
    def read(db, schema) -> Raw:
        return Raw()


EMPTY = _Empty()


def _require(schema, table, columns, name):
    missing = sorted(set(columns) - schema.get(table, set()))
    if missing:
        raise ToolkitError(f"{name}: table {table} lacks columns {', '.join(missing)}")


def _is_toolkit(db, schema):
    if "name" not in schema.get("meta", ()) or "value" not in schema["meta"]:
        return False
    row = db.execute("SELECT value FROM meta WHERE name='format'").fetchone()
    return row is not None and str(row[0]).startswith("resume-toolkit-ledger/")


@register("toolkit-sqlite", "sqlite", _is_toolkit,
          "resume-toolkit SQLite ledger: meta, items and events tables")
def read_toolkit_sqlite(db, schema) -> Raw:
    (version,) = db.execute("SELECT value FROM meta WHERE name='format'").fetchone()
    if version != TOOLKIT_FORMAT:
        raise ToolkitError(f"toolkit-sqlite: unsupported ledger version {version!r}")
    _require(schema, "items", ITEM_FIELDS, "toolkit-sqlite")
    _require(schema, "events", EVENT_FIELDS, "toolkit-sqlite")
    raw = Raw()
    mark = salvage_mark(db)  # the ledger's own reading of its meta row (salvage_sqlite)
    if mark is not None:
        raw.notes.append(salvaged_note(mark))
    history = History(Raw(), numbered=False)  # the fold, kept apart from the items table
    detail_of = detail_reader() if lines.FAST else parse_json_column
    fast = lines.FAST and sqlfold.usable(db)
    # a child process reads the later events meanwhile, when that pays (sqlparts); reaped
    # by scan, or below if anything here ends before
    later = sqlfold.ahead(db, detail_of.many, lambda again: numbered(item_rows(again, '"key"'))) \
        if fast else None
    try:
        rows = item_rows(db, ", ".join(f'"{name}"' for name in ITEM_FIELDS))
        if fast:
            # one lean pass folds every key, the items rows' keys numbered first (then
            # matched by position); the replay reads again only the keys it doubts
            folds, state, digests = sqlfold.scan(db, detail_of, detail_of.many,
                                                 numbered(rows), later)
    finally:
        if later is not None:
            later.close()
    slow = sqlfold.SLOW
    if fast:
        dropped = _replay(raw, history, sqlfold.slow_rows(db, folds, state, EVENT_FIELDS),
                          detail_of)
        raw.events = sqlfold.without(folds, dropped)
    else:  # the reference: every event through the replay
        quoted = ", ".join(f'"{name}"' for name in EVENT_FIELDS)
        _replay(raw, history, db.execute(f"SELECT {quoted} FROM events ORDER BY seq"),
                detail_of)
        raw.events = history.finish()
        state, digests = dict.fromkeys(history.raw.items, slow), {}
    # state: key -> the state its events fold to, or SLOW: then the replay's item
    # holds it (a key the replay ended without an item has no fold at all)
    replayed = history.raw.items
    raw.anomalies.extend(history.raw.anomalies)
    folded = isinstance(state, sqlfold.Folded)
    matched = fold_items(raw, rows, state, digests, replayed)
    if not matched:
        items_one_by_one(raw, rows, state, state.digest_map() if folded else digests, replayed)
    if matched and folded and state.numbered == len(rows):
        unlisted = state.unlisted()  # raw.items holds every items row: the keys past them
    else:
        unlisted = ((key, state[key]) for key in state.keys() - raw.items.keys())
    for key, last in unlisted:
        if last is not slow or key in replayed:
            raw.finding(key, "history_mismatch", "events for a key with no valid item row")
    return raw


def _replay(raw, history, rows, detail_of) -> set:
    """Fold event ``rows`` (EVENT_FIELDS, in seq order) with ``history``; a row it refuses
    is a corrupt_record in ``raw``. Returns the seqs of the rows not applied."""
    check, finding, dropped = history.check, raw.finding, set()
    for seq, ts, op, key, frm, to, attempt, worker, token, text in rows:
        detail, problem = detail_of(text)
        why = f"detail is {problem}" if problem else \
            check(seq, ts, op, key, frm, to, attempt, worker, token, detail, None)
        if why is not None:
            finding(key if type(key) is str else None, "corrupt_record", f"event seq={seq}: {why}")
            dropped.add(seq)
    return dropped


# A foreign key column read as its bytes, whatever the connection's text decoding (the
# lenient pass escapes odd bytes but not a backslash: two keys could meet); foreign_key
# then escapes them one to one (``_keyed``).
_KEY_BYTES = "CASE WHEN typeof({0}) = 'text' THEN CAST({0} AS BLOB) ELSE {0} END, typeof({0})"


def _keyed(where, rows):
    """The rows for ``_read_foreign``, a text key (read as _KEY_BYTES) escaped by
    ``foreign_key``; a BLOB key stays bytes (no key: a corrupt_record)."""
    for row in rows:
        key, kind = row[1], row[2]
        yield (f"{where}={row[0]}", foreign_key(key) if kind == "text" else key, *row[3:])


def _read_foreign(raw, rows, states, name):
    """rows: (where, key, raw state, payload, result, updated); the last row of a key wins."""
    seen: dict[str, tuple] = {}
    for where, key, status, payload, result, updated in rows:
        if isinstance(key, (int, float)) and not isinstance(key, bool):
            key = str(key)
        if type(key) is not str or not key:
            raw.finding(None, "corrupt_record",
                        f"{name} row {where}: key {key!r} {key_fault(key)}")
            continue
        state = states.get(status)
        if state is None:  # a word outside the format ("running": what a dead worker left?):
            # the item stays, its outcome unknown, for a person (never dropped from the plan)
            raw.finding(key, "unknown_state", f"{name} row {where}: state {status!r} is not one "
                        f"of {sorted(states)}")
            state = "unknown"
        info, problem = parse_json_column(result)
        given, _ = parse_json_column(payload)  # a bad payload only hides the input digest
        if key in seen and seen[key][1:] != (status, result):
            raw.finding(key, "duplicate_key", f"{name} rows {seen[key][0]} ({seen[key][1]}) and "
                        f"{where} ({status}) disagree")
        seen[key] = (where, status, result)
        if problem and state == "done":
            raw.finding(key, "corrupt_record", f"{name} row {where}: result is {problem}")
        raw.items[key] = foreign_item(key, state, status, info,
                                      source=first(given, SOURCE_FIELDS, str),
                                      input_digest=first(given, INPUT_DIGEST_FIELDS, str),
                                      updated=updated)
    return raw


TASK_ITEM_STATES = {"pending": "pending", "done": "done", "failed": "failed", "timeout": "unknown"}


@register("sqlite-task_items", "sqlite", lambda db, schema: "task_items" in schema,
          "SQLite task_items table: seq, biz_no, payload, status "
          "pending|done|failed|timeout, result, updated_at")
def read_task_items(db, schema) -> Raw:
    """``payload`` (JSON: file/source, digest/sha256 of the input), ``result``
    (JSON: output/artifact_path, size, sha256, error, failure|retryable)."""
    _require(schema, "task_items", ("seq", "biz_no", "status"), "sqlite-task_items")
    columns = schema["task_items"]
    payload = "payload" if "payload" in columns else "NULL"
    result = "result" if "result" in columns else "NULL"
    updated = "updated_at" if "updated_at" in columns else "NULL"
    rows = db.execute(f"SELECT seq, {_KEY_BYTES.format('biz_no')}, status, {payload}, "
                      f"{result}, {updated} FROM task_items ORDER BY seq")
    return _read_foreign(Raw(), _keyed("seq", rows), TASK_ITEM_STATES,
                         "task_items")


JOB_STATES = {"unknown": "unknown", "done": "done"}


@register("sqlite-jobs", "sqlite", lambda db, schema: "jobs" in schema,
          "SQLite jobs table: key, state unknown|done, result")
def read_jobs(db, schema) -> Raw:
    """``result`` (JSON: output/artifact_path, size, sha256); no input digest."""
    _require(schema, "jobs", ("key", "state"), "sqlite-jobs")
    result = "result" if "result" in schema["jobs"] else "NULL"
    try:
        rows = db.execute(f"SELECT rowid, {_KEY_BYTES.format('key')}, state, NULL, "
                          f"{result}, NULL FROM jobs ORDER BY rowid")
    except sqlite3.OperationalError:  # a WITHOUT ROWID table: its natural order
        rows = db.execute(f"SELECT NULL, {_KEY_BYTES.format('key')}, state, NULL, "
                          f"{result}, NULL FROM jobs")
    return _read_foreign(Raw(), _keyed("rowid", rows), JOB_STATES,
                         "jobs")
