"""An artifact's stat record: the full SHA-256 only when the file is not the one recorded.

Like git's index. When the runner commits ``done`` (or a checkpoint's
``partial``), it records, beside the artifact's size and SHA-256, the
``stat`` of the file it has just fsynced and renamed into place: ``mtime_ns``,
``ctime_ns`` and the inode (``stat_fields``). A later run compares them with a
fresh ``stat`` (one system call, no read of the file): all equal, the bytes
are the ones the ledger hashed; any difference (rewritten in place, replaced
by another file, mtime set back by ``touch -d``: ``ctime`` cannot be set from
user space) and the file is hashed in full (``intact``). ``--verify`` hashes
every artifact whatever its stat says. A record without the fields (a ledger
written before them, a strategy that does not record them) is always hashed.

What the stat cannot see (racy git): a change that keeps the size and the
inode and lands within the same clock tick as the recorded ``ctime`` (a
writer racing the commit), or a file system that does not keep ``ctime``.
``--verify`` is the answer there; nothing but the runner writes under ``--out``.
"""

import os

from toolkit import documents

STAT_FIELDS = ("artifact_mtime_ns", "artifact_ctime_ns", "artifact_ino")
_INO_WRAP = 1 << 64  # an inode above 2**63 is stored as its signed 64-bit value
_INO_HALF = _INO_WRAP >> 1


def _signed(ino: int) -> int:
    """SQLite and PostgreSQL keep signed 64-bit integers; st_ino is unsigned."""
    return ino - _INO_WRAP if ino >= _INO_HALF else ino


def _stamp(info: os.stat_result) -> tuple:
    return info.st_size, info.st_mtime_ns, info.st_ctime_ns, _signed(info.st_ino)


def stat_fields(path) -> dict:
    """The stat fields to commit with an artifact just placed at ``path`` (after its rename:
    a rename changes ``ctime``). All None if it cannot be read: the next run hashes it."""
    try:
        _, mtime, ctime, ino = _stamp(os.stat(path))
    except OSError:
        return dict.fromkeys(STAT_FIELDS)
    return dict(zip(STAT_FIELDS, (mtime, ctime, ino)))


def unchanged(path, item) -> bool:
    """True when ``path`` has the size and stat recorded with ``item``'s artifact (an older
    record, its fields None, never has: nothing vouches for the file but its hash)."""
    return unchanged_all((path,), (item,))[0]


def unchanged_all(paths, items) -> list:
    """``unchanged(path, item)`` of each pair, in order: the one rule, in one frame for a
    chunk of done items (a rerun of a large, nearly done batch is mostly these, and a
    Python call per artifact was a fifth of its cost). One ``stat`` per artifact."""
    stat, wrap, half, found = os.stat, _INO_WRAP, _INO_HALF, []
    for path, item in zip(paths, items, strict=True):
        try:
            info = stat(path)
        except OSError:
            found.append(False)
            continue
        ino = info.st_ino  # ``_signed``, inline
        found.append(info.st_mtime_ns == item.artifact_mtime_ns
                     and info.st_size == item.artifact_size
                     and info.st_ctime_ns == item.artifact_ctime_ns
                     and (ino - wrap if ino >= half else ino) == item.artifact_ino)
    return found


def intact(path, item, verify: bool = False) -> bool:
    """``path`` holds ``item``'s artifact: vouched for by its stat, else (or with
    ``verify``) by its full SHA-256 (``documents.verify``)."""
    if not verify and unchanged(path, item):
        return True
    return documents.verify(path, item.artifact_size, item.artifact_sha256)
