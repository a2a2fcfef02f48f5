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
    "sqlite": LedgerVariant(".sqlite", {}, "SQLite, WAL, synchronous=FULL"),
    "jsonl": LedgerVariant(".jsonl", {}, "JSONL, append and fsync before a commit returns",
                           power_loss=True),
    # Group commit (toolkit.ledger.group): commits share fsyncs, each acked once synced.
    "sqlite-group": LedgerVariant(".sqlite", {"group_commit": True},
                                  "SQLite, WAL, group commit (shared fsync of the WAL)"),
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


def drop_unsynced(path, size: int) -> int:
    """Cut ``path`` back to ``size`` bytes, as a power cut would; return the bytes dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    dropped = max(0, path.stat().st_size - size)
    if dropped:
        os.truncate(path, size)
    return dropped


def surviving_events(path) -> set[tuple]:
    """``(seq, op, key, to)`` of every whole, parseable line of a JSONL ledger."""
    path = Path(path)
    if not path.exists():
        return set()
    found = set()
    for raw in path.read_bytes().split(b"\n")[:-1]:  # the last piece has no newline: torn
        try:
            obj = json.loads(raw)
            found.add((int(obj["seq"]), obj["op"], obj["key"], obj["to"]))
        except (ValueError, KeyError, TypeError):
            continue
    return found


def lost_acknowledged(path, messages) -> list[dict]:
    """Acknowledged transitions (``ack`` messages) that are not in the ledger file any more."""
    alive = surviving_events(path)
    return [{k: m[k] for k in ("seq", "op", "key", "to")} for m in messages if m["t"] == "ack"
            and (m["seq"], m["op"], m["key"], m["to"]) not in alive]
