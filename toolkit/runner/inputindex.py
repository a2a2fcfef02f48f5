"""The inputs' stat index: an unchanged input is vouched for by its stat, never re-read.

Like git's index. A run that reads an input to key it records, beside a file
ledger in ``<ledger>.inputs``, the input's path, its stat (device, inode,
size, ``mtime_ns``, ``ctime_ns``) and the SHA-256 of the bytes it read. A
later run stats the path (one system call): all five equal, the recorded
digest is the content's, and keying goes on from it (``keying.vouched``:
which item, if any, the ledger holds for it) without opening the file. Any
difference, a path not recorded, or ``run --verify``: the file is read and
hashed in full, and its new stat and digest are recorded.

The index is a cache of facts about files, not state: which items exist and
where they are is the ledger's alone (every input vouched for here is still
looked up there). A missing, stale, foreign or damaged index costs reads,
never a wrong key: a line that does not parse is skipped; a new index is
written beside the old one, fsynced and renamed over it at the run's end.

Racy git: a write that lands within the same clock tick as the stat recorded
keeps every field the same. So a stat is recorded only when its ``ctime`` is
older than the moment its read began by more than the file system's tick
(``settled``): any later write then has a later ``ctime``. ``ctime`` cannot be
set from user space (``touch -d`` sets ``mtime`` and moves ``ctime``). What the
stat cannot see: a write through a shared ``mmap`` to a page already dirty (the
kernel moves the times at a page's first write fault only: the stat stays as it
was), or a network file system whose server clock lags; ``--verify`` is the
answer (README rule 5).

The recorded index is untrusted bytes: it is opened non-blocking and read only
when it is a regular file (a FIFO would block ``open``, a device never ends),
and a line over ``MAX_LINE`` is damage, read around in bounded pieces.

The run's inputs come sorted by path (``order``); the index is written in that
order and read alongside them, one line ahead (a merge): a run holds one line
of it, not the batch's.
"""

import contextlib
import glob
import io
import operator
import os
import tempfile
import time
from pathlib import Path

from toolkit import liveness
from toolkit.runner.inputs import open_regular
from toolkit.storage import INPUTS as SUFFIX

HEADER = "toolkit-inputs 1\n"
# The longest line read (characters): five numbers, a digest and a name as long as Linux's
# PATH_MAX (4096 bytes), each byte escaped; a longer line (no newline within it) is damage,
# read around, so that an index without newlines costs bounded memory, not its size.
MAX_LINE = 16384
# ctime granularity, by what a ctime looks like: whole seconds (FAT keeps 2 s,
# ext3 1 s) or finer (a kernel clock tick, at most 10 ms at HZ=100; margin x2).
_COARSE_NS, _FINE_NS = 2_000_000_000, 20_000_000
_CLOCK = getattr(time, "CLOCK_REALTIME_COARSE", time.CLOCK_REALTIME)


# The sort key of a run's inputs (``Path``s), and of the index's lines: the path's text.
# ``str`` (a Path's ``__str__``, cached) rather than ``os.fspath``, which calls
# ``__fspath__`` and then it: one Python frame per input less, three times per input.
order = str


def now_ns() -> int:
    """The clock file times are taken from (the kernel's coarse clock), before a read."""
    return time.clock_gettime_ns(_CLOCK)


# The stat that vouches for a file's bytes, ``stamp(info)``: device, inode, size, mtime,
# ctime (one C call, no Python frame: a rerun takes it once per input).
stamp = operator.attrgetter("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")
# ``stamp`` as a line writes it (``_line``), from the tuple: compared as text, never parsed
# (``%`` formats ints faster than an f-string or a join).
_STAMP_TEXT = "%d %d %d %d %d"


def settled(info: os.stat_result, started_ns: int) -> bool:
    """True when no write after ``started_ns`` (taken before the read) can keep ``ctime``."""
    ctime = info.st_ctime_ns
    return ctime + (_COARSE_NS if ctime % 1_000_000_000 == 0 else _FINE_NS) < started_ns


def index_file(ledger_path) -> Path | None:
    """Where a file ledger's input index lives (None for a URL or an in-memory ledger)."""
    if ledger_path is None or str(ledger_path).startswith(("postgres:", "postgresql:")) \
            or str(ledger_path) == ":memory:":
        return None
    return Path(f"{ledger_path}{SUFFIX}")


def _escape(name: str) -> str:
    return name.replace("\\", "\\\\").replace("\n", "\\n") if "\\" in name or "\n" in name \
        else name


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, chars = [], iter(text)
    for char in chars:
        out.append({"n": "\n"}.get(next(chars, ""), "\\") if char == "\\" else char)
    return "".join(out)


def _line(name: str, stamp_: tuple, digest: str) -> str:
    return f"{_STAMP_TEXT % stamp_} {digest} {_escape(name)}\n"


def _parse(line: str):
    """``(name, stamp text, digest, line)`` of one line (with its newline); None if it is not
    one (``_entry`` holds the rule)."""
    entry = _entry(line[:-1]) if line.endswith("\n") else None
    return None if entry is None else (*entry, line)


def _entry(line: str):
    """``(name, stamp text, digest)`` of one recorded line (without its newline); None if it
    is not one: five stamp fields, a 64-character digest, a name. The stamp stays text: a stat
    is compared with it as ``_line`` writes it (``_STAMP_TEXT``), so a stamp that is not five
    decimal numbers never matches (the file is read). ``InputIndex.vouch`` inlines this."""
    parts = line.split(" ", 6)
    if len(parts) != 7 or len(parts[5]) != 64:
        return None
    name = parts[6]
    return _unescape(name), line[:-66 - len(name)], parts[5]


def _bounded_line(lines) -> str:
    """The next line of ``lines`` ("" at its end), read in bounded memory: a line over
    ``MAX_LINE`` (no newline within it: a damaged or foreign file) is read through to its
    newline in bounded pieces and returned cut, so that it never parses."""
    line = lines.readline(MAX_LINE)
    if len(line) == MAX_LINE and not line.endswith("\n"):
        while (rest := lines.readline(MAX_LINE)) and not rest.endswith("\n"):
            pass
        return line[:1]  # damage: no newline, never parsed
    return line


BLOCK = 1 << 16  # characters of the recorded index read at a time


def _blocks(handle):
    """The recorded index after its header, as lists of its lines (without their newline),
    about ``BLOCK`` characters at a time: a run holds one block of it, never the whole file,
    and takes each line from a list, not from a generator per line. A line over ``MAX_LINE``
    (no newline within it: damage) is read through in bounded pieces and yields as "" (never
    an entry); a last line without its newline (torn) is dropped; a failed read ends it."""
    carry, damaged = "", False
    try:
        while data := handle.read(BLOCK):
            lines = data.split("\n")
            if len(lines) == 1:  # no newline in this piece: the line goes on
                if not damaged:
                    carry += data
                    damaged = len(carry) > MAX_LINE
                    carry = "" if damaged else carry
                continue
            lines[0] = "" if damaged else carry + lines[0]
            carry = lines.pop()
            damaged = len(carry) > MAX_LINE
            carry = "" if damaged else carry
            yield lines
    except (OSError, UnicodeError):
        return


class Folders:
    """Descriptors of folders (``O_PATH``: no read permission needed), opened once each while
    a pass stats the files in them: ``os.stat(name, dir_fd=fd)`` makes the kernel walk one
    name instead of the whole path (a third of a ``stat`` on a deep path). The same file as
    ``os.stat(folder/name)`` for as long as the folder is not renamed meanwhile (the pass is
    one moment of a run, like a stat of each path). ``fd`` is None where one cannot be opened
    (then ``stat`` takes the name relative to the working folder: give it a full one)."""

    FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0) | \
        getattr(os, "O_CLOEXEC", 0)

    def __init__(self):
        self._folder, self._fd, self._opened = None, None, []

    def fd(self, folder: str):
        """A descriptor of ``folder`` ("" or unopenable: None)."""
        if folder != self._folder:
            self._folder, self._fd = folder, None
            if folder and os.stat in os.supports_dir_fd:
                with contextlib.suppress(OSError):
                    self._fd = os.open(folder, self.FLAGS)
                    self._opened.append(self._fd)
        return self._fd

    def close(self) -> None:
        for fd in self._opened:
            os.close(fd)
        self._opened.clear()
        self._folder = self._fd = None


def _open_regular(path: Path):
    """The recorded index opened for reading. A FIFO, a device or a socket at its path is
    damage, never read: ``Odd`` (an ``OSError``: no index) from ``inputs.open_regular``."""
    fd, _ = open_regular(path)
    try:
        return open(fd, encoding="utf-8", errors="surrogateescape", newline="\n")
    except BaseException:
        os.close(fd)
        raise


def _owner() -> str:
    return f"{os.getpid()}-{liveness.my_start()}"


def remove_orphans(ledger_path) -> None:
    """Delete the new indexes that runs killed midway left beside a file ledger
    (``<index>.<pid>-<start>.*.tmp`` of a process that is gone: SIGKILL runs no cleanup); a
    live run's stays. Every run calls it, whether it keeps an index or not (page by page)."""
    path = index_file(ledger_path)
    if path is None:
        return
    for temp in glob.glob(f"{glob.escape(str(path))}.*-*.*.tmp"):
        pid, _, start = temp[len(str(path)) + 1:].partition(".")[0].partition("-")
        try:
            owner_alive = liveness.alive(None, int(pid), None if start == "None" else int(start))
        except ValueError:
            continue  # not one of ours
        if not owner_alive:
            with contextlib.suppress(OSError):
                os.unlink(temp)


class InputIndex:
    """One run's index: the recorded one read alongside the sorted inputs, the new one
    written as they are keyed. ``commit()`` replaces the recorded index; ``discard()``
    keeps it (a run that stopped midway)."""

    def __init__(self, ledger_path, trust: bool = True, record: bool = True):
        """``trust=False`` (``--verify``): vouch for nothing, record what is read;
        ``record=False``: read the recorded index only (a count after the run)."""
        self.path = index_file(ledger_path)
        self._old = self._new = None
        self._blocks, self._block, self._at = iter(()), [], 0  # the recorded lines, a cursor
        self.vouched = 0  # inputs taken on their stat
        if self.path is None:
            return
        if trust:
            with contextlib.suppress(OSError, UnicodeError):
                self._old = _open_regular(self.path)
                if _bounded_line(self._old) == HEADER:
                    self._blocks = _blocks(self._old)
                else:
                    self._close_old()
        if not record:
            return
        with contextlib.suppress(OSError):  # a read-only folder: nothing is recorded
            fd, temp = tempfile.mkstemp(prefix=f"{self.path.name}.{_owner()}.", suffix=".tmp",
                                        dir=self.path.parent)
            self._new = open(fd, "w", encoding="utf-8", errors="surrogateescape",
                             newline="\n")
            self._temp = temp
            self._put(HEADER)

    def vouch(self, paths) -> tuple[list, list]:
        """For each of ``paths``, in order, its recorded digest and line when its stat is the
        one recorded (one ``stat``, no read); else None and None: read it. Two lists aligned
        with ``paths``. Paths come in ascending ``order``, call after call (the recorded
        lines are in it: a merge, a cursor in the block in hand). What is kept goes to
        ``keep``, in the inputs' order.

        One frame for a whole chunk of inputs, each recorded line parsed inline where it is
        met (``_entry``'s rule): a rerun's cost is per item, and a call or a generator step
        per input (and per recorded line) was a third of it."""
        digests, lines = [None] * len(paths), [None] * len(paths)
        folders = Folders()
        try:
            block, at_line, found = self._merge(paths, digests, lines, folders)
        finally:
            folders.close()
        self._block, self._at = block, at_line
        self.vouched += found
        return digests, lines

    def _merge(self, paths, digests, lines, folders) -> tuple:
        """``vouch``'s pass: fills ``digests`` and ``lines``; returns where the recorded lines
        stand (block, position) and how many inputs it vouched for."""
        block, at_line, blocks = self._block, self._at, self._blocks
        stat, text, fields, unescape = os.stat, _STAMP_TEXT, stamp, _unescape
        found, folder, fd = 0, None, None
        for at, path in enumerate(paths):
            name = order(path)
            while True:  # to the first recorded entry not before ``name``
                if at_line == len(block):
                    block, at_line = next(blocks, None), 0
                    if block is None:
                        break
                line = block[at_line]
                parts = line.split(" ", 6)
                recorded = parts[-1] if "\\" not in parts[-1] else unescape(parts[-1])
                if len(parts) != 7 or len(parts[5]) != 64 or recorded < name:
                    at_line += 1  # not an entry, or one of a path no input of ours has
                    continue
                break
            if block is None:
                block = []
                break  # nothing recorded from here on: every other input is read
            if recorded != name:
                continue  # not recorded: read (the line is a later input's)
            at_line += 1
            head, slash, base = name.rpartition("/")
            if (head or slash) != folder:  # a sorted batch is mostly one folder
                folder = head or slash
                fd = folders.fd(folder)
            try:  # in the folder opened once (``Folders``): the kernel walks one name, not all
                info = stat(name) if fd is None else stat(base, dir_fd=fd)
            except OSError:
                continue
            if text % fields(info) == line[:-66 - len(parts[6])]:
                digests[at], lines[at] = parts[5], line
                found += 1
        return block, at_line, found

    def digest(self, path) -> str | None:
        """``vouch`` for one path: its recorded digest (its line kept), else None."""
        (digest,), lines = self.vouch((path,))
        if digest is not None:
            self.keep(lines)  # the recorded line, as it was
        return digest

    def line(self, path, info: os.stat_result, started_ns: int, digest: str) -> str | None:
        """The line (without its newline, as ``vouch`` gives recorded ones) recording that
        ``path``, with the stat ``info`` taken before its bytes were read (a read that began
        at ``started_ns``), holds content ``digest``; None for a stat that a write could
        still keep (``settled``): not recorded."""
        return _line(order(path), stamp(info), digest)[:-1] if settled(info, started_ns) \
            else None

    def note(self, path, info: os.stat_result, started_ns: int, digest: str) -> None:
        """Record ``line(path, info, started_ns, digest)``, if any."""
        self.keep((self.line(path, info, started_ns, digest),))

    def keep(self, lines) -> None:
        """Write ``lines`` (recorded ones, as they were, and new ones from ``line``; None
        skipped) to the new index, in the inputs' order: the next run merges them."""
        text = "\n".join(filter(None, lines))
        if text:
            self._put(text + "\n")

    def _put(self, line: str) -> None:
        """Write one line of the new index; a failed write (a full disk) drops the new
        index, never the run: it is a cache, and the recorded one stays."""
        if self._new is not None:
            try:
                self._new.write(line)
            except OSError:
                self._drop_new()

    def commit(self) -> None:
        """The new index, durable, in place of the recorded one (a failure keeps the old)."""
        self._close_old()
        if self._new is None:
            return
        new, self._new = self._new, None
        try:
            new.flush()
            os.fsync(new.fileno())  # the bytes before the name: never a torn index
            new.close()
            os.replace(self._temp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                new.close()
            with contextlib.suppress(OSError):
                os.unlink(self._temp)

    def discard(self) -> None:
        """Drop the new index; the recorded one stays as it was."""
        self._close_old()
        self._drop_new()

    def _drop_new(self) -> None:
        if self._new is not None:
            new, self._new = self._new, None
            with contextlib.suppress(OSError):
                new.close()  # a close that flushes onto a full disk fails: still closed
            with contextlib.suppress(OSError):
                os.unlink(self._temp)

    def _close_old(self) -> None:
        if self._old is not None:
            self._old.close()
        self._old, self._blocks, self._block = None, iter(()), []
