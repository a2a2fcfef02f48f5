"""The witness in --out (runner/witness.py): a ledger whose history lost transitions --
an older copy restored, the file deleted mid-run, a symlink alias retargeted to a copy --
is seen before anything is sent, by real runs (processes) on real files, against a
non-idempotent provider whose counters say whether any document ran twice."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import run_cli
from toolkit.documents import make_corpus
from toolkit.provider import provider_stats

pytestmark = pytest.mark.slow


def _run_args(tmp_path, ledger, inputs="in", out="out"):
    return ["run", "--inputs", tmp_path / inputs, "--ledger", ledger, "--provider-db",
            tmp_path / "p.db", "--out", tmp_path / out, "--contract", "non-idempotent",
            "--no-progress"]


def two_runs(tmp_path, ledger, docs, seed, outs=("out", "out")):
    """Run 1 on half of a corpus of ``docs`` (``--out outs[0]``), a copy of the ledger then
    (returned: ``backup<suffix>``, the ledger closed: an SQLite WAL checkpointed), run 2
    on all of it (``--out outs[1]``): what a restore of the copy loses."""
    make_corpus(tmp_path / "all", docs=docs, poison=0, seed=seed)
    (tmp_path / "in").mkdir()
    names = sorted(os.listdir(tmp_path / "all"))
    for name in names[:docs // 2]:
        shutil.copy(tmp_path / "all" / name, tmp_path / "in" / name)
    assert run_cli(*_run_args(tmp_path, ledger, out=outs[0])).returncode == 0
    backup = tmp_path / f"backup{ledger.suffix}"
    shutil.copy(ledger, backup)
    for name in names[docs // 2:]:
        shutil.copy(tmp_path / "all" / name, tmp_path / "in" / name)
    second = run_cli(*_run_args(tmp_path, ledger, out=outs[1]))
    assert second.returncode == 0, second.stderr
    return backup


def doubles(tmp_path) -> int:
    tasks = provider_stats(tmp_path / "p.db")["per_task"].values()
    return sum(task["executions"] > 1 for task in tasks)


def _lines(path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _mid_run(tmp_path, ledger, at_lines, act):
    """Start a real run on ``ledger``; once the file at ``watch`` has ``at_lines`` lines,
    ``act()`` (the fault); return the finished run's result."""
    child = subprocess.Popen([sys.executable, "-m", "toolkit", *map(str, _run_args(
        tmp_path, ledger))], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watched = tmp_path / "orig.jsonl" if (tmp_path / "orig.jsonl").exists() else ledger
    deadline = time.monotonic() + 120
    while _lines(watched) < at_lines and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert child.poll() is None, "the run ended before the fault: too few documents"
    act()
    out, err = child.communicate(timeout=300)
    return child.returncode, err


def _header(path) -> dict:
    return json.loads(path.read_bytes().split(b"\n", 1)[0])


def test_backup_restored_between_runs_is_refused_and_its_salvage_is_marked(tmp_path):
    """Fault: the ledger restored from a copy taken before the last run (a backup).
    Property: the next run refuses it before sending anything (exit 2, one line naming
    ``ledger --salvage``); that salvage marks the new ledger, and a run on it executes
    no document twice."""
    ledger = tmp_path / "L.jsonl"
    backup = two_runs(tmp_path, ledger, docs=6, seed=3)
    shutil.copy(backup, ledger)  # restored over it (same inode, cp)

    refused = run_cli(*_run_args(tmp_path, ledger))
    assert refused.returncode == 2, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "--salvage" in refused.stderr
    assert "older copy" in refused.stderr and doubles(tmp_path) == 0

    salvaged = run_cli("ledger", ledger, "--salvage", tmp_path / "S.jsonl")
    assert salvaged.returncode == 0, salvaged.stderr
    assert _header(tmp_path / "S.jsonl")["salvaged"]["lost"].startswith("the events after seq")
    rerun = run_cli(*_run_args(tmp_path, tmp_path / "S.jsonl"))
    assert rerun.returncode == 0, rerun.stderr
    assert doubles(tmp_path) == 0


def test_ledger_removed_mid_run_next_run_is_marked_salvaged_and_runs_nothing_twice(tmp_path):
    """Fault: ``rm`` of the JSONL ledger while a real run writes it (then ``health
    --clear``, as an operator does). Property: the halt no longer says just "run again";
    the next run finds the ledger missing by the witness, makes it anew marked as
    salvaged, looks every request up before sending it: no document executes twice."""
    make_corpus(tmp_path / "in", docs=20, poison=0, seed=4)
    ledger = tmp_path / "L.jsonl"
    code, err = _mid_run(tmp_path, ledger, 45, ledger.unlink)  # 20 adds, then documents
    assert code == 1 and "witness" in err, err
    assert run_cli("health", "--ledger", ledger, "--clear").returncode == 0
    assert provider_stats(tmp_path / "p.db")["executions"] >= 2  # some ran before the rm

    rerun = run_cli(*_run_args(tmp_path, ledger))
    assert rerun.returncode == 0, rerun.stderr
    assert _header(ledger)["salvaged"]["from"] == "L.jsonl (missing)"
    assert doubles(tmp_path) == 0


def test_symlink_alias_retargeted_to_a_copy_mid_run_is_refused_before_any_send(tmp_path):
    """Fault: ``--ledger alias.jsonl`` whose symlink is retargeted mid-run to a copy taken
    then (``cp``, ``ln -sfn``). Property: the next run on the alias refuses the copy (exit
    2, one line naming the original and the salvage), so nothing executes twice."""
    make_corpus(tmp_path / "in", docs=20, poison=0, seed=5)
    orig, copy, alias = tmp_path / "orig.jsonl", tmp_path / "copy.jsonl", tmp_path / "alias.jsonl"
    orig.touch()
    alias.symlink_to(orig.name)

    def retarget():
        shutil.copy(orig, copy)
        subprocess.run(["ln", "-sfn", copy.name, alias.name], cwd=tmp_path, check=True)
    code, err = _mid_run(tmp_path, alias, 45, retarget)
    assert code == 0, err
    executed = provider_stats(tmp_path / "p.db")["executions"]

    refused = run_cli(*_run_args(tmp_path, alias))
    assert refused.returncode == 2, refused.stderr
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1 and "copy of" in line and str(orig) in line
    assert provider_stats(tmp_path / "p.db")["executions"] == executed
    assert doubles(tmp_path) == 0


def test_sqlite_ledger_older_copy_or_missing_is_refused_before_any_send(tmp_path):
    """Fault: an SQLite ledger restored from an older copy, then deleted. Property: each
    next run refuses it (exit 2, one line), executing nothing."""
    ledger = tmp_path / "L.sqlite"
    backup = two_runs(tmp_path, ledger, docs=4, seed=6)
    executed = provider_stats(tmp_path / "p.db")["executions"]
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"L.sqlite{suffix}").unlink(missing_ok=True)
    shutil.copy(backup, ledger)

    older = run_cli(*_run_args(tmp_path, ledger))
    assert older.returncode == 2 and "older copy" in older.stderr, older.stderr
    ledger.unlink()
    missing = run_cli(*_run_args(tmp_path, ledger))
    assert missing.returncode == 2 and "missing" in missing.stderr, missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1 and not ledger.exists()
    assert provider_stats(tmp_path / "p.db")["executions"] == executed
