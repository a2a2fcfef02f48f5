"""Power loss for the JSONL ledger, in the spirit of LazyFS: unsynced bytes are gone.

A process kill leaves everything it wrote in the page cache, so the next
process reads it back; a power cut keeps only what was fsynced. The child
reports the ledger file's size at each fsync (``sync`` messages) and every
commit that returned (``ack`` messages); after the SIGKILL the explorer cuts
the file back to the last synced size, as the disk would be after the cut,
and asks which acknowledged transitions are no longer in it.

The real ``JsonlLedger`` fsyncs before a commit returns, so it loses none.
The variant without fsync (``durable=False``: write and flush every line,
never fsync, as most loggers do) loses every transition since the last sync,
acknowledged or not; the rerun then resubmits work that already ran.

SQLite (WAL, ``synchronous=NORMAL``, the ledger fsyncs the WAL itself): the
file that holds unsynced commits is the WAL, written in commit order; the cut
keeps its bytes up to the last ``fdatasync`` and drops the ``-shm`` index (it
lives in memory on a real machine), so the next open recovers from the WAL as
after a real cut. This holds while the WAL is not restarted by a checkpoint
mid-run (SQLite checkpoints at 1,000 pages; an explored batch writes far
fewer). A deferred transition (``sync=False``, acked with ``deferred``) may be
lost, but only as a suffix: one that is gone while a later one survives is a
hole, and counted as lost.
"""

import dataclasses
import json
import os
from pathlib import Path


@dataclasses.dataclass(frozen=True, slots=True)
class LedgerVariant:
    suffix: str
    options: dict
    summary: str
    power_loss: bool = False  # can the explorer cut it back to its synced size?


LEDGERS = {
    "sqlite": LedgerVariant(".sqlite", {}, "SQLite, WAL, fsync of the WAL before each ack",
                            power_loss=True),
    "jsonl": LedgerVariant(".jsonl", {}, "JSONL, append and fsync before a commit returns",
                           power_loss=True),
    # Group commit (toolkit.ledger.group): commits share fsyncs, each acked once synced.
    "sqlite-group": LedgerVariant(".sqlite", {"group_commit": True},
                                  "SQLite, WAL, group commit (shared fsync of the WAL)",
                                  power_loss=True),
    "jsonl-group": LedgerVariant(".jsonl", {"group_commit": True},
                                 "JSONL, group commit (shared fsync before each ack)",
                                 power_loss=True),
    "jsonl-no-fsync": LedgerVariant(".jsonl", {"durable": False},
                                    "JSONL, append and flush, never fsync", power_loss=True),
}


def synced_size(messages) -> int | None:
    """The ledger's size at its last fsync in this run (None: no power-loss tracking)."""
    sizes = [m["size"] for m in messages if m["t"] == "sync"]
    return sizes[-1] if sizes else None


def synced_file(ledger) -> Path:
    """The file whose unsynced bytes a power cut takes: the JSONL file, SQLite's WAL."""
    ledger = Path(ledger)
    return ledger if ledger.suffix == ".jsonl" else ledger.with_name(f"{ledger.name}-wal")


def drop_unsynced(path, size: int) -> int:
    """Cut the ledger at ``path`` back to ``size`` synced bytes, as a power cut would
    (``synced_file``; SQLite's shared-memory index goes too); return the bytes dropped."""
    path = Path(path)
    if path.suffix != ".jsonl":
        path.with_name(f"{path.name}-shm").unlink(missing_ok=True)
    path = synced_file(path)
    if not path.exists():
        return 0
    dropped = max(0, path.stat().st_size - size)
    if dropped:
        os.truncate(path, size)
    return dropped


def surviving_events(path) -> set[tuple]:
    """``(seq, op, key, to)`` of every event still in the ledger: every whole, parseable
    line of a JSONL file; the events SQLite recovers from its file and WAL."""
    path = Path(path)
    if not path.exists():
        return set()
    if path.suffix != ".jsonl":
        import sqlite3

        db = sqlite3.connect(path)
        try:
            return set(db.execute('SELECT seq, op, key, "to" FROM events'))
        except sqlite3.OperationalError:  # not even the schema survived the cut
            return set()
        finally:
            db.close()
    found = set()
    for raw in path.read_bytes().split(b"\n")[:-1]:  # the last piece has no newline: torn
        try:
            obj = json.loads(raw)
            found.add((int(obj["seq"]), obj["op"], obj["key"], obj["to"]))
        except (ValueError, KeyError, TypeError):
            continue
    return found


def lost_deferred(path, messages) -> int:
    """Deferred transitions the cut took (allowed: a rerun repairs them by lookup)."""
    alive = surviving_events(path)
    return sum(m["t"] == "ack" and m.get("deferred") and
               (m["seq"], m["op"], m["key"], m["to"]) not in alive for m in messages)


def lost_acknowledged(path, messages) -> list[dict]:
    """Acknowledged transitions (``ack`` messages) that are not in the ledger file any more:
    every synced one, and a deferred one that is gone while a later one survives (a hole)."""
    alive = surviving_events(path)
    acks = [m for m in messages if m["t"] == "ack"]
    gone = [m for m in acks if (m["seq"], m["op"], m["key"], m["to"]) not in alive]
    last_alive = max((m["seq"] for m in acks if m not in gone), default=0)
    return [{k: m[k] for k in ("seq", "op", "key", "to")} for m in gone
            if not m.get("deferred") or m["seq"] < last_alive]
