"""Outsider findings O28 R1, R2 and R6 on the JSONL ledger.

R1: a JSONL ledger replaced (``cp -p l l.tmp && mv l.tmp l``: how editors and sync tools
save) or removed while ``run`` wrote it: the run kept appending to the unnamed old file,
said done, exit 0, and the rerun executed documents a second time on a non-idempotent
provider. Now every append checks that its path still names the file it holds
(``JsonlLedger._check_named``): the run halts, exit 1, one line.

R2: a plain header (no snapshot count) put over a salvaged ledger's snapshot lines was
accepted: the salvage mark was lost. Now snapshot lines under a header that does not count
them are ``snapshot_mismatch``.

R6: a UTF-8 BOM at the start of a ledger: run accepted it, the audit called line 1 corrupt.
Now the audit accepts a BOM on line 1 too.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter

from toolkit import documents
from toolkit.cli import main
from toolkit.forensics import audit
from toolkit.ledger import State
from toolkit.ledger.jsonl import JsonlLedger
from toolkit.provider.records import provider_stats

from test_outsider_o27_ledger import _lines, _run, _salvaged_batch  # noqa: F401


def _command(folder):
    return [sys.executable, "-m", "toolkit", "run", "--inputs", str(folder / "in"),
            "--ledger", str(folder / "l.jsonl"), "--provider-db", str(folder / "p.db"),
            "--out", str(folder / "out"), "--contract", "non-idempotent", "--no-progress"]


def _interrupted_run(tmp_path, change, lines: int):
    """A real run in a child process, stopped (SIGSTOP) once ``lines`` lines of its ledger
    are on disk (so mid-run: 20 documents write far more), ``change`` applied to the
    ledger's path, continued. Returns the finished child."""
    documents.make_corpus(tmp_path / "in", docs=20, poison=0, seed=2)
    ledger = tmp_path / "l.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(_command(tmp_path), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
    try:
        while True:
            seen = ledger.read_bytes().count(b"\n") if ledger.exists() else 0
            assert child.poll() is None, "the run ended before the ledger was changed"
            if seen >= lines:
                break
            time.sleep(0.002)
        child.send_signal(signal.SIGSTOP)
        seen = ledger.read_bytes().count(b"\n")
        assert lines <= seen < 20 * 4, seen  # mid-run: not every document is done
        change(ledger)
    finally:
        child.send_signal(signal.SIGCONT)
    out, err = child.communicate(timeout=300)
    return child.returncode, err.decode()


def _cp_mv(ledger):
    shutil.copy2(ledger, ledger.with_name("l.tmp"))
    os.replace(ledger.with_name("l.tmp"), ledger)


def _twice(folder) -> int:
    stats = provider_stats(folder / "p.db")
    return sum(t["succeeded"] > 1 for t in stats["per_task"].values())


def test_ledger_replaced_mid_run_halts_and_rerun_executes_nothing_twice(tmp_path, capsys):
    code, err = _interrupted_run(tmp_path, _cp_mv, lines=40)
    assert code == 1
    assert len(err.strip().splitlines()) == 1, err
    assert "was replaced or removed while this run wrote it" in err
    assert main(["health", "--ledger", str(tmp_path / "l.jsonl"), "--clear"]) == 0
    assert _run(tmp_path, tmp_path / "l.jsonl") == 0
    assert _twice(tmp_path) == 0
    # Every document done and executed once -- but for one whose intent reached the copy and
    # whose run was stopped at that intent's own check (the kill-like halt before its
    # submit): never sent, "not found", and a non-idempotent contract forbids a resend, so
    # it is parked for a person. Which of the two the timing gives is not the property.
    with JsonlLedger(tmp_path / "l.jsonl", view=True) as ledger:
        states = Counter(item.state for item in ledger.items())
    executed = len(provider_stats(tmp_path / "p.db")["per_task"])
    assert states[State.DONE] == executed and states[State.NEEDS_REVIEW] <= 1
    assert executed + states[State.NEEDS_REVIEW] == 20, states


def test_ledger_removed_mid_run_halts_with_one_line(tmp_path):
    code, err = _interrupted_run(tmp_path, os.unlink, lines=40)
    assert code == 1
    assert len(err.strip().splitlines()) == 1, err
    assert "was replaced or removed while this run wrote it" in err


def test_ledger_replaced_after_appends_is_refused_at_close(tmp_path):
    path = tmp_path / "l.jsonl"
    with JsonlLedger(path) as ledger:
        ledger.add("k1", "k1.pdf")
        _cp_mv(path)
        try:
            ledger.close()
        except Exception as exc:  # noqa: BLE001 - the error is the property
            assert "replaced or removed" in str(exc)
        else:
            raise AssertionError("close accepted a replaced ledger")


def test_plain_header_over_snapshots_refused_as_snapshot_mismatch(tmp_path, capsys):
    lost, salvaged = _salvaged_batch(tmp_path, capsys)
    for plain in ({"format": "resume-toolkit-ledger-jsonl", "version": 1},
                  {"format": "resume-toolkit-ledger-jsonl", "version": 1, "snapshots": None}):
        path = tmp_path / "plain.jsonl"
        path.write_bytes(json.dumps(plain).encode() + b"\n" + b"".join(_lines(salvaged)[1:]))
        ledger = JsonlLedger(path, view=True)
        try:
            assert ledger.snapshot_damage and ledger.snapshot_damage[0] == "snapshot_mismatch"
        finally:
            ledger.close()
        assert _run(tmp_path, path) != 0
        kinds = {a.kind for a in audit(path).anomalies}
        assert "snapshot_mismatch" in kinds, kinds
    # salvaged once (as an older compacted ledger is): the new ledger runs, the lost key
    # is looked up at the provider, never executed twice
    assert main(["ledger", str(path), "--salvage", str(tmp_path / "again.jsonl")]) == 0
    assert _run(tmp_path, tmp_path / "again.jsonl") == 0
    assert _twice(tmp_path) == 0


def test_bom_on_line_one_audit_agrees_with_run(tmp_path, capsys):
    documents.make_corpus(tmp_path / "in", docs=3, poison=0, seed=5)
    path = tmp_path / "l.jsonl"
    assert _run(tmp_path, path) == 0
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert _run(tmp_path, path) == 0  # run accepts it
    report = audit(path)
    assert not [a for a in report.anomalies if a.kind == "corrupt_line"], report.anomalies
