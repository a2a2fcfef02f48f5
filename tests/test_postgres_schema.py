"""PostgreSQL: the schema the URL names first is the ledger's; a foreign one is refused
before anything is written. (Needs TOOLKIT_TEST_PG; CI starts a server.)"""

import uuid

import pytest

from conftest import PG_URL, pg_schema, require_pg
from toolkit.errors import LedgerError
from toolkit.ledger import open_ledger


@pytest.fixture
def admin():
    require_pg()
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        yield conn


def _columns(admin, schema, table):
    return sorted(row[0] for row in admin.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
        "AND table_name = %s", [schema, table]))


def test_schema_with_the_users_own_meta_and_items_is_refused_before_anything_is_written(admin):
    """The user's schema holds their own ``meta`` (name, value) and ``items`` tables: the
    old guard saw 'meta', inserted its format row, added columns to their items, committed,
    and only then failed. Now: LedgerError, and their tables are exactly as they were."""
    with pg_schema() as url:
        schema = url.rsplit("%3D", 1)[1]
        admin.execute(f"CREATE SCHEMA {schema}")
        admin.execute(f"CREATE TABLE {schema}.meta (name TEXT PRIMARY KEY, value TEXT)")
        admin.execute(f"INSERT INTO {schema}.meta VALUES ('owner', 'accounting')")
        admin.execute(f"CREATE TABLE {schema}.items (sku TEXT PRIMARY KEY, price NUMERIC)")
        before = (_columns(admin, schema, "meta"), _columns(admin, schema, "items"))
        with pytest.raises(LedgerError, match="not a resume-toolkit ledger.*nothing was written"):
            open_ledger(url)
        assert (_columns(admin, schema, "meta"), _columns(admin, schema, "items")) == before
        assert admin.execute(f"SELECT * FROM {schema}.meta").fetchall() == [("owner", "accounting")]


def test_first_schema_of_the_search_path_is_created_and_used_not_public(admin):
    """search_path=newbatch,public with newbatch missing: the old ledger landed in public
    (current_schema() skips missing names), so every such batch shared one ledger. Now
    newbatch is created and holds the ledger; public gains nothing."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    separator = "&" if "?" in PG_URL else "?"
    url = f"{PG_URL}{separator}options=-csearch_path%3D{schema}%2Cpublic"
    public_before = _columns(admin, "public", "items")
    try:
        with open_ledger(url) as ledger:
            ledger.add("k")
        assert _columns(admin, schema, "items")  # the ledger is in the named schema
        assert _columns(admin, "public", "items") == public_before
        with open_ledger(url) as again:
            assert [item.key for item in again.items()] == ["k"]
    finally:
        admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
