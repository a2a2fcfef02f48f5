"""Snapshot mode of crash exploration: the same verdicts as real SIGKILLs, from copies.

The reference is the real mode (a replayed child killed by SIGKILL at step k);
snapshot mode records one run, copies the batch folder at every step and
recovers from the copies. These tests prove that both give the same row at
every crash point, that every counted point was really recovered and judged,
and that what snapshot mode cannot reproduce is refused, not approximated.
"""

import subprocess
import sys
import threading

import pytest

from toolkit.errors import ToolkitError
from toolkit.explore import TEAR, Plan, explore
from toolkit.explore.snapshot import Recorder

from test_explore import same_rows

@pytest.mark.slow
def test_snapshot_and_real_sigkill_modes_give_the_same_verdict_at_every_crash_point():
    """Kill at every durable step (and tear every download) of the benchmark's batch, both modes.

    The safe two-document batch rests everywhere, with one parked intent per
    document. Every point of the real mode must have its twin in snapshot
    mode with the same step, verdict, anomalies, executions, submits and
    outcome; and every snapshot point really ran a recovery. (Each naive
    design is compared the same way in test_explore.py.)
    """
    real = explore(Plan(contract="non-idempotent", docs=2))
    snapshot = explore(Plan(contract="non-idempotent", docs=2, mode="snapshot"))
    assert (real.mode, snapshot.mode) == ("real", "snapshot")
    assert snapshot.steps == real.steps
    assert same_rows(snapshot) == same_rows(real)
    assert all(row["runs"] >= 1 for row in snapshot.rows)  # a recovery ran at every point
    assert snapshot.total()["recovered"] == len(snapshot.rows)  # and each counts in the rate
    assert sum(row["how"] == TEAR for row in snapshot.rows) == 2  # one download per document
    assert {row["verdict"] for row in snapshot.rows} == {"valid", "parked"}


def test_snapshot_mode_refuses_what_it_cannot_reproduce_with_a_one_line_error():
    """Pairs, power loss and expiring keys need the real mode: refused, never approximated."""
    for plan in (Plan(mode="snapshot", pairs=True),
                 Plan(mode="snapshot", ledger="jsonl", power_loss=True),
                 Plan(mode="snapshot", contract="non-idempotent,retention=60"),
                 Plan(mode="fast")):
        with pytest.raises(ToolkitError):
            plan.validate()
    result = subprocess.run([sys.executable, "-m", "toolkit", "explore", "--mode", "snapshot",
                             "--pairs"], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_recorder_refuses_to_copy_while_another_thread_may_write(tmp_path):
    """A thread other than a lease heartbeat alive at a step: no copy, an error instead."""
    (tmp_path / "batch").mkdir()
    (tmp_path / "batch" / "ledger.sqlite").write_bytes(b"x")
    record = Recorder(tmp_path / "batch", tmp_path / "snapshots", quiet=60.0)
    record(1)
    assert (tmp_path / "snapshots" / "1-kill" / "ledger.sqlite").read_bytes() == b"x"
    stop = threading.Event()
    writer = threading.Thread(target=stop.wait, name="writer")
    writer.start()
    try:
        with pytest.raises(RuntimeError, match="writer"):
            record(2)
    finally:
        stop.set()
        writer.join()
    assert not (tmp_path / "snapshots" / "2-kill").exists()
    late = Recorder(tmp_path / "batch", tmp_path / "snapshots", quiet=0.0)
    with pytest.raises(RuntimeError, match="heartbeat"):  # past half the lease: it may write
        late(3)


def test_recorder_tear_copy_cuts_the_download_in_the_copy_only(tmp_path):
    """The tear+kill twin: the copy's download is cut to half, the recording's stays whole."""
    batch = tmp_path / "batch"
    (batch / "out").mkdir(parents=True)
    download = batch / "out" / ".tmp-x.part"
    download.write_bytes(b"0123456789")
    Recorder(batch, tmp_path / "snapshots", quiet=60.0)(4, download)
    assert download.read_bytes() == b"0123456789"
    assert (tmp_path / "snapshots" / "4-kill" / "out" / ".tmp-x.part").read_bytes() == \
        b"0123456789"
    assert (tmp_path / "snapshots" / "4-tear" / "out" / ".tmp-x.part").read_bytes() == b"01234"


def test_recorder_copies_explored_steps_whole_and_stops_at_a_copy_naming_its_folder(tmp_path):
    """Fault: a naive ledger records an absolute path; its copy, recovered in another folder,
    would name a folder that is not the recovery's. Property: each explored step's copy
    keeps bytes, mode and ``mtime_ns``; steps not explored (``every``) are not copied; the
    first copy holding the recording's folder is named (``dependent``) and no copy follows."""
    import os

    batch = tmp_path / "batch"
    (batch / "out").mkdir(parents=True)
    ledger = batch / "ledger.json"
    ledger.write_bytes(b'{"a": "out/a.pdf"}')
    os.chmod(ledger, 0o640)
    os.utime(ledger, ns=(1_000_000_123, 2_000_000_456))
    record = Recorder(batch, tmp_path / "snapshots", quiet=60.0, every=2)
    record(1)
    record(2)  # (2 - 1) % 2: not explored
    copy = tmp_path / "snapshots" / "1-kill" / "ledger.json"
    assert copy.read_bytes() == ledger.read_bytes()
    assert (copy.stat().st_mode & 0o777, copy.stat().st_mtime_ns) == (0o640, 2_000_000_456)
    assert (tmp_path / "snapshots" / "1-kill" / "out").is_dir()
    assert not (tmp_path / "snapshots" / "2-kill").exists() and record.dependent is None
    ledger.write_text(f'{{"a": "{batch}/out/a.pdf"}}')  # an absolute path into the batch
    record(3)
    assert record.dependent == "3-kill/ledger.json names the folder it was recorded in"
    record(5)
    assert not (tmp_path / "snapshots" / "5-kill").exists()


def test_checks_are_answered_by_content_and_torn_bytes_are_checked_for_real(tmp_path,
                                                                          monkeypatch):
    """Snapshot mode answers preflight and OCR routing by the bytes' SHA-256 (``memo``).

    A copy of an input under another name (the client's private copy) is answered
    from the table without MuPDF; a copy torn to half its bytes (what a crash
    mid-copy leaves) is new content: checked for real, and found truncated.
    """
    import shutil

    from toolkit import documents
    from toolkit.documents import make_corpus
    from toolkit.explore.memo import input_checks, same_checks

    (source,) = make_corpus(tmp_path / "in", docs=1, poison=0, seed=0)
    table = input_checks([source])
    real, calls = documents.preflight, []

    def counted(path, *args, **kwargs):
        calls.append(path)
        return real(path, *args, **kwargs)
    monkeypatch.setattr(documents, "preflight", counted)  # restored after the test
    monkeypatch.setattr(documents, "ocr_routed", documents.ocr_routed)
    same_checks(table)
    copy = tmp_path / "private-copy.pdf"
    shutil.copyfile(source, copy)
    assert documents.preflight(copy).ok and calls == []
    assert documents.ocr_routed(copy.read_bytes(), {}) == {}  # a text document: as it is
    torn = tmp_path / "torn.pdf"
    torn.write_bytes(source.read_bytes()[: source.stat().st_size // 2])
    verdict = documents.preflight(torn)
    assert calls == [torn] and not verdict.ok and verdict.reason.startswith("truncated")
