"""JSONL ledger: one event per line, appended, flushed and fsynced per change.

The file is the history; items are rebuilt by replaying it. A crash can leave
a final line without its newline (a torn write): on open it is ignored,
reported in ``torn_tail`` and cut off before the next append, so the next
event never glues onto it. Interior lines that do not parse are reported in
``corrupt_lines`` (1-based) and skipped, never fatal. One writer process at a
time: a second one gets ``LedgerError`` from a lock on ``<path>.lock``.
"""

import contextlib
import dataclasses
import fcntl
import json
import os

from toolkit.documents import fsync_dir
from toolkit.errors import LedgerError, StorageError
from toolkit.ledger import Event, Item, Ledger, State, apply_event

SNAPSHOT = "snapshot"


def item_to_json(item: Item) -> dict:
    return {**dataclasses.asdict(item), "state": item.state.value}


def item_from_json(obj: dict) -> Item:
    return Item(**{**obj, "state": State(obj["state"])})


def parse_line(raw: bytes) -> tuple[Event | None, Item | None, int]:
    """One line → (event, snapshot item, seq); raises ValueError/KeyError/TypeError if malformed."""
    obj = json.loads(raw)
    if not isinstance(obj, dict):
        raise TypeError("line is not a JSON object")
    if SNAPSHOT in obj:
        return None, item_from_json(obj[SNAPSHOT]), int(obj["seq"])
    event = Event.from_json(obj)
    return event, None, event.seq


class JsonlLedger(Ledger):
    """Append-only backend (``*.jsonl``); single writer process, many threads."""

    def __init__(self, path, **options):
        super().__init__(path, **options)
        self.torn_tail: dict | None = None  # {"line": n, "bytes": b} when the file ended mid-line
        self.corrupt_lines: list[int] = []
        try:
            self._lock_fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LedgerError(f"cannot open JSONL ledger {str(self.path)!r}: {exc}") from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise LedgerError(f"JSONL ledger {str(self.path)!r} is open in another writer") from None
        try:
            created = not self.path.exists()
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            if created and self.durable:
                fsync_dir(self.path.parent)  # the new file's name survives a power cut too
            self._replay()
        except (OSError, UnicodeError) as exc:
            self.close()
            # A path that cannot be a file is bad input; an I/O failure is the storage's.
            bad_input = isinstance(exc, (UnicodeError, IsADirectoryError, NotADirectoryError,
                                         PermissionError, FileNotFoundError))
            raise (LedgerError if bad_input else StorageError)(
                f"cannot read JSONL ledger {str(self.path)!r}: {exc}") from exc

    def _replay(self):
        with open(self._fd, "rb", closefd=False) as handle:
            data = handle.read()
        self._state: dict[str, Item] = {}
        self._history: list[Event] = []
        self._seq = 0
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        self._valid_end = len(data) - len(tail)
        if tail:
            self.torn_tail = {"line": len(lines) + 1, "bytes": len(tail)}
        for number, raw in enumerate(lines, start=1):
            try:
                event, snapshot, seq = parse_line(raw)
                if snapshot is not None:
                    self._state[snapshot.key] = snapshot
                else:
                    self._state[event.key] = apply_event(self._state.get(event.key), event)
                    self._history.append(event)
            except (ValueError, KeyError, TypeError, AssertionError):
                self.corrupt_lines.append(number)
                continue
            self._seq = max(self._seq, seq)

    @contextlib.contextmanager
    def _txn(self):
        # The in-process lock (held by the caller) and the file lock make this
        # process the only writer; the single append in _write is the commit.
        yield

    def _load(self, key):
        return self._state.get(key)

    def _append(self, line: bytes):
        try:
            if self._valid_end is not None:  # cut a torn tail before the first append
                os.ftruncate(self._fd, self._valid_end)
                self._valid_end = None
            start = os.fstat(self._fd).st_size
        except OSError as exc:
            raise StorageError(f"cannot append to {str(self.path)!r}: {exc}") from exc
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view):]
            if self.durable:
                os.fsync(self._fd)
        except OSError as exc:
            # Leave no half line behind: the next append would glue onto it.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
            raise StorageError(f"cannot append to {str(self.path)!r}: {exc}") from exc

    def _write(self, old, new, event):
        event = dataclasses.replace(event, seq=self._seq + 1)
        self._append(json.dumps(event.to_json(), sort_keys=True).encode() + b"\n")
        # Memory changes only after the line is on disk (and fsynced if durable).
        self._seq = event.seq
        self._state[new.key] = new
        self._history.append(event)
        return event

    def _items(self):
        return list(self._state.values())

    def _events(self):
        return list(self._history)

    def compact(self) -> int:
        """Replace the history by one snapshot line per item; return the item count.

        Temp file, fsync, ``os.replace``, fsync of the directory: a crash at any
        point leaves either the old file or the new one, whole.
        """
        with self._lock:
            tmp = self.path.with_name(self.path.name + ".compact")
            lines = [json.dumps({SNAPSHOT: item_to_json(item), "seq": self._seq}, sort_keys=True)
                     for item in self._state.values()]
            with open(tmp, "wb") as handle:
                handle.write("".join(line + "\n" for line in lines).encode())
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
            fsync_dir(self.path.parent)
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
            self._history, self._valid_end, self.torn_tail, self.corrupt_lines = [], None, None, []
            return len(lines)

    def close(self):
        for name in ("_fd", "_lock_fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, None)
