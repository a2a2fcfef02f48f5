"""Outsider o25, the rest: O10 (views that disagree on an empty ledger; health writing
into a ledger; ``audit --csv`` on a full disk exiting 2) and O9 (a torn line glued to
the next one blamed on intact lines). Real files, real limits, real mounts."""

import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import fill_disk
from toolkit.forensics import audit
from toolkit.ledger import State, open_ledger


def tk(cwd, *args, preexec_fn=None, stdout=subprocess.PIPE):
    return subprocess.run([sys.executable, "-m", "toolkit", *map(str, args)], cwd=cwd,
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300,
                          preexec_fn=preexec_fn)


def tree(folder: Path) -> dict:
    """Every name in ``folder`` with its bytes: what a command left behind."""
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def _empty_wal_database(path: Path) -> None:
    """What a kill -9 as a ledger is created can leave: WAL mode set, no table yet."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.close()


def test_empty_wal_sqlite_file_audits_as_an_empty_ledger_as_ledger_and_review_read_it(
        tmp_path):
    """Fault: a kill -9 at a ledger's creation leaves an SQLite file in WAL mode with no
    table. `ledger` and `review` read it as an empty ledger (exit 0) while `audit` said
    "unexpected tables (none)" (exit 2). Property: audit agrees (exit 0, 0 items, format
    empty, as for a 0-byte file or an empty JSONL file), and nothing is written."""
    _empty_wal_database(tmp_path / "l.sqlite")
    (tmp_path / "zero.sqlite").write_bytes(b"")
    (tmp_path / "zero.jsonl").write_bytes(b"")
    before = tree(tmp_path)
    for name in ("l.sqlite", "zero.sqlite", "zero.jsonl"):
        result = tk(tmp_path, "audit", name, "--json")
        assert result.returncode == 0, (name, result.stderr)
        report = json.loads(result.stdout)
        assert (report["format"], report["items"], report["anomalies"]) == ("empty", 0, []), name
    assert tk(tmp_path, "ledger", "l.sqlite").returncode == 0
    assert tk(tmp_path, "review", "--ledger", "l.sqlite").returncode == 0
    assert tree(tmp_path) == before
    # a database with something in its schema (a view alone) is still someone else's
    with sqlite3.connect(tmp_path / "view.db") as db:
        db.execute("CREATE VIEW jobs AS SELECT 1 AS key")
    refused = tk(tmp_path, "audit", "view.db")
    assert refused.returncode == 2 and "unexpected tables" in refused.stderr


@pytest.mark.parametrize("name", ["l.sqlite", "l.jsonl", "wal.sqlite"])
def test_empty_ledger_review_agrees_with_ledger_and_health_writes_nothing_into_it(
        tmp_path, name):
    """Fault: a 0-byte ledger (or an SQLite file with no table). `review` said "is empty:
    not a ledger" (exit 2) where `ledger` and `audit` list 0 items, and `health` said
    ready after writing a schema into it (a .jsonl got a lock file beside it). Property:
    review lists nothing parked (exit 0), health says ready (exit 0: `run` creates the
    ledger in it), and the folder is byte for byte as it was."""
    if name == "wal.sqlite":
        _empty_wal_database(tmp_path / name)
    else:
        (tmp_path / name).write_bytes(b"")
    before = tree(tmp_path)
    review = tk(tmp_path, "review", "--ledger", name)
    assert review.returncode == 0 and review.stdout.strip() == "needs_review (0)", review
    assert tk(tmp_path, "ledger", name).returncode == 0
    assert tk(tmp_path, "audit", name).returncode == 0
    health = tk(tmp_path, "health", "--ledger", name)
    assert health.returncode == 0 and health.stdout.strip() == "ready", health
    assert tree(tmp_path) == before
    # resolve writes: an empty file is still no ledger to record a decision in
    resolve = tk(tmp_path, "resolve", "--ledger", name, "--key", "k", "--cancel", "--note", "x")
    assert resolve.returncode == 2 and len(resolve.stderr.strip().splitlines()) == 1
    assert tree(tmp_path) == before


@pytest.fixture
def folder(tmp_path):
    """A real tmpfs of 1 MiB when this process may mount one (so the disk can be filled),
    else a plain folder (the full-disk half of a test is then skipped); unmounted after."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = shutil.which("mount") is not None and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
        capture_output=True).returncode == 0
    try:
        yield where, mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(where)], check=False)


@pytest.mark.parametrize("suffix", [".sqlite", ".jsonl"])
def test_health_probe_writes_nothing_into_the_ledger_and_a_full_disk_is_not_ready(
        folder, suffix):
    """Fault: `health` on a ready ledger wrote a probe row into the SQLite ledger (and
    created a JSONL ledger's lock file beside it), so a monitor polling health changes the ledger it
    watches and contends with a live batch. Property: health reads a private copy and
    probes the disk beside the ledger: ready, exit 0, and the folder is byte for byte as
    it was; on a full disk (a real tmpfs filled to ENOSPC) it is not ready, exit 1, and
    still nothing changed."""
    where, mounted = folder
    ledger = where / f"l{suffix}"
    with open_ledger(ledger) as opened:
        opened.add("k", source="a.pdf")
    (where / f"{ledger.name}.lock").unlink(missing_ok=True)  # a ledger copied without it
    before = tree(where)
    ready = tk(where, "health", "--ledger", ledger.name)
    assert ready.returncode == 0 and ready.stdout.strip() == "ready", ready
    assert tree(where) == before
    if not mounted:
        pytest.skip("needs permission to mount a tmpfs for the full-disk half")
    fill_disk(where)
    before = tree(where)
    full = tk(where, "health", "--ledger", ledger.name)
    assert full.returncode == 1 and full.stdout.startswith("not ready: cannot be written"), full
    assert "No space left" in full.stdout
    assert tree(where) == before


def test_audit_csv_beyond_the_file_size_limit_exits_1_as_json_does(tmp_path):
    """Fault: the kernel refuses the CSV's bytes (RLIMIT_FSIZE: EFBIG, a storage error as
    a full disk is). `audit --json` into such a file exited 1 ("free space, run again")
    but `--csv` exited 2 ("bad input"). Property: both exit 1 with one line, no traceback,
    and no partial CSV; a --csv in a folder that does not exist stays bad input (2)."""
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        for n in range(20):
            ledger.add(f"key-{n}", source=f"doc-{n}.pdf")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))

    csv = tk(tmp_path, "audit", "l.sqlite", "--csv", "report.csv", preexec_fn=limit)
    assert csv.returncode == 1, csv
    assert len(csv.stderr.strip().splitlines()) == 1 and "Traceback" not in csv.stderr
    assert "File too large" in csv.stderr
    with open(tmp_path / "report.json", "w") as out:
        as_json = tk(tmp_path, "audit", "l.sqlite", "--json", preexec_fn=limit, stdout=out)
    assert as_json.returncode == csv.returncode == 1, as_json
    assert sorted(p.name for p in tmp_path.iterdir() if "csv" in p.name) == []
    missing = tk(tmp_path, "audit", "l.sqlite", "--csv", "no/such/report.csv")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def _glued_ledger(path: Path, cut: str) -> None:
    """Keys a, b, c added (lines 2-4), then each claimed, moved and released in turn. Then
    the add of b (line 3) is cut, and the add of c glued right after it, as an append
    after a write killed mid-line: ``cut`` "torn" keeps half of b's add, "newline" all of
    it but its newline (``head -c -1``, then more lines appended)."""
    with open_ledger(path) as ledger:
        for key in "abc":
            ledger.add(key, source=f"{key}.pdf")
        for key in "abc":
            token = ledger.claim(key, "w", 60.0)
            ledger.move(key, State.PENDING, State.UNKNOWN, token=token, worker="w")
            ledger.release(key, token, "w")
    lines = path.read_bytes().split(b"\n")
    b_add = lines[2] if cut == "newline" else lines[2][:len(lines[2]) // 2]
    lines[2:4] = [b_add + lines[3]]
    path.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize("cut", ["torn", "newline"])
def test_torn_add_glued_to_the_next_line_missing_history_names_the_glued_line(tmp_path, cut):
    """Fault: a write of b's add is cut before its newline and c's add is appended right
    after it: line 3 is no JSON, and both keys' later lines come before any add. The
    audit blamed c's lost add on "unusable lines 7, 8, 9" (b's intact claim, move and
    release). Property: c's missing_history names line 3, where its add is whole, and no
    intact line of another key; line 3's finding names the whole events inside it."""
    path = tmp_path / "l.jsonl"
    _glued_ledger(path, cut)
    report = audit(path)
    details = {a.key: a.detail for a in report.anomalies if a.kind == "missing_history"}
    assert set(details) == {"b", "c"}, details
    assert "its add (seq 3) is whole inside unusable line 3" in details["c"], details["c"]
    b_lines = [int(a.detail.split(":")[0].split()[1]) for a in report.anomalies
               if a.kind == "corrupt_line" and "of key 'b' before its add" in a.detail]
    assert b_lines == [7, 8, 9], report.anomalies
    assert not any(f"line {n}" in details["c"] for n in b_lines)
    line_3 = next(a.detail for a in report.anomalies
                  if a.kind == "corrupt_line" and a.detail.startswith("line 3:"))
    assert "seq 3 (add of key 'c')" in line_3
    if cut == "newline":  # b's add is whole too: b's finding names it as well
        assert "its add (seq 2) is whole inside unusable line 3" in details["b"]
        assert "seq 2 (add of key 'b')" in line_3
    else:  # its torn half is the only unusable line that may have held b's add
        assert "unusable line 3 before it may have held the add" in details["b"]
