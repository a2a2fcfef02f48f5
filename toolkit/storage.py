"""Storage primitives shared by the ledger and the fake provider (rank 1).

``sqlite_txn`` is the one ``BEGIN IMMEDIATE … COMMIT`` of every SQLite user.
SQLite rolls a transaction back *itself* on some errors (``SQLITE_FULL``,
``SQLITE_IOERR`` during a commit): a plain ``ROLLBACK`` then raises "cannot
rollback - no transaction is active" and hides the real error. Here the
rollback happens only while a transaction is open, and every ``sqlite3.Error``
becomes ``StorageError`` naming what could not be recorded.
"""

import contextlib
import sqlite3

from toolkit.errors import LedgerError, StorageError

# Errors that say "this path is not (and cannot be) a database": bad input, not a failing disk.
NOT_A_DATABASE = ("SQLITE_NOTADB", "SQLITE_CANTOPEN")


def storage_error(what: str, exc: sqlite3.Error) -> LedgerError:
    """The toolkit error for ``exc``: ``StorageError`` unless the file is no database at all."""
    bad_input = getattr(exc, "sqlite_errorname", "") in NOT_A_DATABASE
    return (LedgerError if bad_input else StorageError)(f"{what}: {exc}")


def rollback(db: sqlite3.Connection) -> None:
    """Roll back if (and only if) a transaction is still open; never raises."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):  # the connection is being abandoned anyway
            db.execute("ROLLBACK")


@contextlib.contextmanager
def sqlite_txn(db: sqlite3.Connection, what: str):
    """One exclusive transaction on ``db``; yields ``db``.

    Order matters: the COMMIT is inside the ``try`` so that a failed commit
    (the engine may already have rolled back) is mapped like any other error.

    Raises:
        StorageError: any ``sqlite3.Error`` (disk full, I/O error, busy, read-only).
    """
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        raise storage_error(f"{what}: cannot begin a transaction", exc) from exc
    try:
        yield db
        db.execute("COMMIT")
    except sqlite3.Error as exc:
        rollback(db)
        raise storage_error(what, exc) from exc
    except BaseException:
        rollback(db)
        raise


def sqlite_read(what: str, reader, *args):
    """``reader(*args)`` outside a transaction, with ``sqlite3.Error`` mapped to ``StorageError``."""
    try:
        return reader(*args)
    except sqlite3.Error as exc:
        raise storage_error(what, exc) from exc
