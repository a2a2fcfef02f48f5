"""JSONL ledger: one event per line, appended, flushed and fsynced per change.

The file is the history; items are rebuilt by replaying it (``replay.py``: the events
are not kept, ``events()`` reads them again). A crash can leave a final line without its
newline (a torn write): on open it is ignored, reported in ``torn_tail`` and cut off before
the next append, so the next event never glues onto it; one whose bytes name a key is cut
on open, marked in the header (``torn.py``). A final line that reads whole is that event, its
newline lost (``replay.whole_line``): read, named in ``unterminated``, and given its
newline before the next append. Interior lines that do not parse are reported in
``corrupt_lines`` (1-based) and skipped, never fatal; seqs absent from the history
(lines deleted: ``gaps.py``) in ``missing_seqs``, event lines out of seq order (copied,
moved) in ``disorder``, snapshot lines the header does not count in ``snapshot_damage``.
Any of them makes the ledger refuse writes (``corruption``). One writer process at a
time: a second one gets ``LedgerBusyError`` from a lock on ``<path>.lock`` and one on the
ledger file itself (``storage.open_exclusive``; the lock file can be deleted under its holder).
"""

import contextlib
import dataclasses
import fcntl
import json
import os

from toolkit.advice import salvaged_name, toolkit_command
from toolkit.documents import fsync_dir
from toolkit.errors import LedgerBusyError, LedgerError, StorageError
from toolkit.ledger import Event, Item, Ledger
from toolkit.ledger.gaps import damage_words
from toolkit.ledger.group import GroupCommit
from toolkit.ledger.adopt import adopt
from toolkit.ledger.header import (FORMAT, HEADER_LINE, SALVAGED, VERSION,  # noqa: F401
                                   header_line, header_version, newer_version, read_header)
from toolkit.ledger.lines import event_line
from toolkit.ledger.records import ItemRow, item_of
from toolkit.ledger.replay import (KEY_PATTERN, SEQ_PATTERN, SNAPSHOT,  # noqa: F401
                                   item_from_json, parse_line, replay)
from toolkit.ledger.replay import history as replay_history
from toolkit.storage import LOCK, open_exclusive, os_error, take_exclusive


def item_to_json(item: Item) -> dict:
    return {**dataclasses.asdict(item), "state": item.state.value}


class JsonlLedger(Ledger):
    """Append-only backend (``*.jsonl``); single writer process, many threads."""

    def __init__(self, path, *, view: bool = False, group_commit: bool = False, **options):
        """``view=True``: read only; the file is never changed (no header added, no write).

        ``group_commit=True`` (with ``durable=True``): the threads of this process share
        their fsyncs (``group``); each call still returns only once its line is fsynced.
        """
        super().__init__(path, **options)
        self.view = view
        self._end = None  # the file's size after our last append (None: ask fstat)
        self._held = None  # (st_dev, st_ino) of self._fd (None: ask fstat; _check_named)
        self._named = os.fspath(self.path)  # the path as os.stat takes it (bytes once open)
        if group_commit and self.durable:
            self._group = GroupCommit(lambda: os.fsync(self._fd),
                                      f"JSONL ledger {str(self.path)!r}")
        self.torn_tail: dict | None = None  # {"line": n, "bytes": b} when the file ended mid-line
        self.corrupt_lines: list[int] = []
        self.missing_seqs: list[tuple[int, int]] = []  # (first, last) ranges: gaps.py
        self.disorder: list[tuple[int, int, int]] = []  # (line, seq, seq before): gaps.py
        self.snapshot_damage: tuple[str, str] | None = None  # (kind, words): gaps.py
        try:
            self._lock_fd = os.open(f"{self.path}{LOCK}", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # no free inode for the lock is the storage's, not bad input
            raise os_error(f"cannot open JSONL ledger {str(self.path)!r}", exc) from exc
        # A view reads whole lines only: a live writer does not stop it.
        holder = None if view else take_exclusive(self._lock_fd)
        if holder is not None:
            os.close(self._lock_fd)
            raise self._busy(holder)
        try:
            created = not self.path.exists()
            flags = os.O_RDWR | os.O_CREAT | os.O_APPEND
            if view:
                self._fd = os.open(self.path, flags, 0o644)
            else:  # the ledger file's own lock too: <path>.lock can be deleted under its holder
                self._fd, holder = open_exclusive(self.path, flags)
                if holder is not None:
                    raise self._busy(holder)
            # Encoded once, now that it is known to encode: the path check's stat per append
            # then skips the conversion of a str (os.stat would encode it each time).
            self._named = os.fsencode(self._named)
            if created and self.durable:
                fsync_dir(self.path.parent)  # the new file's name survives a power cut too
            self._replay()
            adopt(self)  # line 1's rules: refuse, upgrade, record a cut (adopt.py)
        except LedgerError:
            self.close()
            raise
        except (OSError, UnicodeError) as exc:
            self.close()
            # A path that cannot be a file is bad input; an I/O failure is the storage's.
            bad_input = isinstance(exc, (UnicodeError, IsADirectoryError, NotADirectoryError,
                                         PermissionError, FileNotFoundError))
            # A file it may read but not write (mode 444): the open for appending is refused.
            verb = "write" if isinstance(exc, PermissionError) and os.access(
                self.path, os.R_OK) and not os.access(self.path, os.W_OK) else "read"
            raise (LedgerError if bad_input else StorageError)(
                f"cannot {verb} JSONL ledger {str(self.path)!r}: {exc}") from exc

    def _busy(self, holder: str) -> LedgerBusyError:
        return LedgerBusyError(f"JSONL ledger {str(self.path)!r} is busy: open in another "
                               f"writer ({holder}); run again when it ends")

    def _replay(self):
        """Items and damage from the file (``replay.py``): its events are read again
        only when ``events()`` asks (``_events``)."""
        replay(self, self._fd)

    @property
    def damaged(self) -> bool:
        """Its history cannot be read whole (``corruption`` says how): writes are refused."""
        return bool(self.corrupt_lines or self.missing_seqs or self.disorder
                    or self.snapshot_damage)

    def _read_all(self) -> bytes:
        with open(self._fd, "rb", closefd=False) as handle:
            handle.seek(0)
            return handle.read()

    def _rewrite(self, data: bytes):
        """Replace the file by ``data`` atomically (a header upgrade, ``adopt.py``) and
        append to the new file from now on (``_replace``)."""
        self._replace(data, ".upgrade", self.durable)
        self.version = VERSION

    def _replace(self, data: bytes, suffix: str, sync: bool):
        """Put ``data`` at the ledger's name as a new file: ``<name><suffix>`` written,
        fsynced (``sync``), ``os.replace``d over the name, the folder fsynced; a crash
        leaves the old file or the new one, whole. A write cut short (a size limit, a full
        disk) removes the temp file (ours: only the lock's holder writes it) and leaves
        the old ledger.

        Order: the temp file is flocked before it takes the name, and its descriptor is
        the one appended to from then on, so the ledger file's lock (``open_exclusive``)
        never leaves this writer: an opener that reaches the new file finds it held; one
        that took the old file's lock after we closed it sees the name is not that file.
        """
        tmp = self.path.with_name(self.path.name + suffix)
        fd = None
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o666)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no one else opens it
            with open(fd, "wb", closefd=False) as handle:
                handle.write(data)
            if sync:
                os.fsync(fd)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):  # the write's error is the one to report
                if fd is not None:
                    os.close(fd)
                os.unlink(tmp)
            raise
        if sync:
            fsync_dir(self.path.parent)
        os.close(self._fd)
        self._fd = fd
        self._end = self._held = None

    def corruption(self, refusing: str = "to write on it", shown=None) -> str | None:
        """One line naming the corrupt lines and the keys affected, and the missing seqs
        (lines deleted), or None when intact: the ledger's one verdict on its file, and its
        one wording (``gaps.damage_words``; a view names what it refuses: ``refusing``, and
        the user's path for its private name: ``shown``)."""
        return damage_words(self, refusing, shown)

    # No transaction to begin (``Ledger._txn``): the in-process lock (held by the caller)
    # and the file lock make this process the only writer; the one append in _write is
    # the commit.
    _txn = None

    # ``_state`` holds each item as an Item, or as the ItemRow a write folded (``_write``):
    # the Item (a frozen dataclass: 21 attribute sets) is built when someone reads it, at
    # most once per write, and kept; the transactions read either (``_current``, bound
    # to ``_state.get`` in ``replay.replay``, the one place ``_state`` is assigned).
    def _as_item(self, row):
        item = self._state[row[0]] = item_of(row)  # the row _write just stored
        return item

    def _load(self, key):
        item = self._state.get(key)
        if item.__class__ is ItemRow:
            item = self._state[key] = item_of(item)
        return item

    def _append(self, line: bytes):
        """Append one whole line; fsync it unless group commit syncs it later.

        The size after our last append is kept (we are the only writer: the flock), so
        an append costs its write (and fsync) only, not an fstat each time.
        """
        try:
            if self._valid_end is not None:  # cut a torn tail before the first append
                os.ftruncate(self._fd, self._valid_end)
                if self.unterminated:  # a whole last line lost its newline: give it one
                    os.write(self._fd, b"\n")  # (fsynced with the line below)
                    self.unterminated = None
                self._valid_end, self._end = None, None
            start = self._end if self._end is not None else os.fstat(self._fd).st_size
        except OSError as exc:
            raise StorageError(f"cannot append to {str(self.path)!r}: {exc}") from exc
        try:
            written = os.write(self._fd, line)
            if written < len(line):  # a short write (a size limit): finish or fail
                view = memoryview(line)[written:]
                while view:
                    view = view[os.write(self._fd, view):]
            if self.durable and self._group is None:
                os.fsync(self._fd)
            self._end = start + len(line)  # inside: an interrupt before it is cut below
        except BaseException as exc:
            # Leave no line behind that the caller was not told of: half a line (the next
            # append would glue onto it), or a whole one an interrupt (a second Ctrl-C's
            # KeyboardInterrupt, raised from the signal handler between any two bytecodes)
            # cut off from its bookkeeping: kept, it would be bytes past ``_end`` (a false
            # "written by another program" at close) and a seq memory never took.
            self._end = None
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
                self._end = start
            if isinstance(exc, OSError):
                raise StorageError(f"cannot append to {str(self.path)!r}: {exc}") from exc
            raise
        # After the line is on disk (fsynced) and before this returns, so before any side
        # effect the event permits: the path must still name the file we hold. A cp+mv (how
        # editors and sync tools save) or an rm would leave our appends in an unnamed inode
        # and the next run would redo what this one did. What remains is a replacement
        # between this check and the provider call (README, "Ledger files"). Inline, the one
        # case that needs no more: the path's stat names our file at the size our appends
        # left (one stat). Anything else -- the first append, a stat that fails or names
        # another file -- is decided by ``_check_named``, which looks again and raises.
        held = self._held
        if held is not None:
            try:
                named = os.stat(self._named)
                if named.st_ino == held[1] and named.st_dev == held[0] \
                        and named.st_size == self._end:
                    return
            except OSError:
                pass
        self._check_named("append")

    def _check_named(self, when: str):
        """StorageError unless ``self.path`` still names the file open as ``self._fd``, at
        the size our appends left it (``_end``, when known): a file truncated or emptied
        in place (``: > l``, ``cat h > l``) or written by another program is no history
        this run can go on from. The one ``stat`` answers both; the first error halts the
        ledger (``_halted``): ``close`` then adds no second one."""
        try:
            if self._held is None:  # the file of this descriptor: asked once per open
                held = os.fstat(self._fd)
                self._held = (held.st_dev, held.st_ino)
            named = os.stat(self._named)
            same = self._held == (named.st_dev, named.st_ino)
        except FileNotFoundError:
            same = False
        except OSError as exc:
            raise StorageError(f"cannot check JSONL ledger {str(self.path)!r}: {exc}") from exc
        if not same:
            self._halted = True
            raise StorageError(
                f"JSONL ledger {str(self.path)!r} was replaced or removed while this run "
                f"wrote it (seen at {when}); the run stopped: the events it wrote since are "
                "not in the file at that path; do not copy, move or delete a ledger while a "
                "run writes it; put the file this run wrote back at that path if you can; "
                "else a run with the same --out sees the loss in its witness: a ledger "
                "missing there is made anew, marked as salvaged, and every request is looked "
                "up before it is sent; an older copy is refused (salvage it)")
        if self._end is not None and named.st_size != self._end:
            self._halted = True
            raise StorageError(
                f"JSONL ledger {str(self.path)!r} is {named.st_size} bytes where this run's "
                f"appends end at {self._end} (seen at {when}): truncated or written by another "
                "program while this run wrote it; the run stopped; run "
                f"{toolkit_command('ledger', self.path, '--salvage', salvaged_name(self.path))}"
                " and run on that new ledger")

    def _write(self, old, new, parts):
        if self.view:
            raise LedgerError(f"JSONL ledger {str(self.path)!r} is open as a read-only view")
        if self.damaged:  # a history we cannot read whole
            raise LedgerError(self.corruption())
        seq = self._seq + 1
        # The event's fields in one tuple: the line's arguments, then the history's entry
        # (one tuple fewer kept per event than (seq, parts): less for the GC to scan).
        fields = (seq, *parts)
        self._append(event_line(*fields))  # one write: the line, encoded once
        # Memory changes only after the line is written (and fsynced, unless group commit
        # fsyncs it before this call's caller is answered: see group.py).
        self._seq = seq
        self._state[new[0]] = new  # an ItemRow: its Item is built when read (_load)
        self._history.append(fields)  # its Event is built when the history is read
        return seq

    def _items(self):
        state = self._state
        for key, item in state.items():  # values replaced, none added: iteration is safe
            if item.__class__ is ItemRow:
                state[key] = item_of(item)
        return list(state.values())

    def _events(self):
        history = self._history  # Events read from the file, the fields of our writes
        if self._history_read is not None:  # the file's, read again once asked for
            history[:0] = replay_history(self, self._fd)
            self._history_read = None
        for index, entry in enumerate(history):
            if type(entry) is tuple:
                history[index] = Event(*entry)  # once: kept as built
        return list(history)

    def compact(self) -> int:
        """Replace the history by one snapshot line per item; return the item count.

        Temp file, fsync, ``os.replace``, fsync of the directory: a crash at any
        point leaves either the old file or the new one, whole.
        """
        with self._lock, (self._group.paused() if self._group is not None
                          else contextlib.nullcontext()):
            # Paused: no group fsync may run on the descriptor closed below.
            if self.damaged:  # compaction would erase the evidence
                raise LedgerError(self.corruption())
            lines = [json.dumps({SNAPSHOT: item_to_json(item), "seq": self._seq}, sort_keys=True)
                     for item in self._items()]
            head = header_line(self.salvaged, (len(lines), self._seq), self.torn_marks)
            self._replace(head + "".join(line + "\n" for line in lines).encode(),  # marks kept
                          ".compact", True)
            self._history, self._valid_end, self.torn_tail, self.corrupt_lines = [], None, None, []
            self.unterminated = None  # every line just written has its newline
            self._history_read = None  # no event line left in the file
            return len(lines)

    @contextlib.contextmanager
    def all_or_nothing(self):
        """Appends made inside are kept together or not at all: on an error (a full disk
        after the first of several lines) the file is cut back to its size before, fsynced,
        and this object closed (its memory holds what was cut). Used by ``resolve``: claim,
        move, release are one decision. We are the only writer (the flock), so no other
        process appended meanwhile; a kill -9 inside still leaves whole lines (a claim
        whose dead owner's lease the next claim takes)."""
        with self._lock:
            start = self._valid_end if self._valid_end is not None else \
                self._end if self._end is not None else os.fstat(self._fd).st_size
            try:
                yield
            except BaseException:
                self._end = start  # what the cut leaves: close checks the size against it
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, start)
                    os.fsync(self._fd)
                self.close()
                raise

    def probe(self) -> None:
        """A small durable write beside the ledger (temp file, fsync, removed): the same
        disk the next append needs. Raises StorageError when it fails."""
        probe = self.path.with_name(f".{self.path.name}.probe-{os.getpid()}")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(b"probe\n" * 64)
                while view:  # a short write (a size limit) is retried, and then fails
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(f"JSONL ledger {str(self.path)!r}: cannot write: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()

    def close(self):
        """Close the files; a writer first checks its path still names its file
        (``_check_named``): the error is raised after both are closed."""
        error = None
        if not self.view and getattr(self, "_fd", None) is not None \
                and getattr(self, "_seq", 0) and getattr(self, "_end", None) is not None \
                and not getattr(self, "_halted", False):  # said once, where it was seen
            try:
                self._check_named("close")
            except StorageError as exc:
                error = exc
        for name in ("_fd", "_lock_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, None)
        if error is not None:
            raise error

    def _item_count(self):
        return len(self._state)
