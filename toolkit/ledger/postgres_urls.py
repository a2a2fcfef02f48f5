"""Naming a PostgreSQL ledger: which locations are URLs, and what a URL may show.

``postgres_url`` tells a URL from a file path (and restores one that ``Path()``
folded); ``redact`` hides its password in messages and logs; ``_first_schema``
reads the schema a ``search_path`` names first. No database is touched here:
``toolkit.ledger.postgres`` connects.
"""

import os
import urllib.parse
from pathlib import Path, PurePath

from toolkit.errors import LedgerError

SCHEMES = ("postgresql", "postgres")


def postgres_url(path) -> str | None:
    """The PostgreSQL URL that ``path`` names, or None when it names a file.

    Code that wraps every ledger location in ``Path()`` folds the URL's ``//``
    into ``/``; a URL with a host and a database survives that and is restored.

    Raises:
        LedgerError: a folded URL without a host or database (it cannot be restored).
    """
    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(text, str):
        return None
    scheme, sep, rest = text.partition(":/")
    if scheme not in SCHEMES or not sep:
        return None
    if rest.startswith("/"):
        return text
    if isinstance(path, PurePath) and not Path(text).exists():
        authority, slash, database = rest.partition("/")
        if authority and slash and database:
            return f"{scheme}://{rest}"
        raise LedgerError(f"{redact(text)!r} looks like a PostgreSQL URL turned into a file path "
                          "(its '//' is lost); pass it as a string, with a host and a database")
    return None


def redact(url: str) -> str:
    """``url`` without its password (for messages and logs)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    query = "&".join("password=***" if pair.startswith("password=") else pair
                     for pair in parts.query.split("&")) if parts.query else ""
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


def _first_schema(search_path: str) -> str | None:
    """The first name in a ``search_path`` setting (None for ``"$user"`` or nothing)."""
    first = search_path.split(",")[0].strip()
    if first.startswith('"') and first.endswith('"') and len(first) > 1:
        first = first[1:-1].replace('""', '"')
    return first if first and first != "$user" else None
