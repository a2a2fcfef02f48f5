"""Storage primitives shared by the ledger and the fake provider (rank 1).

``sqlite_txn`` is the one ``BEGIN IMMEDIATE … COMMIT`` of every SQLite user.
SQLite rolls a transaction back *itself* on some errors (``SQLITE_FULL``,
``SQLITE_IOERR`` during a commit): a plain ``ROLLBACK`` then raises "cannot
rollback - no transaction is active" and hides the real error. Here the
rollback happens only while a transaction is open, and every ``sqlite3.Error``
becomes ``StorageError`` naming what could not be recorded.

The names of the files a file ledger keeps beside itself (``<ledger><suffix>``)
live here too, once: the code that makes each one and ``audit --csv``, which must
never write over any of them, import them from here.
"""

import contextlib
import errno
import fcntl
import json
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from toolkit.errors import LedgerBusyError, LedgerError, StorageError

WAL, SHM, JOURNAL = "-wal", "-shm", "-journal"  # SQLite's own
FLUSH = "-flush"       # group commit's counter, shared by a ledger's processes (ledger/group.py)
LOCK = ".lock"         # the JSONL ledger's single-writer lock (ledger/jsonl.py)
ROOTS = ".roots.json"  # the batch's roots (roots.py); held under ROOTS + LOCK
INPUTS = ".inputs"     # the inputs' stat index (runner/inputindex.py)
HEALTH = ".health"     # the not-ready marker of a batch that failed closed (runner/ops.py)
COMPANIONS = (WAL, SHM, JOURNAL, FLUSH, LOCK, ROOTS, ROOTS + LOCK, INPUTS, HEALTH)

# Errors that say "this path is not (and cannot be) a database": bad input, not a failing disk.
NOT_A_DATABASE = ("SQLITE_NOTADB", "SQLITE_CANTOPEN")
# What an operator fixes on the storage, not in the command: no free byte or inode, a quota,
# a file-size limit, a failing device. Anything else from the OS (no such folder, no
# permission, not a directory) is the path the user gave: bad input.
FULL_OR_FAILING = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})
# A read-only file system (EROFS) is a storage state too (exit 1), with its own advice: a
# writer (run, resolve) cannot even take the ledger's lock there; the views read it as it is.
READ_ONLY = ("the file system is read-only: remount it writable, or copy the batch folder "
             "to writable storage and run there (ledger and audit read it where it is)")


def storage_error(what: str, exc: sqlite3.Error, path=None) -> LedgerError:
    """The toolkit error for ``exc``: ``StorageError`` unless the file is no database at all.

    SQLite says "unable to open database file" (``SQLITE_CANTOPEN``) both for a folder
    that does not exist and for one whose filesystem has no free inode (the database or
    its ``-wal`` cannot be created). With ``path`` (the database file) the folder itself
    is asked: a real file created there fails with the storage's errno or it does not.
    """
    name = getattr(exc, "sqlite_errorname", "")
    full = cannot_create(path) if name == "SQLITE_CANTOPEN" and path is not None else None
    if full is not None and full.errno == errno.EROFS:
        return StorageError(f"{what}: {exc}; {READ_ONLY}")
    if full is not None:  # the folder answers ENOSPC (no inode) or EDQUOT: the storage's
        return StorageError(f"{what}: {exc} (a new file there: {full.strerror})")
    if name.startswith("SQLITE_READONLY") and path is not None and read_only(path):
        return StorageError(f"{what}: {exc}; {READ_ONLY}")
    return (LedgerError if name in NOT_A_DATABASE else StorageError)(f"{what}: {exc}")


def os_error(what: str, exc: OSError) -> LedgerError:
    """The toolkit error for an OS error on a ledger's file: ``StorageError`` when the
    storage is full or failing (exit 1, run again once space is freed), else bad input."""
    if exc.errno == errno.EROFS:
        return StorageError(f"{what}: {exc.strerror}; {READ_ONLY}")
    storage = exc.errno in FULL_OR_FAILING
    return (StorageError if storage else LedgerError)(f"{what}: {exc}")


def read_only(path) -> bool:
    """Is the file system holding ``path`` (or its folder) mounted read-only?"""
    try:
        return bool(os.statvfs(os.path.dirname(os.path.abspath(path))).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def cannot_create(path) -> OSError | None:
    """The error (full, failing or read-only storage only) that creating a file beside
    ``path`` meets now.

    A real file of a fresh private name (``mkstemp``), removed at once: it asks the
    filesystem what SQLite asked it (``statvfs`` shows neither quotas nor reserved
    inodes). None when a file can be created, or when the folder fails for another
    reason (missing, not writable: the caller's bad input stays bad input).
    """
    try:
        fd, probe = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                                     prefix=f".{os.path.basename(path)}.", suffix=".probe")
    except OSError as exc:
        return exc if exc.errno in FULL_OR_FAILING or exc.errno == errno.EROFS else None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def rollback(db: sqlite3.Connection) -> None:
    """Roll back if (and only if) a transaction is still open; never raises."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):  # the connection is being abandoned anyway
            db.execute("ROLLBACK")


class sqlite_txn:  # noqa: N801 -- used as a function: ``with sqlite_txn(db, what):``
    """One exclusive transaction on ``db``; ``with`` yields ``db``.

    Order matters: the COMMIT is inside the error mapping so that a failed commit
    (the engine may already have rolled back) is mapped like any other error.
    A class rather than a generator: it runs once per ledger transition, and a
    generator-based context manager costs more Python than the rest of it.

    Raises:
        StorageError: any ``sqlite3.Error`` (disk full, I/O error, busy, read-only).
    """

    __slots__ = ("db", "what")

    def __init__(self, db: sqlite3.Connection, what: str):
        self.db, self.what = db, what

    def __enter__(self) -> sqlite3.Connection:
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:  # CANTOPEN: a -wal/-shm/-journal not created; ask why
            raise storage_error(f"{self.what}: cannot begin a transaction", exc,
                                _main_file(self.db)) from exc
        return self.db

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is not None:
            rollback(self.db)
            if issubclass(kind, sqlite3.Error):
                raise storage_error(self.what, exc, _read_only_file(self.db, exc)) from exc
            return False
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error as error:
            rollback(self.db)
            raise storage_error(self.what, error, _read_only_file(self.db, error)) from error
        return False


def _read_only_file(db: sqlite3.Connection, exc: sqlite3.Error) -> str | None:
    """``db``'s file when ``exc`` says it cannot be written (``SQLITE_READONLY*``), so that
    ``storage_error`` asks its file system and gives the read-only advice: a write refused
    inside a transaction (a ledger with a ``-wal`` left by a kill, on a file system since
    remounted read-only: the open succeeds, the first write does not). Only on this error
    path: a transaction that succeeds never asks."""
    if getattr(exc, "sqlite_errorname", "").startswith("SQLITE_READONLY"):
        return _main_file(db)
    return None


def _main_file(db: sqlite3.Connection) -> str | None:
    """The file of ``db``'s main database (None: in memory, or the connection cannot say)."""
    try:
        return next((row[2] for row in db.execute("PRAGMA database_list")
                     if row[1] == "main"), None) or None
    except sqlite3.Error:
        return None


def sqlite_read(what: str, reader, *args):
    """``reader(*args)`` outside a transaction, with ``sqlite3.Error`` mapped to ``StorageError``."""
    try:
        return reader(*args)
    except sqlite3.Error as exc:
        raise storage_error(what, exc) from exc


EOF_OFFSET = 2 ** 63 - 1  # a lock "to EOF" in /proc/locks: past any byte


def live_process(pid: int | None) -> str:
    """A lock holder in words: ``"live process N"``, or ``"a live process"`` (pid unknown)."""
    return f"live process {pid}" if pid else "a live process"


def _locks_on(info: os.stat_result):
    """``(kind, pid, start, end)`` of every lock held on the file ``info`` describes, from
    ``/proc/locks`` (none without it). It names a file by ``MAJOR:MINOR:INODE`` (hex, hex,
    decimal); a waiter's line is marked ``->`` and is skipped (it holds nothing)."""
    where = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        with open("/proc/locks") as locks:
            lines = locks.read().splitlines()
    except OSError:
        return
    for line in lines:
        fields = line.split()
        if len(fields) > 7 and fields[4].isdigit() and fields[5] == where:
            end = EOF_OFFSET if fields[7] == "EOF" else int(fields[7])
            yield fields[1], int(fields[4]), int(fields[6]), end


def lock_holder(fd: int) -> int | None:
    """The pid of the live process whose ``flock`` on ``fd``'s file kept ours out; None if
    unknown (no ``/proc/locks``, the holder just exited, or its pid is not ours to see).
    The pid is checked to be alive: a flock inherited across fork outlives its taker."""
    for kind, pid, _, _ in _locks_on(os.fstat(fd)):
        if kind == "FLOCK" and pid > 0 and os.path.exists(f"/proc/{pid}"):
            return pid
    return None


# SQLite's lock bytes in a database file (os_unix.c): PENDING_BYTE, RESERVED_BYTE and the
# 510 of SHARED_FIRST. A connection in WAL mode holds a read lock there for as long as it
# is open: how its closing peer knows it is not the last (and must not delete the WAL).
SQLITE_LOCK_BYTES = (0x40000000, 0x40000000 + 511)
# How long an opener that finds -shm or -wal missing while another process holds it waits
# for that to end: a peer between its lock and its -shm (opening), or deleting the WAL and
# -shm (the last one closing), takes milliseconds; a live run whose -shm was deleted, for ever.
SHM_SETTLE = 2.0


def _sqlite_users(info: os.stat_result) -> tuple[int | None, bool]:
    """Who holds SQLite's lock bytes of the file ``info`` describes: the pid of another
    process (0: not ours to see; None: no other), and whether this process does."""
    first, last = SQLITE_LOCK_BYTES
    other, mine = None, False
    for kind, pid, start, end in _locks_on(info):
        if kind == "POSIX" and start <= last and end >= first:
            if pid == os.getpid():
                mine = True
            elif other is None:
                other = pid
    return other, mine


def sqlite_holder(path) -> int | None:
    """Another live process that has the SQLite database ``path`` open, by SQLite's lock
    bytes in ``/proc/locks`` (no descriptor opened): its pid (0: not ours to see), or None
    (none, no such file, no ``/proc/locks``). This process's own connections do not count."""
    try:
        return _sqlite_users(os.stat(path))[0]
    except OSError:
        return None


SECOND_INDEX = ("opening it now would build a second index and each process would miss the "
                "other's commits (work done twice, a corrupt database)")


def refuse_deleted_wal_shm(path, what: str, sides=None, harm: str = SECOND_INDEX) -> None:
    """Refuse to open the SQLite database ``path`` while its ``-shm`` or ``-wal`` is
    missing and another live process has it open (Linux; elsewhere nothing is checked).

    SQLite takes a missing ``-shm`` to mean nobody has the database open and builds a new
    index from the WAL (a missing ``-wal``: a new, empty WAL). If a live process still
    has the old file open (it was deleted under it), there would be two: each process
    misses the other's commits (work it recorded runs again) and the database ends up
    corrupt. A live connection always has both (SQLite makes them at its open and deletes
    them only as the last one closes), so the two are missing together with a holder
    only for the moments a peer opens or closes: ``SHM_SETTLE``. Checked before any
    connection, and without opening the file (closing a descriptor of it would drop every
    POSIX lock this process holds on it, SQLite's own included): the holder is read from
    ``/proc/locks``. While this process has a connection open on the file, a new one
    needs no check: SQLite shares one mapping per file and process (a ``--workers``
    worker's own reads). ``sides``: the side files asked about (a reader of a private
    copy needs the WAL alone: ``forensics.private.refuse_stale``), ``harm`` what opening
    it would do. Not covered: a file deleted between this check and SQLite's open of it.

    Raises:
        LedgerBusyError: one line naming the process; nothing was opened or written.
    """
    deadline = time.monotonic() + SHM_SETTLE
    sides = sides or (SHM, WAL)  # a reader of a copy of the file and its WAL: (WAL,) alone
    while missing := [side for side in sides if not os.path.exists(f"{path}{side}")]:
        try:
            holder, mine = _sqlite_users(os.stat(path))
        except OSError:
            return  # no database yet: connect makes it, or says why it cannot
        if holder is None or mine:
            return
        if time.monotonic() > deadline:
            raise LedgerBusyError(
                f"{what}: its {' and '.join(missing)} was deleted while "
                f"{live_process(holder)} has it open; {harm}: run again when that process "
                f"ends, and never delete a ledger's {WAL} or {SHM} while it is in use")
        time.sleep(0.05)


@contextlib.contextmanager
def exclusive_lock(path, best_effort: bool = False):
    """Hold an exclusive ``flock`` on the lock file ``path`` (created if missing) for the
    ``with`` block, waiting for it: the one "lock beside X" of the roots, the witness and
    the batch registry. The kernel releases it with its descriptor, and with the process
    (kill -9 included): a lock file left behind is never a held lock.

    ``best_effort``: a lock file that cannot be opened (a read-only folder) leaves the
    block unlocked, since nothing beside it can be written either; otherwise the
    ``OSError`` is the caller's."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        if not best_effort:
            raise
        fd = None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the flock


def take_exclusive(fd: int) -> str | None:
    """Take an exclusive ``flock`` on ``fd`` without waiting (how a JSONL ledger's writer
    holds ``<ledger>.lock``): None when taken -- held until ``fd`` is closed -- else who
    holds it, in words: ``"live process N"``, or ``"a live process"`` (``lock_holder``)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return live_process(lock_holder(fd))
    return None


def open_exclusive(path, flags: int, mode: int = 0o644) -> tuple[int | None, str | None]:
    """Open ``path`` and take an exclusive ``flock`` on the file itself, never waiting:
    ``(fd, None)`` once held (until ``fd`` is closed), else ``(None, who holds it)``.

    How a JSONL ledger's writers exclude each other on the ledger file, not only on
    ``<ledger>.lock``: a lock file can be deleted under its holder (the next opener makes a
    new one and takes it), the ledger cannot without the holder's next append seeing it.
    The classic race of a lock on a file that is replaced or unlinked: between our open and
    our flock, the holder may ``os.replace`` a new file over the name (a compaction or an
    upgrade, which locks the new file before it takes the name) and close the old one, whose
    lock we would then get. So the name is checked to still be the file we hold; if not,
    we open it again (a few times: a name replaced on every try is held by someone).

    Raises:
        OSError: from ``os.open`` (the caller words it).
    """
    for _ in range(3):
        fd = os.open(path, flags, mode)
        holder = take_exclusive(fd)
        if holder is not None:
            os.close(fd)
            return None, holder
        held = os.fstat(fd)
        try:
            named = os.stat(path)
        except FileNotFoundError:  # removed after our open: the name is another file's now
            named = None
        if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
            return fd, None
        os.close(fd)
    return None, "a process replacing it"


def roots_file(ledger_path) -> Path | None:
    """Where a file ledger's roots are recorded (None for a PostgreSQL URL); ``roots`` writes
    them, and the ledger's own messages read them here."""
    if ledger_path is None or str(ledger_path).startswith(("postgres:", "postgresql:")):
        return None
    return Path(f"{ledger_path}{ROOTS}")


def recorded(ledger_path) -> dict[str, Path]:
    """The recorded roots (``{"out": Path, "inputs": Path}``), resolved; {} if none."""
    marker = roots_file(ledger_path)
    try:
        saved = json.loads(marker.read_text()) if marker is not None else {}
    except (OSError, ValueError):
        return {}
    if not isinstance(saved, dict):
        return {}
    base = Path(ledger_path).parent
    return {name: base / value for name, value in saved.items() if isinstance(value, str)}
