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


class sqlite_txn:  # noqa: N801 -- used as a function: ``with sqlite_txn(db, what):``
    """One exclusive transaction on ``db``; ``with`` yields ``db``.

    Order matters: the COMMIT is inside the error mapping so that a failed commit
    (the engine may already have rolled back) is mapped like any other error.
    A class rather than a generator: it runs once per ledger transition, and a
    generator-based context manager costs more Python than the rest of it.

    Raises:
        StorageError: any ``sqlite3.Error`` (disk full, I/O error, busy, read-only).
    """

    __slots__ = ("db", "what")

    def __init__(self, db: sqlite3.Connection, what: str):
        self.db, self.what = db, what

    def __enter__(self) -> sqlite3.Connection:
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise storage_error(f"{self.what}: cannot begin a transaction", exc) from exc
        return self.db

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is not None:
            rollback(self.db)
            if issubclass(kind, sqlite3.Error):
                raise storage_error(self.what, exc) from exc
            return False
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error as error:
            rollback(self.db)
            raise storage_error(self.what, error) from error
        return False


def sqlite_read(what: str, reader, *args):
    """``reader(*args)`` outside a transaction, with ``sqlite3.Error`` mapped to ``StorageError``."""
    try:
        return reader(*args)
    except sqlite3.Error as exc:
        raise storage_error(what, exc) from exc
