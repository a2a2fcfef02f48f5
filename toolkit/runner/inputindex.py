"""The inputs' stat index: an unchanged input is vouched for by its stat, never re-read.

Like git's index. A run that reads an input to key it records, beside a file
ledger in ``<ledger>.inputs``, the input's path, its stat (device, inode,
size, ``mtime_ns``, ``ctime_ns``), the SHA-256 of the bytes it read and the
key that digest has under the run's first option set (``keying.keyers``). A
later run stats the path (one system call): all five equal, the recorded
digest is the content's, and keying goes on from it (``keying.vouched``:
which item, if any, the ledger holds for it) without opening the file. Any
difference, a path not recorded, or ``run --verify``: the file is read and
hashed in full, and its new stat, digest and key are recorded.

The key is a memo of a pure function of the digest and the keyer (version,
options, the material's spelling: ``TaskKeyer.fingerprint``), and the header
names the keyer its keys were made by. A run that keys with another one (other
options, another key version) takes the recorded digests, never their keys:
it computes its own, and records them under its fingerprint.

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

The lines are sealed in blocks (``sealed``): each block of at most ``BLOCK`` lines,
as one run wrote them, is followed by a line ``#`` and the CRC-32 of the block's
bytes, seeded by the CRC-32 of the header they were written under. A block changed
by hand or by a bit flip (a key, a digest moved to another input's line, o38 F2),
cut short, or lines of an index of another keyer set under this header, fails its
seal and is damage, skipped whole: its inputs are read in full. One C call checks
a block (format 3 checked each line on its own: about half the cost of parsing the
line). It guards against accidents, not against someone who recomputes it; a
SHA-256 would cost what the index saves.

The recorded index is untrusted bytes: it is opened non-blocking and read only
when it is a regular file (a FIFO would block ``open``, a device never ends),
and a line over ``MAX_LINE`` is damage, read around in bounded pieces.

The run's inputs come sorted by path (``order``); the index is written in that
order and read alongside them, one block ahead (a merge): a run holds one block
of it (at most ``BLOCK`` lines), not the batch's.
"""

import contextlib
import operator
import os
import tempfile
import time
import zlib
from pathlib import Path

from toolkit import liveness
from toolkit.runner.inputs import open_regular
from toolkit.storage import INPUTS as SUFFIX

# The first line: ``HEADER`` and the fingerprint of the keyer the lines' keys were made by.
# An index of another version (1 held no keys, 2 no checksums, 3 one per line) vouches for
# nothing: its inputs are read.
HEADER = "toolkit-inputs 4 "
# The most lines a seal covers (``keep`` seals each run of kept lines in blocks of at most
# this many): a damaged block costs at most this many reads, and a reader holds at most
# this many lines (more before a seal is damage).
BLOCK = 256
# The longest line read (characters): five numbers, a digest, a key and a name as long as
# Linux's PATH_MAX (4096 bytes), each byte escaped; a longer line (no newline within it) is
# damage, read around, so that an index without newlines costs bounded memory, not its size.
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


def header(keyed_by: str) -> str:
    """The index's first line: its version and the fingerprint of the keyer of its keys."""
    return f"{HEADER}{keyed_by}\n"


def _line(name: str, stamp_: tuple, digest: str, key: str) -> str:
    """One entry's line: the stamp, the digest, the key, the name (escaped), a newline."""
    return f"{_STAMP_TEXT % stamp_} {digest} {key} {_escape(name)}\n"


def _seed(header_line: str) -> int:
    """The CRC-32 a block's seal starts from: its header's (version, keyer)."""
    return zlib.crc32(header_line.encode("utf-8", "surrogateescape"))


def _seal(block: str, seed: int) -> str:
    """The seal line of ``block`` (whole lines, as written) under the header of ``seed``."""
    return "#%08x\n" % zlib.crc32(block.encode("utf-8", "surrogateescape"), seed)


def _blocks(lines: list, seed: int):
    """``lines`` (whole lines) in blocks of at most ``BLOCK``, each followed by its seal."""
    for start in range(0, len(lines), BLOCK):
        block = "".join(lines[start:start + BLOCK])
        yield block + _seal(block, seed)


def sealed(lines: list, keyed_by: str) -> str:
    """``lines`` as an index headed ``header(keyed_by)`` holds them, after that header."""
    return "".join(_blocks(lines, _seed(header(keyed_by))))


def _parse(line: str):
    """``(name, stamp text, digest, key, line)`` of one line, its seal unchecked; None if it
    is not one (a seal line, damage)."""
    return next(iter(_entries((line,))), None)


def _rekeyed(line: str, key: str) -> str:
    """A recorded ``line`` with ``key`` in place of the one it holds."""
    parts = line.split(" ", 7)
    parts[6] = key
    return " ".join(parts)


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


def _recorded(lines, seed: int):
    """The entries ``(name, stamp text, digest, key, line)`` of the recorded index after its
    header (whose ``_seed`` is ``seed``), in its order: those of each block whose seal holds.
    A block that fails it (changed, another header's), holds more than ``BLOCK`` lines or
    has no seal (torn: the index ends) is skipped whole; a line over ``MAX_LINE`` (no
    newline) is damage, read around in bounded pieces and no line of any block; a read that
    fails ends it."""
    readline, crc, block, extra = lines.readline, zlib.crc32, [], False
    try:
        while line := readline(MAX_LINE):
            if line[-1] != "\n":
                if len(line) == MAX_LINE:  # damage: read around, skipped
                    while (rest := readline(MAX_LINE)) and not rest.endswith("\n"):
                        pass
                continue
            if line[0] != "#":  # an entry's line (a stamp's digits first): one of the block
                if len(block) < BLOCK:
                    block.append(line)
                else:
                    extra = True  # more than a seal covers: not as written
                continue
            if block and not extra and line == "#%08x\n" % crc(
                    "".join(block).encode("utf-8", "surrogateescape"), seed):
                yield from _entries(block)
            block, extra = [], False
    except (OSError, UnicodeError):
        return


def _entries(lines) -> list:
    """The entries of ``lines`` (a sealed block): each one's stamp, digest, key and name;
    a line that is not one is skipped. The stamp stays text: a stat is compared with it as
    ``_line`` writes it (``_STAMP_TEXT``), so a stamp that is not five decimal numbers never
    matches (the file is read). The parse is inline: it runs once per input of a rerun."""
    found = []
    for line in lines:
        parts = line.split(" ", 7)  # five stamp numbers, the digest, the key, the name
        if len(parts) == 8 and len(digest := parts[5]) == 64 and len(key := parts[6]) == 64:
            name = parts[7]
            found.append(((_unescape(name[:-1]) if "\\" in name else name[:-1]),
                          line[:-131 - len(name)], digest, key, line))
    return found


def _open_regular(path: Path):
    """The recorded index opened for reading. A FIFO, a device or a socket at its path is
    damage, never read: ``Odd`` (an ``OSError``: no index) from ``inputs.open_regular``."""
    fd, _ = open_regular(path)
    try:
        return open(fd, encoding="utf-8", errors="surrogateescape", newline="\n")
    except BaseException:
        os.close(fd)
        raise


def remove_orphans(ledger_path) -> None:
    """Delete the new indexes that runs killed midway left beside a file ledger
    (``<index>.<pid>-<start>.*.tmp`` of a process that is gone: SIGKILL runs no cleanup); a
    live run's stays (``liveness.remove_dead_temps``). Every run calls it, whether it keeps
    an index or not (page by page)."""
    liveness.remove_dead_temps(index_file(ledger_path))


class InputIndex:
    """One run's index: the recorded one read alongside the sorted inputs, the new one
    written as they are keyed. ``commit()`` replaces the recorded index; ``discard()``
    keeps it (a run that stopped midway)."""

    def __init__(self, ledger_path, keyed_by: str, trust: bool = True, record: bool = True):
        """``keyed_by``: the fingerprint of the run's first keyer (``TaskKeyer.fingerprint``),
        the one whose keys are recorded and trusted; ``trust=False`` (``--verify``): vouch
        for nothing, record what is read; ``record=False``: read the recorded index only (a
        count after the run)."""
        self.path = index_file(ledger_path)
        self._old = self._new = self._next = None
        self._entries = iter(())
        self.vouched = 0  # inputs taken on their stat
        self.rekeyed = False  # the recorded keys are another keyer's: digests only
        if self.path is None:
            return
        if trust:
            with contextlib.suppress(OSError, UnicodeError):
                self._old = _open_regular(self.path)
                first = _bounded_line(self._old)
                if first.startswith(HEADER) and first.endswith("\n"):
                    self.rekeyed = first != header(keyed_by)
                    self._entries = _recorded(self._old, _seed(first))
                else:
                    self._close_old()
        self._next = next(self._entries, None)
        if not record:
            return
        with contextlib.suppress(OSError):  # a read-only folder: nothing is recorded
            fd, temp = tempfile.mkstemp(prefix=liveness.owned_temp_prefix(self.path), suffix=".tmp",
                                        dir=self.path.parent)
            self._new = open(fd, "w", encoding="utf-8", errors="surrogateescape",
                             newline="\n")
            self._temp = temp
            self._put(header(keyed_by))
            self._sealing = _seed(header(keyed_by))

    def vouch(self, paths) -> tuple[list, list, list]:
        """For each of ``paths``, in order, its recorded digest, key and line when its stat is
        the one recorded (one ``stat``, no read); else None, None and None: read it. The
        key is None too when the recorded keys are another keyer's (``rekeyed``): key the
        digest. Three lists aligned with ``paths``. Paths come in ascending ``order``, call
        after call (the recorded lines are in it: a merge, one line ahead). What is kept
        goes to ``keep``, in the inputs' order.

        One frame for a whole chunk of inputs: a rerun's cost is per item, and a method
        call per input (and per recorded line) was a third of it."""
        digests, keys, lines = [None] * len(paths), [None] * len(paths), [None] * len(paths)
        entry, entries, stat, text, fields = self._next, self._entries, os.stat, _STAMP_TEXT, stamp
        for at, path in enumerate(paths):
            name = order(path)
            while entry is not None and entry[0] < name:
                entry = next(entries, None)
            if entry is None:
                break  # nothing recorded from here on: every other input is read
            if entry[0] != name:
                continue
            recorded, entry = entry, next(entries, None)
            try:
                info = stat(name)
            except OSError:
                continue
            if text % fields(info) == recorded[1]:
                _, _, digests[at], keys[at], lines[at] = recorded
        self._next = entry
        self.vouched += len(digests) - digests.count(None)
        return digests, [None] * len(paths) if self.rekeyed else keys, lines

    def line(self, path, info: os.stat_result, started_ns: int, digest: str,
             key: str) -> str | None:
        """The line recording that ``path``, with the stat ``info`` taken before its bytes
        were read (a read that began at ``started_ns``), holds content ``digest``, whose key
        under the run's first keyer is ``key``; None for a stat that a write could still
        keep (``settled``): not recorded."""
        return _line(order(path), stamp(info), digest, key) if settled(info, started_ns) \
            else None

    def keep(self, lines, keys) -> None:
        """Write ``lines`` (recorded ones, and new ones from ``line``; None skipped) to the
        new index, in the inputs' order: the next run merges them. ``keys``, aligned with
        them, are the run's keys: a recorded line holding another keyer's (``rekeyed``) is
        written with the run's key in its place; any other, as it was. Sealed in blocks of
        at most ``BLOCK`` lines (``_seal``)."""
        if self._new is None:
            return
        if self.rekeyed:
            lines = [line and _rekeyed(line, key) for line, key in zip(lines, keys)]
        for block in _blocks(list(filter(None, lines)), self._sealing):
            self._put(block)

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
        self._old, self._entries = None, iter(())
