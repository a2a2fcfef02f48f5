"""Faults an outside tester found in the audit of queue libraries' databases: a symlink
to a file with a dead writer's WAL, a Celery SUCCESS naming an artifact nobody checked,
Celery states of any spelling, text cells that are not UTF-8, tables beside the queue,
a full disk under the private copy. Every database is written by the library itself
(a row or cell no library writes is added by plain SQL, and says so)."""

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid

import pytest
from test_forensics_queues import (
    FOREIGN_DONE,
    LITEQUEUE_WORKER,
    NOW,
    PERSIST_WORKER,
    kinds,
    run_child,
    snapshot,
    table,
)

from toolkit.forensics import audit


LEDGER_WRITER = """
    import os, signal, sys
    from toolkit.ledger import open_ledger
    ledger = open_ledger(sys.argv[1])
    for n in range(5):
        ledger.add(f"k{n}", source=f"d{n}.pdf")
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_symlink_to_a_sqlite_file_with_a_dead_writers_wal_is_audited_through_that_wal(
        tmp_path):
    """A litequeue worker, a persist-queue worker and a writer of the toolkit's own SQLite
    ledger are SIGKILLed: their WAL (holding every row) stays beside the real file. Audited through a same-folder relative alias, a relative
    link from another folder and an absolute link, the report must equal the one of the
    real path (the -wal beside the link's name does not exist; the one beside its target
    does), and nothing is created beside either."""
    lq, pq, own, links = (tmp_path / name for name in ("lq", "pq", "own", "links"))
    for folder in (lq, own, links):
        folder.mkdir()
    run_child(LITEQUEUE_WORKER, lq / "q.db")
    run_child(PERSIST_WORKER, pq)
    run_child(LEDGER_WRITER, own / "l.sqlite")
    formats = {lq: "litequeue", pq: "persist-queue", own: "toolkit-sqlite"}
    for real in (lq / "q.db", pq / "data.db", own / "l.sqlite"):
        assert os.path.exists(f"{real}-wal")
        (real.parent / "alias.db").symlink_to(real.name)  # relative, same folder
        (links / f"rel-{real.parent.name}").symlink_to(os.path.relpath(real, links))
        (links / f"abs-{real.parent.name}").symlink_to(real)
        before = snapshot(real.parent), snapshot(links)
        expected = table(audit(real, now=NOW))
        assert len(expected) == 5
        for link in (real.parent / "alias.db", links / f"rel-{real.parent.name}",
                     links / f"abs-{real.parent.name}"):
            report = audit(link, now=NOW)
            assert report.format == formats[real.parent]
            assert table(report) == expected, link
        assert (snapshot(real.parent), snapshot(links)) == before


def _celery_app(db):
    celery = pytest.importorskip("celery")
    return celery.Celery("faults", broker="memory://", backend=f"db+sqlite:///{db}")


def test_celery_success_naming_an_artifact_is_verify_not_skip_without_an_artifacts_folder(
        tmp_path):
    """A Celery SUCCESS whose result names output/size/sha256 (here a file that does not
    exist and a bogus digest) is audited without --artifacts: nothing was checked, so it
    must be ``verify`` (never ``skip``: skip means verified). With the folder, the missing
    file is ``review``; with the real file it is ``skip`` (the check can pass)."""
    app = _celery_app(tmp_path / "results.db")
    body = b"text of a.pdf"
    good, bogus = str(uuid.UUID(int=1)), str(uuid.UUID(int=2))
    app.backend.store_result(good, {"output": "a.txt", "size": len(body),
                                    "sha256": hashlib.sha256(body).hexdigest()}, "SUCCESS")
    app.backend.store_result(bogus, {"output": "gone.txt", "size": 7, "sha256": "0" * 64},
                             "SUCCESS")
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").write_bytes(body)

    blind = audit(tmp_path / "results.db", now=NOW)
    assert {key: row[3] for key, row in table(blind).items()} == {good: "verify",
                                                                  bogus: "verify"}
    assert kinds(blind) == [(good, "done_without_artifact"), (bogus, "done_without_artifact")]
    assert "not checked" in blind.anomalies[0].detail
    # Outsider o32 P8: its why said "the format records no artifact to check" beside a
    # finding naming the artifact recorded; now one line true for both, naming what to do.
    assert all("records no artifact" not in why and "--artifacts" in why
               for why in blind.items["why"])

    checked = audit(tmp_path / "results.db", artifacts=out, now=NOW)
    assert {key: row[3] for key, row in table(checked).items()} == {good: "skip",
                                                                    bogus: "review"}
    assert kinds(checked) == [(bogus, "artifact_missing")]


CUSTOM_STATES = ("Processing", "progress", "started", "page-3", "", "état", "SUCCESS ")


def test_celery_custom_states_of_any_spelling_stay_items_planned_unknown(tmp_path):
    """``update_state`` stores any string as a task's state (Celery's own backend does it
    here): not all-caps, with a dash, empty, accented, with a trailing space. Each must stay
    an item, ``unknown`` (the task had not finished) with its word as raw_state, planned
    ``reconcile``; none is a corrupt_record."""
    app = _celery_app(tmp_path / "results.db")
    ids = {}
    for number, state in enumerate(CUSTOM_STATES, 1):
        ids[state] = str(uuid.UUID(int=number))
        app.backend.store_result(ids[state], {"page": number}, state)

    report = audit(tmp_path / "results.db", now=NOW)

    assert table(report) == {ids[state]: ("unknown", state, None, "reconcile")
                             for state in CUSTOM_STATES}
    assert {kind for _, kind in kinds(report)} == {"stuck_unknown"}
    assert report.by_state["unknown"] == len(CUSTOM_STATES)


LITEQUEUE_PUTS = """
    import sys
    from litequeue import LiteQueue
    q = LiteQueue(sys.argv[1])
    for name in ("a.pdf", "b.pdf", "c.pdf"):
        print(q.put(name).message_id)
    q.close()
"""
PERSIST_PUTS = """
    import sys
    from persistqueue import SQLiteAckQueue
    from persistqueue.serializers import json as as_json
    q = SQLiteAckQueue(sys.argv[1], serializer=as_json)
    for name in ("a.pdf", "b.pdf"):
        q.put({"file": name})
    q.close()
"""
LATIN1 = "X'636166e92e706466'"  # 'café.pdf' in Latin-1: not UTF-8


def _sql(db, *statements):
    con = sqlite3.connect(db)
    for statement in statements:
        con.execute(statement)
    con.commit()
    con.close()


def test_text_cells_that_are_not_utf8_are_opaque_and_every_other_item_is_audited(tmp_path):
    """One TEXT cell in Latin-1 (set by plain SQL in files litequeue, persist-queue and
    Celery wrote: a litequeue payload and message_id, a persist-queue payload, a Celery
    traceback) made the whole database unauditable. The bad payload must be reported
    opaque, the bad key kept with its byte escaped, and every other item audited."""
    lq = tmp_path / "lq.db"
    a, b, c = run_child(LITEQUEUE_PUTS, lq, expect_kill=False).split()
    _sql(lq, f"UPDATE Queue SET data = CAST({LATIN1} AS TEXT) WHERE message_id = '{a}'",
         f"UPDATE Queue SET message_id = CAST(X'{b.encode().hex()}ff' AS TEXT) "
         f"WHERE message_id = '{b}'")
    report = audit(lq, now=NOW)
    assert table(report) == {a: ("pending", "READY", None, "run"),
                             b + "\\xff": ("pending", "READY", "b.pdf", "run"),
                             c: ("pending", "READY", "c.pdf", "run")}
    assert kinds(report) == [(None, "opaque_payload")]

    run_child(PERSIST_PUTS, tmp_path / "pq", expect_kill=False)
    _sql(tmp_path / "pq" / "data.db",
         f"UPDATE ack_queue_default SET data = CAST({LATIN1} AS TEXT) WHERE _id = 1")
    report = audit(tmp_path / "pq" / "data.db", now=NOW)
    assert table(report) == {"1": ("pending", "inited", None, "run"),
                             "2": ("pending", "inited", "b.pdf", "run")}
    assert "1 of 2 rows hold payload: binary" in report.anomalies[0].detail

    app = _celery_app(tmp_path / "results.db")
    failed, done = str(uuid.UUID(int=1)), str(uuid.UUID(int=2))
    app.backend.mark_as_failure(failed, ValueError("cannot read x.pdf"),
                                traceback="Traceback\nValueError: cannot read x.pdf\n")
    app.backend.store_result(done, {"pages": 1}, "SUCCESS")
    _sql(tmp_path / "results.db", "UPDATE celery_taskmeta SET traceback = CAST("
         f"X'{b'ValueError: caf'.hex()}e9' AS TEXT) WHERE task_id = '{failed}'")
    report = audit(tmp_path / "results.db", now=NOW)
    assert table(report) == {failed: ("failed", "FAILURE", None, "review"),
                             done: ("done", "SUCCESS", None, FOREIGN_DONE)}


PERSIST_MIXED = """
    import sys
    from persistqueue import SQLiteAckQueue, SQLiteQueue
    from persistqueue.serializers import json as as_json
    ack = SQLiteAckQueue(sys.argv[1], serializer=as_json)
    ack.put({"file": "a.pdf"})
    ack.close()
    plain = SQLiteQueue(sys.argv[1], name="plain", serializer=as_json, auto_commit=True)
    plain.put({"file": "p.pdf"})
    plain.close()
"""
LITEQUEUE_BESIDE = """
    import sys
    from litequeue import LiteQueue
    LiteQueue(sys.argv[1]).put("l.pdf")
"""


def test_queue_tables_the_audit_does_not_read_are_reported_never_silent(tmp_path):
    """persist-queue writes a plain SQLiteQueue (queue_plain) into the data.db of an ack
    queue, then litequeue adds its table to the same file. The audit reads one format; every
    other table must be named in an ``unaudited_table`` finding, never dropped in silence."""
    folder = tmp_path / "pq"
    run_child(PERSIST_MIXED, folder, expect_kill=False)
    db = folder / "data.db"

    report = audit(db, now=NOW)
    assert report.format == "persist-queue"
    assert table(report) == {"1": ("pending", "inited", "a.pdf", "run")}
    assert kinds(report) == [(None, "unaudited_table")]
    assert report.anomalies[0].detail.endswith("not audited (not of this format): "
                                               "queue_plain; audit them apart")

    run_child(LITEQUEUE_BESIDE, db, expect_kill=False)
    report = audit(db, now=NOW)
    assert report.format == "litequeue"
    assert [row[2] for row in table(report).values()] == ["l.pdf"]
    assert kinds(report) == [(None, "unaudited_table")]
    assert "ack_queue_default, queue_plain;" in report.anomalies[0].detail


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_full_disk_during_the_private_copy_is_a_storage_error_not_a_format_list(tmp_path):
    """A killed litequeue writer leaves a WAL, so the audit copies the file privately; the
    kernel answers ENOSPC to that copy (strace injects it into sendfile, which only the
    copy calls). The audit must fail with one line naming the full disk (TMPDIR, where the
    copy is made), exit 1 as every storage failure, without the list of supported formats
    (the file IS one of them), and leave the queue unchanged."""
    folder = tmp_path / "q"
    folder.mkdir()
    run_child(LITEQUEUE_WORKER, folder / "q.db")
    before = snapshot(folder)
    command = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=sendfile",
               "-e", "inject=sendfile:error=ENOSPC", sys.executable, "-m", "toolkit", "audit",
               str(folder / "q.db")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "No space left on device" in line and "TMPDIR" in line
    assert "supported" not in line
    assert snapshot(folder) == before
