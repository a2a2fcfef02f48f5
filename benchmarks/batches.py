"""Whole-batch workloads: a resumed 99%-done batch, a stub-provider batch, the 30 documents.

``resume_fixture`` builds, fast and without the runner, what a batch looks
like after an earlier run finished 99% of it: one input file per item, the
done items' artifacts, a SQLite ledger holding each item's history
(add, claim, intent, submitted, done, release) and the inputs' stat index;
``record_roots`` writes the roots file that run left beside the ledger.
``InstantProvider`` answers at once with the input itself as the artifact, so
a 10,000-item run measures the runner and the ledger, not PDF rendering.
"""

import hashlib
import json
import os
import shutil
import sqlite3
import time
from pathlib import Path

from toolkit import roots
from toolkit.errors import PermanentError
from toolkit.identity import task_key, task_keyer
from toolkit.ledger.sqlite import ITEM_COLUMNS, SCHEMA
from toolkit.provider import Contract, Job, JobStatus
from toolkit.runner import inputindex
from toolkit.runner.artifacts import stat_fields

PERMANENT_REASON = "poison: not-pdf: no %PDF- header"


def _content(number: int) -> bytes:
    return f"%PDF-1.4\n% resume benchmark input {number:07d}\n%%EOF\n".encode()


def resume_fixture(folder: Path, items: int, done_share: float = 0.99) -> tuple[Path, list[Path]]:
    """Inputs, artifacts and a ledger with ``done_share`` of ``items`` done, the rest
    ``failed(permanent)`` (quarantined poison): a batch with nothing left to execute.

    Returns (ledger path, input paths).
    """
    inputs_dir, out_dir = folder / "inputs", folder / "out"
    inputs_dir.mkdir(parents=True)
    out_dir.mkdir()
    done_count = round(items * done_share)
    keyer = task_keyer({})  # the runner's first route, options {}
    item_rows, event_rows, paths, index_lines = [], [], [], [inputindex.header(keyer.fingerprint)]
    ts = 1_700_000_000.0
    for number in range(items):
        data = _content(number)
        path = inputs_dir / f"doc-{number:07d}.pdf"
        path.write_bytes(data)
        paths.append(path)
        digest = hashlib.sha256(data).hexdigest()
        key = task_key(digest, {})
        index_lines.append(inputindex._line(inputindex.order(path),  # as the run that read it
                                            inputindex.stamp(os.stat(path)), digest, key))
        source = path.name
        row = dict.fromkeys(ITEM_COLUMNS)
        row.update(key=key, source=source, attempt=1, token=1, updated=ts)
        history = [("add", None, "pending", 0, 0, {"source": source, "digest": digest}),
                   ("claim", "pending", "pending", 0, 1, {"lease_owner": "w"})]
        if number < done_count:
            artifact = out_dir / f"doc-{number:07d}.{key[:8]}.pdf"
            artifact.write_bytes(data)  # the stub provider's artifact is the input itself
            fields = {"job_id": f"job-{number:07d}", "artifact_path": artifact.name,  # as stored:
                      # relative to the outputs root (``roots``), recorded below
                      "artifact_size": len(data), "artifact_sha256": digest,
                      **stat_fields(artifact)}  # as the runner records them at done
            row.update(state="done", **fields)
            history += [("move", "pending", "unknown", 1, 1, {"note": "intent"}),
                        ("move", "unknown", "submitted", 1, 1, {"job_id": fields["job_id"]}),
                        ("move", "submitted", "done", 1, 1, fields)]
        else:
            row.update(state="failed", attempt=0, failure="permanent", reason=PERMANENT_REASON)
            history += [("move", "pending", "failed", 0, 1,
                         {"failure": "permanent", "reason": PERMANENT_REASON})]
        history.append(("release", row["state"], row["state"], row["attempt"], 1,
                        {"lease_owner": None}))
        item_rows.append([row[name] for name in ITEM_COLUMNS])
        for op, frm, to, attempt, token, detail in history:
            event_rows.append((ts, op, key, frm, to, attempt, "w", token,
                               json.dumps(detail, sort_keys=True)))
    ledger = folder / "ledger.sqlite"
    db = sqlite3.connect(ledger, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("BEGIN")
    for statement in SCHEMA.strip().split(";"):
        if statement.strip():
            db.execute(statement)
    db.executemany(f"INSERT INTO items ({', '.join(ITEM_COLUMNS)}) VALUES "
                   f"({', '.join('?' * len(ITEM_COLUMNS))})", item_rows)
    db.executemany('INSERT INTO events (ts, op, key, frm, "to", attempt, worker, token, detail)'
                   " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", event_rows)
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    header, entries = index_lines[0], index_lines[1:]  # sealed in blocks, as a run keeps them
    Path(f"{ledger}{inputindex.SUFFIX}").write_text(
        header + inputindex.sealed(entries, keyer.fingerprint), encoding="utf-8")
    return ledger, paths


def record_roots(ledger: Path, fixture: Path) -> None:
    """The roots the earlier run recorded beside ``ledger`` (a copy of the fixture's ledger
    elsewhere): its outputs root, where the artifacts' relative paths lead."""
    roots.record(ledger, out=fixture / "out", inputs=fixture / "inputs")


class InstantProvider:
    """The provider interface, answering at once: the artifact is the input's bytes.

    Keeps a ``Job`` in memory only until its artifact is fetched: a real provider keeps
    its records in its own process, and a run's peak memory (section 7) is the runner's.
    A job it forgot is unknown to ``poll`` (``PermanentError``), as a real provider says.
    """

    def __init__(self):
        self.contract = Contract()
        self._jobs: dict[str, Job] = {}
        self._by_id: dict[str, tuple[Job, Path]] = {}
        self._count = 0

    def submit(self, key: str, document_path, options: dict, task_key: str | None = None) -> Job:
        if key in self._jobs:
            return self._jobs[key]
        data = Path(document_path).read_bytes()
        now = time.time()
        self._count += 1
        job = Job(f"job-{self._count:07d}", key, key.rpartition(":")[0], "-",
                  JobStatus.SUCCEEDED, None, None, str(document_path), len(data),
                  hashlib.sha256(data).hexdigest(), now, now)
        self._jobs[key] = job
        self._by_id[job.job_id] = (job, Path(document_path))
        return job

    def lookup(self, key: str) -> Job | None:
        return self._jobs.get(key)

    def poll(self, job_id: str) -> Job:
        if job_id not in self._by_id:
            raise PermanentError(f"unknown job {job_id}")
        return self._by_id[job_id][0]

    def fetch(self, job_id: str, dest_path) -> Job:
        job, source = self._by_id.pop(job_id)
        shutil.copyfile(source, dest_path)
        del self._jobs[job.idem_key]
        return job

    def close(self):
        pass


def tiny_pdfs(folder: Path, count: int) -> list[Path]:
    """``count`` distinct one-page PDFs that pass preflight (one rendering, varied tails)."""
    from toolkit import documents

    folder.mkdir(parents=True, exist_ok=True)
    base = documents.pdf_bytes(["Invoice 42: pump housing, delivery within 30 days."])
    paths = []
    for number in range(count):
        path = folder / f"doc-{number:06d}.pdf"
        path.write_bytes(base + f"%bench {number:06d}\n".encode())  # a comment after %%EOF
        paths.append(path)
    return paths


def batch_seconds(ledger, provider, out_dir: Path, inputs: list[Path],
                  clock=time.perf_counter) -> tuple[float, dict]:
    """Run the safe runner over ``inputs``; return (seconds by ``clock``, counts).

    ``time.process_time`` measures this process's CPU (a resume: what it computes, not
    what a loaded machine's other processes take from it); the default, wall time,
    counts the waits too (a durable ledger's fsyncs)."""
    from toolkit.runner import Runner

    runner = Runner(ledger, provider, out_dir, sleep=lambda seconds: None)
    start = clock()
    counts = runner.run(inputs)
    elapsed = clock() - start
    runner.close()
    return elapsed, counts


def tmpfs(fallback: Path, files: int) -> Path:
    """A tmpfs folder with room for ``files`` small files (creating 400,000 of them
    on a disk is setup time, not what we measure), else ``fallback``."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        free = os.statvfs(shm)
        if free.f_bavail * free.f_frsize > files * 8192 + (64 << 20):
            return shm
    return fallback
