"""``ledger L.sqlite --salvage NEW --out OUT``: the way out for an SQLite ledger that lost history.

An SQLite ledger cannot show its own loss: an older copy put back, or the file deleted,
reads as a whole, younger history. The witness in ``--out`` sees it (``runner.witness``)
and ``run`` refuses it; this is what the refusal names. Salvage reads the old ledger --
opened by the caller on a private copy (``forensics.private.opened_view``), so nothing is
written to it or beside it -- or nothing at all (a deleted ledger the witness knows: the
witness says what was lost), and writes NEW *marked as salvaged* with what was lost,
parking every item not settled for good (``salvage.conclude``: the rule JSONL salvage
follows). A run on NEW then looks up every request it never recorded before sending it
(``runner.salvaged``).

NEW is JSONL or SQLite by its suffix. SQLite: the mark is a meta row (``sqlite.salvage_mark``
reads it into ``Ledger.salvaged``, as JSONL's header is read), written in the transaction
that writes the items, into a temp file in NEW's folder that is linked into place only
once it reads back whole: no process ever sees a NEW without its mark, and a NEW made
meanwhile is never replaced (``os.link``).

An SQLite ledger has no snapshot line: every items row stands on its events (the audit
folds them and holds each row to their end). So each item gets the shortest history the
one transition policy allows from its ``add`` to its state (``_history``), each move noted
as salvage's, the last carrying the item's fields: NEW audits as the JSONL salvage does.
"""

import collections
import contextlib
import functools
import json
import os
import stat
from pathlib import Path

from toolkit.errors import ToolkitError
from toolkit.ledger.header import ROWLESS, SALVAGED
from toolkit.ledger.records import MUTABLE_FIELDS, detail_json
from toolkit.ledger.salvage import Found, check_new, conclude
from toolkit.ledger.transitions import ARTIFACT_FIELDS, TRANSITIONS, State, why_illegal

# Each move of a salvaged item's history says so: written by salvage, not by a run.
NOTE = "salvage: this item's state as read, not its events"


def salvage_sqlite(old, path, new_path, loss=None) -> dict:
    """Write ``new_path`` from the SQLite ledger ``old`` (open on a private copy of
    ``path``), or from nothing when ``old`` is None (``path`` is missing). ``loss(old)``:
    what the witness says the history lost, in words (with ``old`` None it must say it).
    Returns what ``salvage.salvage`` returns.

    Raises:
        ToolkitError: ``new_path`` exists or has no folder, or the new file does not read
            back whole.
    """
    path, new_path = Path(path), Path(new_path)
    check_new(new_path)
    if old is None:  # deleted: only the witness knows what was there
        return conclude(f"{path.name} (missing)", new_path,
                        Found(items={}, witnessed=loss(None) if loss else "all of it"))
    top = old._query("SELECT max(seq) FROM events")[0][0] or 0
    found = Found(items={item.key: item for item in old.items()},
                  mark=old.salvaged,  # an earlier salvage's mark stays, as ``earlier``
                  mode=_mode(path), seq=top,
                  witnessed=loss(old) if loss is not None else None)
    return conclude(path.name, new_path, found)


def _mode(path) -> int:
    with contextlib.suppress(OSError):
        return stat.S_IMODE(os.stat(path).st_mode)  # the original's, not the private copy's
    return 0o644


def write_sqlite(new_path: Path, items: dict, mark, mode: int) -> None:
    """A new SQLite ledger at ``new_path`` holding ``items`` and, when ``mark`` is not None,
    the salvage mark: one transaction, in a temp file linked into place once it reads back.

    Order: the temp ledger's schema (its own first transaction), then the items, their
    histories (``_history``) and the mark (one transaction), then close (the last
    connection checkpoints its WAL into the file and removes it), read back, chmod, fsync,
    ``os.link`` (never over a file), fsync the folder.
    A crash before the link leaves only the temp file (a dot name), never a NEW unmarked.
    """
    from toolkit.documents import fsync_dir
    from toolkit.ledger.sqlite import INSERT_EVENT, INSERT_ITEM, ITEM_COLUMNS, SqliteLedger

    tmp = new_path.with_name(f".{new_path.name}.salvage-{os.getpid()}")
    try:
        ledger = SqliteLedger(tmp)
        try:
            with ledger._lock, ledger._txn():
                ledger._db.executemany(INSERT_ITEM, (
                    (item.key, item.state.value, *(getattr(item, name)
                                                   for name in ITEM_COLUMNS[2:]))
                    for item in items.values()))
                ledger._db.executemany(INSERT_EVENT, (
                    event for item in items.values() for event in _history(item)))
                if mark is not None:
                    ledger._db.execute("INSERT INTO meta VALUES (?, ?)",
                                       (SALVAGED, json.dumps(mark, sort_keys=True)))
        finally:
            ledger.close()
        check = SqliteLedger(tmp)  # prove it reads back as an intact ledger of ours
        try:
            intact = len(check.items()) == len(items) and check.salvaged == mark
        finally:
            check.close()
        if not intact:
            raise ToolkitError(f"salvaged ledger {str(new_path)!r} does not read back whole")
        os.chmod(tmp, mode)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, new_path)
        except FileExistsError:  # made since ``check_new``: never replaced
            raise ToolkitError(f"{str(new_path)!r} exists: salvage writes a new ledger, "
                               "never over one") from None
        fsync_dir(new_path.parent)
    finally:
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{tmp}{suffix}").unlink(missing_ok=True)


def mark_rowless(path, mark: dict) -> bool:
    """Mark in place, as salvaged, an SQLite ledger that has its tables and no row (a first
    run stopped before its first event, or every row deleted): the meta row, written in one
    transaction that checks again, under SQLite's write lock, that no row is there. True
    when marked; False when it has rows by now, or is no such ledger (then refused)."""
    import sqlite3

    from toolkit.storage import refuse_deleted_wal_shm

    refuse_deleted_wal_shm(path, f"SQLite ledger {str(path)!r}")  # LedgerBusyError: one line
    try:
        db = sqlite3.connect(path, isolation_level=None, timeout=5.0)
    except sqlite3.Error:
        return False
    try:
        db.execute("BEGIN IMMEDIATE")
        rowless = bool(db.execute(ROWLESS, (SALVAGED,)).fetchone()[0])
        if rowless:
            db.execute("INSERT INTO meta VALUES (?, ?)", (SALVAGED, json.dumps(mark)))
        db.execute("COMMIT")
        return rowless
    except sqlite3.Error:
        return False
    finally:
        db.close()


def _history(item):
    """The event rows (INSERT_EVENT's values) of ``item``'s shortest legal history: its add
    (source, no digest: as a JSONL snapshot, the item keeps none), then ``_path``'s moves,
    the last carrying the item's fields, so the fold of these rows is the items row's state."""
    fields = {name: getattr(item, name) for name in MUTABLE_FIELDS
              if getattr(item, name) is not None}
    ts, key = item.updated, item.key
    rows = [(ts, "add", key, None, "pending", 0, None, 0, detail_json({"source": item.source}))]
    frm = State.PENDING
    for to in _path(item.state, fields.get("failure"),
                    tuple(name in fields for name in ARTIFACT_FIELDS)):
        detail = {"note": NOTE, **(fields if to is item.state else {})}
        rows.append((ts, "move", key, frm.value, to.value, item.attempt, None, item.token,
                     detail_json(detail)))
        frm = to
    return rows


@functools.cache  # what ``why_illegal`` reads of the item: its failure, which artifact fields
def _path(state, failure, artifact) -> tuple:
    """The states from ``pending`` to ``state`` by the fewest moves the transition policy
    allows, found breadth first, the last move judged with the item's ``failure`` and
    ``artifact`` fields (a failed transient item goes through ``unknown``: ``pending ->
    failed`` is poison's alone); none legal (a done without its artifact): the one move,
    as it is, which the audit then names."""
    after = {"failure": failure, **{name: 1 for name, kept in zip(ARTIFACT_FIELDS, artifact)
                                    if kept}}
    paths, queue = {State.PENDING: ()}, collections.deque([State.PENDING])
    while queue and state not in paths:
        frm = queue.popleft()
        for to in sorted(TRANSITIONS[frm], key=list(State).index):  # one order, every time
            if to not in paths and why_illegal(frm, to, None, after if to is state else {}) \
                    is None:
                paths[to] = (*paths[frm], to)
                queue.append(to)
    return paths.get(state, (state,))
