"""The fake remote service: a ``Contract``, its own SQLite job ledger, real PDF work.

"The other ledger" is its own SQLite file (WAL, ``BEGIN IMMEDIATE``,
``synchronous=FULL``), shared by any number of processes, each with its own
``FakeProvider``. Counters are rows bumped in the transaction that records
what they count: ``submit_calls`` (every call, refused ones too),
``executions`` (work done, counted with its result), ``succeeded``, ``failed``.
An execution runs outside any transaction (``provider.execution``: claim, real
work, commit under the claim); an executor that dies in between committed
nothing and the next call touching the job runs it again. A job cancelled in
between stays cancelled; the work counts, its artifact is deleted.
"""

import hashlib
import os
import shutil
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Callable

from .. import documents
from ..errors import KeyReuseError, PermanentError, StorageError, ToolkitError, TransientError
from ..identity import canonical_json
from ..storage import sqlite_read, sqlite_txn, storage_error
from . import records
from .contract import ACTIVE, Contract, Job, JobStatus, ProviderConflict
from .execution import _executor_alive  # noqa: F401 - re-exported (tests/test_liveness.py)
from .execution import Executions, _executing, _me, _relative


class FakeProvider(Executions):
    """A remote document-translation service: real work, a durable job table.

    ``on_phase(phase, job_id)`` runs at ``"claimed"`` (no work done yet) and
    ``"executed"`` (result not committed yet); drills crash the provider there.
    Submitted documents are copied to ``out_dir/uploads/<sha256>.pdf``;
    artifacts are ``out_dir/<job_id>.pdf``. Raises ``ToolkitError`` for a
    ``db_path`` that is not a provider database.
    """

    def __init__(self, db_path, out_dir, contract: Contract = Contract(), clock=time.time,
                 on_phase: Callable[[str, str], None] | None = None):
        self.db_path, self.out_dir = Path(db_path), Path(out_dir)
        self.contract, self.clock, self.on_phase = contract, clock, on_phase
        self._lock, self._db, self._pid = threading.RLock(), None, None
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        try:  # the database first: a file that is not one leaves no jobs folder behind
            with self._txn() as db:
                records.create(db)
        except StorageError:
            raise  # the disk, not the caller's input: the batch halts (exit 1)
        except ToolkitError as exc:
            raise ToolkitError(f"{self.db_path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise ToolkitError(f"cannot open provider database {self.db_path}: {exc}") from exc
        self.out_dir.mkdir(parents=True, exist_ok=True)

    def _connect(self):
        try:
            return self._open()
        except sqlite3.Error as exc:  # with the path: a folder with no free inode is storage
            raise storage_error(self._what, exc, self.db_path) from exc

    @property
    def _what(self) -> str:
        return f"provider database {str(self.db_path)!r}"

    def _open(self):
        if self._db is None or self._pid != os.getpid():  # never reuse a connection across fork
            db = sqlite3.connect(self.db_path, timeout=60, isolation_level=None, check_same_thread=False)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA synchronous=FULL")
            for attempt in range(1, 201):  # switching to WAL skips the busy handler: retry it
                try:
                    if db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal":
                        break
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or attempt == 200:
                        raise
                time.sleep(0.002 * min(attempt, 25))
            self._db, self._pid = db, os.getpid()
        return self._db

    @contextmanager
    def _txn(self):
        with self._lock, sqlite_txn(self._connect(), self._what) as db:
            yield db

    def close(self):
        if self._db is not None and self._pid == os.getpid():
            self._db.close()
        self._db = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def _row(db, job_id):
        row = db.execute("SELECT * FROM jobs WHERE job_id=?", (job_id,)).fetchone()
        if row is None:
            raise PermanentError(f"no job {job_id}")
        return row

    def _job(self, row) -> Job:
        job = {f.name: row[f.name] for f in fields(Job)}
        if job["artifact_path"]:  # stored relative to the jobs folder: the job names the file
            job["artifact_path"] = str(self.out_dir / job["artifact_path"])
        return Job(**{**job, "status": JobStatus(row["status"])})

    def _read(self, job_id: str) -> Job:
        with self._lock:
            return self._job(sqlite_read(self._what, self._row, self._connect(), job_id))

    def _log(self, db, op: str, job: Job | None, outcome: str, idem_key=None, task=None) -> None:
        records.log_call(db, self.clock(), op, job.idem_key if job else idem_key,
                         job.task_key if job else task, job.job_id if job else None, outcome)

    def _transient(self, idem_key: str, call_no: int) -> bool:
        digest = hashlib.sha256(f"{self.contract.seed}:{idem_key}:{call_no}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.contract.transient_rate

    def _upload(self, document_path) -> tuple[str, Path]:
        """Receive the document: a content-addressed copy the provider owns.

        Raises OSError when the document cannot be read (the caller's input),
        StorageError when the copy cannot be stored (the provider's disk).
        """
        data = Path(document_path).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        upload = self.out_dir / "uploads" / f"{digest}.pdf"
        if not upload.exists():
            try:
                documents.write_atomic(data, upload)
            except OSError as exc:
                raise StorageError(f"provider upload store {str(upload.parent)!r}: {exc}") from exc
        return digest, upload

    def _insert(self, db, idem_key, claim, task, payload, upload, options_json) -> str | None:
        """Insert a job unless ``claim`` is held; an immediate job is claimed by this process."""
        next_id = db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM jobs").fetchone()[0]
        job_id, deferred, now = f"job-{next_id:06d}", self.contract.run_polls > 0, self.clock()
        pid, started = (None, None) if deferred else _me()
        cur = db.execute(
            "INSERT INTO jobs (id, job_id, idem_key, claim, task_key, payload_hash, upload, options,"
            " status, created, updated, exec_no, executor_pid, executor_started)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT (claim) DO NOTHING",
            (next_id, job_id, idem_key, claim, task, payload, _relative(upload, self.out_dir),
             options_json,
             "queued" if deferred else "running", now, now, int(not deferred), pid, started))
        # upload: relative to the jobs folder, as every path in this database is
        if cur.rowcount != 1:
            return None
        if not deferred:
            _executing((job_id, 1), True)
        return job_id

    def submit(self, idem_key: str, document_path, options: dict, task_key: str | None = None,
               *, worker: str | None = None, token: int | None = None,
               refuse: bool = False) -> Job:
        """Accept (or deduplicate) a job; with ``run_polls == 0`` it executes before returning.

        ``task_key`` defaults to ``idem_key`` up to its last ``:``. ``worker`` and ``token``
        (the caller's lease) are recorded with the call, for the checker. ``refuse``: a
        transient refusal forced by the caller (the service's ``refuse_submits`` fault).

        Raises:
            TransientError: the seeded transient failure (nothing accepted).
            KeyReuseError: an idempotent key reused with another payload.
            ProviderConflict: ``active_conflict`` and the key's job is still active.
            PermanentError: the document cannot be read.
        """
        task = task_key or (idem_key.rpartition(":")[0] or idem_key)
        options_json, error, existing, job_id = canonical_json(options), None, None, None
        try:
            digest, upload = self._upload(document_path)
            payload = hashlib.sha256(f"{digest}\n{options_json}".encode()).hexdigest()
        except OSError as exc:
            error = PermanentError(f"cannot read document {document_path}: {exc}")
        contract = self.contract
        with self._txn() as db:
            call_no = records.bump(db, idem_key, task, "submit_calls")  # counted even if refused
            if error is None and (refuse or self._transient(idem_key, call_no)):
                error = TransientError(f"provider busy (call {call_no} with key {idem_key})")
            if error is None:
                claim = idem_key if contract.idempotent_keys else None
                if claim and contract.key_retention is not None:  # an expired key is a new key
                    db.execute("UPDATE jobs SET claim=NULL WHERE claim=? AND created < ?",
                               (claim, self.clock() - contract.key_retention))
                latest = db.execute("SELECT * FROM jobs WHERE idem_key=? ORDER BY id DESC LIMIT 1",
                                    (idem_key,)).fetchone()
                if claim is None and contract.active_conflict and latest and latest["status"] in ACTIVE:
                    existing = latest  # no dedupe without idempotent keys, but the 409 applies
                else:
                    job_id = self._insert(db, idem_key, claim, task, payload, upload, options_json)
                    if job_id is None:  # the conditional insert lost: read the claim holder
                        existing = db.execute("SELECT * FROM jobs WHERE claim=?", (claim,)).fetchone()
                if existing is not None:
                    job_id = existing["job_id"]
                    if claim and existing["payload_hash"] != payload:
                        error = KeyReuseError(idem_key)
                    elif contract.active_conflict and existing["status"] in ACTIVE:
                        error = ProviderConflict(self._job(existing))
            outcome = ("transient" if isinstance(error, TransientError) else "conflict"
                       if isinstance(error, ProviderConflict) else "rejected" if error
                       else "deduped" if existing is not None else "created")
            records.log_call(db, self.clock(), "submit", idem_key, task,
                             job_id if outcome in ("conflict", "deduped", "created") else None, outcome,
                             worker, token)
        if error is not None:
            raise error  # after the commit: the refused call stays counted
        if existing is None and not contract.run_polls:
            self._execute(job_id, 1)
        return self._touch(job_id)

    def lookup(self, idem_key: str) -> Job | None:
        """The latest job for ``idem_key``, as far as the contract lets this lookup see it.

        Raises:
            TransientError: the contract's lookup is ``unavailable``.
        """
        task = idem_key.rpartition(":")[0] or idem_key
        with self._txn() as db:
            if self.contract.lookup == "unavailable":
                self._log(db, "lookup", None, "unavailable", idem_key, task)
                row = None
            else:
                row = db.execute("SELECT * FROM jobs WHERE idem_key=? ORDER BY id DESC LIMIT 1",
                                 (idem_key,)).fetchone()
                retention = self.contract.key_retention
                if row is not None and retention is not None and row["created"] < self.clock() - retention:
                    row = None  # forgotten: the same answer as never seen
                if row is not None:
                    db.execute("UPDATE jobs SET lookups = lookups + 1 WHERE id=?", (row["id"],))
                    if self.contract.lookup == "lagging" and row["lookups"] < self.contract.lag:
                        row = None  # the job exists; this lookup just cannot see it yet
                self._log(db, "lookup", None, "found" if row else "not_found", idem_key,
                          row["task_key"] if row else task)
        if self.contract.lookup == "unavailable":
            raise TransientError("provider lookup unavailable")
        return None if row is None else self._touch(row["job_id"])

    def poll(self, job_id: str) -> Job:
        """Current state of a job; a deferred job executes on its ``run_polls``-th poll."""
        return self._touch(job_id, "poll")

    def fetch(self, job_id: str, dest_path) -> Job:
        """Copy a succeeded job's artifact to ``dest_path``; the caller verifies size and SHA-256.

        Raises:
            PermanentError: no such job, not succeeded, or its artifact is gone.
        """
        job, error = self._touch(job_id), None
        if job.status != JobStatus.SUCCEEDED:
            error = PermanentError(f"job {job_id} is {job.status}: nothing to fetch")
        elif not Path(job.artifact_path).is_file():  # checked apart: a bad dest_path is not "gone"
            error = PermanentError(f"artifact of job {job_id} is gone: {job.artifact_path}")
        else:
            shutil.copyfile(job.artifact_path, dest_path)
        with self._txn() as db:
            self._log(db, "fetch", job, "fetched" if error is None else f"refused: {error}")
        if error is not None:
            raise error
        return job

    def cancel(self, job_id: str) -> Job:
        """Cancel exactly this job if it is queued or running; a finished job is left as is."""
        with self._txn() as db:
            db.execute("UPDATE jobs SET status='cancelled', updated=? WHERE id=? AND status IN "
                       "('queued','running')", (self.clock(), self._row(db, job_id)["id"]))
            job = self._job(self._row(db, job_id))
            self._log(db, "cancel", job, str(job.status))
        return job

    def jobs(self) -> list[Job]:
        """Every job, oldest first (for notebooks and drills)."""
        with self._lock:
            rows = sqlite_read(self._what, lambda db: db.execute("SELECT * FROM jobs ORDER BY id")
                               .fetchall(), self._connect())
            return [self._job(r) for r in rows]

    def _query(self, reader):
        with self._lock:
            return sqlite_read(self._what, reader, self._connect())

    def stats(self) -> dict:
        """``{"submit_calls", "executions", "succeeded", "failed", "per_task": {task: {...}}}``."""
        return self._query(records.stats)

    def key_stats(self) -> dict:
        """Counters per idempotency key: ``{key: {counter: n}}`` (only counters that moved)."""
        return self._query(records.key_stats)

    def calls(self) -> list[dict]:
        """The provider's call log, in order (fields of ``checker.Call``)."""
        return self._query(records.calls)

    def executions(self) -> list[dict]:
        """Every finished execution, in order (fields of ``checker.Execution``)."""
        return self._query(records.executions)


def provider_at(db_path, contract: Contract = Contract()) -> FakeProvider:
    """The fake provider whose database is ``db_path``; its jobs live beside it (``<stem>-jobs``).

    The one convention the CLI, worker processes and tests share for "a provider on disk".
    """
    db_path = Path(db_path)
    return FakeProvider(db_path, db_path.with_name(db_path.stem + "-jobs"), contract)
