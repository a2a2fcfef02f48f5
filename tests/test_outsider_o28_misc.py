"""Outsider o28, the rest: salvage through a hard link, from a read-only mount, into a
missing folder, and its summary; explore started with SIGINT ignored.

R3: ``ln L.jsonl bk/L.jsonl`` beside a live (stopped) writer, then ``ledger bk/L.jsonl
--salvage`` gave exit 0 and an unmarked copy of an unfinished history (its writer's lock is
named after the other name); now refused by ``run``'s rule (``canonical_path``), exit 2,
before any lock. R8: a read-only mount failed "cannot open the lock" (exit 2) with no way
out; a NEW in a missing folder made the folder; a salvage that lost only the lines' order
said "corrupt lines none". R7: an explore started with SIGINT ignored ignored an early
``kill -INT`` and honoured a later one; now it keeps ignoring it (POSIX), SIGTERM stops it.

Real files, real processes: a real run's ledger, a real writer stopped with SIGSTOP, a real
read-only bind mount (in a private mount namespace), a real explore.
"""

import glob
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from toolkit import documents
from toolkit.cli import main

pytestmark = pytest.mark.slow

TOOLKIT = [sys.executable, "-m", "toolkit"]


def _ledger(tmp_path):
    """A real non-idempotent batch of 2 run to rest: its JSONL ledger."""
    documents.make_corpus(tmp_path / "in", docs=2, poison=0, seed=5)
    ledger = tmp_path / "L.jsonl"
    assert main(["run", "--inputs", str(tmp_path / "in"), "--ledger", str(ledger),
                 "--provider-db", str(tmp_path / "p.db"), "--out", str(tmp_path / "out"),
                 "--contract", "non-idempotent", "--no-progress"]) == 0
    return ledger


def _salvage(ledger, new):
    return subprocess.run([*TOOLKIT, "ledger", str(ledger), "--salvage", str(new)],
                          capture_output=True, text=True, timeout=120)


def _one_line(done):
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_hard_link_of_a_stopped_live_writers_ledger_salvage_is_refused_before_any_lock(
        tmp_path):
    """Fault (R3): a real writer holds L.jsonl (opened as ``run`` opens it) and is stopped
    (SIGSTOP); the ledger is hard-linked into bk/ and bk/L.jsonl salvaged. Property: exit 2,
    one line naming the hard links, no new ledger and no bk/L.jsonl.lock made; with the link
    gone and the writer dead, the same salvage succeeds."""
    ledger = _ledger(tmp_path)
    writer = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom toolkit.ledger import open_ledger\n"
         f"ledger = open_ledger({str(ledger)!r})\nprint('open', flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    (tmp_path / "bk").mkdir()
    link, new = tmp_path / "bk" / "L.jsonl", tmp_path / "N.jsonl"
    try:
        assert writer.stdout.readline().strip() == "open"
        os.kill(writer.pid, signal.SIGSTOP)
        os.link(ledger, link)
        refused = _salvage(link, new)
        assert refused.returncode == 2, (refused.stdout, refused.stderr)
        assert "hard links" in refused.stderr, refused.stderr
        _one_line(refused)
        assert not new.exists()
        assert sorted(os.listdir(tmp_path / "bk")) == ["L.jsonl"]
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    link.unlink()
    done = _salvage(ledger, new)
    assert done.returncode == 0 and new.exists(), done.stderr


def test_read_only_mount_salvage_says_to_salvage_a_writable_copy(tmp_path):
    """Fault (R8a): the ledger's folder is a real read-only bind mount (a private mount
    namespace: nothing stays mounted). Property: exit 1 (a read-only disk is a storage
    state, README), one line saying to copy the ledger to a writable folder and salvage the
    copy, no new ledger; doing so works."""
    ledger = _ledger(tmp_path)
    ro, new = tmp_path / "ro", tmp_path / "N.jsonl"
    ro.mkdir()
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no private mount namespace here (unshare -m needs root)")
    script = ('mount --bind "$1" "$2" && mount -o remount,bind,ro "$2" && '
              'exec "$3" -m toolkit ledger "$2/L.jsonl" --salvage "$4"')
    refused = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script,
                              "sh", str(tmp_path), str(ro), sys.executable, str(new)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert "read-only" in refused.stderr, refused.stderr
    assert "copy the ledger to a writable folder and salvage the copy" in refused.stderr
    _one_line(refused)
    assert not new.exists()
    (tmp_path / "w").mkdir()
    shutil.copy2(ledger, tmp_path / "w" / "L.jsonl")
    assert _salvage(tmp_path / "w" / "L.jsonl", new).returncode == 0 and new.exists()


def test_salvage_into_a_missing_folder_is_refused_and_makes_no_folder(tmp_path):
    """Fault (R8b): ``--salvage nodir/x.jsonl``, nodir not there (a typo). Property: exit 2,
    one line naming the folder, no folder made (as run refuses a --provider-db there)."""
    ledger = _ledger(tmp_path)
    refused = _salvage(ledger, tmp_path / "nodir" / "x.jsonl")
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "no folder" in refused.stderr and "nodir" in refused.stderr, refused.stderr
    _one_line(refused)
    assert not (tmp_path / "nodir").exists()


def test_salvage_of_swapped_lines_summary_names_the_order_lost_not_corrupt_lines_none(
        tmp_path, capsys):
    """Fault (R8c): two adjacent event lines of a real run's ledger swapped (no line lost,
    only their order). Property: the summary says what was lost (the order of event lines),
    never "corrupt lines none"; an intact ledger's salvage says nothing was lost."""
    ledger = _ledger(tmp_path)
    capsys.readouterr()
    assert main(["ledger", str(ledger), "--salvage", str(tmp_path / "A.jsonl")]) == 0
    intact = capsys.readouterr().out
    assert "lost: nothing" in intact and "corrupt lines" not in intact, intact
    lines = ledger.read_bytes().splitlines(keepends=True)
    lines[3], lines[4] = lines[4], lines[3]
    ledger.write_bytes(b"".join(lines))
    assert main(["ledger", str(ledger), "--salvage", str(tmp_path / "B.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "corrupt lines none" not in out and "lost: the order of event lines" in out, out


def _ignored(pid) -> set[int]:
    """The signals ``pid`` ignores (its SigIgn mask in /proc)."""
    with open(f"/proc/{pid}/status") as status:
        mask = int(next(line for line in status if line.startswith("SigIgn:")).split()[1], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def test_explore_started_with_sigint_ignored_ignores_early_and_late_sigint_sigterm_stops_it(
        tmp_path):
    """Fault (R7): explore started with SIGINT ignored (``explore &`` from a script), sent
    ``kill -INT`` at once and again once it works in its folder. Property: it ignores both
    (SIGINT still in its ignore mask mid-exploration: no handler installed, it keeps
    running); SIGTERM then stops it, exit 143, its folder removed, no traceback."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    with open(tmp_path / "err", "w") as err:
        child = subprocess.Popen(
            [*TOOLKIT, "explore", "--docs", "1", "--every", "2"], env=env,
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=err,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        os.kill(child.pid, signal.SIGINT)  # early: as it starts
        folder = None
        for _ in range(3000):  # polled, not timed: the folder stays until explore ends
            found = glob.glob(str(tmp_path / f"explore-{child.pid}-*"))
            if found:
                folder = found[0]
                break
            assert child.poll() is None, (tmp_path / "err").read_text()
            time.sleep(0.01)
        assert folder, "explore never made its folder"
        assert signal.SIGINT in _ignored(child.pid)  # mid-exploration: still ignored
        os.killpg(child.pid, signal.SIGINT)  # late, to its group (a terminal's Ctrl-C)
        assert signal.SIGINT in _ignored(child.pid)
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    text = (tmp_path / "err").read_text()
    assert child.returncode == 128 + signal.SIGTERM, text
    assert not os.path.exists(folder)
    assert "Traceback" not in text
