"""Who has an SQLite ledger open: a shared ``flock`` on the database file, held by every
connection the toolkit opens on it (``hold``), taken before ``sqlite3.connect``.

Why: SQLite's own rule is that a process opening a WAL database whose ``-shm`` is missing
is alone, and it builds a new index from the WAL. If a live process still has the old
``-shm`` mapped (the file was deleted under it), there are then two indexes: each process
thinks it is alone, both append to one WAL, each misses the other's commits (work the
other recorded runs again) and the database ends up corrupt. The flock tells the two cases
apart: an opener that finds ``-shm`` missing proceeds only if it gets the flock
exclusively (nobody live has the file; SQLite may rebuild), keeping it so until the
connection has made its ``-shm`` (``Hold.settle``); otherwise it is refused
(``LedgerBusyError``), nothing written.

flock and SQLite's locks (POSIX ``fcntl`` byte ranges) are independent on Linux local file
systems. A POSIX lock from a second descriptor would be wrong: closing that descriptor
drops every POSIX lock of the process on the file, SQLite's own included.

Not covered: a ``-shm`` deleted in the microseconds between the check here and SQLite's
open of it; a connection of another program (the ``sqlite3`` shell) holds no flock.
"""

import fcntl
import os
import random
import threading
import time

from toolkit.errors import LedgerBusyError

# How long an opener that finds -shm missing and the file held waits for that to end: an
# opener holding it exclusively while it connects, or the last connection closing (SQLite
# deletes -wal and -shm as it closes, before its process lets go of the flock) take
# milliseconds; a live run whose -shm was deleted holds it until it ends.
SETTLE = 1.0
# (st_dev, st_ino) -> (pid, connections): the ledgers this process has open. A new
# connection of this process shares the -shm mapping of an open one (SQLite's unix VFS
# keeps one per file and process), so it rebuilds nothing whether -shm is there or not.
# The pid: a forked child inherits the dict, not the connections.
_OPEN: dict = {}
_OPEN_LOCK = threading.Lock()


class Hold:
    """The flock on one SQLite ledger for one connection: ``settle()`` once the connection
    has read the database (its -shm is made), ``release()`` after the connection is closed."""

    def __init__(self, fd: int, file: tuple, exclusive: bool):
        self.fd, self._file, self.exclusive = fd, file, exclusive
        with _OPEN_LOCK:
            pid, count = _OPEN.get(self._file, (os.getpid(), 0))
            _OPEN[self._file] = (os.getpid(), count + 1 if pid == os.getpid() else 1)

    def settle(self) -> None:
        """Exclusive -> shared: the connection's -shm is there now, others may open it."""
        if self.exclusive and self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_SH)
            self.exclusive = False

    def release(self) -> None:
        """Close the descriptor (the kernel drops the flock with it); call after the
        connection is closed, so the flock covers the connection's whole life."""
        if self.fd is None:
            return
        with _OPEN_LOCK:
            pid, count = _OPEN.get(self._file, (os.getpid(), 1))
            if count <= 1 or pid != os.getpid():
                _OPEN.pop(self._file, None)
            else:
                _OPEN[self._file] = (pid, count - 1)
        os.close(self.fd)
        self.fd = None


def hold(path, create: bool = False) -> Hold | None:
    """Hold the SQLite database at ``path`` for a connection about to be opened on it.

    ``create``: make the file if missing (as ``sqlite3.connect`` would, same mode), for a
    writer. None when the file cannot be opened (missing, unreadable): then neither can
    SQLite, and its connect says why, as before.

    Raises:
        LedgerBusyError: ``path``'s -shm is missing while a live process has it open.
    """
    try:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not create:
                return None
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        file = (info.st_dev, info.st_ino)
        return Hold(fd, file, _settle(fd, file, _real(fd, path)))
    except BaseException:
        os.close(fd)
        raise


def _real(fd: int, path) -> str:
    """The file's own name, symlinks resolved (SQLite names -shm after it): the kernel's
    name of the open descriptor, one readlink where ``realpath`` is one lstat per folder."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)
    return real if real.startswith("/") and not real.endswith(" (deleted)") \
        else os.path.realpath(path)


def _settle(fd: int, file: tuple, real: str) -> bool:
    """Take the flock on ``fd``: True if exclusive (hold it so until ``Hold.settle``)."""
    deadline = None
    while True:
        # Exclusive first: nobody else has the file open, whatever -shm is (a missing one
        # SQLite rebuilds from the WAL, an existing one it checks with its own locks).
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        # Shared: waits while an opener holds it exclusively (until its -shm is made). The
        # check comes after the flock: held, no one of ours can be making -shm meanwhile.
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.path.exists(f"{real}-shm") or _ours(file):
            return False
        # -shm missing while someone holds the file. Let go, wait a little (jittered: two
        # openers meeting here do not retry in step) and try again; past SETTLE it is a
        # live holder whose -shm was deleted under it.
        fcntl.flock(fd, fcntl.LOCK_UN)
        now = time.monotonic()
        deadline = deadline or now + SETTLE
        if now > deadline:
            raise LedgerBusyError(_refusal(fd, real))
        time.sleep(random.uniform(0.01, 0.05))


def _ours(file: tuple) -> bool:
    with _OPEN_LOCK:
        pid, count = _OPEN.get(file, (None, 0))
    return pid == os.getpid() and count > 0


def _refusal(fd: int, real: str) -> str:
    from toolkit.storage import lock_holder  # /proc/locks: only on this rare path

    pid = lock_holder(fd)
    who = f"live process {pid}" if pid else "a live process"
    return (f"SQLite ledger {real!r} is open in {who}, but its {os.path.basename(real)}-shm "
            "was deleted: opening it now would build a second index beside that process's "
            "and corrupt the ledger; let that run end (or stop it), then run again; never "
            "delete the -wal or -shm of a ledger in use")
