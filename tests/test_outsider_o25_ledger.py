"""Outsider findings O2 (the ledger's part) and O7 on the JSONL ledger.

O2: lines deleted from a JSONL ledger (a gap in its seqs) went unnoticed: ``ledger`` listed
what was left, and ``run`` executed the lost key a second time. A gap is now damage, the
same rule as a corrupt interior line (``JsonlLedger._replay``, ``ledger/gaps.py``). The
legitimate ways a ledger's file changes (header, compaction, salvage, a torn tail cut, a
failed append, group commit across threads, a kill -9) leave no gap, and stay accepted.

O7: ``run`` answered a damaged JSONL ledger with exit 1 ("run again"), though no rerun gets
past it; ``ledger`` and ``review`` say 2. Now ``run`` says 2 too.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from toolkit import documents
from toolkit.cli import main
from toolkit.errors import LedgerError
from toolkit.ledger import State, open_ledger
from toolkit.ledger.jsonl import HEADER_LINE, JsonlLedger
from toolkit.ledger.salvage import salvage
from toolkit.provider import provider_at

S = State


def _listing(folder):
    return sorted(os.path.relpath(os.path.join(top, name), folder)
                  for top, dirs, files in os.walk(folder) for name in dirs + files)


def _run(folder, corpus, *extra):
    return main(["run", "--inputs", str(corpus), "--ledger", str(folder / "l.jsonl"),
                 "--provider-db", str(folder / "p.db"), "--out", str(folder / "out"),
                 "--contract", "non-idempotent", "--no-progress", *extra])


def _ledger(path, keys=("a", "b", "c"), header=True):
    """A small JSONL ledger: each key added and moved to unknown (seqs 1..2n)."""
    with open_ledger(path) as ledger:
        for key in keys:
            ledger.add(key)
        for key in keys:
            ledger.move(key, S.PENDING, S.UNKNOWN)
    if not header:
        path.write_bytes(path.read_bytes()[len(HEADER_LINE):])
    (path.parent / f"{path.name}.lock").unlink()
    return path


def _without(path, drop):
    """``path`` without the lines for which ``drop(line)`` holds (a person deleting them)."""
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join(line for line in lines if not drop(line)))
    return path.read_bytes()


def test_deleted_lines_of_a_done_key_run_refuses_exit_2_and_nothing_executes_twice(
        tmp_path, capsys):
    """Fault (outsider O2, their commands): a non-idempotent batch of 3 documents done, then
    every line of the second key deleted. Property: ``run`` refuses (exit 2, one line naming
    the missing seqs, audit and salvage), executes nothing (3 executions, none twice), and
    leaves the folder and the ledger's bytes as they were; ``ledger`` and ``review`` refuse
    the same file with one line naming the seqs (exit 2)."""
    corpus = tmp_path / "in"
    documents.make_corpus(corpus, docs=3, poison=0, seed=5)
    assert _run(tmp_path, corpus) == 0
    path = tmp_path / "l.jsonl"
    victim = json.loads(path.read_bytes().split(b"\n")[2])["key"]
    damaged = _without(path, lambda line: victim.encode() in line)
    before = _listing(tmp_path)
    capsys.readouterr()

    assert _run(tmp_path, corpus) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "seq 2, " in line and "missing" in line and "audit" in line and "--salvage" in line
    assert path.read_bytes() == damaged and _listing(tmp_path) == before
    with provider_at(tmp_path / "p.db") as provider:
        stats = provider.stats()
    assert stats["executions"] == 3
    assert all(task["succeeded"] <= 1 for task in stats["per_task"].values())

    for view in (["ledger", str(path)], ["ledger", str(path), "--json"],
                 ["review", "--ledger", str(path)]):
        assert main(view) == 2
        captured = capsys.readouterr()
        [line] = captured.err.strip().splitlines()
        assert captured.out == "" and "seq 2, " in line and "deleted" in line and "audit" in line
    assert path.read_bytes() == damaged


@pytest.mark.parametrize("header", [True, False], ids=["header", "headerless"])
def test_deleted_first_event_line_refuses_writes_and_leaves_the_file_unchanged(tmp_path, header):
    """Fault: the first event line (seq 1, an add) deleted, in a ledger with its header and in
    one written before headers existed. Property: the gap before the first seq counts (a
    history starts at 1); the writer's open changes nothing (no header upgrade), and every
    write and compaction is refused with the missing seq named."""
    path = _ledger(tmp_path / "l.jsonl", header=header)
    damaged = _without(path, lambda line: b'"seq": 1,' in line)
    with open_ledger(path) as ledger:
        assert ledger.missing_seqs == [(1, 1)]
        with pytest.raises(LedgerError, match=r"events of seq 1 \(1 event\)"):
            ledger.add("d")
        with pytest.raises(LedgerError, match="seq 1 "):
            ledger.compact()
        assert "salvage" in ledger.corruption()
    assert path.read_bytes() == damaged


def test_many_and_huge_gaps_are_named_in_one_bounded_line(tmp_path, capsys):
    """Fault: every other move line of 40 keys deleted (19 ranges), and in another ledger a
    last line whose seq jumps to 10**12. Property: one line naming at most 5 ranges and
    counting the rest; the jump is one range, measured without listing its seqs."""
    path = _ledger(tmp_path / "l.jsonl", keys=[f"k{n:02}" for n in range(40)])
    _without(path, lambda line: b'"seq": ' in line
             and json.loads(line)["seq"] % 2 == 0 and 40 < json.loads(line)["seq"] < 80)
    with JsonlLedger(path, view=True) as view:
        assert len(view.missing_seqs) == 19 and view.corrupt_lines == []
        text = view.corruption()
    assert "seq 42, 44, 46, 48, 50 and 14 more ranges (19 events)" in text
    # bounded apart from the paths it names (the ledger, and the salvage's new file beside it)
    assert len(text.replace(str(path.parent), "")) < 300
    assert main(["ledger", str(path)]) == 2
    assert "and 14 more ranges" in capsys.readouterr().err

    jump = _ledger(tmp_path / "j.jsonl")
    lines = jump.read_bytes().split(b"\n")
    lines[-2] = lines[-2].replace(b'"seq": 6,', b'"seq": 1000000000000,')
    jump.write_bytes(b"\n".join(lines))
    with JsonlLedger(jump, view=True) as view:
        assert view.missing_seqs == [(6, 999_999_999_999)]
        assert "seq 6-999999999999 (999999999994 events)" in view.corruption()


def test_zeroed_interior_line_is_reported_corrupt_not_as_deleted_lines(tmp_path):
    """Fault: an interior line zeroed (a crash's zeroed block): its seq cannot be read, so
    its absence from the seqs is that line, not a deletion. Property: corrupt line named,
    no missing seqs claimed; one more line deleted beside it is claimed (two seqs absent,
    one unreadable line)."""
    path = _ledger(tmp_path / "l.jsonl")
    lines = path.read_bytes().split(b"\n")
    lines[2] = b"\0" * len(lines[2])
    path.write_bytes(b"\n".join(lines))
    with JsonlLedger(path, view=True) as view:
        assert view.corrupt_lines == [3, 6] and view.missing_seqs == []  # 6: b's move
        assert "deleted" not in view.corruption()
    _without(path, lambda line: b'"seq": 5,' in line)
    with JsonlLedger(path, view=True) as view:
        assert view.missing_seqs == [(2, 2), (5, 5)]


@pytest.mark.parametrize("damage", ["zeroed-line", "deleted-lines"])
def test_damaged_jsonl_ledger_run_exits_2_as_ledger_and_review_do(tmp_path, capsys, damage):
    """Fault (outsider O7): a real run's JSONL ledger with an interior line zeroed, or lines
    deleted. ``run`` answered exit 1 ("run again"), but no rerun ever gets past it: a person
    must salvage. Property: ``run`` exits 2 with one line, as ``ledger`` and ``review`` do on
    the same file; nothing executed, the ledger's bytes unchanged."""
    corpus = tmp_path / "in"
    documents.make_corpus(corpus, docs=2, poison=0, seed=6)
    assert _run(tmp_path, corpus) == 0
    path = tmp_path / "l.jsonl"
    if damage == "zeroed-line":
        lines = path.read_bytes().split(b"\n")
        lines[2] = b"\0" * len(lines[2])
        path.write_bytes(b"\n".join(lines))
    else:
        _without(path, lambda line: b'"seq": 3,' in line or b'"seq": 4,' in line)
    data = path.read_bytes()
    capsys.readouterr()
    codes = [_run(tmp_path, corpus), main(["ledger", str(path)]),
             main(["review", "--ledger", str(path)])]
    errors = capsys.readouterr().err.strip().splitlines()
    assert codes == [2, 2, 2] and len(errors) == 3 and "Traceback" not in "".join(errors)
    assert path.read_bytes() == data
    with provider_at(tmp_path / "p.db") as provider:
        assert provider.stats()["executions"] == 2


# -- the legitimate histories: no gap, accepted ----------------------------------------------

def _intact(path, more=1):
    """Reopened as a writer: no gap, no corrupt line, seqs 1.. (or base+1..) contiguous, and
    ``more`` writes taken."""
    with open_ledger(path) as ledger:
        assert ledger.missing_seqs == [] and ledger.corrupt_lines == []
        for number in range(more):
            ledger.add(f"{path.stem}-after-{number}")
    with JsonlLedger(path, view=True) as view:
        assert view.missing_seqs == [] and view.corrupt_lines == []
        seqs = [event.seq for event in view.events()]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    return seqs


def test_compaction_and_salvage_snapshots_then_more_events_leave_no_gap(tmp_path):
    """Compaction writes snapshot lines all at the last seq N (the events before are gone);
    the next event is N+1. Salvage writes the same shape. Property: neither reads as a gap,
    and writes go on."""
    path = _ledger(tmp_path / "l.jsonl")
    with open_ledger(path) as ledger:
        ledger.move("a", S.UNKNOWN, S.SUBMITTED)
        assert ledger.compact() == 3
        ledger.move("b", S.UNKNOWN, S.SUBMITTED)
    assert _intact(path)[0] == 8
    salvaged = tmp_path / "s.jsonl"
    assert salvage(path, salvaged)["seq_gaps"] == []
    assert _intact(salvaged)[0] == 10


def test_torn_final_line_cut_by_the_next_writer_leaves_no_gap(tmp_path):
    """Fault: the last line cut mid-way (a crash during its write, never acknowledged).
    The next writer cuts it and reuses its seq. Property: no gap, before or after."""
    path = _ledger(tmp_path / "l.jsonl")
    data = path.read_bytes()
    path.write_bytes(data[:-20])
    with open_ledger(path) as ledger:
        assert ledger.torn_tail is not None and ledger.missing_seqs == []
        ledger.move("c", S.PENDING, S.UNKNOWN)  # its torn move, again: seq 6 reused
    assert _intact(path) == list(range(1, 8))


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (Debian strace)")
def test_append_failed_with_enospc_then_the_next_appends_and_run_leave_no_gap(tmp_path):
    """Fault: the kernel answers ENOSPC to the 4th write on the ledger (strace inject), in a
    process that goes on adding, then a second process writes on. The failed append is cut
    back and its seq not taken. Property: one add failed; no gap, no corrupt line."""
    path = tmp_path / "l.jsonl"
    script = ("import sys\nfrom toolkit.errors import StorageError\n"
              "from toolkit.ledger import open_ledger\nfailed = 0\n"
              "with open_ledger(sys.argv[1]) as ledger:\n    for n in range(8):\n"
              "        try:\n            ledger.add(f'k{n}')\n"
              "        except StorageError:\n            failed += 1\nprint(failed)\n")
    result = subprocess.run(
        ["strace", "-f", "-qq", "-o", "/dev/null", f"-P{path}", "-e", "trace=write",
         "-e", "inject=write:error=ENOSPC:when=4", sys.executable, "-c", script, str(path)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1"]
    with JsonlLedger(path, view=True) as view:
        assert len(view.items()) == 7
    assert _intact(path) == list(range(1, 9))


GROUP_WRITER = """
import sys, threading
from toolkit.ledger import State, open_ledger
ledger = open_ledger(sys.argv[1], group_commit=True)
def work(thread):
    for n in range(100000):
        key = f"t{thread}-{n}"
        ledger.add(key)
        ledger.move(key, State.PENDING, State.UNKNOWN)
threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def test_group_commit_threads_killed_by_sigkill_leave_no_gap(tmp_path):
    """Fault: six threads of one process write with group commit (seq taken and line
    written under the ledger's lock, fsyncs shared outside it), SIGKILLed mid-stream.
    Property: the file's seqs are contiguous (write order is seq order), and the next
    writer goes on from them."""
    path = tmp_path / "l.jsonl"
    child = subprocess.Popen([sys.executable, "-c", GROUP_WRITER, str(path)])
    try:
        for _ in range(600):
            if path.exists() and path.stat().st_size > 60_000:
                break
            time.sleep(0.05)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert path.stat().st_size > 60_000
    seqs = _intact(path, more=3)
    assert seqs[0] == 1 and len(seqs) > 200
