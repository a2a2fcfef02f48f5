"""Finding a batch's inputs, and reading each exactly once, without ever blocking.

An entry of the inputs folder is an input (``documents.is_input_entry``) when its
name ends in ``.pdf`` in any case (``SCAN.PDF``), or when it is a regular file whose
content starts as a PDF does (``%PDF-``). Only regular files are read: the entry is opened with
``O_NONBLOCK`` (a FIFO or a device never blocks the open) and ``fstat`` of the
open descriptor decides (what we read is what we checked, not what the name
pointed at a moment earlier). Anything else that looks like an input (a
dangling or looping symlink, a directory, a FIFO, an unreadable file) is kept
as an ``Odd`` entry: the runner quarantines it as its own item with the reason,
and the batch goes on.
"""

import errno
import os
import stat
from pathlib import Path, PurePath

from toolkit import roots
from toolkit.documents import is_input_entry
from toolkit.errors import ToolkitError

_CHUNK = 1 << 20


class Odd(OSError):
    """An input entry that is not a readable regular file; ``reason`` says why."""

    def __init__(self, path, reason: str):
        super().__init__(f"{entry_name(path)}: {reason}")
        self.path, self.reason = Path(path), reason


def entry_name(path) -> str:
    """An entry's name as the ledger stores it: text that always encodes as UTF-8.

    A name that is not UTF-8 (``b'bad\\xff.pdf'``) arrives from the OS with surrogates
    (``surrogateescape``) that SQLite, JSON lines and a terminal refuse; it is stored
    with its undecodable bytes escaped (``bad\\xff.pdf``): readable, and one batch's
    odd name never stops the others. The file itself is still opened by its real name.
    """
    raw = os.fsencode(path.name if isinstance(path, PurePath) else Path(path).name)
    return roots.escaped_name(raw)  # one to one: a literal backslash is doubled


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_input(path, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``), read once.

    Raises:
        Odd: a dangling or looping symlink, a directory, FIFO, device, or an unreadable file.
    """
    return read_stat(path, limit)[0]


def open_regular(path) -> tuple[int, os.stat_result]:
    """``path`` opened for reading, with the ``fstat`` of the open descriptor, when it is a
    regular file; the caller closes the descriptor.

    ``O_NONBLOCK``: a FIFO at the path (no writer) would block a plain ``open`` forever;
    the ``fstat`` of what was opened decides (not a stat of the name a moment earlier), and
    a FIFO, a device (``/dev/zero``: endless) or a socket is never read. On a regular file
    the flag changes nothing.

    Raises:
        Odd: a dangling or looping symlink, a directory, FIFO, device, or an unopenable file
            (no descriptor is left open).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENOENT and os.path.islink(path):
            raise Odd(path, "a dangling symlink") from exc
        if exc.errno == errno.ELOOP:
            raise Odd(path, "a symlink loop") from exc
        raise Odd(path, exc.strerror or str(exc)) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Odd(path, _kind(info.st_mode))
    except BaseException as exc:
        os.close(fd)
        if isinstance(exc, OSError) and not isinstance(exc, Odd):
            raise Odd(path, exc.strerror or str(exc)) from exc
        raise
    return fd, info


def read_stat(path, limit: int | None = None) -> tuple[bytes, os.stat_result]:
    """``read_input``, with the ``fstat`` of the open file taken before its bytes were read
    (what the input index records: ``inputindex``)."""
    fd, info = open_regular(path)
    try:
        chunks, left, got = [], limit, 0
        while left is None or left > 0:
            # The size fstat gave, plus one byte to see the end (asking 1 MiB of a 2 KiB
            # file costs a 1 MiB buffer per read: most of a rerun's time); then chunks.
            asked = min(_CHUNK, info.st_size - got + 1) if got <= info.st_size else _CHUNK
            if left is not None:
                asked = min(asked, left)
            chunk = os.read(fd, asked)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            if left is not None:
                left -= len(chunk)
            if len(chunk) < asked:
                break  # a short read of a regular file is its end: no read just to see EOF
        return b"".join(chunks), info
    except OSError as exc:  # EISDIR on some systems, EIO, ...
        raise Odd(path, exc.strerror or str(exc)) from exc
    finally:
        os.close(fd)


def scan(folder) -> list[Path]:
    """The input entries of ``folder``, sorted (``documents.is_input_entry``: the rule the
    audit's ``--inputs`` check asks too)."""
    return sorted(Path(entry.path) for entry in os.scandir(folder)
                  if is_input_entry(entry.path, entry.name))


def within(inner, outer) -> bool:
    """``inner`` is ``outer`` or inside it (both resolved; neither needs to exist)."""
    inner, outer = Path(inner).resolve(), Path(outer).resolve()
    return inner == outer or outer in inner.parents


def require_regular(path, flag: str) -> None:
    """A ledger or database path must be a regular file (or not exist yet).

    Raises:
        ToolkitError: it is a FIFO, a device, a directory, a dangling symlink...
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            raise ToolkitError(f"{flag} {str(path)!r} is a dangling symlink") from None
        return
    except OSError as exc:
        raise ToolkitError(f"{flag} {str(path)!r}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise ToolkitError(f"{flag} {str(path)!r} is {_kind(mode)}, not a regular file")


def check_batch_paths(args) -> list[Path]:
    """``run``'s paths, checked before anything is created; the inputs, scanned.

    ``--out``, the ledger and the provider's files inside (or equal to) ``--inputs``
    are refused, not excluded: outputs taken for inputs on the next run would make
    every rerun new work (3 -> 6 -> 9 executions), and a rule that skips them would
    silently skip a user's own files of the same name.

    Raises:
        ToolkitError: one line, for any of these.
    """
    folder = Path(args.inputs)
    if not folder.is_dir():
        raise ToolkitError(f"--inputs {args.inputs!r} is not a directory")
    places = [("--out", args.out), ("--ledger", args.ledger)]
    if args.provider_db:
        db = Path(args.provider_db)
        places += [("--provider-db", db), ("--provider-db's jobs folder",
                                           db.with_name(db.stem + "-jobs"))]
    for flag, place in places:
        if "://" not in str(place) and within(place, folder):
            raise ToolkitError(f"{flag} {str(place)!r} is inside --inputs {args.inputs!r}: "
                               "give it a place outside the inputs folder")
    seen: dict = {}  # one path for two of them: the run would create one and break the other
    for flag, place in (("--ledger", args.ledger), ("--provider-db", args.provider_db),
                        ("--out", args.out)):
        if place and "://" not in str(place):
            real = os.path.realpath(place)
            if real in seen:
                raise ToolkitError(f"{flag} {str(place)!r} is the same path as {seen[real]}: "
                                   "give each its own place")
            seen[real] = f"{flag} {str(place)!r}"
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise ToolkitError(f"--out {args.out!r} exists and is not a directory")
    if "://" not in str(args.ledger):
        require_regular(args.ledger, "--ledger")
    if args.provider_db:
        require_regular(args.provider_db, "--provider-db")
        if not Path(args.provider_db).parent.is_dir():  # a typo, as --ledger's is refused
            raise ToolkitError(f"--provider-db {args.provider_db!r}: no folder "
                               f"{str(Path(args.provider_db).parent)!r} to hold it")
    inputs = scan(folder)
    if not inputs:
        raise ToolkitError(f"no PDF files in {args.inputs!r}")
    _refuse_our_files(inputs, args, places)
    return inputs


def _refuse_our_files(inputs, args, places) -> None:
    """An input entry that is one of our own files by another name is refused like one
    inside --inputs: a hard link to the ledger or the provider's database (same device
    and inode), or a symlink that resolves inside --out (an output taken for an input)."""
    ours = {}
    for flag, place in places:
        for side in ("", "-wal", "-journal"):
            with_side = f"{place}{side}"
            try:
                info = os.stat(with_side)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                ours[(info.st_dev, info.st_ino)] = f"{flag} {with_side!r}"
    for path in inputs:
        try:
            info = os.stat(path)
        except OSError:
            continue  # dangling: quarantined as an odd entry later
        what = ours.get((info.st_dev, info.st_ino))
        if what is None and path.is_symlink() and within(path, args.out):
            what = f"a file inside --out {args.out!r}"
        if what is not None:
            raise ToolkitError(f"input {entry_name(path)!r} is {what} (another name for it): "
                               "remove it from --inputs")
