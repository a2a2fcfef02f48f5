"""Group commit across processes: a waiter waits on its flush's gate, not on the lead lock.

``SharedFlushes`` (toolkit/ledger/group.py): the leader of flush *n* holds the lead
byte and gate byte *n* while it flushes; a waiter takes a read lock on the gate. Here
the test process speaks that protocol itself, with real OFD locks on the real
``-flush`` file and a real ``fdatasync`` of the ledger's WAL, so that it can stop
between two steps; the waiter is a real process writing through a real ledger. What
is checked is an order (who returns while which lock is held), never a time: the
test knows the waiter is parked from ``/proc/locks``, where the kernel lists it.
"""

import fcntl
import os
import subprocess
import sys
import time

import pytest

from toolkit.ledger import open_ledger
from toolkit.ledger.group import COUNTERS, FLOCK, LEAD_BYTE, _gate

WAITER = r"""
import sys
from toolkit.ledger import open_ledger
ledger = open_ledger(sys.argv[1], group_commit=True)
ledger.add("doc-1")  # returns only once a flush that started after the write has ended
print("acked", ledger._flushes.skipped, flush=True)
ledger.close()
"""


def _lock(fd, byte, kind, wait=True):
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK,
                FLOCK.pack(kind, os.SEEK_SET, byte, 1, 0))


def _parked(path) -> bool:
    """Does the kernel list a lock request waiting on ``path`` (any byte)?"""
    info = os.stat(path)
    where = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            if "->" in fields and where in fields:
                return True
    return False


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="needs /proc/locks (Linux)")
def test_next_leader_hung_holding_the_lead_byte_covered_waiter_still_acked(tmp_path):
    """What breaks: a flush ends and, before its waiters run, the next leader takes the
    lead byte and hangs in its fsync. Must hold: a waiter whose write that ended flush
    covered returns at once (acknowledged, no fsync of its own) while the lead byte is
    still held. With waiters queued on the flush lock itself, it stayed parked behind
    the hung leader, and it slept through flushes that had covered it."""
    path = tmp_path / "ledger.sqlite"
    open_ledger(path, group_commit=True).close()  # the tables and the -flush file
    flush_file = f"{path}-flush"
    fd = os.open(flush_file, os.O_RDWR)
    try:
        started, done = COUNTERS.unpack(os.pread(fd, COUNTERS.size, 0) or bytes(16))
        number = started + 1
        # The leader of flush ``number``, stopped after taking its locks and before
        # counting it: a write made now is covered by this flush.
        _lock(fd, LEAD_BYTE, fcntl.F_WRLCK, wait=False)
        _lock(fd, _gate(number), fcntl.F_WRLCK, wait=False)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        waiter = subprocess.Popen([sys.executable, "-c", WAITER, str(path)], env=env,
                                  stdout=subprocess.PIPE, text=True)
        try:
            for _ in range(6000):  # the waiter writes, then parks (on gate ``number``)
                if _parked(flush_file) or waiter.poll() is not None:
                    break
                time.sleep(0.01)
            assert _parked(flush_file), "the waiter never waited"
            # The flush, done for real: count it, fsync the WAL the waiter wrote, count it done.
            os.pwrite(fd, COUNTERS.pack(number, done), 0)
            wal = os.open(f"{path}-wal", os.O_RDONLY)
            os.fdatasync(wal)
            os.close(wal)
            os.pwrite(fd, COUNTERS.pack(number, number), 0)
            _lock(fd, _gate(number), fcntl.F_UNLCK)  # the gate opens; the lead byte stays held
            out, _ = waiter.communicate(timeout=120)
            assert waiter.returncode == 0 and out.split() == ["acked", "1"], out
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
    finally:
        os.close(fd)  # frees the lead byte
    with open_ledger(path) as ledger:
        assert [item.key for item in ledger.items()] == ["doc-1"]


def test_counter_file_with_done_above_started_still_fsyncs_before_the_ack(tmp_path):
    """What breaks: the ``-flush`` file holds counts no leader of ours wrote (*done*
    above *started*: damaged, or written by another program). Must hold: a caller
    does not read that as "another process's fsync covered me"; it runs the fsync
    itself before its ack, and the counts it leaves are ours again."""
    path = tmp_path / "ledger.sqlite"
    open_ledger(path).close()
    with open(f"{path}-flush", "wb") as counters:
        counters.write(COUNTERS.pack(3, 9))
    with open_ledger(path, group_commit=True) as ledger:
        ledger.add("doc-1")
        assert (ledger._group.flushes, ledger._flushes.skipped) == (1, 0)
    with open(f"{path}-flush", "rb") as counters:
        assert COUNTERS.unpack(counters.read(COUNTERS.size)) == (4, 4)
