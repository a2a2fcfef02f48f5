"""Resume without re-reading unchanged inputs: the inputs' stat index (git's index).

A rerun takes an input's content digest from ``<ledger>.inputs`` while the
input's device, inode, size, ``mtime_ns`` and ``ctime_ns`` are those recorded;
any difference, ``--verify``, a stat a write could still keep (racy), or a
damaged index: the input is read and hashed in full. Reads are counted (in
process: the reader's calls; across a real process: ``openat`` under strace),
never timed.
"""

import os
import shutil
import subprocess
import sys
import types

import pytest

from toolkit import liveness
from toolkit.provider import provider_stats
from toolkit.runner import inputindex, keying

from indexed_batch import batch, inputs, reads, wait_until_settled  # noqa: F401 (fixtures)


def test_rerun_of_a_done_batch_reads_no_input_whose_stat_matches(batch, reads):
    """Fault: none (a plain rerun). Property: the first run reads each input and records
    its stat and digest; the rerun stats them and reads none, keys every one to its item
    (4 done, the poison still quarantined) and executes nothing."""
    batch()
    assert len(reads) >= 5 and batch.index.is_file()
    executions = provider_stats(batch.provider_db)["executions"]
    reads.clear()
    runner, counts = batch()
    assert reads == [] and counts["done"] == 4 and counts["failed"] == 1
    assert runner.reused == 4 and provider_stats(batch.provider_db)["executions"] == executions


def test_touched_input_is_read_again_and_keyed_to_its_item(batch, reads, inputs):
    """Fault: one input touched (``utime``: mtime moved, bytes unchanged). Property: the
    rerun reads exactly that input, finds it is the same content (reused, not re-executed)
    and reads none of the others."""
    batch()
    victim = inputs[0]
    info = os.stat(victim)
    os.utime(victim, ns=(info.st_atime_ns, info.st_mtime_ns + 1_000_000_000))
    wait_until_settled([victim])
    executions = provider_stats(batch.provider_db)["executions"]
    reads.clear()
    runner, counts = batch()
    assert reads == [victim.name] and counts["done"] == 4
    assert provider_stats(batch.provider_db)["executions"] == executions


def test_same_size_rewrite_with_mtime_restored_is_new_content_not_the_done_item(
        batch, reads, inputs):
    """Fault: an input's bytes rewritten in place, same size, its mtime set back with
    ``utime`` (only ``ctime`` moves). Property: the rerun reads it, keys its new content
    as a new item and executes it; the old done item is not taken for it."""
    batch()
    victim = next(path for path in inputs if path.read_bytes().startswith(b"%PDF"))
    info, data = os.stat(victim), bytearray(victim.read_bytes())
    data[-1:] = b" " if data[-1:] == b"\n" else b"\n"  # after %%EOF: still the same PDF
    with open(victim, "r+b") as handle:  # the same inode, the same size
        handle.write(data)
    os.utime(victim, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert (os.stat(victim).st_size, os.stat(victim).st_mtime_ns, os.stat(victim).st_ino) == \
        (info.st_size, info.st_mtime_ns, info.st_ino)
    executions = provider_stats(batch.provider_db)["executions"]
    reads.clear()
    runner, counts = batch()
    assert victim.name in reads and set(reads) == {victim.name}
    assert counts["done"] == 4 and runner.reused == 3  # three reused, the new one executed
    assert provider_stats(batch.provider_db)["executions"] == executions + 1


def test_input_replaced_by_a_copy_with_a_new_inode_is_read_again(batch, reads, inputs):
    """Fault: an input replaced by a byte-identical copy (new inode, same size, mtime kept
    by ``copy2``). Property: the rerun reads that one input and reuses its done item."""
    batch()
    victim = inputs[1]
    shutil.copy2(victim, victim.with_suffix(".tmp"))
    os.replace(victim.with_suffix(".tmp"), victim)
    wait_until_settled([victim])
    reads.clear()
    runner, counts = batch()
    assert reads == [victim.name] and counts["done"] == 4 and runner.reused == 4


def test_verify_reads_every_input_and_records_them_again(batch, reads, inputs):
    """Fault: none. Property: ``verify=True`` (``run --verify``) trusts no recorded stat:
    every input is read; the index it leaves still vouches for them (a plain rerun after
    it reads none)."""
    batch()
    reads.clear()
    batch(verify=True)
    assert sorted(set(reads)) == sorted(path.name for path in inputs)
    reads.clear()
    batch()
    assert reads == []


def test_a_stat_taken_within_the_writes_clock_tick_is_not_recorded(batch, reads, inputs,
                                                                   monkeypatch):
    """Fault: racy git: the first run's reads start within the clock tick of the inputs'
    last writes (the clock the reader consults reads the earliest of their ctimes: each
    write may have landed after the read began). Property: no stat is
    recorded, so the rerun reads every input again; the next one, whose reads were not
    racy, reads none."""
    monkeypatch.setattr(keying, "now_ns", lambda: min(os.stat(p).st_ctime_ns for p in inputs))
    batch()
    monkeypatch.setattr(keying, "now_ns", inputindex.now_ns)
    reads.clear()
    batch()
    assert sorted(set(reads)) == sorted(path.name for path in inputs)
    reads.clear()
    batch()
    assert reads == []


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign paths"])
def test_damaged_index_costs_reads_never_a_wrong_key(batch, reads, damage):
    """Fault: the index file damaged (random bytes, cut mid-line, lines of other paths).
    Property: the rerun reads what the index cannot vouch for, keys each input to its own
    item (4 done, 1 poison) and executes nothing."""
    batch()
    text = batch.index.read_bytes()
    batch.index.write_bytes({"garbage": os.urandom(len(text)),
                             "truncated": text[:len(text) // 2],
                             "foreign paths": text.replace(b"/inputs/", b"/other/")}[damage])
    executions = provider_stats(batch.provider_db)["executions"]
    reads.clear()
    runner, counts = batch()
    assert reads and counts["done"] == 4 and counts["failed"] == 1
    assert provider_stats(batch.provider_db)["executions"] == executions


def test_index_lines_keep_any_name(tmp_path):
    """Fault: none. Property: names with a newline, a backslash, a space or bytes that are
    not UTF-8 survive the index's line format unchanged."""
    for name in ["a b.pdf", "new\nline.pdf", "back\\slash.pdf", "bad\udcff.pdf", "\\n.pdf"]:
        line = inputindex._line(name, (1, 2, 3, 4, 5), "f" * 64, "e" * 64)
        assert line.count("\n") == 1 and inputindex._parse(line)[:4] == \
            (name, "1 2 3 4 5", "f" * 64, "e" * 64)
    assert inputindex.index_file("postgresql://h/db") is None
    assert inputindex.index_file(":memory:") is None


def test_stamp_not_written_as_the_stat_writes_it_is_never_vouched_for(tmp_path):
    """Fault: an index line whose stamp holds the file's numbers spelled otherwise (a
    leading zero, a plus sign) or garbage. Property: the stamp is compared as the text a
    stat writes, never parsed: only the exact line vouches; any other costs a read."""
    path = tmp_path / "doc.pdf"
    path.write_bytes(b"%PDF-1.4 bytes\n")
    dev, ino, size, mtime, ctime = inputindex.stamp(os.stat(path))
    ledger = tmp_path / "ledger.sqlite"
    for stamp_text, vouched in [(f"{dev} {ino} {size} {mtime} {ctime}", True),
                                (f"{dev} {ino} 0{size} {mtime} {ctime}", False),
                                (f"{dev} {ino} +{size} {mtime} {ctime}", False),
                                (f"{dev} {ino} {size} {mtime} x", False)]:
        index_path = inputindex.index_file(ledger)
        index_path.write_text(inputindex.header('k') + inputindex.sealed(
            [f"{stamp_text} {'a' * 64} {'b' * 64} {path}\n"], 'k'))
        index = inputindex.InputIndex(ledger, "k", record=False)
        digests, keys, _ = index.vouch([path])
        assert (digests, keys) == ((["a" * 64], ["b" * 64]) if vouched else
                                   ([None], [None])), stamp_text
        assert index.vouched == vouched
        index.discard()


def test_settled_needs_the_ctime_older_than_the_reads_start_by_a_tick():
    """Fault: none. Property (the racy rule): a ctime within the margin before the read's
    start is not vouched for; a whole-second ctime (1 s or 2 s file systems) needs 2 s."""
    started = 1_700_000_000_123_456_789

    def info(ctime):
        return types.SimpleNamespace(st_ctime_ns=ctime)
    assert inputindex.settled(info(started - 10**9), started)
    assert not inputindex.settled(info(started - 1_000_000), started)
    assert not inputindex.settled(info(started), started)
    assert not inputindex.settled(info(1_699_999_999_000_000_000), started)  # whole second
    assert inputindex.settled(info(1_699_999_997_000_000_000), started)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_cli_rerun_opens_no_input_file_under_strace(tmp_path, inputs):
    """Fault: none. Property, seen by the kernel: a real ``python -m toolkit run`` over a
    done batch opens none of its input files (strace counts every ``openat``), and exits 0;
    with ``--verify`` it opens each of them."""
    wait_until_settled(inputs)
    args = [sys.executable, "-m", "toolkit", "run", "--inputs", str(inputs[0].parent),
            "--ledger", str(tmp_path / "l.sqlite"), "--provider-db", str(tmp_path / "p.db"),
            "--out", str(tmp_path / "out"), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run(args, check=True, capture_output=True, env=env)

    def opened(extra=()):
        trace = tmp_path / "trace.txt"
        done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat,open", "-o",
                               str(trace), *args, *extra], capture_output=True, env=env)
        assert done.returncode == 0, done.stderr.decode()[-500:]
        return {name for line in trace.read_text().splitlines() for name in
                (path.name for path in inputs) if f'/inputs/{name}"' in line}
    assert opened() == set()
    assert opened(["--verify"]) == {path.name for path in inputs}


@pytest.mark.slow
def test_workers_count_reads_no_input_the_index_vouches_for(tmp_path, inputs, monkeypatch):
    """Fault: none (``run --workers 2`` twice). Property: after the workers of the rerun
    exit, the parent counts the batch from the input index (no input read, no MuPDF look):
    4 done and the poison, as the workers left them."""
    from toolkit.runner import workers

    wait_until_settled(inputs)
    ledger, provider_db = tmp_path / "l.sqlite", tmp_path / "p.db"
    workers.run_workers(ledger, provider_db, inputs, tmp_path / "out", 2)
    seen = []
    real_stat, real_key = keying.read_stat, workers._input_key
    monkeypatch.setattr(keying, "read_stat", lambda path, limit=None: seen.append(path) or
                        real_stat(path, limit))
    monkeypatch.setattr(workers, "_input_key", lambda path, *args: seen.append(path) or
                        real_key(path, *args))
    result = workers.run_workers(ledger, provider_db, inputs, tmp_path / "out", 2)
    assert seen == [] and result.counts["done"] == 4 and result.counts["failed"] == 1


def test_new_index_left_by_a_killed_run_is_removed_by_the_next(batch, tmp_path):
    """Fault: a run killed before its end leaves its new index (a ``.tmp`` named by its pid
    and start time). Property: the next run deletes the one whose process is gone and
    keeps the one of a live process (this test's own)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"ledger.sqlite.inputs.{gone.pid}-1.abc.tmp"
    live = tmp_path / f"{liveness.owned_temp_prefix('ledger.sqlite.inputs')}abc.tmp"
    for leftover in (dead, live):
        leftover.write_text(inputindex.HEADER)
    batch()
    assert not dead.exists() and live.exists() and batch.index.is_file()
    assert sorted(p.name for p in tmp_path.glob("ledger.sqlite.inputs.*")) == [live.name]


KILLED_RUN = """
import os, signal, sys
from pathlib import Path
from toolkit.ledger import open_ledger
from toolkit.provider import FakeProvider
from toolkit.runner import Runner

folder, *inputs = sys.argv[1:]
def hook(point, key, **context):  # the run's new index is open now: die as kill -9 does
    if point == "before_intent":
        os.kill(os.getpid(), signal.SIGKILL)
Runner(open_ledger(Path(folder) / "ledger.sqlite"), FakeProvider(Path(folder) / "provider.db",
       Path(folder) / "jobs"), Path(folder) / "out", hook=hook).run(inputs)
"""


def test_index_temp_of_a_run_killed_by_sigkill_is_removed_by_a_page_by_page_rerun(
        batch, tmp_path, inputs):
    """Fault (outsider o35 S3): a run's process really killed by SIGKILL while its new index
    (``<ledger>.inputs.<pid>-<start>.*.tmp``) is open; the next run routes page by page (it
    keeps no index). Property: the killed run's temp is there after the kill (SIGKILL runs no
    cleanup) and the next run removes it all the same; a live process's temp stays."""
    batch(inputs=inputs[:1])  # a ledger with an index; the other inputs are new work
    killed = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(tmp_path),
                               *map(str, inputs)], stderr=subprocess.PIPE)
    _, stderr = killed.communicate(timeout=120)
    assert killed.returncode == -9, stderr.decode()[-2000:]
    left = [p.name for p in tmp_path.glob("ledger.sqlite.inputs.*.tmp")]
    assert len(left) == 1 and left[0].startswith(f"ledger.sqlite.inputs.{killed.pid}-")
    live = tmp_path / f"{liveness.owned_temp_prefix('ledger.sqlite.inputs')}abc.tmp"
    live.write_text(inputindex.HEADER)
    batch(inputs=inputs, page_by_page_from=100)
    assert sorted(p.name for p in tmp_path.glob("ledger.sqlite.inputs.*.tmp")) == [live.name]
