"""What the benchmarks time: bare loops (the physical limits) and ledger work.

Subjects (``BareSqlite``, ``BareAppend``, ``SqlFloor``, ``LedgerSubject``)
keep a fresh file open and time ``step(items)``, so ``measure.paired`` can
alternate a baseline and the ledger it bounds block by block. Functions
(``ledger_lifecycles``, ``rewrite_state``) time one whole sample on a fresh
file; setup is never inside the clock.

The ledger workload is one item's life as the safe runner records it: add,
claim, intent (pending -> unknown), submitted, done with its artifact,
release -- six transitions, six transactions (``LIFECYCLE``).
"""

import contextlib
import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path

from toolkit.ledger import Event, Ledger, State, open_ledger
from toolkit.ledger.records import item_of

S = State
LIFECYCLE = 6  # transitions per item in ``lifecycle``
EVENT_BYTES = 320  # about one JSONL ledger line of the lifecycle (measured: 250-420)


def _fresh(path: Path) -> Path:
    for suffix in ("", "-wal", "-shm", "-journal", ".lock"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{suffix}")
    return path


def keys(count: int, salt: str = "") -> list[str]:
    return [hashlib.sha256(f"{salt}:{i}".encode()).hexdigest() for i in range(count)]


# -- subjects timed in interleaved blocks ----------------------------------------------
#
# A subject holds its file open and does ``step(items)``: the work of recording
# ``items`` lifecycles, ``LIFECYCLE * items`` commits (or appends), and returns
# the seconds it took. ``measure.paired`` alternates subjects block by block,
# so a baseline and the ledger it bounds see the same disk weather.

class BareSqlite:
    """One ``INSERT`` + ``COMMIT`` per transaction (WAL), nothing else."""

    def __init__(self, folder: Path, synchronous: str = "FULL"):
        self.path = _fresh(folder / f"bare-{synchronous.lower()}.sqlite")
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self.db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        self.payload = "x" * 150

    def step(self, items: int) -> float:
        db, payload = self.db, (self.payload,)
        start = time.perf_counter()
        for _ in range(items * LIFECYCLE):
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t (v) VALUES (?)", payload)
            db.execute("COMMIT")
        return time.perf_counter() - start

    def close(self):
        self.db.close()
        _fresh(self.path)


class BareAppend:
    """``os.write`` of one line (+ ``fsync``) per record on an ``O_APPEND`` file.

    ``sync="fdatasync"``: the same loop with ``os.fdatasync``, measured beside the
    baseline (which stays ``fsync``, as the JSONL ledger does): on an append the size
    change is metadata a read needs, so fdatasync journals it too and costs the same.
    """

    def __init__(self, folder: Path, fsync: bool = True, sync: str = "fsync"):
        self.path = _fresh(folder / f"bare-{sync if fsync else 'write'}.jsonl")
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.sync = getattr(os, sync) if fsync else None
        self.line = b"x" * (EVENT_BYTES - 1) + b"\n"

    def step(self, items: int) -> float:
        fd, line, sync = self.fd, self.line, self.sync
        start = time.perf_counter()
        for _ in range(items * LIFECYCLE):
            os.write(fd, line)
            if sync is not None:
                sync(fd)
        return time.perf_counter() - start

    def close(self):
        os.close(self.fd)
        _fresh(self.path)


class SqlFloor:
    """The SQL the SQLite ledger issues per lifecycle, without its Python.

    The statements *and their values* are the ledger's own: at setup a real SQLite
    ledger records one item's lifecycle (``lifecycle``, after one item to warm its row
    cache) through a connection that notes each ``execute`` (``_Recorder``); ``step``
    replays those transactions for each new key -- ``BEGIN IMMEDIATE``, ``PRAGMA
    data_version``, the ``SELECT`` of the add (the one the row cache cannot answer), the
    item's insert or guarded update, the event's insert, ``COMMIT`` -- with the key
    substituted (keys are all 64 hex digits: every row is the ledger's row, byte for
    byte in size). So the floor writes the rows the ledger writes: the same WAL frames
    per commit, the same page splits, the same checkpoints (``strace -f``: 4.54 WAL
    ``pwrite``s and 0.085 checkpoint ``pread``s per transaction, as the ledger; a floor
    of its own smaller rows, as this was before, wrote 4.04 and 0.061). The gap between
    this and the ledger is Python; the gap between this and ``BareSqlite`` is pages
    written per commit.
    """

    def __init__(self, folder: Path, synchronous: str = "FULL", schema: str | None = None):
        from toolkit.ledger.sqlite import SCHEMA

        self.path = _fresh(folder / f"floor-{synchronous.lower()}.sqlite")
        self.transactions, self.template = _ledger_statements(folder)
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        for statement in (schema or SCHEMA).strip().split(";"):
            if statement.strip():
                self.db.execute(statement)
        self.count = 0

    def step(self, items: int) -> float:
        transactions = self.transactions
        names = keys(items, f"floor{self.count}")
        self.count += items
        run = self.run
        start = time.perf_counter()
        for key in names:
            for transaction in transactions:
                run(transaction, key)
        return time.perf_counter() - start

    def run(self, transaction: list, key: str) -> None:
        """One of the ledger's transactions (``self.transactions``) for ``key``."""
        db = self.db
        for sql, values, keyed, split, fetch, guarded in transaction:
            if keyed or split:  # the key's values: a few stores, no str.replace
                values = values.copy()
                for index in keyed:
                    values[index] = key
                for index, parts in split:
                    values[index] = key.join(parts)
            cursor = db.execute(sql, values)
            if fetch:  # the ledger fetches what it selects (data_version, the add's SELECT)
                cursor.fetchone()
            elif guarded and cursor.rowcount != 1:
                raise AssertionError("the guarded update must hit its row")

    def close(self):
        self.db.close()
        _fresh(self.path)


class _Recorder:
    """An ``sqlite3.Connection`` stand-in that notes every ``execute`` and runs it."""

    def __init__(self, db):
        self._db, self.statements = db, []

    def execute(self, sql, args=()):
        self.statements.append((sql, tuple(args)))
        return self._db.execute(sql, args)

    def __getattr__(self, name):
        return getattr(self._db, name)


def _ledger_statements(folder: Path) -> tuple[list, str]:
    """The transactions (lists of ``(sql, values, guarded)``) a real SQLite ledger runs for
    one item's lifecycle, and that item's key (a 64-hex-digit template to substitute)."""
    path = _fresh(folder / "floor-template.sqlite")
    ledger = open_ledger(path, durable=False)
    try:
        lifecycle(ledger, keys(1, "floor-warm"))  # steady state: row cache, pages
        recorder = ledger._db = _Recorder(ledger._db)  # _txn() hands it to the transaction
        template = keys(1, "floor-template")[0]
        lifecycle(ledger, [template], first=1)
        ledger._db = recorder._db
    finally:
        ledger.close()
        _fresh(path)
    transactions = []
    for sql, args in recorder.statements:
        if sql == "BEGIN IMMEDIATE":
            transactions.append([])
        # Where the key goes: a value that is the key (the item's, the event's, the
        # artifact digest the lifecycle gives) or holds it (the event's detail JSON).
        keyed = tuple(i for i, value in enumerate(args) if value == template)
        split = tuple((i, value.split(template)) for i, value in enumerate(args)
                      if isinstance(value, str) and value != template and template in value)
        fetch = sql.startswith(("PRAGMA", "SELECT"))
        transactions[-1].append((sql, list(args), keyed, split, fetch, sql.startswith("UPDATE")))
    assert len(transactions) == LIFECYCLE, transactions
    return transactions, template


class LedgerSubject:
    """The real ledger (``.sqlite`` or ``.jsonl``) recording lifecycles."""

    def __init__(self, folder: Path, suffix: str, durable: bool):
        self.path = _fresh(folder / f"ledger-{'durable' if durable else 'fast'}{suffix}")
        self.ledger = open_ledger(self.path, durable=durable)
        self.count = 0

    def step(self, items: int) -> float:
        names = keys(items, f"ledger{self.count}")
        start = time.perf_counter()
        lifecycle(self.ledger, names, first=self.count)
        self.count += items
        return time.perf_counter() - start

    @classmethod
    def memory(cls) -> "LedgerSubject":
        """The ledger's policy over a dict (``MemoryLedger``): no storage at all."""
        subject = cls.__new__(cls)
        subject.path, subject.ledger, subject.count = None, MemoryLedger(), 0
        return subject

    def close(self):
        self.ledger.close()
        if self.path is not None:
            _fresh(self.path)


# -- the ledger ------------------------------------------------------------------

def lifecycle(ledger: Ledger, names: list[str], worker: str = "bench", first: int = 0) -> None:
    """Record ``LIFECYCLE`` transitions per key: the safe runner's transitions of one
    document (add, claim, intent, submitted, done, release), each one synced. The runner
    itself defers all but the intent's fsync (``sync=False``, docs/design.md); here every
    transition pays its own, so the ledger ratios compare one durable transition with one
    fsynced record of the bare loops."""
    for number, key in enumerate(names, start=first):
        source = f"doc-{number:06d}.pdf"
        ledger.add(key, source=source, digest=key)
        token = ledger.claim(key, worker, 60.0)
        ledger.move(key, S.PENDING, S.UNKNOWN, token=token, worker=worker, note="intent")
        ledger.move(key, S.UNKNOWN, S.SUBMITTED, token=token, worker=worker,
                    job_id=f"job-{number:06d}")
        ledger.move(key, S.SUBMITTED, S.DONE, token=token, worker=worker,
                    job_id=f"job-{number:06d}", artifact_path=f"out/{source}",
                    artifact_size=12345, artifact_sha256=key)
        ledger.release(key, token, worker)


def ledger_lifecycles(folder: Path, items: int, suffix: str, durable: bool) -> float:
    """``items`` lifecycles on a fresh ledger (``.sqlite`` or ``.jsonl``), in seconds."""
    subject = LedgerSubject(folder, suffix, durable)
    try:
        return subject.step(items)
    finally:
        subject.close()


class MemoryLedger(Ledger):
    """The ledger's policy with no storage at all: the zero-cost reference."""

    def __init__(self, **options):
        super().__init__(":memory:", **options)
        self._state, self._history = {}, []

    @contextlib.contextmanager
    def _txn(self):
        yield

    def _load(self, key):
        return self._state.get(key)

    def _write(self, old, new, parts):
        # As the JSONL ledger keeps them: the Item built by the ledger's one constructor,
        # the Event only when the history is read.
        seq = len(self._history) + 1
        self._state[new[0]] = item_of(new)
        self._history.append((seq, parts))
        return seq

    def _items(self):
        return list(self._state.values())

    def _events(self):
        return [Event(seq, *parts) for seq, parts in self._history]

    def close(self):
        pass


# -- the rewrite-the-state-file design ---------------------------------------------

def _entry(number: int, key: str) -> dict:
    # what toolkit.runner.naive.RewriteState stores per finished item
    return {"state": "done", "job_id": f"job-{number:06d}",
            "artifact_path": f"out/doc-{number:06d}.{key[:8]}.pdf",
            "artifact_size": 12345, "artifact_sha256": key}


def rewrite_state(folder: Path, items: int, atomic: bool = False) -> float:
    """The whole JSON state rewritten after every item.

    In place (``atomic=False``): truncate and write, no fsync -- the
    ``rewrite-state`` strategy, but with one C-encoded ``json.dumps`` instead
    of its streaming ``json.dump`` (which is slower still): the charitable
    version. ``atomic=True``: temp file, fsync, ``os.replace``, fsync of the
    folder -- the power-loss-safe variant.
    """
    path = _fresh(folder / "state.json")
    temp = folder / "state.json.tmp"
    state = {}
    names = keys(items, "rewrite")
    start = time.perf_counter()
    for number, key in enumerate(names):
        state[key] = _entry(number, key)
        data = json.dumps(state)
        if not atomic:
            with open(path, "w") as handle:
                handle.write(data)
            continue
        with open(temp, "w") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    elapsed = time.perf_counter() - start
    _fresh(path)
    return elapsed
