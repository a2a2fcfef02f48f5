"""A batch folder copied elsewhere (outsider o32 P2): the witness entries in the copy's --out
name the original ledger's real path, so they do not know the copy's ledger. Emptied or
deleted there, the ledger would start an empty history; the roots file the batch's first
run wrote beside it (``<ledger>.roots.json``) still says runs used it. Real runs (processes)
on real files, against a non-idempotent provider whose counters say whether any document
ran twice."""

import os
import shutil

import pytest

from conftest import run_cli
from test_witness_ledger import _run_args, doubles
from toolkit.documents import make_corpus

pytestmark = pytest.mark.slow


def _copied_batch(tmp_path, suffix):
    """A finished batch in ``orig/`` (ledger, roots file, --out), copied to ``copy/`` as a
    user makes a working copy; the provider is the same one."""
    orig = tmp_path / "orig"
    make_corpus(orig / "in", docs=4, poison=0, seed=11)
    ledger = orig / f"b{suffix}"
    first = run_cli(*_run_args(tmp_path, ledger, inputs="orig/in", out="orig/out"))
    assert first.returncode == 0, first.stderr
    shutil.copytree(orig, tmp_path / "copy", symlinks=True)
    return tmp_path / "copy" / f"b{suffix}"


@pytest.mark.parametrize("how", ["emptied", "deleted"])
def test_jsonl_ledger_emptied_in_a_copied_batch_is_made_anew_marked_and_runs_nothing_twice(
        tmp_path, how):
    ledger = _copied_batch(tmp_path, ".jsonl")
    if how == "emptied":
        ledger.write_bytes(b"")
    else:
        ledger.unlink()
    for name in os.listdir(tmp_path / "copy" / "out"):  # outputs gone too: only lookups help
        if name.endswith(".pdf"):
            os.unlink(tmp_path / "copy" / "out" / name)
    rerun = run_cli(*_run_args(tmp_path, ledger, inputs="copy/in", out="copy/out"))
    assert rerun.returncode == 0, rerun.stderr
    assert doubles(tmp_path) == 0
    assert b'"salvaged"' in ledger.read_bytes().split(b"\n", 1)[0]  # marked: looked up first


def test_sqlite_ledger_emptied_in_a_copied_batch_is_refused_then_salvaged_with_no_double(
        tmp_path):
    ledger = _copied_batch(tmp_path, ".sqlite")
    for side in ("-wal", "-shm"):
        (tmp_path / "copy" / f"b.sqlite{side}").unlink(missing_ok=True)
    ledger.write_bytes(b"")
    refused = run_cli(*_run_args(tmp_path, ledger, inputs="copy/in", out="copy/out"))
    assert refused.returncode == 2 and "--salvage" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and doubles(tmp_path) == 0
    new = tmp_path / "copy" / "new.sqlite"
    salvaged = run_cli("ledger", ledger, "--salvage", new, "--out", tmp_path / "copy" / "out")
    assert salvaged.returncode == 0, salvaged.stderr
    rerun = run_cli(*_run_args(tmp_path, new, inputs="copy/in", out="copy/out"))
    assert rerun.returncode == 0, rerun.stderr
    assert doubles(tmp_path) == 0


def test_audit_of_a_ledger_emptied_beside_its_roots_file_says_its_history_was_lost(tmp_path):
    """Outsider o32 P2, the audit's half: it said "empty, 0 items" and nothing else. Must
    hold: a note names the roots file and what run will do; a ledger with no roots file
    beside it (a new one) gets no such note."""
    from toolkit.forensics import audit

    for name in ("emptied.jsonl", "emptied.sqlite", "new.jsonl"):
        (tmp_path / name).write_bytes(b"")
    for name in ("emptied.jsonl", "emptied.sqlite"):
        (tmp_path / f"{name}.roots.json").write_text('{"out": "out"}')
    for name in ("emptied.jsonl", "emptied.sqlite"):
        (note,) = [n for n in audit(tmp_path / name).notes if n.startswith("no_history")]
        assert f"{name}.roots.json" in note and "salvage" in note
    assert not [n for n in audit(tmp_path / "new.jsonl").notes if n.startswith("no_history")]


def test_sqlite_ledger_with_every_row_deleted_and_no_witness_is_marked_and_runs_nothing_twice(
        tmp_path):
    """Outsider o35 S2. Fault: a finished SQLite batch, its witness deleted, then every row of
    its ledger deleted (`delete from events; delete from items`): the file keeps its tables and
    read as a fresh ledger (20 of 20 ran twice). Property: a ledger with no row whose roots
    file is beside it is marked salvaged in place, as a JSONL one is made anew marked: every
    request looked up first, none run twice; the rerun is not refused."""
    import sqlite3

    make_corpus(tmp_path / "in", docs=4, poison=0, seed=12)
    ledger = tmp_path / "L.sqlite"
    assert run_cli(*_run_args(tmp_path, ledger)).returncode == 0
    (tmp_path / "out" / ".witness.json").unlink()
    with sqlite3.connect(ledger) as db:
        db.execute("DELETE FROM events")
        db.execute("DELETE FROM items")
    for name in os.listdir(tmp_path / "out"):  # outputs gone too: only lookups help
        if name.endswith(".pdf"):
            os.unlink(tmp_path / "out" / name)
    rerun = run_cli(*_run_args(tmp_path, ledger))
    assert rerun.returncode == 0, rerun.stderr
    assert doubles(tmp_path) == 0
    with sqlite3.connect(ledger) as db:
        assert db.execute("SELECT count(*) FROM meta WHERE name = 'salvaged'").fetchone() == (1,)


def test_sqlite_first_run_killed_before_its_first_event_reruns_without_refusal(tmp_path):
    """The same rule must not refuse a legitimate rerun: a first run on a new SQLite ledger
    SIGKILLed before its first intent (tables made, roots file written, no row) runs on:
    every document done, none twice (nothing was sent: no mark either,
    ``test_witness_first_run_killed``)."""
    import json
    import subprocess
    import sys

    from test_witness_progress import KILL_BEFORE_FIRST_INTENT

    make_corpus(tmp_path / "in", docs=3, poison=0, seed=13)
    ledger = tmp_path / "L.sqlite"
    killed = subprocess.run([sys.executable, "-c", KILL_BEFORE_FIRST_INTENT,
                             *map(str, _run_args(tmp_path, ledger))], capture_output=True,
                            timeout=300)
    assert killed.returncode == -9
    rerun = run_cli(*_run_args(tmp_path, ledger), "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["by_state"]["done"] == 3 and doubles(tmp_path) == 0
