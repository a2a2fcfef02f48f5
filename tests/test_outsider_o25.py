"""Outsider findings O1, O2 (audit), O9 on the audit, each reproduced with the real thing:
a real run's inputs and artifacts as ``--csv`` targets (O1), a real JSONL ledger whose lines
are really deleted (O2), real files with odd names really removed (O9), a real add line
deleted under a done item (O9).
"""

import json
import os
import shutil
from pathlib import Path

import pytest

from toolkit.cli import main
from toolkit.documents import make_corpus
from toolkit.forensics import KINDS, audit, render_text

ROOT = Path(__file__).resolve().parents[1]


def tree(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes: what a refused command must not change."""
    return {str(path.relative_to(folder)): path.read_bytes() if path.is_file() else None
            for path in sorted(folder.rglob("*"))}


def run_batch(root: Path, ledger: str, docs: int = 3, *extra) -> None:
    make_corpus(root / "in", docs=docs, poison=0, seed=25)
    assert main(["run", "--inputs", str(root / "in"), "--ledger", str(root / ledger),
                 "--provider-db", str(root / "p.sqlite"), "--out", str(root / "out"),
                 "--no-progress", *extra]) == 0


@pytest.fixture(scope="module")
def done_batch(tmp_path_factory):
    """A real run of three documents to done, SQLite ledger (copied per test)."""
    root = tmp_path_factory.mktemp("batch")
    run_batch(root, "l.sqlite")
    return root


@pytest.fixture
def batch(tmp_path, done_batch):
    shutil.copytree(done_batch, tmp_path / "b", symlinks=True)
    return tmp_path / "b"


# -- O1: audit --csv never writes into the batch's folders ---------------------------------

def _target(batch: Path, where: str) -> tuple[Path, list]:
    """(the --csv target, the extra audit arguments) for each way a CSV lands on the batch."""
    first_input = sorted((batch / "in").iterdir())[0]
    first_output = sorted((batch / "out").glob("*.pdf"))[0]
    elsewhere = batch.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    (batch.parent / "link-to-in").symlink_to(batch / "in")
    return {
        "an input, --inputs given": (first_input, ["--inputs", batch / "in"]),
        "an input, inputs root recorded": (first_input, []),
        "a new file in --inputs": (batch / "in" / "report.csv", ["--inputs", batch / "in"]),
        "a new file through a symlink to --inputs": (batch.parent / "link-to-in" / "r.csv",
                                                     ["--inputs", batch / "in"]),
        "an artifact, outputs root recorded": (first_output, []),
        "an artifact, --artifacts given": (first_output, ["--artifacts", batch / "out"]),
        "an artifact, --artifacts elsewhere": (first_output, ["--artifacts", elsewhere]),
        "a new file in a subfolder of the outputs": (batch / "out" / "sub" / "r.csv", []),
    }[where]


@pytest.mark.parametrize("where", [
    "an input, --inputs given", "an input, inputs root recorded", "a new file in --inputs",
    "a new file through a symlink to --inputs", "an artifact, outputs root recorded",
    "an artifact, --artifacts given", "an artifact, --artifacts elsewhere",
    "a new file in a subfolder of the outputs"])
def test_csv_target_inside_the_inputs_or_artifacts_is_refused_and_nothing_is_written(
        batch, capsys, where):
    """Fault: ``audit --csv FILE`` names an input of the batch, an artifact, or a new file
    inside the inputs folder or the outputs root (given, recorded beside the ledger, or
    reached through a symlink). Property: exit 2 with one line on stderr naming the
    folder, and every file of the batch keeps its bytes (no CSV, no temporary file)."""
    target, extra = _target(batch, where)
    before = tree(batch)
    assert main(["audit", str(batch / "l.sqlite"), "--csv", str(target),
                 *map(str, extra)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to write there" in err, err
    assert tree(batch) == before


def test_csv_target_outside_the_batch_folders_is_still_written(batch, capsys):
    """Fault: none (the refusal must not catch a CSV beside the ledger). Property: a CSV
    next to the ledger, outside inputs and outputs, is written, one row per item."""
    assert main(["audit", str(batch / "l.sqlite"), "--inputs", str(batch / "in"),
                 "--csv", str(batch / "report.csv")]) == 0
    assert len((batch / "report.csv").read_text().splitlines()) == 4
