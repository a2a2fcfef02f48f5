"""Executing a job of the fake provider: claim it, do the real work, commit under the claim.

An execution runs outside any transaction::

    txn 1  status=running, exec_no+1, executor=(pid, start ticks)    claim
           documents.process(upload -> out_dir/<job_id>.pdf)        real work
    txn 2  UPDATE ... WHERE status='running' AND exec_no=<mine>      result + counters

An executor that dies in between committed nothing; the next call touching the
job sees it dead (``_executor_alive``) and runs the job again (the provider's
own recovery). ``Executions`` holds these steps for ``FakeProvider``, which
gives them its ``_txn``, ``_row``, ``_read``, ``_job``, ``_log``, ``clock``,
``contract``, ``out_dir`` and ``on_phase``.
"""

import json
import os
import threading
from pathlib import Path

from .. import documents
from ..errors import PermanentError
from ..liveness import alive, my_start
from ..storage import sqlite_read
from . import records
from .contract import ACTIVE, Job, JobStatus

# Executions in progress in *this* process, as (job_id, exec_no). A job whose
# executor is this process but which is not in here was abandoned by an exception.
_EXECUTING: set = set()
_EXECUTING_LOCK = threading.Lock()


def _me() -> tuple[int, int | None]:
    """This process as an executor: (pid, start in clock ticks since boot)."""
    return os.getpid(), my_start()


def _executing(token, add: bool) -> None:
    with _EXECUTING_LOCK:
        (_EXECUTING.add if add else _EXECUTING.discard)(token)


def _executor_alive(row) -> bool:
    pid, started = row["executor_pid"], row["executor_started"]
    if (pid, started) == _me():
        with _EXECUTING_LOCK:
            return (row["job_id"], row["exec_no"]) in _EXECUTING
    # pid + start ticks, compared exactly (the one liveness helper): a recycled pid is
    # not the old executor, and a stepped wall clock does not make a live one look dead.
    return alive(None, pid, started) is True


def _relative(path, root) -> str:
    """A path as this database stores it: relative to the jobs folder (moves with it)."""
    return os.path.relpath(os.path.abspath(path), os.path.abspath(root))


class Executions:
    """The execution steps of ``FakeProvider`` (see the module docstring)."""

    def _claim(self, db, row, polls: int) -> int | None:
        """Take the execution of ``row``, guarded by its exec_no; return mine or None."""
        pid, started = _me()
        mine = row["exec_no"] + 1
        cur = db.execute("UPDATE jobs SET status='running', exec_no=?, executor_pid=?, executor_started=?,"
                         " polls=?, updated=? WHERE id=? AND exec_no=? AND status IN ('queued','running')",
                         (mine, pid, started, polls, self.clock(), row["id"], row["exec_no"]))
        if cur.rowcount != 1:
            return None
        _executing((row["job_id"], mine), True)  # before commit: no sibling thread sees an orphan
        return mine

    def _execute(self, job_id: str, exec_no: int) -> None:
        """Do the work of a claimed job, then commit its result under the claim."""
        try:
            with self._lock:
                row, artifact = sqlite_read(self._what, self._row, self._connect(), job_id), None
            if self.on_phase:
                self.on_phase("claimed", job_id)
            try:
                artifact = documents.process(self.out_dir / row["upload"],
                                             self.out_dir / f"{job_id}.pdf", json.loads(row["options"]))
                result = (JobStatus.SUCCEEDED, None, None, _relative(artifact.path, self.out_dir),
                          artifact.size, artifact.sha256)
            except PermanentError as exc:
                result = (JobStatus.FAILED, "permanent", str(exc), None, None, None)
            except Exception as exc:  # disk full, I/O error: a retry may succeed
                result = (JobStatus.FAILED, "transient", f"{type(exc).__name__}: {exc}", None, None, None)
            if self.on_phase:
                self.on_phase("executed", job_id)
            with self._txn() as db:
                committed = db.execute(
                    "UPDATE jobs SET status=?, failure=?, reason=?, artifact_path=?, artifact_size=?,"
                    " artifact_sha256=?, updated=? WHERE job_id=? AND status='running' AND exec_no=?",
                    (*result, self.clock(), job_id, exec_no)).rowcount == 1
                status = str(result[0]) if committed else "cancelled"  # work done, result dropped
                records.bump(db, row["idem_key"], row["task_key"], "executions",
                             *((status,) if committed else ()))
                records.log_execution(db, self.clock(), row, status, *(result[4:] if committed
                                                                        else (None, None)))
            if artifact and not committed:  # cancelled meanwhile: the result is discarded
                Path(artifact.path).unlink(missing_ok=True)
        finally:
            _executing((job_id, exec_no), False)

    def _touch(self, job_id: str, op: str | None = None) -> Job:
        """Advance a job as far as this call may: recover a dead executor, count a poll.

        With ``op``, the call is logged with the status it returns.
        """
        poll = op == "poll"
        with self._txn() as db:
            row, mine = self._row(db, job_id), None
            if row["status"] in ACTIVE and row["executor_pid"] is not None:
                if not _executor_alive(row):
                    mine = self._claim(db, row, row["polls"])  # the provider's own recovery
            elif row["status"] in ACTIVE and poll:
                if row["polls"] + 1 >= self.contract.run_polls:
                    mine = self._claim(db, row, row["polls"] + 1)
                else:
                    db.execute("UPDATE jobs SET polls=polls+1, status='running', updated=? WHERE id=?",
                               (self.clock(), row["id"]))
        if mine is not None:
            self._execute(job_id, mine)
        if op is None:
            return self._read(job_id)
        with self._txn() as db:
            job = self._job(self._row(db, job_id))
            self._log(db, op, job, str(job.status))
        return job
