"""``ledger L.sqlite --salvage NEW --out OUT``: the way out for an SQLite ledger the witness
refuses (an older copy put back, the file deleted), by real runs (processes) on real files,
against a non-idempotent provider whose counters say whether any document ran twice."""

import json
import os
import shutil
import sqlite3

import pytest

from conftest import run_cli
from toolkit.documents import make_corpus
from toolkit.provider import provider_stats

pytestmark = pytest.mark.slow


def _run_args(tmp_path, ledger):
    return ["run", "--inputs", tmp_path / "in", "--ledger", ledger, "--provider-db",
            tmp_path / "p.db", "--out", tmp_path / "out", "--contract", "non-idempotent",
            "--no-progress"]


def _doubles(tmp_path) -> int:
    tasks = provider_stats(tmp_path / "p.db")["per_task"].values()
    return sum(task["executions"] > 1 for task in tasks)


def _mark(path) -> dict | None:
    """The salvage mark as the file holds it: SQLite's meta row, JSONL's header line."""
    if path.suffix == ".jsonl":
        return json.loads(path.read_bytes().split(b"\n", 1)[0]).get("salvaged")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT value FROM meta WHERE name='salvaged'").fetchone()
    finally:
        db.close()
    return json.loads(row[0]) if row else None


def _by_state(ledger) -> dict:
    shown = run_cli("ledger", ledger, "--json")
    assert shown.returncode == 0, shown.stderr
    return {state: n for state, n in json.loads(shown.stdout)["by_state"].items() if n}


def _one_line_refusal(result, *words):
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    for word in words:
        assert word in line, line


def _older_copy(tmp_path, docs=4):
    """Two runs on L.sqlite (half the documents, then all), then the copy taken between
    them put back: its last events are lost. Returns the ledger and the copy's bytes."""
    make_corpus(tmp_path / "all", docs=docs, poison=0, seed=11)
    (tmp_path / "in").mkdir()
    names = sorted(os.listdir(tmp_path / "all"))
    for name in names[:docs // 2]:
        shutil.copy(tmp_path / "all" / name, tmp_path / "in" / name)
    ledger = tmp_path / "L.sqlite"
    assert run_cli(*_run_args(tmp_path, ledger)).returncode == 0
    shutil.copy(ledger, tmp_path / "backup.sqlite")  # closed: its WAL was checkpointed
    for name in names[docs // 2:]:
        shutil.copy(tmp_path / "all" / name, tmp_path / "in" / name)
    assert run_cli(*_run_args(tmp_path, ledger)).returncode == 0
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"L.sqlite{suffix}").unlink(missing_ok=True)
    shutil.copy(tmp_path / "backup.sqlite", ledger)
    return ledger, ledger.read_bytes()


@pytest.mark.parametrize("new_name", ["S.sqlite", "S.jsonl"])
def test_older_sqlite_copy_put_back_is_salvaged_and_runs_no_document_twice(tmp_path, new_name):
    """Fault: an SQLite ledger replaced by a copy taken before its last run (the run that
    took the second half of the documents). Property: run refuses it (exit 2, one line
    naming ``--salvage``); ``ledger L.sqlite --salvage NEW --out OUT`` reads it without
    changing a byte of it (nor making a file beside it) and writes NEW marked with the
    witness's words (SQLite: a meta row; JSONL: the header); a run on NEW looks up the
    documents the lost events sent instead of sending them again: no document executes
    twice, and every document is done."""
    ledger, before = _older_copy(tmp_path)
    executed = provider_stats(tmp_path / "p.db")["executions"]

    refused = run_cli(*_run_args(tmp_path, ledger))
    _one_line_refusal(refused, "older copy", f"python -m toolkit ledger {ledger} --salvage "
                      f"{tmp_path / 'L.salvaged.sqlite'} --out")  # shlex.quote: plain paths
    assert provider_stats(tmp_path / "p.db")["executions"] == executed

    new = tmp_path / new_name
    beside = sorted(os.listdir(tmp_path))
    salvaged = run_cli("ledger", ledger, "--salvage", new, "--out", tmp_path / "out")
    assert salvaged.returncode == 0, salvaged.stderr
    assert ledger.read_bytes() == before  # read through a private copy: never written
    assert sorted(os.listdir(tmp_path)) == sorted([*beside, new_name])  # no -wal, -shm, lock
    assert _mark(new)["from"] == "L.sqlite"
    assert _mark(new)["lost"].startswith("the events after seq")

    rerun = run_cli(*_run_args(tmp_path, new))
    assert rerun.returncode == 0, rerun.stderr
    assert _doubles(tmp_path) == 0
    assert _by_state(new) == {"done": 4}
    assert provider_stats(tmp_path / "p.db")["executions"] == executed  # all were adopted


@pytest.mark.parametrize("in_place", [False, True], ids=["new-path", "same-path"])
def test_deleted_sqlite_ledger_is_salvaged_from_nothing_and_runs_no_document_twice(tmp_path,
                                                                                   in_place):
    """Fault: the SQLite ledger deleted (``rm L.sqlite*``) after a run that executed every
    document. Property: run refuses it (exit 2, one line naming the salvage); the salvage,
    from nothing, writes NEW (at a new path, or at the deleted one's) marked "missing",
    with the seq the witness saw; a run on it adopts every job by lookup: no document
    executes twice, every document done; a second run on it is refused nothing."""
    make_corpus(tmp_path / "in", docs=3, poison=0, seed=12)
    ledger = tmp_path / "L.sqlite"
    assert run_cli(*_run_args(tmp_path, ledger)).returncode == 0
    executed = provider_stats(tmp_path / "p.db")["executions"]
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"L.sqlite{suffix}").unlink(missing_ok=True)

    refused = run_cli(*_run_args(tmp_path, ledger))
    _one_line_refusal(refused, "missing", f"--salvage {tmp_path / 'L.salvaged.sqlite'} --out")
    assert not ledger.exists()

    new = ledger if in_place else tmp_path / "S.sqlite"
    salvaged = run_cli("ledger", ledger, "--salvage", new, "--out", tmp_path / "out")
    assert salvaged.returncode == 0, salvaged.stderr
    assert _mark(new)["from"] == "L.sqlite (missing)" and "reach seq" in _mark(new)["lost"]
    for _ in range(2):
        rerun = run_cli(*_run_args(tmp_path, new))
        assert rerun.returncode == 0, rerun.stderr
    assert _doubles(tmp_path) == 0
    assert provider_stats(tmp_path / "p.db")["executions"] == executed
    assert _by_state(new) == {"done": 3}


def test_salvaged_sqlite_ledger_salvaged_again_keeps_its_mark(tmp_path):
    """Fault: none new: a salvaged SQLite ledger is salvaged once more (a copy for the
    audit, a move to JSONL). Property: the new ledger keeps the mark (the keys the first
    loss hid are still unknown to it), so its run still looks up before sending."""
    make_corpus(tmp_path / "in", docs=1, poison=0, seed=13)
    ledger = tmp_path / "L.sqlite"
    assert run_cli(*_run_args(tmp_path, ledger)).returncode == 0
    ledger.unlink()
    out = tmp_path / "out"
    assert run_cli("ledger", ledger, "--salvage", tmp_path / "S.sqlite", "--out", out) \
        .returncode == 0
    again = run_cli("ledger", tmp_path / "S.sqlite", "--salvage", tmp_path / "T.jsonl")
    assert again.returncode == 0, again.stderr
    assert _mark(tmp_path / "T.jsonl") == _mark(tmp_path / "S.sqlite")


def test_bad_salvage_input_is_one_line_and_writes_nothing(tmp_path):
    """Fault: bad input to ``ledger OLD --salvage NEW``: NEW exists, NEW inside --out,
    OLD not a ledger (the provider's database, a text file), OLD deleted with no witness
    to say what it held. Property: one line on stderr, a non-zero exit, no traceback; NEW
    is not made (an existing one is left as it was) and OLD is not changed."""
    make_corpus(tmp_path / "in", docs=1, poison=0, seed=14)
    ledger, out = tmp_path / "L.sqlite", tmp_path / "out"
    assert run_cli(*_run_args(tmp_path, ledger)).returncode == 0
    before = ledger.read_bytes()
    (tmp_path / "taken.sqlite").write_bytes(b"mine")
    (tmp_path / "notes.sqlite").write_text("not a database\n" * 100)
    cases = [
        (ledger, tmp_path / "taken.sqlite", "exists"),
        (ledger, out / "S.sqlite", "--out"),
        (tmp_path / "p.db", tmp_path / "S1.sqlite", "not a resume-toolkit ledger"),
        (tmp_path / "notes.sqlite", tmp_path / "S2.sqlite", "notes.sqlite"),
        (tmp_path / "gone.sqlite", tmp_path / "S3.sqlite", "no ledger"),
        (ledger, tmp_path / "S4.txt", ".sqlite"),
    ]
    for old, new, word in cases:
        refused = run_cli("ledger", old, "--salvage", new, "--out", out)
        assert refused.returncode != 0, (old, new, refused.stdout)
        line = refused.stderr.strip()
        assert len(line.splitlines()) == 1 and "Traceback" not in line, line
        assert word in line, line
        if new.name != "taken.sqlite":
            assert not new.exists(), new
    assert (tmp_path / "taken.sqlite").read_bytes() == b"mine"
    assert ledger.read_bytes() == before
    assert not [name for name in os.listdir(tmp_path) if ".salvage-" in name]  # no temp left
