"""Opening a ledger by its location: the backend chosen by suffix or URL, one name per file.

``open_ledger`` picks the backend (``.sqlite``/``.db``/``.sqlite3``, ``.jsonl``,
``postgresql://``) and imports only that one; ``canonical_path`` gives a file
ledger the one name its locks, WAL and markers are named after. Both are
re-exported from ``toolkit.ledger``.
"""

import os
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.errors import LedgerError

if TYPE_CHECKING:  # the base class, for the annotation only: the package imports this module
    from toolkit.ledger import Ledger


def canonical_path(path) -> Path:
    """The one name of the ledger file at ``path``: every lock, WAL and marker is named after it.

    A symlink alias resolves to its target, so two runs typing two names still meet
    on one lock (JSONL's ``<path>.lock``, the health marker) and one WAL. A hard link
    cannot be resolved (both names are the file), so a ledger with st_nlink > 1 is
    refused: SQLite's WAL and journal, and the JSONL lock, are named after the path,
    and two names would give two writers two views of one file.

    Raises:
        LedgerError: the file has more than one hard link.
    """
    resolved = Path(os.path.realpath(path))
    try:
        links = os.stat(resolved).st_nlink
    except OSError:
        return resolved  # not there (yet): the backend reports what is wrong with it
    if links > 1:
        raise LedgerError(f"ledger {str(path)!r} has {links} hard links: refusing it, because "
                          "its lock, WAL and journal are named after the path and a second "
                          "name would let two writers in at once; copy it to one name")
    return resolved


SQLITE_SUFFIXES = (".sqlite", ".db", ".sqlite3")  # the suffixes open_ledger opens as SQLite


def open_ledger(path, **options) -> "Ledger":
    """Open the ledger at ``path``, choosing the backend by suffix or ``postgresql://`` URL.

    Raises:
        LedgerError: unknown suffix, unreadable file, (JSONL) a second writer, or
            (PostgreSQL) an unreachable server.
    """
    from toolkit.ledger.postgres import postgres_url  # psycopg itself is imported on connect

    url = postgres_url(path)
    if url is not None:
        from toolkit.ledger.postgres import PostgresLedger

        return PostgresLedger(url, **options)
    suffix = Path(path).suffix.lower()
    if suffix in SQLITE_SUFFIXES or suffix == ".jsonl":
        path = canonical_path(path)
    if suffix in SQLITE_SUFFIXES:
        from toolkit.ledger.sqlite import SqliteLedger

        return SqliteLedger(path, **options)
    if suffix == ".jsonl":
        from toolkit.ledger.jsonl import JsonlLedger

        return JsonlLedger(path, **options)
    raise LedgerError(f"unknown ledger type {str(path)!r}: use .sqlite, .db, .jsonl "
                      "or a postgresql:// URL")
