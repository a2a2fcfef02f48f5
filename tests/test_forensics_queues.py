"""The audit on databases that real queue and task libraries wrote, in the test.

litequeue, persist-queue's SQLiteAckQueue and Celery's database result backend
each write their own file here, through their own API, in a real process that
then dies the way workers die (SIGKILL with a message taken, a Celery worker
killed mid-task). Every expectation below is written by hand from what the
test did to the queue: which message was taken, finished, failed, left.
"""

import json
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from toolkit.forensics import ACTIONS, audit

NOW = 4_000_000_000.0  # long after every timestamp written here: no lease is live
# A done whose format records no artifact: issue 22 gives it the `verify` action (the
# person checks the output); before that plan rule exists, it is `reconcile`.
FOREIGN_DONE = "verify" if "verify" in ACTIONS else "reconcile"


def run_child(code: str, *args, expect_kill=True) -> str:
    """Run ``code`` in a fresh Python; it prints what it did and, when ``expect_kill``,
    dies by a real SIGKILL with its connection open (nothing closed, nothing flushed)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == (-signal.SIGKILL if expect_kill else 0), done.stderr
    return done.stdout


def snapshot(folder: Path) -> dict:
    return {path.name: path.read_bytes() if path.is_file() else "folder"
            for path in sorted(folder.iterdir())}


def table(report) -> dict:
    """{key: (state, raw_state, source, action)} for every item (a missing source is None,
    whatever missing value pandas chose for the column)."""
    items = report.items
    return {key: (state, raw, source if isinstance(source, str) else None, action)
            for key, state, raw, source, action
            in zip(items["key"], items["state"], items["raw_state"], items["source"],
                   items["action"])}


def kinds(report) -> list:
    return [(a.key, a.kind) for a in report.anomalies]


def counts(**given):
    return {**dict.fromkeys(("pending", "unknown", "submitted", "done", "failed",
                             "needs_review", "cancelled", "partial"), 0), **given}


def plan(**given):
    return {**dict.fromkeys(ACTIONS, 0), **given}


LITEQUEUE_WORKER = """
    import json, os, signal, sys
    from litequeue import LiteQueue
    q = LiteQueue(sys.argv[1])
    ids = {}
    for data in ('{"file": "contracts/a.pdf"}', "contracts/b.pdf", '{"file": "contracts/c.pdf"}',
                 "contracts/d.pdf", '{"source": "contracts/e.pdf", "sha256": "abc"}'):
        ids[data] = q.put(data).message_id
    first = q.pop(); q.done(first.message_id)               # a.pdf: finished
    second = q.pop(); q.mark_failed(second.message_id)      # b.pdf: failed
    third = q.pop()                                         # c.pdf: taken ...
    print(json.dumps(ids), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)                    # ... and the worker dies
"""


@pytest.mark.slow
def test_litequeue_worker_killed_holding_a_message_leaves_it_locked_and_audited_unknown(tmp_path):
    """A litequeue worker pops a message and is SIGKILLed before done(): the row stays
    LOCKED and the WAL stays beside the file. The audit reads it (from a private copy,
    the file and its WAL untouched) and must say: LOCKED is unknown (look up first),
    DONE done without an artifact, FAILED failed (a person reviews), READY pending (run)."""
    folder = tmp_path / "q"
    folder.mkdir()
    db = folder / "queue.sqlite3"
    ids = json.loads(run_child(LITEQUEUE_WORKER, db))
    a, b, c, d, e = ids.values()
    assert (folder / "queue.sqlite3-wal").exists()  # the dead writer's WAL is the evidence
    before = snapshot(folder)

    report = audit(db, now=NOW)

    assert snapshot(folder) == before  # nothing written, created or removed beside it
    assert report.format == "litequeue"
    assert table(report) == {
        a: ("done", "DONE", "contracts/a.pdf", FOREIGN_DONE),
        b: ("failed", "FAILED", "contracts/b.pdf", "review"),
        c: ("unknown", "LOCKED", "contracts/c.pdf", "reconcile"),
        d: ("pending", "READY", "contracts/d.pdf", "run"),
        e: ("pending", "READY", "contracts/e.pdf", "run"),
    }
    assert kinds(report) == [(a, "done_without_artifact"), (c, "stuck_unknown")]  # uuid7: a < c
    assert report.by_state == counts(pending=2, unknown=1, done=1, failed=1)
    expected = plan(run=2, reconcile=1, review=1)
    expected[FOREIGN_DONE] += 1
    assert report.plan == expected
    stuck = next(x for x in report.anomalies if x.kind == "stuck_unknown")
    assert "recorded as 'LOCKED'" in stuck.detail
    assert report.items.set_index("key").loc[e, "input_digest"] == "abc"


LITEQUEUE_JOBS = """
    import sys
    from litequeue import LiteQueue
    q = LiteQueue(sys.argv[1], queue_name="jobs")
    print(q.put("contracts/a.pdf").message_id)
    q.close()
"""


def test_litequeue_named_jobs_is_litequeue_and_rows_outside_its_states_are_corrupt(tmp_path):
    """A litequeue whose queue is named ``jobs`` must not be taken for the ``sqlite-jobs``
    format (exact table shapes are tried first). Rows no litequeue writes (a status outside
    MessageStatus, a second row for one message_id, added here by plain SQL) are reported
    on their keys; the message with two rows goes to a person (review)."""
    db = tmp_path / "jobs.db"
    key = run_child(LITEQUEUE_JOBS, db, expect_kill=False).strip()
    con = sqlite3.connect(db)
    con.execute("INSERT INTO jobs VALUES ('x.pdf', 'bad-status', 7, 1, NULL, NULL)")
    con.execute("INSERT INTO jobs SELECT data, message_id, 2, in_time, 1, 2 FROM jobs "
                "WHERE message_id = ?", (key,))
    con.commit()
    con.close()

    report = audit(db, now=NOW)

    assert report.format == "litequeue"
    assert key < "bad-status"  # uuid7 of now: its hex starts with 0
    assert kinds(report) == [(key, "duplicate_key"), (key, "done_without_artifact"),
                             ("bad-status", "corrupt_record")]
    assert table(report) == {key: ("done", "DONE", "contracts/a.pdf", "review")}


PERSIST_WORKER = """
    import os, signal, sys
    from persistqueue import SQLiteAckQueue
    from persistqueue.serializers import json as as_json
    q = SQLiteAckQueue(sys.argv[1], serializer=as_json)
    for name in "abcde":
        q.put({"file": f"scans/{name}.pdf"})
    q.ack(q.get())             # _id 1 a.pdf: acked
    q.ack_failed(q.get())      # _id 2 b.pdf: ack_failed
    held = q.get()             # _id 3 c.pdf: unack, held when the worker dies
    q.nack(q.get())            # _id 4 d.pdf: back to ready
    # _id 5 e.pdf: never taken (inited)
    os.kill(os.getpid(), signal.SIGKILL)
"""
PERSIST_REOPEN = """
    import sys
    from persistqueue import SQLiteAckQueue
    from persistqueue.serializers import json as as_json
    SQLiteAckQueue(sys.argv[1], serializer=as_json).close()  # auto_resume=True, the default
"""


@pytest.mark.slow
def test_persist_queue_unack_row_of_a_killed_worker_is_unknown_until_a_reopen_erases_it(tmp_path):
    """A SQLiteAckQueue worker is SIGKILLed holding an unacked item. The audit reads the
    file without opening it through persist-queue and must say: unack unknown, acked done,
    ack_failed failed, ready and inited pending. Then the queue is reopened the way the
    library does by default (auto_resume): the same item now reads ``ready``, which is why
    the audit never opens a queue with its library."""
    path = tmp_path / "pq"
    run_child(PERSIST_WORKER, path)
    db = path / "data.db"
    before = snapshot(path)

    report = audit(db, now=NOW)

    assert snapshot(path) == before
    assert report.format == "persist-queue"
    assert table(report) == {
        "1": ("done", "acked", "scans/a.pdf", FOREIGN_DONE),
        "2": ("failed", "ack_failed", "scans/b.pdf", "review"),
        "3": ("unknown", "unack", "scans/c.pdf", "reconcile"),
        "4": ("pending", "ready", "scans/d.pdf", "run"),
        "5": ("pending", "inited", "scans/e.pdf", "run"),
    }
    assert kinds(report) == [("1", "done_without_artifact"), ("3", "stuck_unknown")]
    assert report.by_state == counts(pending=2, unknown=1, done=1, failed=1)
    expected = plan(run=2, reconcile=1, review=1)
    expected[FOREIGN_DONE] += 1
    assert report.plan == expected

    run_child(PERSIST_REOPEN, path, expect_kill=False)
    reopened = table(audit(db, now=NOW))
    assert reopened["3"] == ("pending", "ready", "scans/c.pdf", "run")  # the evidence is gone


PICKLE_WORKER = """
    import os, sys
    from persistqueue import SQLiteAckQueue
    from persistqueue.serializers import json as as_json

    class Trap:
        def __reduce__(self):  # unpickling this calls os.mkdir(marker)
            return (os.mkdir, (sys.argv[2],))

    q = SQLiteAckQueue(sys.argv[1])  # the default serializer: pickle
    q.put({"file": "scans/a.pdf"})
    q.ack(q.get())
    q.put(Trap())
    q.put(Trap())
    q.close()
    other = SQLiteAckQueue(sys.argv[1], name="other", serializer=as_json)  # same data.db
    other.put("scans/z.pdf")
    other.close()
"""


def test_pickled_payloads_are_reported_opaque_and_never_unpickled(tmp_path):
    """persist-queue pickles its payloads by default; two of them here are pickles whose
    unpickling creates a folder (a second, JSON queue shares the file). The audit must report them as opaque and leave the
    folder uncreated (an audit never runs code from the file it audits); unpickling one
    by hand then creates it, so the trap is live."""
    path, marker = tmp_path / "pq", tmp_path / "UNPICKLED"
    run_child(PICKLE_WORKER, path, marker, expect_kill=False)
    db = path / "data.db"

    report = audit(db, now=NOW)

    assert not marker.exists()
    assert table(report) == {  # two queues in one data.db: keys name their queue
        "default:1": ("done", "acked", None, FOREIGN_DONE),
        "default:2": ("pending", "inited", None, "run"),
        "default:3": ("pending", "inited", None, "run"),
        "other:1": ("pending", "inited", "scans/z.pdf", "run")}
    assert kinds(report) == [(None, "opaque_payload"), ("default:1", "done_without_artifact")]
    opaque = report.anomalies[0].detail
    assert ("ack_queue_default: 3 of 3 rows hold payload: a pickle "
            "(default:1, default:2, default:3)") in opaque
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)  # the control: the payload runs code
    blob = con.execute("SELECT data FROM ack_queue_default WHERE _id = 2").fetchone()[0]
    con.close()
    pickle.loads(blob)
    assert marker.is_dir()


CELERY_TASKS = """
    import hashlib, os, time
    from celery import Celery

    HERE = os.environ["QUEUE_TEST_DIR"]
    app = Celery("queue_tasks")
    app.conf.update(
        broker_url="filesystem://",
        broker_transport_options={"data_folder_in": f"{HERE}/broker",
                                  "data_folder_out": f"{HERE}/broker",
                                  "processed_folder": f"{HERE}/broker", "store_processed": False,
                                  "control_folder": f"{HERE}/control"},
        result_backend=f"db+sqlite:///{HERE}/results.db",
        task_track_started=True, result_extended=True,
    )

    @app.task
    def convert(name):
        body = f"text of {name}".encode()
        out = name.replace(".pdf", ".txt")
        with open(os.path.join(HERE, "out", out), "wb") as handle:
            handle.write(body)
        return {"output": out, "size": len(body), "sha256": hashlib.sha256(body).hexdigest()}

    @app.task
    def broken(name):
        raise ValueError(f"cannot read {name}")

    @app.task(bind=True)
    def flaky(self, name):
        raise self.retry(countdown=3600, exc=ConnectionError("provider timeout"))

    @app.task
    def hang(name):
        while True:  # the worker is killed here
            time.sleep(0.05)
"""


def _wait_statuses(db: Path, wanted: dict, worker, deadline: float):
    """Until every task of ``wanted`` (task id -> status) has its status in ``db``."""
    while time.monotonic() < deadline and worker.poll() is None:
        if db.exists():
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            try:
                rows = dict(con.execute("SELECT task_id, status FROM celery_taskmeta"))
            except sqlite3.OperationalError:
                rows = {}  # the backend has not created its tables yet
            finally:
                con.close()
            if all(rows.get(task) == status for task, status in wanted.items()):
                return
        time.sleep(0.1)
    raise AssertionError(f"tasks never reached {wanted} (worker exit {worker.poll()})")


@pytest.fixture(scope="module")
def celery_db(tmp_path_factory):
    """A real ``celery worker -P solo`` with task_track_started runs five tasks and is
    SIGKILLed inside the last; a PENDING row is stored through the backend itself.
    Returns (results.db, outputs folder, {input name: task id})."""
    pytest.importorskip("celery")
    here = tmp_path_factory.mktemp("celery")
    (here / "broker").mkdir()
    (here / "out").mkdir()
    (here / "queue_tasks.py").write_text(textwrap.dedent(CELERY_TASKS))
    env = {**os.environ, "QUEUE_TEST_DIR": str(here),
           "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    sys.path.insert(0, str(here))
    os.environ["QUEUE_TEST_DIR"] = str(here)
    try:
        import datetime

        import queue_tasks as tasks
        from celery import states
        from celery.app.task import Context

        sent = {"a.pdf": tasks.convert.delay("a.pdf"), "b.pdf": tasks.broken.delay("b.pdf"),
                "c.pdf": tasks.flaky.delay("c.pdf"),
                "d.pdf": tasks.convert.apply_async(("d.pdf",), expires=datetime.datetime.now(
                    datetime.UTC) - datetime.timedelta(minutes=1))}  # expired: REVOKED
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "queue_tasks", "worker", "-P", "solo",
             "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "critical"],
            cwd=here, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # The hanging task only once the others are settled: the filesystem broker does
            # not keep the order of messages sent within one clock tick (CI, 2026-12-02: the
            # worker took the hanging one first and never ran two of the others).
            _wait_statuses(here / "results.db", {
                sent["a.pdf"].id: "SUCCESS", sent["b.pdf"].id: "FAILURE",
                sent["c.pdf"].id: "RETRY", sent["d.pdf"].id: "REVOKED"}, worker,
                time.monotonic() + 120)
            sent["e.pdf"] = tasks.hang.delay("e.pdf")
            _wait_statuses(here / "results.db", {sent["e.pdf"].id: "STARTED"}, worker,
                           time.monotonic() + 120)
        finally:
            worker.kill()  # SIGKILL: mid-task, as a worker dies
            worker.wait()
        pending = str(uuid.UUID(int=6))
        tasks.app.backend.store_result(pending, None, states.PENDING, request=Context(
            args=["f.pdf"], kwargs={}, task="queue_tasks.convert", retries=0,
            delivery_info={"routing_key": "celery"}))
        ids = {name: result.id for name, result in sent.items()} | {"f.pdf": pending}
    finally:
        sys.path.remove(str(here))
        sys.modules.pop("queue_tasks", None)
    return here / "results.db", here / "out", ids


@pytest.mark.slow
def test_celery_worker_killed_mid_task_leaves_started_which_audits_as_unknown(celery_db):
    """A Celery worker is SIGKILLed while a task runs under task_track_started: its row
    stays STARTED. The audit must say: STARTED unknown (look up first), SUCCESS done and,
    with the outputs folder, verified (skip), FAILURE failed (review, with the exception),
    RETRY a transient failure (retry), REVOKED cancelled (skip), PENDING pending (run)."""
    db, out, ids = celery_db
    before = snapshot(db.parent)

    report = audit(db, artifacts=out, now=NOW)

    assert snapshot(db.parent) == before
    assert report.format == "celery-db"
    assert table(report) == {
        ids["a.pdf"]: ("done", "SUCCESS", "a.pdf", "skip"),
        ids["b.pdf"]: ("failed", "FAILURE", "b.pdf", "review"),
        ids["c.pdf"]: ("failed", "RETRY", "c.pdf", "retry"),
        ids["d.pdf"]: ("cancelled", "REVOKED", "d.pdf", "skip"),
        ids["e.pdf"]: ("unknown", "STARTED", "e.pdf", "reconcile"),
        ids["f.pdf"]: ("pending", "PENDING", "f.pdf", "run"),
    }
    assert kinds(report) == [(ids["e.pdf"], "stuck_unknown")]
    assert report.by_state == counts(pending=1, unknown=1, done=1, failed=2, cancelled=1)
    assert report.plan == plan(skip=2, review=1, retry=1, reconcile=1, run=1)
    items = report.items.set_index("key")
    assert items.loc[ids["b.pdf"], "reason"] == "ValueError: cannot read b.pdf"
    assert items.loc[ids["c.pdf"], "failure"] == "transient"
    assert items.loc[ids["a.pdf"], "artifact_path"] == "a.txt"


@pytest.mark.slow
def test_celery_done_whose_output_was_lost_is_not_skipped(celery_db, tmp_path):
    """The same database, audited against an outputs folder that lacks a.txt: the done
    task's artifact is missing, so it must not be skipped."""
    db, _, ids = celery_db
    report = audit(db, artifacts=tmp_path, now=NOW)
    assert (ids["a.pdf"], "artifact_missing") in kinds(report)
    assert table(report)[ids["a.pdf"]][3] != "skip"


@pytest.mark.slow
def test_auditing_library_databases_imports_none_of_the_libraries(celery_db, tmp_path):
    """The adapters read SQL: auditing a Celery, a persist-queue and a litequeue file in a
    fresh process must load neither celery, sqlalchemy, kombu, persistqueue nor litequeue."""
    from litequeue import LiteQueue
    from persistqueue import SQLiteAckQueue

    pq = SQLiteAckQueue(str(tmp_path / "pq"))
    pq.put({"file": "a.pdf"})
    pq.close()
    (tmp_path / "lq").mkdir()
    lq = LiteQueue(tmp_path / "lq" / "q.db")
    lq.put("a.pdf")
    lq.close()
    code = ("import sys\nfrom toolkit.forensics import audit\n"
            "print([audit(p).format for p in sys.argv[1:]])\n"
            "print([m for m in ('celery', 'sqlalchemy', 'kombu', 'persistqueue', 'litequeue')"
            " if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code, str(celery_db[0]),
                           str(tmp_path / "pq" / "data.db"), str(tmp_path / "lq" / "q.db")],
                          capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["['celery-db', 'persist-queue', 'litequeue']", "[]"]


class Trap:
    """Unpickling this creates the folder it names: a visible side effect."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_celery_pickled_result_is_opaque_and_a_custom_state_is_unknown(tmp_path):
    """A Celery app with ``result_serializer='pickle'`` stores a SUCCESS whose result is a
    pickle that would create a folder, a task's ``update_state(state='PROGRESS')`` (what
    it does: ``backend.store_result``) and a failure (``mark_as_failure``, as the worker
    does). The audit must report the results opaque and leave the folder uncreated, read
    the SUCCESS as done without an artifact, the custom state as unknown (the task had not
    finished), and the failure's reason from its stored traceback."""
    celery = pytest.importorskip("celery")
    marker = tmp_path / "UNPICKLED"
    app = celery.Celery("pickled", broker="memory://",
                        backend=f"db+sqlite:///{tmp_path / 'results.db'}")
    app.conf.update(result_serializer="pickle", result_accept_content=["pickle", "json"])
    done, running = str(uuid.UUID(int=1)), str(uuid.UUID(int=2))
    app.backend.store_result(done, Trap(marker), "SUCCESS")
    app.backend.store_result(running, {"page": 3}, "PROGRESS")
    failed = str(uuid.UUID(int=3))
    app.backend.mark_as_failure(failed, ValueError("cannot read x.pdf"), traceback=(
        'Traceback (most recent call last):\n  File "t.py", line 1\n'
        "ValueError: cannot read x.pdf\n"))

    report = audit(tmp_path / "results.db", now=NOW)

    assert not marker.exists()
    assert table(report) == {done: ("done", "SUCCESS", None, FOREIGN_DONE),
                             running: ("unknown", "PROGRESS", None, "reconcile"),
                             failed: ("failed", "FAILURE", None, "review")}
    assert kinds(report) == [(None, "opaque_payload"), (done, "done_without_artifact"),
                             (running, "stuck_unknown")]
    assert "3 of 3 rows hold result: a pickle" in report.anomalies[0].detail
    reasons = dict(zip(report.items["key"], report.items["reason"]))
    assert reasons[failed] == "ValueError: cannot read x.pdf"  # from the stored traceback
    con = sqlite3.connect(f"file:{tmp_path / 'results.db'}?mode=ro", uri=True)
    blob = con.execute("SELECT result FROM celery_taskmeta WHERE task_id = ?", (done,)).fetchone()
    con.close()
    pickle.loads(blob[0])  # the control: the stored result really runs code
    assert marker.is_dir()
