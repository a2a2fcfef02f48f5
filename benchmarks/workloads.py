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

    Per transaction: ``BEGIN IMMEDIATE``, ``PRAGMA data_version`` (has another
    connection committed?), read the item only where the ledger's row cache
    cannot answer (the add: a new key), insert or guarded update of the item
    row, insert the event row, ``COMMIT`` -- on the ledger's own schema
    (``SCHEMA``, the statements of ``toolkit.ledger.sqlite``). The gap between
    this and the ledger is Python; the gap between this and ``BareSqlite`` is
    pages written per commit.
    """

    STEPS = (("claim", "pending"), ("move", "unknown"), ("move", "submitted"),
             ("move", "done"), ("release", "done"))

    def __init__(self, folder: Path, synchronous: str = "FULL", schema: str | None = None):
        from toolkit.ledger.sqlite import (DATA_VERSION, INSERT_EVENT, INSERT_ITEM, ITEM_COLUMNS,
                                           SCHEMA, SELECT_ITEM, UPDATE_ITEM)

        self.path = _fresh(folder / f"floor-{synchronous.lower()}.sqlite")
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        for statement in (schema or SCHEMA).strip().split(";"):
            if statement.strip():
                self.db.execute(statement)
        self.width = len(ITEM_COLUMNS)
        self.version, self.select, self.insert = DATA_VERSION, SELECT_ITEM, INSERT_ITEM
        self.update, self.event = UPDATE_ITEM, INSERT_EVENT
        self.detail = json.dumps({"artifact_path": "out/doc.pdf", "artifact_size": 12345,
                                  "artifact_sha256": "0" * 64}, sort_keys=True)
        self.count = 0

    def step(self, items: int) -> float:
        db = self.db
        names = keys(items, f"floor{self.count}")
        self.count += items
        start = time.perf_counter()
        for key in names:
            row = [key, "pending", "doc.pdf", 0, 0] + [None] * (self.width - 6) + [1.0]
            db.execute("BEGIN IMMEDIATE")
            db.execute(self.version).fetchone()
            db.execute(self.select, (key,)).fetchone()
            db.execute(self.insert, row)
            db.execute(self.event, (1.0, "add", key, None, "pending", 0, None, 0, "{}"))
            db.execute("COMMIT")
            for op, to in self.STEPS:
                guard = [key, row[1], row[4]]
                row[1], row[4] = to, 1
                db.execute("BEGIN IMMEDIATE")
                db.execute(self.version).fetchone()  # unchanged: the ledger's cached row
                if db.execute(self.update, row[1:] + guard).rowcount != 1:
                    raise AssertionError("the guarded update must hit its row")
                db.execute(self.event, (1.0, op, key, guard[1], to, 1, "bench", 1, self.detail))
                db.execute("COMMIT")
        return time.perf_counter() - start

    def close(self):
        self.db.close()
        _fresh(self.path)


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
    """Record ``LIFECYCLE`` transitions per key, exactly as the safe runner does."""
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
