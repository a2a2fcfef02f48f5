"""The witness during a run: the ledger's progress, recorded before it can be lost.

``witness.check`` records a ledger's seq at a run's start and ``record_end`` at its end;
a run killed in between (``kill -9``, SIGTERM, a power cut) records no end. Had the
witness only the start's seq, a backup taken before that run and restored over the
ledger would read as no older than the witness saw, and the next run would send again
every request the killed run had sent. So the CLI gives the runner ``Progress`` as its
hook: at ``after_intent`` -- the intent just made durable (its fsync; an SQLite commit
with its WAL fsync), before the request it announces is sent -- the witness of every
folder of the ledger's circle records the seq, at every intent (``EVERY`` = 0). Recording
only every few seconds left a window: a copy of the ledger taken during a run (a backup
job, a snapshot) within the last seconds of intents read as the newest once restored,
and every request sent after the copy ran again (17 of 30 documents with a fast
provider). One record costs ~0.7 ms of CPU and two fsyncs per witness folder, once per
request: small beside a request to a remote service.

Order: the seq recorded is one the ledger holds durably at that instant (read after the
intent's fsync, or, for a worker reading through its own connection, fsynced by us after
the read): a witness seq never exceeds the durable ledger, or a power cut would make the
ledger look like an older copy of itself.

``--workers N``: each worker process runs its own Runner, and each records through its own
``Progress`` (picklable: spawn sends it), reading the SQLite ledger through a read-only
connection of its own; the witness's lock serializes them and a seq only grows (the max).
A record the run's own ``--out`` cannot take (full, read-only, gone, damaged since) halts
the run before the request is sent (fail closed: ``__call__``; a damaged witness file
leaves the ledger's health as it is: ``WitnessDamagedError``); another folder of the
circle that cannot take it is skipped, its entry a lower bound, as at a run's end. The
CLI then records that intent as never sent (``record_unsent``: one process; a worker's
stays ``unknown``, looked up by the rerun), so the rerun sends it without a person.
"""

import contextlib
import os
import sqlite3
import time
import urllib.parse

from toolkit.errors import LedgerError, StorageError, ToolkitError
from toolkit.ledger import TRANSIENT, State
from toolkit.ledger.sqlite_damage import DamagedLedgerError, damage_of, damaged_in_run
from toolkit.runner import witness
from toolkit.runner.witness_damaged import WitnessDamagedError
from toolkit.runner.witness_read import sqlite_seq_and_id
from toolkit.storage import refuse_deleted_wal_shm

EVERY = 0.0  # seconds of a run at most between two records (0: at every intent)
NOT_SENT = ("not sent: the run halted before sending it (the witness in --out could not "
            "record its intent); the next run sends it as a new attempt")


def _sqlite_facts(path: str) -> dict | None:
    """``witness.facts`` of the SQLite ledger at ``path`` (seq, identity), read through a
    read-only connection of our own, then the WAL fsynced: what was read is durable."""
    # mode=ro would rebuild a deleted -shm too: LedgerBusyError halts the run
    refuse_deleted_wal_shm(path, f"SQLite ledger {path!r}")
    uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?mode=ro"
    db = sqlite3.connect(uri, uri=True, timeout=5.0)
    try:
        top, ident = sqlite_seq_and_id(db)
    except sqlite3.Error as exc:  # the ledger's own bytes (its WAL emptied under the run)
        if (why := damage_of(exc)) is None:
            raise
        raise damaged_in_run(path, why) from exc
    finally:
        db.close()
    with contextlib.suppress(FileNotFoundError):  # no WAL: every commit is in the file
        fd = os.open(f"{path}-wal", os.O_RDONLY)
        try:
            os.fdatasync(fd)  # covers every frame written so far, the ones read included
        finally:
            os.close(fd)
    return {"real": os.path.realpath(path), "kind": "sqlite", "seq": top, "id": ident}


class Progress:
    """A runner hook recording the ledger's seq in the witness of ``folders`` (the circle
    ``witness.check`` returned) at intent boundaries: every one (``EVERY`` s apart at most).

    ``ledger``: the open ledger the runner writes (one process); or ``path``: the SQLite
    ledger a worker process writes through a connection of its own (``--workers``).
    """

    def __init__(self, folders, ledger=None, path=None, every: float = EVERY):
        self.folders, self.path, self.every = list(folders), path, every
        self.ledger = ledger
        self.records = 0  # records made (the cost: one witness write in each folder)
        self.unsent: str | None = None  # the key whose send this hook's halt came before
        self._last: float | None = None

    def __getstate__(self):  # a worker gets the folders and the path, never a handle
        return {**self.__dict__, "ledger": None, "_last": None}

    def __call__(self, point, key, **context) -> None:
        if point != "after_intent":
            return
        now = time.monotonic()
        if self._last is not None and now - self._last < self.every:
            return
        self._last = now
        # Fail closed: the request this intent announces is sent only once the run's own
        # --out has recorded it (record_all's first folder; the others are skipped when
        # they cannot take it). Sent unrecorded, a copy of the ledger taken now and restored
        # later would read as the newest, and the request would run again (outsider o35 S1:
        # a full or read-only --out). Raised from the hook, a StorageError halts the run
        # before the send (exit 1); the CLI then records the intent as not sent
        # (``record_unsent``), or, if the ledger cannot take that, the rerun looks it up.
        try:
            seen = witness.facts(self.ledger) if self.ledger is not None else \
                _sqlite_facts(self.path) if self.path is not None else None
        except (StorageError, DamagedLedgerError):  # the disk's, the ledger's: their words
            raise
        except (ToolkitError, OSError, sqlite3.Error) as exc:
            raise _halt(self.folders[0], exc) from exc
        if seen is None:
            return
        try:
            witness.record_all(self.folders, seen)
        except (ToolkitError, OSError) as exc:
            # The ledger read well, the witness could not take it: this run knows the
            # request was never sent (``record_unsent``). Not so for a ledger that did not
            # read (above): nothing more is written to it.
            self.unsent = key
            if isinstance(exc, StorageError):
                raise
            raise _halt(self.folders[0], exc) from exc
        self.records += 1


def _halt(folder, exc) -> LedgerError:
    """The halt's one line, its advice by the cause: a damaged witness file is moved aside
    (its own words say how; the ledger's health stays as it is), a full or read-only one
    freed or made writable."""
    if isinstance(exc, WitnessDamagedError):
        return WitnessDamagedError(f"cannot record the ledger's progress, halted before "
                                   f"sending: {exc}")
    return StorageError(f"cannot record the ledger's progress in the witness of {str(folder)!r} "
                        f"({exc}): halted before sending (free space there, or make it "
                        "writable, then run again)")


def record_unsent(ledger, hook, worker: str) -> bool:
    """After a run that ``hook`` (a ``Progress``) halted at an intent, before its send: that
    intent recorded as never sent, ``unknown -> failed(transient)`` (the move that says a
    request was turned away and nothing was done), its lease released. The rerun then
    sends it as a new attempt (a new key, the one its intent will name), where keys are
    not idempotent too; left ``unknown``, it would be looked up, not found, and parked for
    a person, as a request killed between intent and send must be (it may have been sent).

    Only the hook's own halt counts: the hook raised before the runner's send, in the same
    thread, so the send never started. Only while the item is as that halt left it:
    ``unknown`` under this run's lease (``worker``); the move is fenced by that lease's
    token, so an owner that took the item over since wins. Best effort: a ledger that
    cannot take the move (on the same full disk) keeps the intent ``unknown``, as before.
    Returns whether it was recorded.
    """
    key = getattr(hook, "unsent", None)
    if key is None:
        return False
    with contextlib.suppress(ToolkitError, OSError):
        item = ledger.get(key)
        if item.state is not State.UNKNOWN or item.lease_owner != worker:
            return False
        ledger.move(key, State.UNKNOWN, State.FAILED, token=item.token, worker=worker,
                    failure=TRANSIENT, reason=NOT_SENT, note="not sent")
        hook.unsent = None
        with contextlib.suppress(ToolkitError):
            ledger.release(key, item.token, worker)
        return True
    return False
