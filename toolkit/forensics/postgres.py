"""Audit a PostgreSQL ledger (a ``postgresql://`` URL): the toolkit's own tables, read-only.

One ``REPEATABLE READ READ ONLY`` transaction gives one snapshot for every
query, and the server itself refuses any write in it. The tables are the
SQLite ledger's (same columns, same format line in ``meta``), so the SQLite
adapter's reader reads them through the psycopg connection unchanged.
"""

from toolkit.errors import ToolkitError
from toolkit.forensics.model import Raw
from toolkit.forensics.sqlite import _is_toolkit, read_toolkit_sqlite

NAME = "toolkit-postgres"


def read_postgres(url: str) -> Raw:
    """Read the ledger in the schema the URL's search_path names.

    Raises:
        ToolkitError: one line: unreachable server, no such schema, or tables
            that are not a resume-toolkit ledger.
    """
    import psycopg

    from toolkit.ledger.postgres import _first_line, redact

    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            schema_name = conn.execute("SELECT current_schema()").fetchone()[0]
            if schema_name is None:
                raise ToolkitError("the URL's search_path names no existing schema")
            schema: dict[str, set[str]] = {}
            for table, column in conn.execute(
                    "SELECT table_name, column_name FROM information_schema.columns "
                    "WHERE table_schema = %s", [schema_name]):
                schema.setdefault(table, set()).add(column)
            if not _is_toolkit(conn, schema):
                listed = ", ".join(sorted(schema)) or "none"
                raise ToolkitError(f"schema {schema_name!r} holds no resume-toolkit ledger "
                                   f"(tables: {listed})")
            raw = read_toolkit_sqlite(conn, schema)
            conn.rollback()  # nothing was written; end the snapshot
    except psycopg.Error as exc:
        raise ToolkitError(f"cannot read {redact(url)}: {_first_line(exc)}") from exc
    return raw
