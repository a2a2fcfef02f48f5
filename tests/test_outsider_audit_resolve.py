"""Faults an outside tester found in ``audit --csv``, ``--output-name``, ``resolve`` and the
views, each on a real batch ledger (a run that parked an item, as in
test_review_resolve.py) or a real foreign state file."""

import csv
import json
import os
import subprocess
import sys

import pytest

from test_review_resolve import cli, make_small, parked, snapshot  # noqa: F401 (fixture)
from toolkit.documents.render import pdf_bytes
from toolkit.ledger import State, open_ledger

S = State


# -- 1, 11: --csv never writes onto the audited ledger, never leaves half a file --------------

@pytest.mark.parametrize("target", ["{L}", "link.csv", "{L}-wal", "{L}-shm", "{L}-journal",
                                    "{L}.roots.json", "{L}.lock", "hard.csv"])
def test_csv_onto_the_audited_ledger_or_a_companion_is_refused_exit_2_nothing_written(
        parked, tmp_path, capsys, target):
    """What breaks: ``--csv`` names the ledger itself, a symlink or hard link to it, or one
    of its companion files. Must hold: one line, exit 2, every existing file byte-identical,
    no companion created."""
    path = parked[0]
    os.symlink(path, tmp_path / "link.csv")
    os.link(path, tmp_path / "hard.csv")
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    name = target.replace("{L}", str(path))
    status, _, err = cli(capsys, "audit", path, "--csv", tmp_path / name)
    assert (status, err.count("\n")) == (2, 1) and "refusing to write over it" in err
    assert {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


@pytest.mark.slow
def test_csv_write_past_rlimit_fsize_leaves_the_old_csv_whole_and_no_partial_file(
        parked, tmp_path, capsys):
    """What breaks: the CSV write hits a real RLIMIT_FSIZE (EFBIG) part-way. Must hold: exit 2,
    one line naming the target, the previous CSV byte-identical, no temporary file left."""
    path = parked[0]
    target = tmp_path / "report" / "items.csv"
    target.parent.mkdir()
    target.write_bytes(b"previous,report\n")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100)); "
            "from toolkit.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "audit", str(path), "--csv", str(target)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert str(target) in done.stderr and "too large" in done.stderr
    assert target.read_bytes() == b"previous,report\n"
    assert os.listdir(target.parent) == ["items.csv"]


# -- 5: the CSV is exact ------------------------------------------------------------------------

def test_csv_keeps_a_carriage_return_name_in_its_cell_and_sizes_as_integers(parked, tmp_path,
                                                                           capsys):
    """What breaks: a source name holds ``\\r`` and ``\\t`` (beside a real run's done items
    and a parked one with no artifact). Must hold: a csv reader gets one row per item with
    the name whole, and every size is written as an integer (never ``2914.0``)."""
    path = parked[0]
    name = "tab\there\r.pdf"
    with open_ledger(path) as ledger:
        ledger.add("odd", name)
        sizes = {item.key: item.artifact_size for item in ledger.items()}
    target = tmp_path / "items.csv"
    status, _, _ = cli(capsys, "audit", path, "--csv", target)
    with open(target, newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    assert status == 0 and len(rows) == len(sizes) == 6
    by_key = {row["key"]: row for row in rows}
    assert by_key["odd"]["source"] == name
    assert {key: row["artifact_size"] for key, row in by_key.items()} == \
        {key: "" if size is None else str(size) for key, size in sizes.items()}
    assert sum(size is not None for size in sizes.values()) == 3
