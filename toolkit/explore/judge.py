"""What one crash point came to: where its child died, whether the batch rested, the verdict.

``_note_kill`` names the step the killed child died at; ``_rested`` reads
whether a run ended with every item at rest; ``_judge`` collects the whole
history the point left (both ledgers, the provider's call and execution logs,
the disk) and asks ``toolkit.checker.check``, giving one of ``VERDICTS``
(see ``toolkit.explore``) with the anomalies and a one-line detail.
"""

import collections
import os

from toolkit.explore.child import killed_by_sigkill

VERDICTS = ("valid", "parked", "violation", "undecided", "not-reached", "diverged")


def _note_kill(row, field, messages, status, kill_at) -> bool:
    """Name the step where the child died; False when it should have died and did not."""
    kill = next((m for m in messages if m["t"] == "kill"), None)
    if kill is not None:
        row[field] = kill["label"]
        if field == "step":
            row["kind"] = kill["kind"]
    return kill_at is None or (kill is not None and killed_by_sigkill(status))


def _rested(messages) -> bool:
    end = next((m for m in messages if m["t"] == "end"), None)
    return end is not None and not end["unsettled"] and not end["halted"]


def _read_only(path):
    """A read-only connection to the SQLite file ``path``, once no process writes it (every
    run of the point has ended). With no ``-wal`` and no ``-journal`` beside it (its last
    writer closed it: the WAL checkpointed and removed), ``immutable=1``: no lock, no
    ``-shm``, the file as it is (as ``forensics.sqlite`` reads such a file); else (a run
    killed) ``mode=ro``, which reads the WAL's committed frames. A ``mode=ro`` reader of
    a closed WAL database made a -wal and a -shm beside it: ~0.3 ms a point, with the
    ``resolve`` of its path, for the same rows."""
    import sqlite3
    import urllib.parse

    logs = any(os.path.exists(f"{path}{suffix}") for suffix in ("-wal", "-journal"))
    mode = "mode=ro" if logs else "immutable=1"
    return sqlite3.connect(f"file:{urllib.parse.quote(os.path.abspath(path))}?{mode}", uri=True)


class _ProviderLogs:
    """What the oracle reads of the fake provider (its call and execution logs, its
    counters), read once from its database opened read-only.

    The provider object itself would create its tables, switch the journal mode and
    checkpoint as it closes: ~0.4 ms more per crash point, for the same rows. A point
    whose runs never made the database (none does: the provider is made before the
    first step) gets the provider object's answer, an empty one it creates.
    """

    def __init__(self, paths, contract):
        from contextlib import closing

        from toolkit.provider import FakeProvider, records

        if not paths.provider_db.is_file():
            with FakeProvider(paths.provider_db, paths.provider_out, contract) as provider:
                self._calls, self._executions = provider.calls(), provider.executions()
                self.counters = provider.stats()
            return
        with closing(_read_only(paths.provider_db)) as db:
            self._calls, self._executions = records.calls(db), records.executions(db)
            self.counters = records.stats(db)

    def calls(self) -> list[dict]:
        return self._calls

    def executions(self) -> list[dict]:
        return self._executions


def _ledger_records(path):
    """An SQLite ledger's ``(events, items by key)``, as ``open_ledger`` reads them, through
    one read-only connection (None: not an SQLite ledger file; the caller opens it).

    Opening the ledger would check and create its schema, switch the journal mode, and
    checkpoint as it closes: ~0.45 ms more per crash point, for the same rows. The rows
    are decoded by the ledger's own readers (``SqliteLedger._events``, ``_items``: one
    place for the SQL and the decoding), sorted by key as ``Ledger.items`` sorts them.
    """
    from contextlib import closing

    from toolkit.ledger.opening import SQLITE_SUFFIXES
    from toolkit.ledger.sqlite import SqliteLedger

    if path.suffix.lower() not in SQLITE_SUFFIXES or not path.is_file():
        return None

    class ReadOnly:  # what the ledger's readers use of it: a connection and a name
        _query = SqliteLedger._query

        def __init__(self, db):
            self._db, self._what = db, f"SQLite ledger {str(path)!r}"

    with closing(_read_only(path)) as db:
        ledger = ReadOnly(db)
        events = tuple(SqliteLedger._events(ledger))
        items = sorted(SqliteLedger._items(ledger), key=lambda item: item.key)
    return events, {item.key: item for item in items}


def _judge(plan, paths, inputs, rested, lost, reached) -> dict:
    from toolkit.checker import check, explain
    from toolkit.drills import collect_history

    contract = plan.contract_object()
    provider = _ProviderLogs(paths, contract)
    history = collect_history(paths.ledger, provider, inputs, contract, ({},),
                              plan.page_by_page_from, records=_ledger_records(paths.ledger))
    stats = provider.counters
    verdict = check(history)
    by_state = collections.Counter(item.state.value for item in history.items.values())
    anomalies = sorted(verdict.anomalies) + ["not_at_rest"] * (not rested) + \
        ["lost_acknowledged"] * bool(lost)
    first = next((found[0] for found in verdict.anomalies.values()), None)
    detail = explain(first) if first else (
        f"{len(lost)} acknowledged transition(s) gone after the power cut" if lost else
        "the batch did not rest after the reruns" if not rested else "")
    parked = by_state.get("needs_review", 0)
    name = ("not-reached" if not reached else "violation" if anomalies else
            "undecided" if verdict.valid is None else "parked" if parked else "valid")
    return {"outcome": " ".join(f"{state}={n}" for state, n in sorted(by_state.items())),
            "submits": stats["submit_calls"], "executions": stats["executions"],
            "verdict": name, "anomalies": anomalies, "parked": parked, "detail": detail}
