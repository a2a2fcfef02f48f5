"""Rule 8 for a URL: the fail-closed health mark as a row of the ledger's ``health`` table.

The functions of ``toolkit.runner.ops`` (``health``, ``mark_unhealthy``,
``clear_health``, ``require_healthy``), same signatures and answers, for a
``postgresql://`` ledger, where there is no file to put a marker beside. A
mark written by one machine stops the workers of every machine.
"""

from toolkit.advice import toolkit_command
from toolkit.errors import LedgerError, NotReadyError, ToolkitError
from toolkit.ledger.postgres import PostgresLedger, _first_line, postgres_url, redact


def _health_row(url) -> tuple[bool, str | None]:
    """(a ledger is there, the reason it is marked not ready); reads only, creates nothing.

    Raises:
        LedgerError: the server cannot be reached.
    """
    import psycopg

    url = postgres_url(url) or str(url)
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            if conn.execute("SELECT to_regclass('health')").fetchone()[0] is None:
                return False, None
            row = conn.execute("SELECT reason FROM health WHERE id = 1").fetchone()
    except psycopg.Error as exc:
        raise LedgerError(f"cannot reach PostgreSQL ledger {redact(url)!r}: "
                          f"{_first_line(exc)}") from exc
    return True, row and row[0]


def health(url) -> dict:
    """``{"ready": bool, "reason": str | None}`` for the ledger at ``url``."""
    try:
        exists, reason = _health_row(url)
    except LedgerError as exc:
        return {"ready": False, "reason": str(exc)}
    if not exists:
        return {"ready": False, "reason": "no ledger at this URL"}
    return {"ready": reason is None, "reason": reason}


def mark_unhealthy(url, reason: str) -> bool:
    """Record why the batch stopped; False if even that cannot be written (server down)."""
    try:
        with _open(url) as ledger:
            ledger.mark_unhealthy(reason)
        return True
    except LedgerError:
        return False


def clear_health(url) -> dict:
    """Prove the ledger writable (a real transaction that removes the mark).

    Raises:
        ToolkitError: the ledger still cannot be opened or written.
    """
    try:
        with _open(url) as ledger:
            ledger.clear_health()
    except LedgerError as exc:
        raise ToolkitError(f"ledger still not writable: {exc}") from exc
    return health(url)


def require_healthy(url) -> None:
    """Raises ToolkitError when an earlier run failed closed and nobody cleared it.

    An unreachable server passes here: opening the ledger then says so.
    """
    try:
        _, reason = _health_row(url)
    except LedgerError:
        return
    if reason is not None:
        raise NotReadyError(f"ledger not ready ({reason}); fix the cause, then run "
                           f"{toolkit_command('health', '--ledger', redact(str(url)), '--clear')}")


def _open(url) -> PostgresLedger:
    return PostgresLedger(postgres_url(url) or str(url), connect_timeout=5)
