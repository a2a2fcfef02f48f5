"""A damaged SQLite ledger: how it is recognised (SQLite's own error names) and the one
line that says so, with the way out (move it aside, salvage from nothing, run again).

The ledger's open (``sqlite.py``), the run's checks (``runner/ops.py``,
``runner/witness_read.py``), ``ledger --salvage`` (``cli/inspect.py``) and the audit
raise the same error with the same advice; those that open a ledger another process may
be running on ask ``busy_or_damaged`` first.
"""

import os
import sqlite3

from toolkit.advice import absolute, shell_words, toolkit_command
from toolkit.errors import LedgerBusyError, LedgerError, StorageError

# What SQLite answers for a file whose own bytes are wrong (cut short by an interrupted copy
# or ``truncate``, pages zeroed, another format under the name): the ledger's damage, never
# the storage's, so never "run again" (a rerun reads the same bytes).
DAMAGE = ("SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_IOERR_SHORT_READ")


class DamagedLedgerError(LedgerError):
    """An SQLite ledger SQLite cannot read (``DAMAGE``): bad input, exit 2, with the way out."""


# What Python's sqlite3 says of a text cell whose bytes are not UTF-8 (bytes overwritten
# inside a key: ``integrity_check`` does not look at text): damage too, never the disk's.
UNDECODABLE = "Could not decode to UTF-8"


def damage_of(exc: BaseException | None) -> str | None:
    """SQLite's words when ``exc`` (or an exception it was raised from) is ``DAMAGE``, or
    Python's for an ``UNDECODABLE`` cell."""
    while exc is not None:
        if str(getattr(exc, "sqlite_errorname", "")).startswith(DAMAGE) or (
                isinstance(exc, sqlite3.Error) and UNDECODABLE in str(exc)):
            return str(exc)
        exc = exc.__cause__ or exc.__context__
    return None


def damaged(path, why: str, new=None, out=None) -> DamagedLedgerError:
    """The one line for a damaged SQLite ledger at ``path`` (the user's name): what SQLite
    said, then what works. The salvage reads nothing of it: moved aside, ``path`` is a ledger
    gone, salvaged from what the witness in the runs' ``--out`` saw (every item not settled
    for good parked, every new request looked up before it is sent)."""
    from toolkit.storage import recorded

    out = out or recorded(os.path.realpath(path)).get("out")
    out = absolute(out) if out else "OUT"  # OUT: a placeholder the person fills in
    new = absolute(new or f"{os.path.splitext(str(path))[0]}.salvaged.sqlite")
    try:  # .recover reads an SQLite file only
        with open(path, "rb") as handle:
            recover = handle.read(16) == b"SQLite format 3\x00"
    except OSError:
        recover = False
    recover = f"`{shell_words('sqlite3', absolute(path), '.recover')}` shows the rows still " \
        "readable; " if recover else ""
    return DamagedLedgerError(
        f"SQLite ledger {str(path)!r} is damaged ({why}): no run, view or salvage reads it, "
        f"and running again repeats this; {recover}move it aside "
        f"(`{shell_words('mv', absolute(path), absolute(f'{path}.damaged'))}`), salvage from "
        f"nothing (`{toolkit_command('ledger', absolute(path), '--salvage', new, '--out', out)}`: "
        f"the witness there says what was lost), then run with --ledger {shell_words(new)}")


def damaged_in_run(path, why: str) -> LedgerError:
    """What a live run says when SQLite's damage words meet it on its own ledger: the
    ledger's damage, unless its ``-wal`` or ``-shm`` is gone (deleted under the run: a
    reader of ours opened after that finds the frames the index names in no file, and says
    "disk I/O error" of a ledger that is whole: its own connections still write the deleted
    files, and their close puts every commit into it). Then a storage halt, exit 1,
    never "move it aside"."""
    from toolkit.storage import SHM, WAL

    gone = [side for side in (WAL, SHM) if not os.path.exists(f"{path}{side}")]
    if not gone:
        return damaged(path, why)
    return StorageError(
        f"SQLite ledger {str(path)!r}: its {' and '.join(gone)} was deleted while this run "
        f"had it open ({why}): halted; the ledger itself may be whole: once this run has "
        "ended, `ledger` reads it, and a run goes on; never delete a ledger's -wal or -shm "
        "while it is in use")


def busy_or_damaged(path, why: str, new=None, out=None) -> LedgerError:
    """What an opener of the SQLite ledger ``path`` says when SQLite finds it damaged:
    while another live process has it open (a run stopped with ``kill -STOP``, its
    ``-wal`` emptied under it), that it is in use, naming that process: moved aside or
    salvaged then, the run would go on writing the old file, and a run on the salvaged
    copy would send its work again. Else ``damaged``, with the way out."""
    from toolkit.storage import live_process, sqlite_holder

    holder = sqlite_holder(path)
    if holder is None:
        return damaged(path, why, new, out)
    return LedgerBusyError(
        f"SQLite ledger {str(path)!r} reads as damaged ({why}) while {live_process(holder)} "
        "has it open: move nothing aside and salvage nothing while it is in use (that "
        "process would go on writing the old file, and its work would be sent again from "
        "the copy); let it end or stop it, then run again, which says what to do with a "
        "damaged ledger")
