"""Faults a second outsider round found on the o25 fixes with README alone (o26 P2-P4).

* P2: an ``--out`` no artifact can land in still billed the whole batch: ``--out`` named
  the ledger's own file (the run created it first, every artifact then failed), or a
  read-only file system (EROFS for every write). Same paths are refused before anything
  is created; a read-only ``--out`` halts at the first artifact, as a full one does.
* P3: ``audit --csv`` replaced files no path rule protects: an input reached through a
  bind mount, another ledger, the provider's database. An existing target that is not
  empty and not an audit CSV is refused.
* P4: the same file for ``--ledger`` and ``--provider-db`` made the provider's database
  at the ledger's path before the refusal: now refused first, nothing created.
"""

import hashlib
import subprocess
from pathlib import Path

import pytest

from conftest import tmpfs_mount
from test_outsider_o25_runner import DOCS, _states, run_args, toolkit
from toolkit.documents import make_corpus
from toolkit.provider import provider_at


def _listing(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else "dir" for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("ledger, provider_db, out", [
    ("l.jsonl", "p.db", "l.jsonl"),       # --out is the ledger the run would create
    ("l.sqlite", "p.db", "p.db"),         # --out is the provider's database
    ("l.jsonl", "l.jsonl", "out"),        # one file for the ledger and the provider
    ("l.sqlite", "./l.sqlite", "out"),    # the same file, spelled another way
])
def test_one_path_for_two_of_ledger_provider_and_out_is_refused_before_anything_is_made(
        tmp_path, ledger, provider_db, out):
    """Fault: two of ``--ledger``, ``--provider-db`` and ``--out`` name one path. Property:
    one line, exit 2, nothing created in the folder, nothing executed (before: the whole
    batch was executed and billed, and no artifact landed)."""
    make_corpus(tmp_path / "in", docs=2, poison=0, seed=2)
    before = _listing(tmp_path)
    refused = toolkit(tmp_path, "run", "--inputs", "in", "--ledger", ledger, "--provider-db",
                      provider_db, "--out", out, "--no-progress", "--contract", "non-idempotent")
    assert refused.returncode == 2, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "same path" in refused.stderr
    assert _listing(tmp_path) == before


def test_read_only_out_halts_the_batch_at_the_first_artifact_and_bills_no_more(tmp_path):
    """Fault: ``--out`` on a read-only file system (a real tmpfs mounted ``ro``: every write
    fails with EROFS). Property: the batch stops with one line, exit 1, before its first
    send (the run cannot record the ledger's witness in --out: runner/witness.py), so the
    provider executed nothing (before the witness: it halted at the first artifact, with
    one document executed and left ``submitted``), never the whole batch."""
    corpus = tmp_path / "in"
    make_corpus(corpus, docs=DOCS, poison=0, seed=5)
    with tmpfs_mount(tmp_path / "out", "size=1m,ro") as out:
        first = toolkit(tmp_path, *run_args(corpus, out))
    assert first.returncode == 1, first.stderr
    lines = first.stderr.strip().splitlines()
    assert len(lines) == 1 and "witness" in lines[0] and "read-only" in lines[0], lines
    states = _states(tmp_path / "l.sqlite")
    with provider_at(tmp_path / "p.sqlite") as provider:
        executed = provider.stats()["executions"]
    assert not states.get("submitted") and executed == 0, (executed, states)


def _audited_batch(tmp_path) -> Path:
    make_corpus(tmp_path / "in", docs=2, poison=0, seed=3)
    done = toolkit(tmp_path, *run_args(tmp_path / "in", tmp_path / "out", "l.sqlite", "p.db"))
    assert done.returncode == 0, done.stderr
    return tmp_path


@pytest.mark.parametrize("target", ["p.db", "other.sqlite", "bound/doc-000.pdf"])
def test_csv_over_a_ledger_a_provider_db_or_a_bind_mounted_input_is_refused_unchanged(
        tmp_path, target):
    """Fault: ``audit --csv`` names the provider's database, another ledger, or an input
    reached through a bind mount of the inputs folder (same file, a path no real-path rule
    sees). Property: one line, exit 2, the file byte-identical; an earlier audit CSV is
    still replaced (the check refuses only what is not one)."""
    batch = _audited_batch(tmp_path)
    (batch / "other.sqlite").write_bytes((batch / "l.sqlite").read_bytes())
    if target.startswith("bound/"):
        (batch / "bound").mkdir()
        if subprocess.run(["mount", "--bind", str(batch / "in"), str(batch / "bound")],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot bind-mount here (needs root)")
    try:
        before = (batch / target).read_bytes()
        refused = toolkit(batch, "audit", "l.sqlite", "--csv", target)
        assert refused.returncode == 2, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert (batch / target).read_bytes() == before
    finally:
        if target.startswith("bound/"):
            subprocess.run(["umount", "-l", str(batch / "bound")], check=False)
    assert toolkit(batch, "audit", "l.sqlite", "--csv", "items.csv").returncode == 0
    again = toolkit(batch, "audit", "l.sqlite", "--csv", "items.csv")
    assert again.returncode == 0, again.stderr
