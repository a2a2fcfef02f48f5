"""Where ``audit --csv`` may write, and how: never onto what it audits, never half a file.

The target is checked before the audit reads anything: a name that is, or resolves to
(a symlink, a hard link), the audited ledger or one of its companions (``-wal``,
``-shm``, ``-journal``, the roots file, the locks, the inputs index, the health
marker: ``storage.COMPANIONS``, the one list of them) is refused, and so is a name that
is, or lies inside, a folder of the batch (``--inputs``, ``--artifacts``, the outputs and
inputs roots recorded beside the ledger): an input may be the only copy, and an artifact
replaced is one the next run finds damaged. Folders and target are compared as real
paths (symlinks resolved; a target that does not exist yet by its parent's real path).
A name that exists and is not a regular file (by ``lstat``: a symlink, a FIFO, a device
node, a directory) is refused too, since the rename would replace the node itself, and so
is a file that is neither empty nor an audit CSV (what a bind mount or a hard link to an
input, another ledger or a provider's database would be). The
table is then written to a temporary file in the target's folder and renamed over the
target: a write that fails part-way (a full disk, ``RLIMIT_FSIZE``) leaves the previous
CSV as it was and no partial file. Such a failure of the storage (``storage.FULL_OR_FAILING``)
is ``StorageError``, exit 1 ("free space, run again"), as ``--json`` on a full disk is;
any other refusal of the path (no such folder, no permission) is bad input, exit 2.
"""

import os
import stat
import tempfile

from toolkit import roots
from toolkit.errors import StorageError, ToolkitError
from toolkit.forensics.checks import inside
from toolkit.storage import COMPANIONS, FULL_OR_FAILING


def _same(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # a hard link to the ledger
    except OSError:
        return False


_KINDS = ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _require_regular_or_absent(path: str) -> None:
    """Refuse a target that exists and is not a regular file, seen by ``lstat``.

    The rename below replaces the name itself: a symlink would be replaced by a file
    (not written through), a FIFO or a device node (``/dev/null`` as root) destroyed.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ToolkitError(f"cannot write --csv {path!r}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise ToolkitError(f"--csv {path!r} exists and is {kind}, not a regular file: "
                           "refusing to replace it; name another file")


def _real(path: str) -> str:
    """``path`` with every symlink resolved; a name that does not exist yet (or is a
    dangling link) is its parent's real path joined with the name."""
    path = os.path.abspath(path)
    if os.path.exists(path):
        return os.path.realpath(path)
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def batch_folders(audited, inputs=None, artifacts=None) -> list[tuple[str, str]]:
    """(what, folder) for each folder of the batch a CSV must never land in: the ones
    given on the command line, then the roots recorded beside the ledger (the outputs
    root is where ``audit`` looks without ``--artifacts``; the inputs root may hold the
    only copy of an input even when ``--inputs`` is not given)."""
    folders = [("the --inputs folder", inputs), ("the --artifacts folder", artifacts)]
    recorded = roots.recorded(audited)  # {} for a URL or a ledger without a roots file
    folders += [("the outputs root recorded beside the ledger", recorded.get("out")),
                ("the inputs root recorded beside the ledger", recorded.get("inputs"))]
    return [(what, os.fspath(folder)) for what, folder in folders if folder is not None]


CSV_HEAD = b'"key","source"'  # how every per-item CSV begins (write_csv quotes every cell)


def _require_ours_or_absent(path: str) -> None:
    """Refuse to replace a file that is not empty and not a per-item CSV: another ledger, a
    provider's database, a PDF (an input reached through a symlink or a bind mount, an
    artifact) would be destroyed by the rename, and no rule on paths sees every way to
    reach one. Called after ``_require_regular_or_absent``: the open cannot block."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(CSV_HEAD))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ToolkitError(f"cannot write --csv {path!r}: {exc.strerror or exc}") from None
    if head and head != CSV_HEAD:
        raise ToolkitError(f"--csv {path!r} exists and is not an audit CSV (it begins "
                           f"{head[:8]!r}): refusing to replace it; name another file")


def check_target(target, audited, inputs=None, artifacts=None) -> None:
    """Raise (one line, exit 2) if writing ``target`` could touch ``audited`` or a companion,
    would land in a folder of the batch (``batch_folders``), or would replace something
    that is not a regular file."""
    target = os.fspath(target)
    if not target:  # as --artifacts '' is: a name that names nothing is refused, not ignored
        raise ToolkitError("--csv '' names no file: give the CSV file's name")
    if "://" not in str(audited):  # a server's database has no file of it here
        for suffix in ("", *COMPANIONS):  # first: the more telling reason for a link to it
            companion = f"{os.fspath(audited)}{suffix}"
            if _same(target, companion):
                raise ToolkitError(f"--csv {target!r} is the audited ledger's file "
                                   f"{companion!r}: refusing to write over it; name another file")
    real = _real(target)
    for what, folder in batch_folders(audited, inputs, artifacts):
        if inside(real, os.path.realpath(folder)):
            raise ToolkitError(f"--csv {target!r} is in {what} {folder!r}: refusing to write "
                               "there (an input or an artifact may be the only copy); name a "
                               "file outside the batch's folders")
    _require_regular_or_absent(target)
    _require_ours_or_absent(target)


def _mode_for(path: str) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0o022)
        os.umask(umask)
        return 0o666 & ~umask


# A cell a spreadsheet would read as a formula (CSV injection: a file named
# ``=HYPERLINK(...).pdf``) gets a leading apostrophe, which spreadsheets show as text (OWASP's
# advice); the names stay exact in ``--json``.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def as_text(value):
    return "'" + value if type(value) is str and value.startswith(FORMULA_START) else value


def write_atomic(table, path, **options) -> None:
    """``table.to_csv`` into a temporary file beside ``path``, then renamed over it; text
    cells that would start a formula are written as text (``as_text``)."""
    path = os.fspath(path)
    table = table.copy()
    for column in table.columns:
        cells = table[column].tolist()
        if any(type(cell) is str and cell.startswith(FORMULA_START) for cell in cells):
            # object dtype: a lone surrogate (kept escaped below) is no pyarrow string
            table[column] = type(table[column])([as_text(cell) for cell in cells],
                                                index=table.index, dtype=object)
    _require_regular_or_absent(path)  # before the temporary file: nothing at path changes
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.",
                                    suffix=".tmp")
    except OSError as exc:
        raise _write_error(path, exc) from None
    try:
        # mkstemp makes 0600: give the CSV the mode of the file it replaces, or what a new
        # file gets under this process's umask (read by setting it back at once)
        os.fchmod(fd, _mode_for(path))
        # a lone surrogate (not UTF-8) is written as its escape, \ud800, as JSON would
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace",
                       newline="") as stream:
            table.to_csv(stream, index=False, **options)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp, path)  # the old CSV stays whole until the new one is
    except OSError as exc:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise _write_error(path, exc) from None


def _write_error(path: str, exc: OSError) -> ToolkitError:
    """The storage's fault (exit 1) or the path's (exit 2), one line either way."""
    kind = StorageError if exc.errno in FULL_OR_FAILING else ToolkitError
    return kind(f"cannot write --csv {path!r}: {exc.strerror or exc}")
