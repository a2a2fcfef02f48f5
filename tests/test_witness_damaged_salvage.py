"""The way out of a damaged ``.witness.json`` (runner/witness_damaged.py), followed as the
refusals word it, with the real CLI: move it aside, run (refused), salvage as said, run the
salvaged ledger. The salvage reads what the moved-aside witness leaves unsaid by one rule
for both backends (``witness.loss_of``), so the new ledger is marked and runs; and a
witness damaged under a live run halts it with advice that fits a damaged file, leaving
the ledger's health as it is (outsider o41, F1 and F5). Real processes, real files, a
non-idempotent provider whose counters say whether any document ran twice."""

import json
import os
import re
import shlex
import subprocess
import sys
import time

import pytest

from conftest import run_cli
from test_witness_ledger import _run_args, doubles
from toolkit.documents import make_corpus
from toolkit.ledger import open_ledger
from toolkit.runner.ops import health_marker
from toolkit.storage import exclusive_lock

pytestmark = pytest.mark.slow


def _one_line(result) -> str:
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, result.stderr
    return line


def _move_aside_as_said(line: str) -> None:
    """Do the ``mv -n SRC DST`` the line names."""
    subprocess.run(shlex.split(re.search(r"\((mv -n [^)]*)\), and run again", line).group(1)),
                   check=True)


def _salvage_as_said(line: str):
    """Do the ``ledger L --salvage NEW --out OUT`` the refusal names; return (its result,
    NEW as the refusal says to run it)."""
    words = shlex.split(re.search(r"salvage it: (.*?) \(the new ledger", line).group(1))
    new = shlex.split(re.search(r"then run with --ledger (.*)$", line).group(1))[0]
    return run_cli(*words[words.index("toolkit") + 1:]), new


def _refused_salvaged_and_run(tmp_path, ledger, docs):
    """After the witness was moved aside: the run on ``ledger`` is refused naming salvage;
    the salvage as said marks NEW with what the moved-aside witness may have held; the run
    on NEW proceeds, every document done or parked, none executed twice."""
    refused = run_cli(*_run_args(tmp_path, ledger))
    assert refused.returncode == 2, refused.stderr
    line = _one_line(refused)
    assert "moved aside damaged" in line and "--salvage" in line
    salvaged, new = _salvage_as_said(line)
    assert salvaged.returncode == 0, salvaged.stderr
    assert "moved aside damaged" in salvaged.stdout  # its "lost:", never "lost: nothing"
    with open_ledger(new) as marked:
        assert marked.salvaged is not None and "moved aside" in marked.salvaged["lost"]
    rerun = run_cli(*_run_args(tmp_path, new), "--json")
    assert rerun.returncode == 0, rerun.stderr
    by_state = json.loads(rerun.stdout)["by_state"]
    assert by_state["done"] + by_state["needs_review"] == docs
    assert doubles(tmp_path) == 0


@pytest.mark.parametrize("suffix", [".jsonl", ".sqlite"])
def test_witness_moved_aside_as_advised_then_salvage_marks_the_new_ledger_and_it_runs(
        tmp_path, suffix):
    """Fault: after a whole run, ``.witness.json`` overwritten with garbage. Property:
    following the refusals (move it aside as said, run: refused, salvage as said) gives a
    new ledger marked with what the moved-aside witness saw, and the run on it proceeds
    (exit 0), no document executed twice. Before: an SQLite salvage read only the witness
    now in --out (none: moved aside), wrote NEW unmarked ("lost: nothing"), and every run
    on it was refused again, naming yet another salvage."""
    make_corpus(tmp_path / "in", docs=5, poison=0, seed=11)
    ledger = tmp_path / f"L{suffix}"
    assert run_cli(*_run_args(tmp_path, ledger)).returncode == 0
    (tmp_path / "out" / ".witness.json").write_text("garbage\n")
    damaged = run_cli(*_run_args(tmp_path, ledger))
    assert damaged.returncode == 2, damaged.stderr
    _move_aside_as_said(_one_line(damaged))
    _refused_salvaged_and_run(tmp_path, ledger, docs=5)


def _outputs(tmp_path) -> int:
    return sum(name.endswith(".pdf") for _, _, names in os.walk(tmp_path / "out")
               for name in names)


@pytest.mark.parametrize("suffix,workers", [(".jsonl", ()), (".sqlite", ()),
                                             (".sqlite", ("--workers", "2"))])
def test_witness_damaged_under_a_live_run_halts_with_move_aside_advice_and_health_kept(
        tmp_path, suffix, workers):
    """Fault: ``{}`` written into ``.witness.json`` (under its lock, as a record writes it)
    while a run (or a pool of 2 workers) is mid-batch. Property: the run halts before its
    next send (exit 1) with advice that fits a damaged file -- move it aside, as said --
    never "free space there, or make it writable", and leaves no health marker (nothing is
    wrong with the ledger: the damaged file refuses the next run itself, and no
    ``health --clear`` is asked for); the advised path then runs, no document twice."""
    docs = 24
    make_corpus(tmp_path / "in", docs=docs, poison=0, seed=12)
    ledger = tmp_path / f"L{suffix}"
    witness = tmp_path / "out" / ".witness.json"
    child = subprocess.Popen([sys.executable, "-m", "toolkit", *map(str, _run_args(
        tmp_path, ledger)), *workers], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    deadline = time.monotonic() + 120
    while _outputs(tmp_path) < 3 and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    with exclusive_lock(f"{witness}.lock"):  # no record in flight replaces it
        assert child.poll() is None, "the run ended before the damage: too few documents"
        witness.write_text("{}")
    _, stderr = child.communicate(timeout=300)
    assert child.returncode == 1, stderr
    assert "Traceback" not in stderr
    halts = [line for line in stderr.splitlines() if line.startswith("halted")]
    assert halts and all("damaged" in line and "mv -n" in line for line in halts), stderr
    assert "free space" not in stderr and "could not be recorded" not in stderr, stderr
    assert not health_marker(ledger).exists()
    assert doubles(tmp_path) == 0

    again = run_cli(*_run_args(tmp_path, ledger))
    assert again.returncode == 2, again.stderr
    line = _one_line(again)
    assert "is damaged" in line and "health" not in line
    _move_aside_as_said(line)
    _refused_salvaged_and_run(tmp_path, ledger, docs)
