"""What the witness reads: a ledger's facts and a witness file's entries (``witness``).

``facts`` is what a witness entry records of a ledger -- its identity (a hash of its first
record, carried by every copy) and the highest seq it holds -- read through the open
ledger's own handle. ``read`` is a folder's ``.witness.json`` read back whole and checked
entry by entry; a file that does not read as one is refused (``witness_damaged``), never
taken for an empty witness. Nothing here writes: ``witness`` records and judges.
"""

import hashlib
import json
import os
import sqlite3
from pathlib import Path

from toolkit.errors import LedgerError
from toolkit.ledger.header import read_header
from toolkit.runner.witness_damaged import NAME, damaged

READ = 1 << 16  # bytes read for the header and the first record (a longer line: its prefix)


def real_path(path) -> str:
    return os.path.realpath(os.fspath(path))


def facts(ledger) -> dict | None:
    """``{"real", "kind", "id", "seq", "salvaged", "compacted"}`` of an open file ledger,
    read through its own handle (not its path: the path may name another file by now);
    None for a ledger with no file (a URL)."""
    from toolkit.ledger.jsonl import JsonlLedger
    from toolkit.ledger.sqlite import SqliteLedger

    if isinstance(ledger, JsonlLedger):
        head = os.pread(ledger._fd, READ, 0).split(b"\n", 2)
        header = read_header(head[0]) if head[0] else None
        first = head[1] if header is not None and len(head) > 1 else head[0]
        snapshots = (header or {}).get("snapshots")
        return {"real": real_path(ledger.path), "kind": "jsonl", "seq": int(ledger._seq),
                "id": hashlib.sha256(first).hexdigest()[:20] if first.strip() else None,
                "salvaged": bool(getattr(ledger, "salvaged", None)),
                "compacted": snapshots.get("seq") if isinstance(snapshots, dict) else None}
    if isinstance(ledger, SqliteLedger):
        from toolkit.runner.salvaged import marked  # its meta row: the runner's one rule

        try:
            top, ident = sqlite_seq_and_id(ledger._db)
        except sqlite3.Error as exc:  # a page of events damaged: the ledger's own words
            from toolkit.ledger.sqlite_damage import busy_or_damaged, damage_of
            from toolkit.storage import storage_error

            raise (busy_or_damaged(ledger.path, str(exc)) if damage_of(exc) else
                   storage_error(f"SQLite ledger {str(ledger.path)!r}", exc)) from exc
        return {"real": real_path(ledger.path), "kind": "sqlite", "seq": top, "id": ident,
                "salvaged": marked(ledger), "compacted": None}
    return None


def sqlite_seq_and_id(db) -> tuple[int, str | None]:
    """An SQLite ledger's high-water seq and identity (a hash of its first event's seq,
    time and key: the ledger's creation stamp, carried by every copy), through ``db``."""
    top = db.execute("SELECT max(seq) FROM events").fetchone()[0] or 0
    row = db.execute("SELECT seq, ts, key FROM events ORDER BY seq LIMIT 1").fetchone()
    return int(top), hashlib.sha256(repr(tuple(row)).encode()).hexdigest()[:20] if row else None


def _valid(entry) -> bool:
    """An entry as ``record`` writes it: id (text or null), seq (int >= 0), kind (text),
    peers (a list of folder paths; absent before peers were recorded)."""
    return isinstance(entry, dict) and isinstance(entry.get("id"), (str, type(None))) and \
        type(entry.get("seq")) is int and entry["seq"] >= 0 and \
        isinstance(entry.get("kind"), str) and \
        isinstance(entry.get("peers", []), list) and \
        all(isinstance(peer, str) for peer in entry.get("peers", []))


def read(out) -> dict:
    """The witness of ``out``: ``{real path: {"id", "seq", "kind", "peers"}}`` ({} if none
    yet).

    Raises:
        LedgerError: the file is there and does not read whole as a witness (exit 2).
    """
    where = Path(out) / NAME
    try:
        raw = where.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except IsADirectoryError:
        raise damaged(where, "a directory in its place") from None
    except OSError as exc:
        raise LedgerError(f"the witness {str(where)!r} cannot be read ({exc.strerror}); it "
                          "records which ledgers the runs into this --out saw: make it "
                          "readable and run again") from exc
    try:
        saved = json.loads(raw)
    except ValueError:
        raise damaged(where, "an empty file" if not raw.strip() else "not JSON") from None
    entries = saved.get("ledgers") if isinstance(saved, dict) else None
    if not isinstance(entries, dict):
        raise damaged(where, 'no "ledgers" object')
    wrong = [real for real, entry in entries.items() if not _valid(entry)]
    if wrong:
        raise damaged(where, f"the entry of {wrong[0]} is not an id, a seq and a kind")
    return entries
