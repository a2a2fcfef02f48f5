"""Group commit: many transitions, one fsync, each caller acknowledged only when durable.

``Commit`` is every transition's frame (lock, transaction, wait, ``on_event``);
``GroupCommit`` and ``SharedFlushes`` are the shared fsync it waits on.

A transition with group commit is written in two phases. Phase one (under the
ledger's lock, and for SQLite under its write lock) checks the guards and
writes the transition -- an SQLite ``COMMIT`` with ``synchronous=NORMAL``, a
JSONL ``write`` -- without an fsync: the bytes are in the page cache, in
commit order, and the guards of the next transition see them. Phase two makes
them durable: the caller takes a *ticket* (the number of flushes started so
far) right after its write, and waits until a flush that started after its
write has finished. The first waiter becomes the leader and runs one fsync;
every transition written before that fsync started rides on it; the ones
written while it is in flight queue for the next one::

    thread A  write(a) ticket 0 --- leader: fsync #1 ------------------| ack a
    thread B     write(b) ticket 0 ---- waits for #1 ------------------| ack b
    thread C                     write(c) ticket 1 -- waits -- leader: fsync #2 --| ack c

Why the prefix is enough: an fsync flushes every byte written to the file
before it started, whoever wrote it, and both files are written strictly in
commit order (JSONL appends; SQLite's WAL frames). So after a power cut the
file holds a prefix of the commits that includes every acknowledged one; a
killed process loses nothing (the page cache is the kernel's). A transition
that read an unsynced one (another thread's claim, say) is itself later in
the file: its own ack waits for a flush that covers both.

``SharedFlushes`` extends the same rule across processes (SQLite worker
processes on one ledger): a ``<ledger>-flush`` file holds two counters,
*started* and *done*, advanced by the one leader that holds the file's lead
byte; a process whose write happened before another process's fsync started
needs no fsync of its own, and waits for that fsync on its own gate byte (a
read lock), so that all the processes one fsync covers return together.
The counters are relative (a caller compares values it read after its own
write), so a stale counter file is harmless; it is never a record.

DEFERRED SYNC. ``sync=False`` on a mutating call of the ledger: the transition
is committed (atomic, guarded, visible to every reader, kept by a kill -9) but
takes no ticket: the next ``sync=True`` transition of any caller, or
``barrier()``/``close()``, makes it durable. A backend that defers
(``Ledger.defers_sync``: SQLite) writes its commits to one ordered log (the
WAL), so that fsync covers every earlier commit and a power cut loses a suffix
of the history, never a hole. The rule for callers (docs/design.md): a
transition an external side effect relies on -- an intent before a submit, a
checkpoint before its predecessor's file is deleted, anything a rerun could
not rebuild by a lookup -- is ``sync=True``; only one whose loss a rerun
repairs without a second execution (the add, a lease, the job id a lookup
finds again, a ``done`` whose fsynced artifact a re-fetch replaces) may defer.
JSONL and PostgreSQL sync every transition.
"""

import contextlib
import fcntl
import os
import struct
import threading

from toolkit.errors import LedgerError, StorageError
from toolkit.ledger.records import Event, fold

COUNTERS = struct.Struct("<QQ")  # started, done
# Two independent locks on one file: open-file-description byte locks (F_OFD_SETLKW), so a
# lock belongs to this process's descriptor and dies with it; flock would be one per file.
WRITER_BYTE, LEAD_BYTE, GATES = 16, 17, 64  # the gates are bytes 64..127 (SharedFlushes)
FLOCK = struct.Struct("hhqqi4x")  # struct flock on Linux: type, whence, start, len, pid
# Each byte's one-byte lock requests, packed once and indexed by kind (Linux: F_RDLCK 0,
# F_WRLCK 1, F_UNLCK 2): a ``pack`` per request cost more than the Python around it.
_KINDS = (fcntl.F_RDLCK, fcntl.F_WRLCK, fcntl.F_UNLCK)
assert _KINDS == (0, 1, 2), _KINDS
_FLOCKS = {byte: tuple(FLOCK.pack(kind, os.SEEK_SET, byte, 1, 0) for kind in _KINDS)
           for byte in (WRITER_BYTE, LEAD_BYTE, *range(GATES, 2 * GATES))}


def _ofd(fd: int, byte: int, kind: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, _FLOCKS[byte][kind])


def _gate(number: int) -> int:
    """The byte whose write lock flush ``number``'s leader holds while it flushes."""
    return GATES + number % GATES


def _try(fd: int, byte: int) -> bool:
    """The write lock on ``byte`` if it is free now (no wait)."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCKS[byte][fcntl.F_WRLCK])
    except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held
        return False
    return True


class Commit:
    """Hold the in-process lock and a backend transaction; emit events after commit.

    Order: guards, write and commit happen under the lock; with group commit
    (``ledger._group``) the caller then waits, outside the lock so that other
    transitions can join the flush, until its own commit is durable. Only then
    do ``on_event`` and the caller's return (the ack) follow. A transition that
    wrote nothing (a guard failed, ``add`` of a known key) waits for nothing.
    A class, not a generator: this runs once per transition. ``sync=False`` defers
    the fsync only where the backend can (``Ledger.defers_sync``). A backend whose
    ``_txn`` is None (JSONL: the lock is the transaction) pays no call and no context manager.
    """

    __slots__ = ("ledger", "txn", "written", "sync")

    def __init__(self, ledger, sync=True):
        self.ledger, self.written, self.sync = ledger, [], sync or not ledger.defers_sync

    def __enter__(self):
        ledger = self.ledger
        group = ledger._group
        if group is not None and group._broken is not None:
            group.check()  # after a failed fsync, write nothing more
        ledger._lock.acquire()
        begin = ledger._txn
        if begin is None:  # the lock is the whole transaction (JSONL): no call to make
            self.txn = None
            return self.commit
        try:
            txn = self.txn = begin()
            if txn is not None:
                txn.__enter__()
        except BaseException:
            ledger._lock.release()
            raise
        return self.commit

    def commit(self, old, op, key, frm, to, attempt, worker, token, detail):
        """Fold the new item, write it with its event; return the new item."""
        ledger = self.ledger
        ts = ledger.clock()
        new = fold(old, op, key, to, attempt, token, ts, detail)
        parts = (ts, op, key, frm, to, attempt, worker, token, detail)
        self.written.append((ledger._write(old, new, parts), parts))
        return new

    def __exit__(self, kind, exc, tb) -> bool:
        ledger, ticket = self.ledger, None
        group = ledger._group
        try:
            txn = self.txn
            suppressed = txn is not None and txn.__exit__(kind, exc, tb)
            if kind is not None:  # rolled back: nothing to wait for, nothing to announce
                return bool(suppressed)
            if self.written and group is not None:
                if self.sync:
                    ticket = group.ticket()
                else:  # deferred (Ledger.defers_sync): the next flush covers it
                    group.defer()
        finally:
            ledger._lock.release()
        if ticket is not None:
            group.wait(ticket)
        if ledger.on_event is not None:
            # Only after the transaction is durable -- or, deferred, committed:
            # ``event_synced`` tells a listener which (Ledger "DEFERRED SYNC").
            ledger.event_synced = self.sync
            for seq, parts in self.written:
                ledger.on_event(Event(seq, *parts))  # built here: only a listener needs it
        return False


class GroupCommit:
    """Leader/follower flushes among the threads of one process.

    ``flush()`` makes every byte written so far durable (raises OSError);
    ``ticket()`` is taken right after a write, ``wait(ticket)`` returns once a
    flush that started after that write has completed. A failed flush breaks
    the group for good: a later fsync could report success for pages the kernel
    already dropped, so every waiter and every later caller gets StorageError.
    """

    def __init__(self, flush, what: str):
        self._flush = flush
        self._what = what
        # A plain lock for the counters (its ``with`` is one C call) and a condition on
        # it for the followers; a leader notifies only when someone waits.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._waiting = 0  # followers inside _cond.wait()
        self._started = 0  # flushes begun in this process
        self._done = 0  # the newest flush completed
        self._leading = False
        self._broken: BaseException | None = None
        self._deferred = -1  # the ticket of the newest deferred write (-1: none)
        self.flushes = 0  # fsyncs this process ran (for tests and benchmarks)

    def defer(self) -> None:
        """A write that returns without waiting: ``barrier()`` will cover it."""
        with self._mutex:
            self.check()
            self._deferred = self._started

    def barrier(self) -> None:
        """Wait until every write so far, the deferred ones included, is durable."""
        with self._mutex:
            ticket = self._deferred
        if ticket >= 0:
            self.wait(ticket)  # returns at once if a later flush already covered it

    def ticket(self) -> int:
        """Taken after the caller's write. No lock: ``_started`` only grows, and a value
        read after the write means every flush numbered above it starts after the write;
        a flush already counted in it may have started before, so it is not waited on."""
        if self._broken is not None:
            self.check()
        return self._started

    def wait(self, ticket: int) -> None:
        """Return once flush number ``ticket + 1`` (or a later one) has completed."""
        with self._mutex:
            while True:
                if self._broken is not None:
                    self.check()
                if self._done > ticket:
                    return
                if not self._leading:
                    break
                self._waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self._waiting -= 1
            # Leader: this flush starts after every write whose ticket is < number.
            self._leading = True
            self._started += 1
            number = self._started
        try:
            self._flush()
            self.flushes += 1
        except BaseException as exc:
            with self._mutex:
                self._broken = exc
                self._leading = False
                self._cond.notify_all()
            if isinstance(exc, LedgerError) and not isinstance(exc, StorageError):
                raise  # the ledger's own words (a WAL found emptied after the fsync: damaged)
            raise StorageError(f"{self._what}: the group's fsync failed: {exc}") from exc
        with self._mutex:
            self._done = number
            self._leading = False
            if self._waiting:  # alone (one thread), there is no one to wake
                self._cond.notify_all()

    @contextlib.contextmanager
    def paused(self):
        """No flush runs inside (e.g. while the file it syncs is being replaced)."""
        with self._mutex:
            while self._leading:
                self._waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self._waiting -= 1
            self._leading = True
        try:
            yield
        finally:
            with self._mutex:
                self._leading = False
                self._cond.notify_all()

    @property
    def broken(self) -> bool:
        return self._broken is not None

    def check(self) -> None:
        """Raises StorageError once a flush of this group has failed."""
        if self._broken is not None:
            raise StorageError(f"{self._what}: an earlier fsync failed ({self._broken}); "
                               "nothing written since is known to be durable: reopen the ledger")


class SharedFlushes:
    """The cross-process half: skip the fsync when another process's covered us.

    ``flush(sync)`` is called by an in-process leader after its writes. It reads
    *started* (a value read after our writes: every flush numbered above it starts
    after them), then loops until a flush numbered above that has completed:

    * *done* > what we read: covered, return (no lock, no fsync);
    * the *lead* byte is free (a write lock taken without waiting; asked only when no
      flush is in flight by the counts, or when that flush's gate stood open): lead --
      *started* += 1, ``sync()``, *done* = that number -- unless, under the lock,
      *done* shows that a flush which ended meanwhile covered us;
    * else wait for flush number *started* (+1 if not yet counted) to end: a read
      lock on that number's *gate* byte, which its leader holds (write) from before
      it counts *started* until after it counts *done*. The kernel wakes every waiter
      when the gate opens, and a woken waiter still has to run to take its read lock:
      the gates rotate through ``GATES`` bytes, so the next leaders take other bytes
      and a waiter that runs late still gets through (one gate for all, each next
      leader would shut it again before most waiters ran: they slept through flushes
      that had covered them). A killed leader's locks die with it: its waiters wake,
      find the lead byte free, and one of them flushes again.

    Counting *started* before ``sync()`` and *done* after it, under the lead lock, is
    what lets a waiter trust *done* without a lock: a flush counted in *done* ran to
    its end, and it started after every write that read a smaller *started*. A killed
    leader leaves *started* > *done*; the next leader's number skips one (only order
    counts). A write lock is never queued for on the lead byte: the kernel orders every
    read lock asked for after a queued write lock behind it, and the waiters would pass
    the lock on one at a time again.

    Measured and not kept (branch groupcommit2-designated-leader): the first process
    written during flush *n* takes gate *n* + 1 and queues on the lead byte, the rest
    sleep on that gate, so each caller sleeps once (0.4-0.7 fewer voluntary switches
    per transition at 8 workers; groups of ~6, not ~4, with gate *n* opened before the
    lead byte). The 8-worker rate fell in 3 of 3 interleaved section-10 pairs.
    """

    def __init__(self, path):
        """Raises OSError when the counter file cannot be opened."""
        self.path = str(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.skipped = 0  # flushes another process's fsync made unnecessary

    def _read(self) -> tuple[int, int]:
        raw = os.pread(self._fd, COUNTERS.size, 0)
        return COUNTERS.unpack(raw) if len(raw) == COUNTERS.size else (0, 0)

    def flush(self, sync) -> None:
        """Return once a flush that started after our writes has ended (``sync()`` run
        here or by another process); raises what ``sync()`` raises. One caller per
        process at a time (``GroupCommit``'s leader): the locks belong to the descriptor,
        so two callers on it would not exclude each other."""
        fd = self._fd
        seen, done = self._read()
        started, last, last_again = seen, None, False
        while True:
            if seen < done <= started:  # (done > started: not counts of ours; flush)
                self.skipped += 1
                return
            again = last == (started, done)
            # Flush ``started`` counted and not done: its leader holds the lead byte (and
            # the gate below) until it ends, so asking for the lead byte would only fail
            # (a raised BlockingIOError per waiter). Asked when nothing is in flight, or
            # when its gate was open with nothing counted since: that leader is dead (or
            # the counts are not ours).
            if (started == done or again) and _try(fd, LEAD_BYTE):
                break
            # The lead byte is held: by the leader of flush ``started`` (in flight, or
            # just counted done: it opens that gate after it frees the lead byte, so
            # the wait ends when leading is possible), by the next leader before it has
            # counted ``started + 1`` (it shuts that gate first), or for an instant by
            # a waiter checking under it. So: wait on gate ``started``; if the lead
            # byte is still held with nothing counted since, on the next one (and,
            # should that be open too, yield the core to whoever holds the lead byte).
            if again and last_again:
                os.sched_yield()
            last, last_again = (started, done), again
            gate = _gate(started + again)
            _ofd(fd, gate, fcntl.F_RDLCK)
            _ofd(fd, gate, fcntl.F_UNLCK)
            started, done = self._read()
        gate = None
        try:  # under the lead lock: nobody else counts or flushes
            started, done = self._read()
            if seen < done <= started:  # a flush that ended since we looked covered us
                self.skipped += 1
                return
            number = started + 1
            gate = _gate(number)
            _ofd(fd, gate, fcntl.F_WRLCK)  # free but for a waiter of GATES flushes ago
            os.pwrite(fd, COUNTERS.pack(number, done), 0)
            sync()
            os.pwrite(fd, COUNTERS.pack(number, number), 0)
        finally:
            # The lead byte first: a waiter woken by the gate that needs the next
            # flush finds it free and leads at once.
            _ofd(fd, LEAD_BYTE, fcntl.F_UNLCK)
            if gate is not None:
                _ofd(fd, gate, fcntl.F_UNLCK)

    def hold_writer(self) -> None:
        """Taken before one write transaction, ``free_writer()`` after it: the processes'
        writers queue in the kernel and each is woken as the lock frees, instead of
        SQLite's busy handler polling with sleeps of 1-100 ms (which leaves the write lock
        idle under contention). Two calls, not a context manager: this runs once per
        transition, and a generator's ``with`` costs about as much as the lock itself."""
        _ofd(self._fd, WRITER_BYTE, fcntl.F_WRLCK)

    def free_writer(self) -> None:
        _ofd(self._fd, WRITER_BYTE, fcntl.F_UNLCK)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
