"""A damaged witness file (runner/witness.py, ``--out/.witness.json``) and a ledger left
with no history at a witnessed path, by real runs (processes) on real files, against a
non-idempotent provider whose counters say whether a document ran twice."""

import json
import os

import pytest

from conftest import run_cli
from test_witness_ledger import _header, _run_args, doubles
from toolkit.documents import make_corpus
from toolkit.provider import provider_stats

pytestmark = pytest.mark.slow

OTHER = {"id": "0123456789abcdef0123", "seq": 7, "kind": "jsonl", "peers": []}
DAMAGE = {  # what is put at --out/.witness.json: bytes, or None for a directory
    "garbage": b"\x00\xffnot a witness\n",
    "empty": b"",
    "directory": None,
    "empty-object": b"{}",
    "list": b"[]",
    "ledgers-a-list": b'{"ledgers": []}',
    "seq-a-string": json.dumps({"ledgers": {"/elsewhere/M.jsonl": OTHER, "/x/L.jsonl": {
        "id": "abc", "seq": "5", "kind": "jsonl"}}}).encode(),
    "entry-a-number": json.dumps({"ledgers": {"/elsewhere/M.jsonl": OTHER,
                                              "/x/L.jsonl": 5}}).encode(),
}


def _run(tmp_path, ledger):
    return run_cli(*_run_args(tmp_path, ledger))


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_witness_file_refused_naming_it_and_never_rewritten(tmp_path, kind):
    """Fault: ``--out/.witness.json`` damaged (garbage bytes, an empty file, a directory in
    its place, ``{}``, ``[]``, an entry of wrong types beside another ledger's good one).
    Property: the run refuses before any send (exit 2, one line naming the file and
    saying to move it aside), the file is left as it was (no entry dropped); once moved
    aside, as the line says, the run goes on (exit 0)."""
    make_corpus(tmp_path / "in", docs=2, poison=0, seed=8)
    witness = tmp_path / "out" / ".witness.json"
    witness.parent.mkdir()
    if DAMAGE[kind] is None:
        witness.mkdir()
    else:
        witness.write_bytes(DAMAGE[kind])

    refused = _run(tmp_path, tmp_path / "L.jsonl")
    assert refused.returncode == 2, refused.stderr
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1 and str(witness) in line, line
    assert "damaged" in line and "move it aside" in line and "Traceback" not in line, line
    assert witness.is_dir() if DAMAGE[kind] is None else witness.read_bytes() == DAMAGE[kind]
    assert not (tmp_path / "p.db").exists() or \
        provider_stats(tmp_path / "p.db")["executions"] == 0

    os.rename(witness, f"{witness}.damaged")
    assert _run(tmp_path, tmp_path / "L.jsonl").returncode == 0
    assert doubles(tmp_path) == 0


@pytest.mark.parametrize("left", ["empty", "header-alone"])
def test_ledger_left_without_history_is_made_anew_marked_and_runs_nothing_twice(tmp_path,
                                                                                left):
    """Fault: a witnessed JSONL ledger emptied (``: > L``) or cut to its header line
    (``head -1 L > L2; mv L2 L``) between runs. Property: one rule for both -- no history
    is left, so the next run makes it anew marked as salvaged (not refused as "older"),
    looks every request up before sending it: exit 0, no document executes twice."""
    make_corpus(tmp_path / "in", docs=3, poison=0, seed=9)
    ledger = tmp_path / "L.jsonl"
    assert _run(tmp_path, ledger).returncode == 0
    header = ledger.read_bytes().split(b"\n", 1)[0] + b"\n"
    ledger.write_bytes(b"" if left == "empty" else header)

    rerun = _run(tmp_path, ledger)
    assert rerun.returncode == 0, rerun.stderr
    assert _header(ledger)["salvaged"]["from"] == "L.jsonl (missing)"
    assert doubles(tmp_path) == 0

