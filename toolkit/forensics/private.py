"""A private copy of a ledger file, for views that must never write beside the original.

SQLite writes even through ``mode=ro``: a reader of a WAL database creates (or
rebuilds) the ``-shm`` index, and the toolkit's own ledger API migrates an
older schema, sets the journal mode, writes a schema into a 0-byte file, and
the JSONL ledger takes ``PATH.lock``. A view reads a copy instead: the file
and its ``-wal`` copied into a private folder, opened there, the folder
removed. Nothing is created, changed or touched beside the original.

The copy is of one moment: the file and its ``-wal`` are copied, then their
size and mtime are compared with what they were before; a writer that moved
meanwhile makes us copy again (a checkpoint between the two copies would
otherwise pair an old database with a restarted WAL).

A JSONL ledger needs no copy (``opened_view``): it is read in place through a name in a
private folder (see ``_jsonl_in_place``), its one lock file made there. The copy is
made in TMPDIR; when TMPDIR is full (or the copy passes this process's file-size limit,
or its device fails a write), the error says so, naming TMPDIR (``ScratchFull``, exit 1):
it says nothing of the ledger. Each error of the copy is told where it happens
(``_copy_file``): a read is the ledger's, a write TMPDIR's. A copy written whole is
the ledger's bytes, so what SQLite then calls damage (malformed, not a database, a short
read: ``sqlite_damage.DAMAGE``) is the ledger's, in the ledger's words (exit 2), never TMPDIR's.
"""

import contextlib
import errno
import fcntl
import os
import struct
import tempfile
from pathlib import Path

from toolkit.errors import LedgerBusyError, StorageError, ToolkitError

# SQLite's unix VFS: every connection to a WAL database holds a shared lock on one byte of
# its -shm file (the "dead man switch", offset 120 + 8 lock bytes) for as long as it is open.
_SHM_DMS_OFFSET = 128
SIDE_FILES = ("-wal",)  # -shm is an index SQLite rebuilds from the WAL; -journal: see sqlite.py
_TRIES = 5
_BLOCK = 8 << 20  # a sendfile call (or a read) at most: as shutil copies


class CopyError(ToolkitError):
    """The copy itself failed (disk full under TMPDIR, an unreadable file): a storage
    error, never a sign that the file is of no known format."""


class ScratchFull(CopyError, StorageError):
    """TMPDIR, where a view makes its private folder, is full, failed a write, or the copy
    passed this process's file-size limit: the storage's (exit 1, "free space, run again"),
    and no verdict on the ledger, which was never written (``about_the_ledger``)."""
    about_the_ledger = False


class LedgerUnreadable(CopyError, StorageError):
    """The ledger's own storage failed a read of it (EIO): exit 1, about the ledger."""


# What a private folder's writes can meet that is the scratch space's, never the ledger's:
# reading a file never answers these.
_SCRATCH_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_ROOM = 1 << 20  # less free in TMPDIR than a copy's -shm and -wal may need: "full"


def scratch_full(exc: BaseException, path) -> ScratchFull | None:
    """The one-line error naming TMPDIR when ``exc`` (an OSError, or SQLite's "database or
    disk is full" on the private copy) is the scratch space's; None otherwise."""
    errno_ = getattr(exc, "errno", None)
    if errno_ not in _SCRATCH_FULL and getattr(exc, "sqlite_errorname", "") != "SQLITE_FULL":
        return None
    why = getattr(exc, "strerror", None) or "database or disk is full"
    where = f"TMPDIR {tempfile.gettempdir()!r}"
    state, fix = (f"{where}: {why}, this process's file-size limit (RLIMIT_FSIZE)", "raise "
                  "the limit") if errno_ == errno.EFBIG else (f"{where} is full ({why})",
                                                              "free space there")
    return ScratchFull(f"{state}: a private copy of {str(path)!r} is read there, so that the "
                       f"original is never written; {fix} or set TMPDIR to a folder with room, "
                       "and run again")


def _scratch_failed(exc: OSError, path) -> ScratchFull:
    """A write into the private folder failed: TMPDIR's, whatever its errno (EIO too)."""
    return scratch_full(exc, path) or ScratchFull(
        f"TMPDIR {tempfile.gettempdir()!r} failed ({exc.strerror or exc}): a private copy of "
        f"{str(path)!r} is written there, so that the original is never written; set TMPDIR to "
        "a folder that works, and run again")


def _copy_file(source, target, path) -> None:
    """``source`` into ``target`` (new, in the private folder), told apart where it fails:
    a failed open or read is the ledger's (``CopyError``), a failed create or write
    TMPDIR's (``ScratchFull``). ``sendfile`` (no bytes through user space, as shutil copies)
    fails as one call for both sides: its error is the read's only if the same bytes do
    not read alone (``_whose``); a file system without it is copied by read and write."""
    try:
        src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise _unreadable(exc, path) from exc
    try:
        try:
            dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise _scratch_failed(exc, path) from exc
        try:
            offset = 0
            while True:
                try:
                    sent = os.sendfile(dst, src, offset, _BLOCK)
                except OSError as exc:
                    if exc.errno in (errno.EINVAL, errno.ENOSYS) and offset == 0:
                        return _read_write(src, dst, path)
                    raise _whose(exc, src, offset, path) from exc
                if not sent:
                    return
                offset += sent
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _read_write(src: int, dst: int, path) -> None:
    while block := memoryview(_read(src, path)):
        while block:  # a write may take part of the block
            try:
                block = block[os.write(dst, block):]
            except OSError as exc:
                raise _scratch_failed(exc, path) from exc


def _read(src: int, path, offset=None) -> bytes:
    try:
        return os.read(src, _BLOCK) if offset is None else os.pread(src, _BLOCK, offset)
    except OSError as exc:
        raise _unreadable(exc, path) from exc


def _whose(exc: OSError, src: int, offset: int, path) -> CopyError:
    """The error of a failed ``sendfile`` at ``offset``: the ledger's when those bytes do
    not read alone either, else TMPDIR's (a full disk never answers a read)."""
    if exc.errno not in _SCRATCH_FULL:
        _read(src, path, offset)  # raises the ledger's CopyError
    return _scratch_failed(exc, path)


def _unreadable(exc: OSError, path) -> CopyError:
    kind = LedgerUnreadable if exc.errno == errno.EIO else CopyError
    return kind(f"cannot read {str(path)!r}: {exc.strerror or exc}")


@contextlib.contextmanager
def _scratch(path):
    """A private folder in TMPDIR, removed afterwards; ScratchFull if it cannot be made."""
    try:
        folder = tempfile.TemporaryDirectory(prefix="toolkit-view-")
    except OSError as exc:  # no free inode (or no space) in TMPDIR for the folder itself
        raise (scratch_full(exc, path) or exc) from exc
    with folder as name:
        yield Path(name)


def _fingerprint(path: Path):
    found = []
    for candidate in (path, *(Path(f"{path}{side}") for side in SIDE_FILES)):
        try:
            info = os.stat(candidate)
            found.append((info.st_size, info.st_mtime_ns))
        except FileNotFoundError:
            found.append(None)
    return found


def live_wal_connection(path) -> bool:
    """Whether another process has the WAL database at ``path`` open right now.

    Asked with ``F_GETLK``, which only reports a conflicting lock and takes none: a
    live writer's ``-shm`` is its own, and a reader through it changes nothing that
    outlives the read; a ``-wal`` left by a dead writer has no such lock, and even a
    ``mode=ro`` reader would rebuild its ``-shm``, so that one is read from a copy.
    """
    try:
        fd = os.open(f"{path}-shm", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        request = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, _SHM_DMS_OFFSET, 1, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, request)
        return struct.unpack("hhqqi4x", answer)[0] != fcntl.F_UNLCK
    except OSError:
        return False
    finally:
        os.close(fd)


def refuse_stale(path) -> None:
    """Refuse to read a WAL database whose ``-wal`` was deleted while a live process has
    it open: its latest commits are in that process's WAL alone, and a view of the file
    would show an older state as if it were now (``LedgerBusyError`` naming the process:
    ``storage.refuse_deleted_wal_shm``). A deleted ``-shm`` alone leaves the view whole: a
    copy of the file and its WAL reads every commit. Only a file whose header says WAL:
    a rollback-journal database never has those side files. The header is read here, a
    process that holds no lock on the file (closing our descriptor drops none)."""
    from toolkit.storage import WAL, live_process, refuse_deleted_wal_shm, sqlite_holder

    try:
        with open(path, "rb") as handle:
            head = handle.read(20)
    except OSError:
        return  # the read that follows says why
    if head[:16] != b"SQLite format 3\x00" or head[18:20] != b"\x02\x02":  # not WAL mode
        return
    harm = ("its latest commits are in that process's WAL alone, and a view now would show "
            "an older state as if it were now")
    refuse_deleted_wal_shm(path, f"SQLite database {str(path)!r}", sides=(WAL,), harm=harm)
    holder = sqlite_holder(path)
    if holder is not None and _wal_cut(path):
        raise LedgerBusyError(
            f"SQLite database {str(path)!r}: its -wal was emptied or cut while "
            f"{live_process(holder)} has it open; {harm}, and that process's next commit "
            "damages the file: run again when it ends (it halts, naming salvage), and never "
            "empty a ledger's -wal while it is in use")


def _wal_cut(path) -> bool:
    """The ``-wal`` is shorter than the frames its ``-shm`` index says it holds: emptied or
    cut in place under a live connection (SQLite resets the index before it ever truncates
    its WAL). The index header (SQLite's wal.c, ``WalIndexHdr``, native byte order): the
    page size at byte 14 (1: 65536), the last valid frame at byte 16. Read here, in a
    process that holds no lock on the file."""
    try:
        with open(f"{path}-shm", "rb") as shm:
            head = shm.read(20)
        size = os.path.getsize(f"{path}-wal")
    except OSError:
        return False
    if len(head) < 20:
        return False
    page, frames = struct.unpack_from("=HI", head, 14)
    page = 65536 if page == 1 else page
    return frames > 0 and size < 32 + frames * (24 + page)


@contextlib.contextmanager
def private_copy(path):
    """Yield the path of a private copy of ``path`` (and its ``-wal``); removed afterwards.

    Raises:
        ToolkitError: the file keeps changing under us; ``CopyError``: it cannot be
            read or copied.
    """
    path = Path(os.path.realpath(path))  # a symlink's -wal is the one beside its target
    refuse_stale(path)
    with _scratch(path) as folder:
        copy = folder / path.name
        for _ in range(_TRIES):
            before = _fingerprint(path)
            _copy_file(path, copy, path)
            for side in SIDE_FILES:
                source, target = Path(f"{path}{side}"), Path(f"{copy}{side}")
                try:
                    target.unlink(missing_ok=True)
                except OSError as exc:
                    raise _scratch_failed(exc, path) from exc
                if source.exists():
                    _copy_file(source, target, path)
            if _fingerprint(path) == before:
                break
        else:
            raise ToolkitError(f"{str(path)!r} kept changing while it was read: try again")
        yield copy


@contextlib.contextmanager
def opened_view(path):
    """The file ledger at ``path`` opened for reading (as ``health``, ``ledger`` and ``review``
    read it), never written, nothing made beside it. JSONL: read in place, without a copy
    (``_jsonl_in_place``). SQLite: ``open_ledger`` on a private copy, since opening one
    writes (journal mode, -wal and -shm, a schema into an empty file, a migration) and even
    ``mode=ro`` rebuilds a dead writer's -shm. An error names the user's ``path``, never the
    private name, and says nothing of writing (a view never writes); the scratch space full
    is ``ScratchFull``, naming TMPDIR.
    """
    with _jsonl_in_place(path) as (name, opener):
        try:
            ledger = opener(name)
        except ToolkitError as exc:
            raise _for_user(exc, name, path) from None
        with ledger:
            try:
                yield ledger
            except StorageError as exc:  # the copy's -wal and -shm grow in TMPDIR as it is read
                raise _for_user(exc, name, path) from None


def _for_user(exc: ToolkitError, name, path) -> ToolkitError:
    """``exc`` naming ``path`` for the private ``name``; ScratchFull if it is TMPDIR's: a
    full-disk errno, or any storage error of a private copy (SQLite writes only the copy's
    -wal and -shm, in TMPDIR: an -shm that does not fit is "disk I/O error"); the ledger's
    damage (``sqlite_damage.damaged``) when SQLite finds the copy, written whole, damaged."""
    from toolkit.ledger.sqlite_damage import busy_or_damaged, damage_of

    why = damage_of(exc)
    if why is not None:  # the copy's bytes are the ledger's: a failed write was ScratchFull
        return busy_or_damaged(path, why)
    if isinstance(exc, StorageError) and not Path(name).is_symlink():
        return copy_failed(exc, name, path)
    full = scratch_full(exc.__cause__ or exc, path)
    if full is not None:
        return full
    text = public_text(str(exc), name, path)
    text = text.replace(": refusing to write into it", "")
    try:
        return type(exc)(text)
    except TypeError:  # an error type built from several fields
        return ToolkitError(text)


def copy_failed(exc: StorageError, name, path) -> ScratchFull:
    """SQLite's storage error on ``name``, the private copy of ``path``: TMPDIR's (SQLite
    writes only the copy's -wal and -shm, there: an -shm that does not fit is "disk I/O
    error"), named with the room left there."""
    full = scratch_full(exc.__cause__ or exc, path)
    if full is not None:
        return full
    free = _free_bytes(Path(name).parent)
    state = "is full" if free is not None and free < _ROOM else "failed"
    return ScratchFull(f"TMPDIR {tempfile.gettempdir()!r} {state} ({exc.__cause__ or exc}"
                       f"{f', {free} bytes free' if free is not None else ''}): a private "
                       f"copy of {str(path)!r} is read there, so that the original is never "
                       "written; free space there or set TMPDIR to a folder with room, "
                       "and run again")


def public_text(text: str, name, path) -> str:
    """``text`` naming the user's ``path`` for the private ``name``, and the salvage's new
    file beside the ledger (never in the private folder, gone once the view closes: o37).
    In this order: the salvage's file; the name shown (``repr``) as the user gave it; the
    name as a word of an advised command (``shlex.quote``) absolute, as ``advice`` gives
    every file (o40: a relative ``-l.jsonl`` read as an option); any other mention."""
    import shlex

    from toolkit.advice import absolute, salvaged_name

    name, path = os.fspath(name), os.fspath(path)
    for private, public in ((salvaged_name(name), salvaged_name(path)),
                            (repr(name), repr(path)),
                            (shlex.quote(name), shlex.quote(absolute(path))),
                            (name, path)):
        text = text.replace(private, public)
    return text


def _free_bytes(folder) -> int | None:
    try:
        info = os.statvfs(folder)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


@contextlib.contextmanager
def _jsonl_in_place(path):
    """``(name, opener)``: a JSONL ledger read in place, else a private copy (``open_ledger``).

    ``JsonlLedger(view=True)`` reads whole lines and never writes, but it opens its file
    read-write and makes ``<name>.lock``. So it is given a name in a private folder, a
    symlink to ``/proc/self/fd/N`` (N our read-only descriptor of the ledger): its lock is
    made in that folder, never beside the ledger, and the bytes read are those of the file
    we opened, even if a compaction renames a new file over the ledger meanwhile (a copy
    would need its fingerprint check for that). ``/proc/self/fd/N`` is never resolved to
    the ledger's path (that is why ``open_ledger``'s ``canonical_path`` is not called), and
    opening it creates nothing even if the ledger was just removed. A file we may not
    open read-write (a read-only file or mount), no ``/proc``, or SQLite: the private copy.
    """
    from toolkit.ledger import open_ledger

    fd = _writable_descriptor(path) if Path(path).suffix.lower() == ".jsonl" else None
    if fd is None:
        with private_copy(path) as copy:
            yield copy, open_ledger
        return
    from toolkit.ledger.jsonl import JsonlLedger

    try:
        with _scratch(path) as folder:
            name = folder / Path(path).name
            try:
                name.symlink_to(f"/proc/self/fd/{fd}")
            except OSError as exc:
                raise (scratch_full(exc, path) or exc) from exc
            yield name, lambda where: JsonlLedger(where, view=True)
    finally:
        os.close(fd)


def _writable_descriptor(path) -> int | None:
    """A read-only descriptor of ``path`` whose ``/proc/self/fd`` name opens read-write (the
    test opens and closes it, writing nothing), or None."""
    try:
        fd = os.open(os.path.realpath(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None  # the copy says why
    try:
        os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC))
        return fd
    except OSError:
        os.close(fd)
        return None
