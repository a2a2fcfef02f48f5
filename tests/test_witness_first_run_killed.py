"""A batch's first run killed before its first intent (outsider o40 MEDIUM 2): its witness
entry says seq 0, its ledger holds no event, and a roots file may lie beside it. The rule
that turns a ledger with no history into a salvage mark (``witness.missing``) took that
entry for a loss: the ledger was marked "salvaged ... lost: all of it" for good, and every
new document then cost 10 lookups (30 under a lagging lookup). Real runs (processes), a
real SIGKILL at each fsync and fdatasync of the run up to its first intent (strace)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import run_cli
from toolkit.documents import make_corpus
from toolkit.forensics import audit
from toolkit.ledger.header import no_history
from toolkit.provider import provider_records, provider_stats

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")]

DOCS = 2
LAST = 40  # more syncs than any run makes before its first intent (a loop that must end)


def _run_args(folder, suffix):
    return ["run", "--inputs", folder / "in", "--ledger", folder / f"l{suffix}",
            "--provider-db", folder / "p.sqlite", "--out", folder / "out", "--no-progress"]


def _killed_first_run(folder, suffix, syscall, nth) -> bool:
    """A new batch in ``folder``, its first run SIGKILLed at its ``nth`` ``syscall`` (the
    main process's); False if it made fewer (it finished)."""
    make_corpus(folder / "in", docs=DOCS, poison=0, seed=5)
    killed = subprocess.run(
        ["strace", "-qq", "-o", os.devnull, "-e", f"trace={syscall}",
         "-e", f"inject={syscall}:signal=SIGKILL:when={nth}", sys.executable, "-m",
         "toolkit", *map(str, _run_args(folder, suffix)), "--new-batch"],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "XDG_STATE_HOME": str(folder / "state")})
    return killed.returncode in (-9, 137)


def _witnessed_at_zero(folder, suffix) -> bool:
    """The case at risk: the witness in ``out`` saw the ledger at seq 0, and it holds none."""
    try:
        entries = json.loads((folder / "out" / ".witness.json").read_text())["ledgers"]
    except FileNotFoundError:
        return False
    seqs = [entry["seq"] for real, entry in entries.items() if real.endswith(f"l{suffix}")]
    return seqs == [0] and no_history(folder / f"l{suffix}")


@pytest.mark.parametrize("suffix", [".sqlite", ".jsonl"])
def test_first_run_killed_before_its_first_intent_leaves_no_salvage_mark_nor_lookups(
        tmp_path, suffix):
    """Fault: the first run of a new batch SIGKILLed at each of its fsyncs and fdatasyncs
    before its first intent is in the ledger (the sweep stops at the first kill that
    leaves an event there). Property: the rerun (lagging lookups, ``lag=2``) runs every
    document once with no lookup at all, and the ledger carries no salvage mark (before:
    "salvaged from l (no rows) (all of it (... reach seq 0 ...))", 3 lookups x 10
    attempts per document); the audit of the killed run's ledger does not say its history
    was lost, only that it was or that the first run stopped before its first event (it
    cannot read the witness; before: "its history was lost")."""
    at_risk = noted = 0
    for syscall in ("fsync", "fdatasync"):
        for nth in range(1, LAST + 1):
            folder = tmp_path / f"{syscall}{nth}"
            if not _killed_first_run(folder, suffix, syscall, nth):
                break
            ledger = folder / f"l{suffix}"
            if os.path.lexists(ledger) and not no_history(ledger):
                break  # killed at or after the first intent: looked up, as any unknown
            at_risk += _witnessed_at_zero(folder, suffix)
            notes = [note for note in audit(ledger).notes if note.startswith("no_history")] \
                if os.path.lexists(ledger) else []
            noted += bool(notes)  # the audit cannot see the witness: it names both readings
            assert all("its first run stopped before its first event" in n for n in notes)
            env = {**os.environ, "XDG_STATE_HOME": str(folder / "state")}
            rerun = subprocess.run([sys.executable, "-m", "toolkit",
                                    *map(str, _run_args(folder, suffix)),
                                    "--contract", "idempotent,lag=2"],
                                   capture_output=True, text=True, timeout=180, env=env)
            where = f"killed at {syscall} #{nth}"
            assert rerun.returncode == 0, (where, rerun.stderr)
            lookups = [call for call in provider_records(folder / "p.sqlite")["calls"]
                       if call["op"] == "lookup"]
            assert not lookups, (where, len(lookups))
            assert provider_stats(folder / "p.sqlite")["executions"] == DOCS, where
            assert not [note for note in audit(ledger).notes if "salvaged" in note], where
        else:
            pytest.fail(f"no {syscall} #{LAST} killed a run after its first intent")
    assert at_risk  # the sweep reached the moments after the witness saw seq 0
    assert noted  # and those after the roots file, where the audit notes no history


def test_ledger_emptied_beside_its_roots_file_alone_is_marked_without_claiming_all_was_lost(
        tmp_path):
    """With no witness entry (its --out's witness deleted), only the roots file says runs
    used an emptied ledger: not how far they got, nor that any event was recorded. The mark
    says what is known ("whatever it held"), not "all of it" (before: "lost: all of it")."""
    make_corpus(tmp_path / "in", docs=DOCS, poison=0, seed=5)
    args = _run_args(tmp_path, ".jsonl")
    assert run_cli(*args).returncode == 0
    (tmp_path / "out" / ".witness.json").unlink()
    (tmp_path / "l.jsonl").write_bytes(b"")
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    (note,) = [note for note in audit(tmp_path / "l.jsonl").notes if "salvaged" in note]
    assert "whatever it held (" in note and "l.jsonl.roots.json says runs used" in note
    assert "all of it" not in note
    assert provider_stats(tmp_path / "p.sqlite")["executions"] == DOCS
