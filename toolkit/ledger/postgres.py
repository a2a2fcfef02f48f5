"""PostgreSQL ledger: one ledger shared by many workers on many machines (psycopg 3).

The tables are the SQLite backend's, in the schema that the URL's
``search_path`` names (created if missing), so several batches can share a
database::

    postgresql://user@db.example/batches?options=-csearch_path%3Dinvoices_2024

Every change is one short transaction, READ COMMITTED, no provider call inside:

    BEGIN
    SELECT ... FROM items WHERE key=$1 FOR UPDATE              _load: the row is ours until COMMIT
    WITH moved AS (UPDATE items SET ... WHERE key=$1 AND state=$2 AND token=$3 RETURNING key)
    INSERT INTO events (...) SELECT ... FROM moved RETURNING seq    _write: item and event together
    COMMIT

A missing row is serialized with a transaction-scoped advisory lock on the key,
so two workers adding the same document cannot both insert it.

What a lost connection means depends on when it is lost:
  before BEGIN   nothing of the next change happened: reconnect once and go on
                 (a server restart between two changes is invisible);
  after BEGIN    the outcome is unknown (the COMMIT may have landed or not):
                 ``LedgerError``; the runner stops and reconciles on its next run.
A worker killed mid-transaction leaves nothing behind: the server rolls its
transaction back, and its row locks go, when the connection drops.

Health (``DESIGN.md`` rule 8) cannot be a file beside a URL: it is a one-row
``health`` table in the same schema (``postgres_health`` has the functions of
``toolkit.runner.ops`` for a URL).
"""

import contextlib

from toolkit.errors import LedgerError, StateConflictError
from toolkit.ledger import Event, Ledger, State
from toolkit.ledger.postgres_urls import SCHEMES, postgres_url  # noqa: F401 - re-exported
from toolkit.ledger.postgres_urls import _first_schema, redact
from toolkit.ledger.records import detail_json
from toolkit.ledger.sqlite import FORMAT, ITEM_COLUMNS, _event, _item

SETUP_LOCK = 7_305_011_962  # advisory lock id: one process at a time creates the tables
# Advisory lock id held by a transaction that records an item's first intent (pending ->
# unknown), until its COMMIT: an IDENTITY seq is drawn at INSERT, not at COMMIT, so two
# intents could commit in the other order than their seqs; under this lock the seq is drawn
# after every earlier first intent committed, and ``first_intents`` reads commit order.
INTENT_ORDER = 7_305_011_963
OWN_TABLES = frozenset({"meta", "items", "events", "health"})  # every table SCHEMA creates
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS items (
    key TEXT PRIMARY KEY, state TEXT NOT NULL, source TEXT, attempt BIGINT NOT NULL,
    token BIGINT NOT NULL, job_id TEXT, failure TEXT, reason TEXT, artifact_path TEXT,
    artifact_size BIGINT, artifact_sha256 TEXT, pages_done BIGINT, lease_owner TEXT,
    lease_host TEXT, lease_pid BIGINT, lease_started DOUBLE PRECISION, lease_expires DOUBLE PRECISION,
    updated DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, ts DOUBLE PRECISION NOT NULL,
    op TEXT NOT NULL, key TEXT NOT NULL, frm TEXT, "to" TEXT NOT NULL,
    attempt BIGINT NOT NULL, worker TEXT, token BIGINT NOT NULL, detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS health (
    id INTEGER PRIMARY KEY CHECK (id = 1), reason TEXT NOT NULL, since DOUBLE PRECISION NOT NULL);
INSERT INTO meta VALUES ('format', '{FORMAT}') ON CONFLICT DO NOTHING;
ALTER TABLE items ADD COLUMN IF NOT EXISTS pages_done BIGINT;
ALTER TABLE items ADD COLUMN IF NOT EXISTS lease_host TEXT;
ALTER TABLE items ADD COLUMN IF NOT EXISTS artifact_mtime_ns BIGINT;
ALTER TABLE items ADD COLUMN IF NOT EXISTS artifact_ctime_ns BIGINT;
ALTER TABLE items ADD COLUMN IF NOT EXISTS artifact_ino BIGINT
"""
SELECT_ITEM = f"SELECT {', '.join(ITEM_COLUMNS)} FROM items"
SELECT_EVENTS = 'SELECT seq, ts, op, key, frm, "to", attempt, worker, token, detail FROM events'
# Typed placeholders: in INSERT ... SELECT the server cannot infer a parameter's type.
_EVENT_INSERT = ('INSERT INTO events (ts, op, key, frm, "to", attempt, worker, token, detail) '
                 "SELECT %s::float8, %s::text, %s::text, %s::text, %s::text, %s::bigint, "
                 "%s::text, %s::bigint, %s::text FROM moved RETURNING seq")
INSERT_ITEM = (f"WITH moved AS (INSERT INTO items ({', '.join(ITEM_COLUMNS)}) "
               f"VALUES ({', '.join(['%s'] * len(ITEM_COLUMNS))}) "
               f"ON CONFLICT (key) DO NOTHING RETURNING key) {_EVENT_INSERT}")
UPDATE_ITEM = (f"WITH moved AS (UPDATE items SET {', '.join(f'{c}=%s' for c in ITEM_COLUMNS[1:])} "
               f"WHERE key=%s AND state=%s AND token=%s RETURNING key) {_EVENT_INSERT}")
# Work a worker may take: unowned, and not resting (done items are re-verified by the walk).
PICK = ("SELECT key FROM items WHERE key = ANY(%s) AND lease_owner IS NULL "
        "AND (state IN ('pending', 'unknown', 'submitted', 'partial') "
        "OR (state = 'failed' AND failure = 'transient')) "
        "ORDER BY key LIMIT 1 FOR UPDATE SKIP LOCKED")


class PostgresLedger(Ledger):
    """The shared backend (``postgresql://`` URLs); one connection per ledger object.

    ``path`` is the URL as given. ``lock_timeout`` bounds a wait for another
    worker's row lock; the server ends a session idle inside a transaction
    after ``idle_in_transaction`` seconds, so a hung worker cannot hold an item.
    """

    def __init__(self, url: str, *, connect_timeout: float = 10.0, lock_timeout: float = 30.0,
                 idle_in_transaction: float = 60.0, **options):
        self._listener = None
        super().__init__(url, **options)
        self.path = url  # a URL, not a file: Path() would fold its '//'
        self.url = url
        self._settings = {"connect_timeout": connect_timeout, "lock_timeout": lock_timeout,
                          "idle_in_transaction": idle_in_transaction}
        self._conn, self._closed = None, False
        self._depth = 0  # > 0 inside _txn; nested _txn join the outer transaction
        self._deferred: list[Event] = []
        try:
            with self._lock, self._txn():
                self._setup()
        except BaseException:
            self.close()
            raise

    # -- connection ------------------------------------------------------------------
    def _connect(self):
        try:
            import psycopg  # lazy: only PostgreSQL ledgers need it
        except ImportError as exc:
            raise LedgerError("PostgreSQL ledgers need psycopg: pip install 'psycopg[binary]'") \
                from exc
        settings = self._settings
        try:
            conn = psycopg.connect(self.url, autocommit=True,
                                   connect_timeout=max(1, round(settings["connect_timeout"])),
                                   application_name="resume-toolkit")
            conn.execute(f"SET lock_timeout = {int(settings['lock_timeout'] * 1000)}")
            conn.execute("SET idle_in_transaction_session_timeout = "
                         f"{int(settings['idle_in_transaction'] * 1000)}")
            # on: a commit survives a server crash; off: it may lose the last instant's commits.
            conn.execute(f"SET synchronous_commit = {'on' if self.durable else 'off'}")
        except psycopg.Error as exc:
            raise LedgerError(f"cannot connect to PostgreSQL ledger {redact(self.url)!r}: "
                              f"{_first_line(exc)}") from exc
        return conn

    def _connection(self):
        """The open connection, or a new one if the old one is known to be dead."""
        if self._closed:
            raise LedgerError(f"the ledger {redact(self.url)!r} is closed")
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._drop()
            self._conn = self._connect()
        return self._conn

    def _read(self, query, params=()):
        """Run a read; outside a transaction, a connection that died idle is replaced once."""
        import psycopg

        for last in (bool(self._depth), True):
            conn = self._conn if self._depth else self._connection()
            try:
                return conn.execute(query, params).fetchall()
            except psycopg.OperationalError as exc:
                if last or not conn.broken:
                    raise LedgerError(f"cannot read the ledger: {_first_line(exc)}") from exc
            except psycopg.Error as exc:
                raise LedgerError(f"cannot read the ledger: {_first_line(exc)}") from exc

    def _setup(self):
        import psycopg

        try:
            self._create_tables(self._conn)
        except psycopg.Error as exc:
            raise LedgerError(f"cannot open PostgreSQL ledger {redact(self.url)!r}: "
                              f"{_first_line(exc)}") from exc

    def _create_tables(self, conn):
        """Use the schema the URL's search_path names first (created if missing); refuse,
        before writing anything, a schema holding any table this toolkit did not create."""
        from psycopg import sql

        conn.execute("SELECT pg_advisory_xact_lock(%s)", [SETUP_LOCK])
        wanted = _first_schema(conn.execute("SHOW search_path").fetchone()[0])
        schema = conn.execute("SELECT current_schema()").fetchone()[0]
        if wanted is not None and wanted != schema:
            # current_schema() skips names that do not exist yet: "newbatch,public" would
            # put the ledger in public, shared by every such batch. The first name is ours.
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(wanted)))
            schema = conn.execute("SELECT current_schema()").fetchone()[0]
        if schema is None or (wanted is not None and schema != wanted):
            raise LedgerError(f"{redact(self.url)!r}: search_path names no schema to keep "
                              "the ledger in")
        self._refuse_foreign(conn, schema)
        for statement in SCHEMA.strip().split(";"):
            conn.execute(statement)
        fmt = conn.execute("SELECT value FROM meta WHERE name='format'").fetchone()
        if fmt is None or fmt[0] != FORMAT:
            raise LedgerError(f"schema {schema!r} is not a resume-toolkit ledger ({fmt})")

    def _refuse_foreign(self, conn, schema):
        """Read-only checks: every table is one of ours, and ``meta`` names our format."""
        tables = {row[0] for row in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", [schema])}
        if not tables:
            return
        foreign = sorted(tables - OWN_TABLES)
        meta = {row[0] for row in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 'meta'", [schema])}
        fmt = None
        if not foreign and meta == {"name", "value"}:
            fmt = conn.execute("SELECT value FROM meta WHERE name='format'").fetchone()
        if foreign or fmt is None or fmt[0] != FORMAT:
            raise LedgerError(f"schema {schema!r} of {redact(self.url)!r} is not a resume-toolkit "
                              f"ledger (tables: {', '.join(sorted(tables))}); nothing was written")

    # -- the primitives ----------------------------------------------------------------
    @contextlib.contextmanager
    def _txn(self):
        if self._depth:  # joined: the outermost transaction commits or rolls back for all
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        import psycopg

        conn = self._begin()
        self._depth = 1
        try:
            yield
        except BaseException:
            self._depth, self._deferred = 0, []
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                self._drop()  # never reuse a connection whose transaction state is unclear
            raise
        self._depth, deferred, self._deferred = 0, self._deferred, []
        try:
            conn.execute("COMMIT")
        except psycopg.Error as exc:
            if conn.broken:  # the COMMIT may have landed before the connection went
                raise LedgerError(f"commit outcome unknown: {_first_line(exc)}") from exc
            raise LedgerError(f"commit failed: {_first_line(exc)}") from exc
        for event in deferred:  # events of joined transactions, now durable
            if self._listener is not None:
                self._listener(event)

    def _begin(self):
        import psycopg

        for last in (False, True):
            conn = self._connection()
            try:
                conn.execute("BEGIN")
                return conn
            except psycopg.Error as exc:
                # Nothing of this change has reached the server: a connection that died
                # while idle (a restart, a terminated backend) is replaced once.
                if last or not conn.broken:
                    raise LedgerError(f"cannot begin a transaction: {_first_line(exc)}") from exc

    def _load(self, key):
        if not self._depth:
            rows = self._read(f"{SELECT_ITEM} WHERE key=%s", [key])
            return _item(rows[0]) if rows else None
        import psycopg

        try:
            row = self._conn.execute(f"{SELECT_ITEM} WHERE key=%s FOR UPDATE", [key]).fetchone()
            if row is None:  # no row to lock: serialize on the key until our COMMIT
                self._conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [key])
                row = self._conn.execute(f"{SELECT_ITEM} WHERE key=%s FOR UPDATE",
                                         [key]).fetchone()
        except psycopg.Error as exc:
            raise LedgerError(f"cannot read item {key}: {_first_line(exc)}") from exc
        return row and _item(row)

    def _write(self, old, new, parts):
        import psycopg

        ts, op, key, frm, to, attempt, worker, token, detail = parts
        values = [getattr(new, name) for name in ITEM_COLUMNS]
        values[ITEM_COLUMNS.index("state")] = new.state.value
        event_values = [ts, op, key, frm and frm.value, to.value, attempt, worker, token,
                        detail_json(detail)]
        if old is None:
            query, params = INSERT_ITEM, values + event_values
        else:
            if op == "move" and not old.attempt and new.state is State.UNKNOWN:
                self._conn.execute("SELECT pg_advisory_xact_lock(%s)", [INTENT_ORDER])
            query = UPDATE_ITEM
            params = values[1:] + [old.key, old.state.value, old.token] + event_values
        try:
            row = self._conn.execute(query, params).fetchone()
        except psycopg.Error as exc:
            raise LedgerError(f"cannot record {op} of {key}: {_first_line(exc)}") from exc
        if row is None:  # cannot happen under the row lock of _load; guard anyway
            raise StateConflictError(key, old and old.state, "changed concurrently")
        return row[0]

    def _items(self):
        return [_item(row) for row in self._read(SELECT_ITEM)]

    def _events(self):
        return [_event(row) for row in self._read(f"{SELECT_EVENTS} ORDER BY seq")]

    def first_intents(self, keys):
        rows = self._read(f'SELECT key, min(seq) FROM events WHERE "to" = %s AND key = ANY(%s) '
                          "GROUP BY key", [State.UNKNOWN.value, list(keys)])
        return dict(rows)

    def close(self):
        self._drop()
        self._closed = True

    def _drop(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- events after commit, also for joined transactions ------------------------------
    @property
    def on_event(self):
        return None if self._listener is None else self._emit

    @on_event.setter
    def on_event(self, listener):
        self._listener = listener

    def _emit(self, event):
        if self._depth:  # the base emits after its own _txn; a joined one is not durable yet
            self._deferred.append(event)
        elif self._listener is not None:
            self._listener(event)

    # -- shared work ---------------------------------------------------------------------
    def claim_next(self, keys, worker: str, ttl: float, *, pid: int | None = None):
        """Claim the first of ``keys`` that nobody holds; ``(key, token)`` or None.

        An item another worker is changing at this instant (its row locked) is
        skipped, not waited for (``FOR UPDATE SKIP LOCKED``); the claim itself is
        the base's ``claim``, in the same transaction, under the same row lock.
        """
        keys = list(keys)
        if not keys:
            return None
        with self._lock, self._txn():
            import psycopg

            try:
                row = self._conn.execute(PICK, [keys]).fetchone()
            except psycopg.Error as exc:
                raise LedgerError(f"cannot pick work: {_first_line(exc)}") from exc
            if row is None:
                return None
            return row[0], self.claim(row[0], worker, ttl, pid=pid)

    # -- health: rule 8, kept in the database ---------------------------------------------
    def health(self) -> dict:
        rows = self._read("SELECT reason FROM health WHERE id = 1")
        return {"ready": not rows, "reason": rows[0][0] if rows else None}

    def mark_unhealthy(self, reason: str) -> None:
        with self._lock, self._txn():
            self._conn.execute("INSERT INTO health VALUES (1, %s, %s) ON CONFLICT (id) DO UPDATE "
                               "SET reason = EXCLUDED.reason, since = EXCLUDED.since",
                               [reason, self.clock()])

    def clear_health(self) -> None:
        with self._lock, self._txn():  # a real write transaction: proves the ledger writable
            self._conn.execute("DELETE FROM health")

    def _item_count(self):
        return self._read("SELECT count(*) FROM items")[0][0]

    def scan(self, ordered: bool = True):
        """``Ledger.scan``: the same ``SELECT`` as SQLite's, read in one round trip (a
        server-side cursor would hold a transaction open on the shared connection
        across the caller's yields)."""
        from toolkit.ledger import State
        from toolkit.ledger.records import LIGHT_FIELDS, Light

        # COLLATE "C": byte order, which is Python's order of these keys; the database's
        # default collation may follow a locale.
        with self._lock:
            rows = self._read(f"SELECT {', '.join(LIGHT_FIELDS)} FROM items"
                              + (' ORDER BY key COLLATE "C"' if ordered else ""))
        for row in rows:
            yield tuple.__new__(Light, (row[0], State(row[1]), *row[2:]))


def _first_line(exc) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
