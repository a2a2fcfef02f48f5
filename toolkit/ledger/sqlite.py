"""SQLite ledger: WAL, one ``BEGIN IMMEDIATE`` transaction per change.

Safe for several processes and threads: every writer serializes on SQLite's
write lock, re-reads the item inside the transaction, and the ``UPDATE`` is
guarded on the from-state and token it read (``rowcount == 1`` or an error).
"""

import dataclasses
import json
import os
import sqlite3

from toolkit.documents import fsync_dir
from toolkit.errors import LedgerError, StateConflictError, StorageError, ToolkitError
from toolkit.ledger import PERMANENT, TERMINAL, Event, Item, Ledger, State
from toolkit.ledger.group import GroupCommit, SharedFlushes
from toolkit.ledger.header import SALVAGED  # the mark's name: a meta row here, JSONL's header key
from toolkit.ledger.records import ItemRow, detail_json, item_of
from toolkit.ledger.sqlite_cache import DATA_VERSION, _LedgerTxn, _RowCache
from toolkit.ledger.sqlite_damage import busy_or_damaged, damage_of, damaged, damaged_in_run
from toolkit.storage import refuse_deleted_wal_shm, storage_error

FORMAT = "resume-toolkit-ledger/1"
WAL_MAGIC = (bytes.fromhex("377f0682"), bytes.fromhex("377f0683"))  # its header's first bytes
ITEM_COLUMNS = tuple(field.name for field in dataclasses.fields(Item))
# New ledgers: each transition's commit writes (and fsyncs) as few WAL pages as the two rows
# need. ``items`` is WITHOUT ROWID: one b-tree keyed by ``key`` (a rowid table with a TEXT
# primary key is two: the rows and their autoindex, both written by every add). ``events``
# numbers ``seq`` as its rowid without AUTOINCREMENT: max(seq)+1, so no sqlite_sequence
# page per insert; monotonic because no event row is ever deleted (nothing in the toolkit
# deletes one: the history is append-only). Ledgers created before (AUTOINCREMENT, rowid
# items: OLD ledgers of the same format) keep their tables: ``IF NOT EXISTS`` leaves them as
# they are, and every statement below reads and writes both shapes alike.
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    key TEXT PRIMARY KEY, state TEXT NOT NULL, source TEXT, attempt INTEGER NOT NULL,
    token INTEGER NOT NULL, job_id TEXT, failure TEXT, reason TEXT, artifact_path TEXT,
    artifact_size INTEGER, artifact_sha256 TEXT, pages_done INTEGER, lease_owner TEXT,
    lease_host TEXT, lease_pid INTEGER, lease_started REAL, lease_expires REAL,
    artifact_mtime_ns INTEGER, artifact_ctime_ns INTEGER, artifact_ino INTEGER,
    updated REAL NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY, ts REAL NOT NULL, op TEXT NOT NULL,
    key TEXT NOT NULL, frm TEXT, "to" TEXT NOT NULL, attempt INTEGER NOT NULL,
    worker TEXT, token INTEGER NOT NULL, detail TEXT NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('format', '{FORMAT}');
"""
# Columns added after format 1 was first written: an older ledger gains them on open
# (NULL for every existing item, which is what those items mean).
ADDED_COLUMNS = {"pages_done": "INTEGER", "lease_host": "TEXT", "artifact_mtime_ns": "INTEGER",
                 "artifact_ctime_ns": "INTEGER", "artifact_ino": "INTEGER"}
# The statements, built once: sqlite3 caches a prepared statement per SQL text, so
# the same string every call is a prepared statement reused (no parse, no f-string).
SELECT_ITEM = f"SELECT {', '.join(ITEM_COLUMNS)} FROM items WHERE key=?"
INSERT_ITEM = (f"INSERT INTO items ({', '.join(ITEM_COLUMNS)}) "
               f"VALUES ({', '.join('?' * len(ITEM_COLUMNS))})")
UPDATE_ITEM = (f"UPDATE items SET {', '.join(f'{name}=?' for name in ITEM_COLUMNS[1:])} "
               "WHERE key=? AND state=? AND token=?")
INSERT_EVENT = ('INSERT INTO events (ts, op, key, frm, "to", attempt, worker, token, detail)'
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
assert ITEM_COLUMNS[:2] == ("key", "state")
_ROW = tuple.__new__  # an ItemRow in one C call
_STATE_OF = {state.value: state for state in State}  # a dict lookup, not an Enum() call
# Bound as plain text: sqlite3 binds a str subclass (a State) only after its adapter
# lookup and a failed __conform__ attribute lookup, which cost more than the statement.
_TEXT = {None: None, **{state: state.value for state in State}}


def salvage_mark(db) -> dict | None:
    """The salvage mark of an SQLite ledger (``ledger --salvage`` writes it into the new file
    in the transaction that writes its items: ``salvage_sqlite.py``), or None. A row there
    marks the ledger whatever its value reads as: never unmarked by a bad value."""
    # the name inlined, no parameter: the audit reads a PostgreSQL ledger's meta through this
    # too (psycopg's placeholder is %s, sqlite3's ?)
    row = db.execute(f"SELECT value FROM meta WHERE name='{SALVAGED}'").fetchone()
    if row is None:
        return None
    try:
        mark = json.loads(row[0])
    except (TypeError, ValueError):
        mark = None
    return mark if isinstance(mark, dict) else {"lost": str(row[0])}


def _item(row) -> Item:
    # Columns are the dataclass fields in order (ITEM_COLUMNS): positional is exact.
    return item_of((row[0], _STATE_OF.get(row[1]) or _not_ours(row[0], row[1]), *row[2:]))


class NotOursError(ToolkitError, ValueError):
    """A row no State or JSON reading holds: bad input (exit 2), not a LedgerError, which a
    run takes for a storage halt (exit 1, the ledger marked unhealthy: one more write)."""


def _not_ours(key, value, what="state"):
    """The slow branch for a row no State or JSON reading holds: refused, naming it."""
    raise NotOursError(f"the ledger holds a record that is not ours (item {key!r}: {what} "
                      f"{value!r}); `audit` reports what is wrong")


def _event(row) -> Event:
    seq, ts, op, key, frm, to, attempt, worker, token, detail = row
    try:
        return Event(seq, ts, op, key, frm and State(frm), State(to), attempt, worker, token,
                     json.loads(detail))
    except ValueError:  # JSONDecodeError is one
        return _not_ours(key, row[4:6] + row[9:], f"event seq={seq} from, to, detail")


def _torn_words(head: bytes) -> str:
    return (f"its -wal was emptied or overwritten while a connection had it open (it starts "
            f"{head.hex()}, not a WAL header)")


class SqliteLedger(Ledger):
    """The default backend (``*.sqlite``, ``*.db``)."""

    defers_sync = True  # commits go to one ordered WAL: a later fsync covers earlier ones

    def __init__(self, path, *, timeout: float = 30.0, group_commit: bool = False, **options):
        """``group_commit=True`` (with ``durable=True``): transitions of this process's
        threads and of other processes on the same file share their fsyncs (``group``)."""
        super().__init__(path, **options)
        self._flushes = None
        self._cache = _RowCache()
        self._what = f"SQLite ledger {str(self.path)!r}"  # built once: named by every txn
        refuse_deleted_wal_shm(self.path, self._what)  # before SQLite builds a second index
        try:
            self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None,
                                       check_same_thread=False)
            self._ctx = _LedgerTxn(self._db, self._what, self._cache, self.path)
            # Refuse a foreign database before changing anything in it (even its journal mode).
            tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master")}
            if tables and ("meta" not in tables or not self._has_format_row()):
                self._db.close()
                swapped = ": it is the fake provider's database (--ledger and " \
                    "--provider-db swapped?)" if "jobs" in tables else ""
                raise LedgerError(f"{str(self.path)!r} is an SQLite database but not a "
                                  f"resume-toolkit ledger (tables: {', '.join(sorted(tables))})"
                                  f"{swapped}")
            if tables and self._db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                self._refuse_states()  # before the switch below rewrites an older file
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL: a commit survives kill -9, and SQLite never fsyncs the WAL at a
            # commit; durable=True fsyncs it itself (``_sync_wal``) before a commit
            # returns -- shared by the threads and (group commit) processes whose
            # commits it covers -- or, for a deferred one, at the next barrier
            # (``Ledger.defers_sync``: the WAL is one ordered log, so that fsync covers
            # every earlier commit). A checkpoint syncs the WAL first at NORMAL too.
            grouped = self.durable and group_commit
            self._db.execute("PRAGMA synchronous=NORMAL")
            with self._txn():  # executescript() would COMMIT first; run each statement
                for statement in SCHEMA.strip().split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                info = self._db.execute("PRAGMA table_info(items)").fetchall()
                have = {row[1] for row in info}
                for name, kind in ADDED_COLUMNS.items():
                    if name not in have:
                        self._db.execute(f"ALTER TABLE items ADD COLUMN {name} {kind}")
            fmt = self._db.execute("SELECT value FROM meta WHERE name='format'").fetchone()
            # ``Ledger.salvaged``: read once, as JSONL's header
            self.salvaged = salvage_mark(self._db)
            self._cache.declare({row[1]: row[2].upper() for row in
                                 self._db.execute("PRAGMA table_info(items)")})
        except StorageError as exc:
            self._db.close()
            if damage_of(exc):  # met in the schema transaction: the file's own bytes
                raise busy_or_damaged(self.path, damage_of(exc)) from exc
            raise
        except sqlite3.Error as exc:  # not a database at all is bad input, the rest is storage
            if damage_of(exc):  # the file's own bytes: no rerun reads them
                self._db.close()
                raise busy_or_damaged(self.path, str(exc)) from exc
            raise storage_error(f"cannot open SQLite ledger {str(self.path)!r}", exc,
                                self.path) from exc
        if fmt is None or fmt[0] != FORMAT:
            self._db.close()
            raise LedgerError(f"{str(self.path)!r} is not a resume-toolkit ledger ({fmt})")
        if grouped:
            try:
                self._flushes = self._ctx.flushes = SharedFlushes(f"{self.path}-flush")
            except OSError as exc:
                self._db.close()
                raise StorageError(f"SQLite ledger {str(self.path)!r}: cannot open its "
                                   f"group-commit file: {exc}") from exc
        if self.durable:
            self._wal_named, self._wal_fd = False, None
            flush = (self._sync_wal if self._flushes is None else
                     lambda: self._flushes.flush(self._sync_wal))
            self._group = GroupCommit(flush, f"SQLite ledger {str(self.path)!r}")

    def _has_format_row(self) -> bool:
        """A ledger of ours has its ``format`` row from its first commit (the tables and the
        row are created in one transaction); a ``meta`` table without it is another
        program's (the fake provider's database keeps one too), read before any write."""
        try:
            return self._db.execute("SELECT 1 FROM meta WHERE name='format'").fetchone() \
                is not None
        except sqlite3.OperationalError:  # a foreign ``meta`` of other columns
            return False

    def _sync_wal(self):
        """fsync the WAL: every frame written so far, by any process, is then durable.

        The WAL exists (our commit just wrote it) and is not deleted while this
        connection is open (a checkpoint restarts it in place: the same file). SQLite at synchronous=NORMAL never syncs the folder of
        the WAL it created, so the first flush of this connection does.
        """
        if self._wal_fd is None:  # opened once: the WAL stays while our connection does
            self._wal_fd = os.open(f"{self.path}-wal", os.O_RDONLY)
        os.fdatasync(self._wal_fd)  # as SQLite syncs its WAL: data and size, not the mtime
        if not self._wal_named:
            fsync_dir(self.path.parent)
            self._wal_named = True
        # After the fsync, before the ack: a WAL emptied under us has our frames behind a
        # hole where its header was, and a checkpoint copies that hole into the database
        # (the close's check alone comes too late: a checkpoint restarts the WAL, header
        # and all). Then this transition is not acknowledged: the run halts, damaged.
        head = os.pread(self._wal_fd, 4, 0)
        if head and head not in WAL_MAGIC:
            raise damaged(self.path, _torn_words(head))

    def _txn(self):
        ctx = self._ctx
        ctx.db = self._db  # the connection of now (benchmarks/profile_ledger.py wraps it)
        return ctx

    def _query(self, sql, args=()):
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def _error(self, exc: sqlite3.Error):
        """A read's error: the ledger's damage when it is the file's own bytes (pages or
        WAL frames gone under the run: exit 2, the way out), else the storage's. The
        transaction's are ``_LedgerTxn``'s."""
        why = damage_of(exc)
        return damaged_in_run(self.path, why) if why else storage_error(self._what, exc)

    def _load(self, key):
        try:
            row = self._db.execute(SELECT_ITEM, (key,)).fetchone()
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        return _item(row) if row is not None else None

    def _refuse_states(self):
        """NotOursError for an item whose state is not ours: one scan, run only before an
        older (rollback-journal) file is switched to WAL, so a refused file stays as it was."""
        ours = ", ".join(f"'{state.value}'" for state in State)
        row = self._db.execute(f"SELECT key, state FROM items WHERE state NOT IN ({ours}) "
                               "LIMIT 1").fetchone()
        if row is not None:
            self._db.close()
            _not_ours(*row)

    def _current(self, key):
        # Inside the transaction (``Commit``): our write lock is held, so the version read
        # here is the one every statement of this transaction sees.
        cache, db = self._cache, self._db
        try:
            version = db.execute(DATA_VERSION).fetchone()[0]
            if version == cache.version:
                row = cache.row
                if row is not None and row[0] == key:
                    return row
            else:
                cache.row, cache.version = None, version  # another connection committed
            row = db.execute(SELECT_ITEM, (key,)).fetchone()
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        except UnicodeEncodeError:  # a lone surrogate: no SQLite text holds it
            raise LedgerError(f"bad key {key!r}: not encodable as UTF-8") from None
        if row is None:
            return None
        cache.row = row = _ROW(ItemRow, (row[0],
                                         _STATE_OF.get(row[1]) or _not_ours(*row[:2]),
                                         *row[2:]))
        return row

    def _write(self, old, new, parts):
        ts, op, key, frm, to, attempt, worker, token, detail = parts
        db = self._db
        try:
            # ``new`` is an ItemRow: its values in column order (ITEM_COLUMNS).
            if old is None:
                db.execute(INSERT_ITEM, (key, _TEXT[new[1]]) + new[2:])
            elif db.execute(UPDATE_ITEM, (_TEXT[new[1]],) + new[2:] + (
                    key, _TEXT[old.state], old.token)).rowcount != 1:
                # cannot happen under BEGIN IMMEDIATE with an exact row cache; guard anyway
                raise StateConflictError(key, old.state, "changed concurrently")
            seq = db.execute(INSERT_EVENT, (ts, op, key, _TEXT[frm], _TEXT[to], attempt, worker,
                                           token, detail_json(detail))).lastrowid
        except sqlite3.Error as exc:
            raise StorageError(f"cannot record {op} of {key}: {exc}") from exc
        self._cache.pending = self._cache.stored(new)  # kept once the COMMIT succeeds
        return seq

    def _load_many(self, keys):
        found = {}
        for start in range(0, len(keys), 500):  # under SQLite's limit of bound parameters
            part = keys[start:start + 500]
            rows = self._query(f"SELECT {', '.join(ITEM_COLUMNS)} FROM items WHERE key IN "
                               f"({', '.join('?' * len(part))})", part)
            found.update((row[0], _item(row)) for row in rows)
        return found

    def _unsettled(self):
        # Item.resting in SQL: not terminal, and not failed(permanent).
        terminal = ", ".join(f"'{state.value}'" for state in TERMINAL)
        rows = self._query(f"SELECT {', '.join(ITEM_COLUMNS)} FROM items WHERE state NOT IN "
                           f"({terminal}) AND NOT (state = ? AND failure IS ?)",
                           (State.FAILED.value, PERMANENT))
        return [_item(row) for row in rows]

    def _items(self):
        rows = self._query(f"SELECT {', '.join(ITEM_COLUMNS)} FROM items")
        return [_item(row) for row in rows]

    def _events(self):
        rows = self._query('SELECT seq, ts, op, key, frm, "to", attempt, worker, token, '
                           "detail FROM events ORDER BY seq")
        return [_event(row) for row in rows]

    def first_intents(self, keys):  # a scan of the history (no index on key): rare calls
        keys = list(keys)
        return dict(self._query(f'SELECT key, min(seq) FROM events WHERE "to" = ? AND key IN '
                                f"({', '.join('?' * len(keys))}) GROUP BY key",
                                [State.UNKNOWN.value, *keys]))

    def probe(self) -> None:
        """A small durable write (a meta row, committed with its fsync); StorageError if not."""
        with self._lock, self._txn():
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('health_probe', ?)",
                             (repr(self.clock()),))
        if self._group is not None:
            self._group.wait(self._group.ticket())

    def close(self):
        try:
            # The barrier for deferred commits; a group whose fsync failed already
            # told its caller so, and has nothing more it could make durable.
            if self._group is not None and not self._group.broken:
                self._group.barrier()
        finally:
            self._close_files()

    def _close_files(self):
        torn = self._wal_torn()
        if getattr(self, "_wal_fd", None) is not None:
            os.close(self._wal_fd)
            self._wal_fd = None
        self._db.close()
        if self._flushes is not None:
            self._flushes.close()
        if torn:  # the run must not end "at rest" on a ledger no one can open after it
            raise damaged(self.path, torn)

    def _wal_torn(self) -> str | None:
        """Why the WAL no longer starts with its header, else None: emptied or overwritten
        in place under this connection (``: > L-wal``), SQLite writes its next frames at
        their offsets behind a hole of zeros, and the close's checkpoint copies the hole
        into the database. The file is read by name: SQLite locks no byte of its WAL."""
        try:
            with open(f"{self.path}-wal", "rb") as handle:
                head = handle.read(4)
        except OSError:
            return None
        return _torn_words(head) if head and head not in WAL_MAGIC else None

    def _item_count(self):
        return self._query("SELECT COUNT(*) FROM items")[0][0]

    def scan(self, ordered: bool = True, batch: int = 4096):
        """``Ledger.scan``: one ``SELECT`` (``ORDER BY key``: the primary key's index, else
        the table in storage order, about half the cost), read ``batch`` rows at a time.
        One statement is one read transaction in WAL mode: the rows are one consistent
        snapshot however long the reader takes. The lock is held per batch, not across
        yields: a caller may write between them."""
        from toolkit.ledger.records import LIGHT_FIELDS, Light

        states = _STATE_OF
        try:
            with self._lock:
                cursor = self._db.execute(f"SELECT {', '.join(LIGHT_FIELDS)} FROM items"
                                          + (" ORDER BY key" if ordered else ""))
            while True:
                with self._lock:
                    rows = cursor.fetchmany(batch)
                if not rows:
                    return
                # A list per batch, then yield from it: one frame resume per row, not a
                # Python block per row; _not_ours() only for a value no State has (it raises).
                yield from [_ROW(Light, (row[0], states.get(row[1]) or _not_ours(*row[:2]),
                                         *row[2:]))
                            for row in rows]
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
