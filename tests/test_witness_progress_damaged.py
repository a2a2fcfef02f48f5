"""What the witness's damage must not lose (runner/witness_damaged.py): a damaged
``.witness.json`` moved aside as its refusal says, or a damaged ``<ledger>.roots.json``,
may drop the only record of a ledger's highest seq and of the peer folder that saw it; a
restored older ledger must still run no document twice. Real processes, real files, a
non-idempotent provider whose counters say whether any document ran twice."""

import json
import os
import re
import shlex
import shutil
import subprocess

import pytest

from conftest import run_cli
from test_witness_ledger import _run_args, doubles, two_runs
from toolkit.documents import make_corpus

pytestmark = pytest.mark.slow


def _one_line(result) -> str:
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    return line


def _salvage_and_run(tmp_path, ledger, out):
    """The refusals' way on: salvage into NEW with ``--out out``, run NEW there."""
    salvaged = run_cli("ledger", ledger, "--salvage", tmp_path / "NEW.jsonl", "--out", out)
    assert salvaged.returncode == 0, salvaged.stderr
    rerun = run_cli(*_run_args(tmp_path, tmp_path / "NEW.jsonl", out=out.name))
    assert rerun.returncode == 0, rerun.stderr


def _moved_as_said(line: str) -> str:
    """Do the ``mv -n SRC DST`` the refusal names; return DST."""
    command = re.search(r"\((mv -n [^)]*)\), and run again", line).group(1)
    subprocess.run(shlex.split(command), check=True)
    return shlex.split(command)[-1]


def test_damaged_witness_moved_aside_as_advised_then_backup_run_no_double(tmp_path):
    """Fault: the ledger run with --out A then --out B (A's entry the only link to B), A's
    witness damaged, the ledger restored from a backup taken before the second run.
    Property: following the refusals -- move the witness aside as said, run again, salvage
    as said, run NEW -- executes no document twice; the run after the move is refused."""
    ledger = tmp_path / "L.jsonl"
    backup = two_runs(tmp_path, ledger, docs=8, seed=5, outs=("A", "B"))
    witness = tmp_path / "A" / ".witness.json"
    witness.write_bytes(b"\x00garbage")
    shutil.copy(backup, ledger)
    # The batch folder's backup held the roots file of then too, naming A (run 2 had
    # replaced it with B): A's witness entry is the only link to B.
    marker = tmp_path / "L.jsonl.roots.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "out": "A"}))

    line = _one_line(run_cli(*_run_args(tmp_path, ledger, out="A")))
    aside = _moved_as_said(line)
    assert os.path.exists(aside) and not witness.exists()

    again = run_cli(*_run_args(tmp_path, ledger, out="A"))
    assert again.returncode == 2, again.stderr
    line = _one_line(again)
    assert "moved aside" in line and "--salvage" in line and str(tmp_path / "A") in line
    assert doubles(tmp_path) == 0
    _salvage_and_run(tmp_path, ledger, tmp_path / "A")
    assert doubles(tmp_path) == 0


def test_damaged_again_advice_names_a_new_file_never_the_earlier(tmp_path):
    """Fault: the witness damaged, moved aside as said, then damaged again. Property: the
    second refusal's ``mv`` names a file that does not exist (the first is never
    overwritten: it may hold the only link to a peer)."""
    ledger = tmp_path / "L.jsonl"
    make_corpus(tmp_path / "in", docs=1, poison=0, seed=9)
    witness = tmp_path / "out" / ".witness.json"
    witness.parent.mkdir()
    witness.write_bytes(b"first")
    first = _moved_as_said(_one_line(run_cli(*_run_args(tmp_path, ledger))))
    witness.write_bytes(b"second")
    line = _one_line(run_cli(*_run_args(tmp_path, ledger)))
    second = shlex.split(re.search(r"\((mv -n [^)]*)\), and run again", line).group(1))[-1]
    assert second != first and not os.path.lexists(second)
    assert open(first, "rb").read() == b"first"


@pytest.mark.parametrize("damage", ["garbage", "empty", "directory"])
def test_damaged_roots_file_then_backup_with_new_out_refused_no_double(tmp_path, damage):
    """Fault: ``<ledger>.roots.json`` damaged (its recorded --out lost), the ledger restored
    from a backup taken before its last run, run with a new --out C. Property: refused
    before any send (exit 2, one line naming the roots file and salvage); salvaged as said
    and run, no document runs twice."""
    ledger = tmp_path / "L.jsonl"
    backup = two_runs(tmp_path, ledger, docs=8, seed=6)
    marker = tmp_path / "L.jsonl.roots.json"
    os.unlink(marker)
    if damage == "directory":
        marker.mkdir()
    else:
        marker.write_bytes(b"" if damage == "empty" else b"\xff{not json")
    shutil.copy(backup, ledger)

    refused = run_cli(*_run_args(tmp_path, ledger, out="C"))
    assert refused.returncode == 2, refused.stderr
    line = _one_line(refused)
    assert str(marker) in line and "--salvage" in line
    assert doubles(tmp_path) == 0
    _salvage_and_run(tmp_path, ledger, tmp_path / "C")
    assert doubles(tmp_path) == 0
