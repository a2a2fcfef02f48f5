"""Operator commands: health (fail-closed readiness) and precise cancellation."""

import sys
from pathlib import Path

from toolkit.cli import command, emit
from toolkit.errors import ToolkitError


@command("health", "Is the ledger ready to take work? A small durable write proves it. "
                   "Exit status 1 when not ready, 2 when the path is not a ledger.")
def _health(parser):
    parser.add_argument("--ledger", required=True, help="client ledger (.sqlite, .db, .jsonl)")
    parser.add_argument("--clear", action="store_true",
                        help="after fixing the cause: prove the ledger writable, clear the marker")
    parser.add_argument("--json", action="store_true", help="print one JSON document")

    def run(args):
        from toolkit.forensics.private import opened_view
        from toolkit.runner.ops import clear_health, health

        # a view of a private copy: health never writes into the ledger (only --clear does)
        state = clear_health(args.ledger) if args.clear else \
            health(args.ledger, probe=True, view=opened_view)
        text = "ready" if state["ready"] else f"not ready: {state['reason']}"
        emit(state, args.json, text)
        return 0 if state["ready"] else 1
    return run


@command("cancel", "Cancel one item: its own job at the provider, then 'cancelled' in the ledger.")
def _cancel(parser):
    parser.add_argument("--ledger", required=True, help="client ledger (.sqlite, .db, .jsonl)")
    parser.add_argument("--key", required=True, help="the item's task key (a unique prefix will do)")
    parser.add_argument("--provider-db", required=True, help="the fake provider's SQLite file")

    def run(args):
        from toolkit.ledger import open_ledger
        from toolkit.provider import provider_at, provider_stats
        from toolkit.runner.reclaim import cancel

        from toolkit.ledger.postgres import postgres_url

        for path, what in ((args.ledger, "ledger"), (args.provider_db, "provider database")):
            if not (Path(path).is_file() or (what == "ledger" and postgres_url(path))):
                raise ToolkitError(f"no {what} at {path!r}")
        provider_stats(args.provider_db)  # refuses a file that is not a provider database
        with open_ledger(args.ledger) as ledger, provider_at(args.provider_db) as provider:
            cancel(ledger, provider, args.key)
        print(f"cancelled {args.key}", file=sys.stderr)
        return 0
    return run
