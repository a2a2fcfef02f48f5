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
"""

import contextlib
import fcntl
import os
import shutil
import struct
import tempfile
from pathlib import Path

from toolkit.errors import ToolkitError

# SQLite's unix VFS: every connection to a WAL database holds a shared lock on one byte of
# its -shm file (the "dead man switch", offset 120 + 8 lock bytes) for as long as it is open.
_SHM_DMS_OFFSET = 128
SIDE_FILES = ("-wal",)  # -shm is an index SQLite rebuilds from the WAL; -journal: see sqlite.py
_TRIES = 5


class CopyError(ToolkitError):
    """The copy itself failed (disk full under TMPDIR, an unreadable file): a storage
    error, never a sign that the file is of no known format."""


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


@contextlib.contextmanager
def private_copy(path):
    """Yield the path of a private copy of ``path`` (and its ``-wal``); removed afterwards.

    Raises:
        ToolkitError: the file keeps changing under us; ``CopyError``: it cannot be
            read or copied.
    """
    path = Path(os.path.realpath(path))  # a symlink's -wal is the one beside its target
    with tempfile.TemporaryDirectory(prefix="toolkit-view-") as folder:
        copy = Path(folder) / path.name
        for _ in range(_TRIES):
            before = _fingerprint(path)
            try:
                shutil.copyfile(path, copy)
                for side in SIDE_FILES:
                    source, target = Path(f"{path}{side}"), Path(f"{copy}{side}")
                    target.unlink(missing_ok=True)
                    if source.exists():
                        shutil.copyfile(source, target)
            except OSError as exc:
                raise CopyError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from exc
            if _fingerprint(path) == before:
                break
        else:
            raise ToolkitError(f"{str(path)!r} kept changing while it was read: try again")
        yield copy


@contextlib.contextmanager
def opened_view(path):
    """``open_ledger`` on a private copy of ``path`` (as ``ledger`` and ``review`` read):
    an error names the user's ``path``, never the private copy, and says nothing of
    writing (a view never writes)."""
    from toolkit.ledger import open_ledger

    with private_copy(path) as copy:
        try:
            ledger = open_ledger(copy)
        except ToolkitError as exc:
            text = str(exc).replace(str(copy), str(path))
            text = text.replace(": refusing to write into it", "")
            try:
                error = type(exc)(text)
            except TypeError:  # an error type built from several fields
                error = ToolkitError(text)
            raise error from None
        with ledger:
            yield ledger
