"""The witness: what the runs into an outputs folder saw of their ledgers, kept outside them.

A ledger cannot testify to its own loss: a backup restored over it, a copy put in its
place (a symlink alias retargeted), or the file deleted and made anew all read as a
whole, younger history, and a run on it sends again every request the lost lines held.
So each run records in its ``--out`` folder (``.witness.json``: written whole -- temp
file, fsync, rename -- under ``.witness.json.lock``) one entry per ledger real path:
the ledger's identity and the highest seq a run saw it reach. Several workers and
ledgers may share one ``--out``: each keeps its entry, and a seq only grows (the max).

Identity: a ledger's first record after its header, hashed -- the first event line of
a JSONL ledger (a compaction's or a salvage's first snapshot line), the seq-1 event row
(its time and key) of an SQLite ledger. It is the ledger's creation stamp, written by
the ledger's own first write and carried by every copy; another ledger has another.

At the start of a run, before anything is sent (``check``), against that entry:

  no file (or an empty one)     JSONL: a new ledger is made *marked as salvaged*
                                (``from``: the missing path, ``lost``: everything), so
                                the run looks up every request before sending it
                                (``runner.salvaged``); SQLite: refused,
                                naming ``ledger L --salvage NEW`` (from nothing)
  a lower last seq, or a copy   an older copy: refused (exit 2), naming ``ledger L
   of a ledger witnessed at a   --salvage NEW``, which reads this witness and marks
   higher seq elsewhere         the new ledger (``loss``)
  another identity              refused, unless the ledger is salvaged (marked: it looks
                                everything up) or compacted at a seq >= the witness's

then records the entry (so a run killed at once is still witnessed) and records it again
at the end with the seq the ledger reached in memory, even when the run halted because
the ledger's path was replaced or removed (the file there no longer holds those events).
PostgreSQL ledgers have no file and no witness.
"""

import contextlib
import errno
import fcntl
import hashlib
import json
import os
from pathlib import Path

from toolkit import documents, roots
from toolkit.errors import LedgerError, StorageError, ToolkitError
from toolkit.ledger.header import header_line, read_header
from toolkit.storage import LOCK, READ_ONLY, take_exclusive

NAME = ".witness.json"
READ = 1 << 16  # bytes read for the header and the first record (a longer line: its prefix)


def _real(path) -> str:
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
        return {"real": _real(ledger.path), "kind": "jsonl", "seq": int(ledger._seq),
                "id": hashlib.sha256(first).hexdigest()[:20] if first.strip() else None,
                "salvaged": bool(getattr(ledger, "salvaged", None)),
                "compacted": snapshots.get("seq") if isinstance(snapshots, dict) else None}
    if isinstance(ledger, SqliteLedger):
        from toolkit.runner.salvaged import marked  # its meta row: the runner's one rule

        db = ledger._db
        top = db.execute("SELECT max(seq) FROM events").fetchone()[0] or 0
        row = db.execute("SELECT seq, ts, key FROM events ORDER BY seq LIMIT 1").fetchone()
        ident = hashlib.sha256(repr(tuple(row)).encode()).hexdigest()[:20] if row else None
        return {"real": _real(ledger.path), "kind": "sqlite", "seq": int(top), "id": ident,
                "salvaged": marked(ledger), "compacted": None}
    return None


def read(out) -> dict:
    """The witness of ``out``: ``{real path: {"id", "seq", "kind"}}`` ({} if none yet)."""
    try:
        saved = json.loads((Path(out) / NAME).read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise LedgerError(f"the witness {str(Path(out) / NAME)!r} cannot be read ({exc}); "
                          "it records which ledgers the runs into this --out saw") from exc
    entries = saved.get("ledgers") if isinstance(saved, dict) else None
    return entries if isinstance(entries, dict) else {}


@contextlib.contextmanager
def _locked(out):
    """The witness's lock: the runs (and workers) sharing ``out`` read-modify-write one by one."""
    fd = os.open(Path(out) / (NAME + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def record(out, seen: dict | None, seq: int | None = None) -> None:
    """Record ``seen`` (``facts`` of a ledger; ``seq``: the seq it reached, if later) in
    ``out``'s witness. The same ledger keeps the higher seq; another identity replaces it
    (``check`` let it in). Raises StorageError when ``out`` cannot be written."""
    if seen is None:
        return
    seq = max(seen["seq"], seq or 0)
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
        with _locked(out):
            entries = read(out)
            old = entries.get(seen["real"])
            ident = seen["id"] or (old or {}).get("id")
            if isinstance(old, dict) and old.get("id") in (None, ident) and \
                    isinstance(old.get("seq"), int):
                seq = max(seq, old["seq"])  # a seq only grows: keep the max
            entries[seen["real"]] = {"id": ident, "seq": seq, "kind": seen["kind"]}
            documents.write_atomic(json.dumps({"ledgers": entries}, indent=1,
                                              sort_keys=True).encode(), Path(out) / NAME)
    except OSError as exc:
        said = f"{exc.strerror}; {READ_ONLY}" if exc.errno == errno.EROFS else exc
        raise StorageError(f"cannot record the ledger's witness in {str(out)!r}: {said}") \
            from exc


def record_end(out, seen, ledger) -> None:
    """At a run's end (``seen``: what ``check`` returned at its start; None: no witness):
    the seq the ledger reached. A failure here (``--out`` full, read-only, gone) is not
    the run's to report: the start's entry stays, a lower bound, so the witness still
    refuses only what lost transitions, and sees a little less far."""
    if seen:
        with contextlib.suppress(ToolkitError, OSError):
            record(out, facts(ledger))


def loss(out, seen: dict) -> str | None:
    """What the witness of ``out`` says ``seen``'s history lost, in words; None if nothing."""
    entries = read(out)
    name, mine = Path(seen["real"]).name, entries.get(seen["real"])
    if isinstance(mine, dict) and isinstance(mine.get("seq"), int):
        same = mine.get("id") is None or seen["id"] is None or mine["id"] == seen["id"]
        if seen["salvaged"] and (seen["id"] is None or seen["id"] != mine.get("id")):
            pass  # a salvaged ledger in its place: it looks up every request it never recorded
        elif same and seen["seq"] < mine["seq"]:
            return (f"the events after seq {seen['seq']} (runs into {out} saw {name} reach seq "
                    f"{mine['seq']}: this is an older copy)")
        if not same and not seen["salvaged"] and not (
                seen["compacted"] is not None and seen["compacted"] >= mine["seq"]):
            return (f"the history of the ledger that was here (another ledger is at {name}; "
                    f"runs into {out} saw the one there reach seq {mine['seq']})")
    for real, entry in entries.items():  # a copy: the same identity, witnessed further on
        if real != seen["real"] and isinstance(entry, dict) and seen["id"] is not None and \
                entry.get("id") == seen["id"] and isinstance(entry.get("seq"), int) and \
                entry["seq"] > seen["seq"]:
            return (f"the events after seq {seen['seq']} ({name} is a copy of {real}, which "
                    f"runs into {out} saw reach seq {entry['seq']})")
    return None


def loss_of(ledger, out=None) -> str | None:
    """What the witness in ``out`` (default: the ledger's recorded outputs root, ``roots``)
    says its history lost, for ``ledger --salvage`` (which marks the new ledger with it);
    None if nothing."""
    out = out if out is not None else roots.recorded(ledger.path).get("out")
    seen = facts(ledger) if out is not None else None
    return loss(out, seen) if seen is not None else None


def check(out, ledger) -> dict | None:
    """At a run's start, the ledger just opened (before anything is sent): refuse a history
    that lost transitions (the module's table), else record it; return its ``facts``.

    Raises:
        LedgerError: an older copy, another ledger, a copy of a ledger witnessed further
            on: one line naming the salvage (exit 2).
        StorageError: the witness cannot be written.
    """
    seen = facts(ledger)
    if seen is None:
        return None
    lost = loss(out, seen)
    if lost is not None:
        where = ledger.path
        new = "NEW.jsonl" if seen["kind"] == "jsonl" else "NEW.sqlite"  # SQLite: from a copy
        advice = (f"salvage it: toolkit ledger {str(where)!r} --salvage {new} --out "
                  f"{str(out)!r} (the new "
                  "ledger is marked: every request it never recorded is looked up before it "
                  f"is sent), then run with --ledger {new}")
        raise LedgerError(f"ledger {str(where)!r} lost transitions: {lost}; {advice}")
    record(out, seen)
    return seen


def missing(out, ledger_path) -> dict | None:
    """The witness's entry for a ledger whose file is missing or empty (None: no entry,
    or the file is there): a run on it would start an empty history."""
    if "://" in os.fspath(ledger_path):
        return None
    with contextlib.suppress(OSError):
        if os.stat(ledger_path).st_size > 0:
            return None
    entry = read(out).get(_real(ledger_path))
    return entry if isinstance(entry, dict) else None


def replace_missing(out, ledger_path) -> None:
    """Before a run opens a ledger: a JSONL ledger the witness of ``out`` knows and that is
    missing (or empty) is made anew *marked as salvaged* (lost: all), so the run looks up
    every request before sending it. An SQLite one is refused.

    Order: the marked header is written to a temp file, fsynced and linked into place
    (``os.link`` never replaces: a ledger made meanwhile by another run wins, and is then
    judged by ``check``); an empty file is replaced only under the ledger's writer lock.

    Raises:
        LedgerError: a missing SQLite ledger (exit 2).
    """
    entry = missing(out, ledger_path)
    if entry is None:
        return
    real = Path(_real(ledger_path))
    gone = (f"runs into {out} saw {real.name} reach seq {entry.get('seq')}; it is missing "
            "or empty now")
    if real.suffix.lower() != ".jsonl":  # SQLite: salvaged from nothing, by a person
        raise LedgerError(f"ledger {str(ledger_path)!r} lost its history: {gone}; put it back, "
                          f"or salvage it: toolkit ledger {str(ledger_path)!r} --salvage "
                          f"NEW.sqlite --out {str(out)!r} (the new ledger is marked: every "
                          "request is looked up before it is sent), then run with --ledger "
                          "NEW.sqlite")
    mark = {"from": f"{real.name} (missing)", "lost": f"all of it ({gone})"}
    tmp = real.with_name(f".{real.name}.witness-{os.getpid()}")
    lock = os.open(f"{real}{LOCK}", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if take_exclusive(lock) is not None:
            return  # a live writer holds it: the open says so
        with open(tmp, "wb") as handle:
            handle.write(header_line(mark))
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, real)
        except FileExistsError:
            if os.stat(real).st_size == 0:
                os.replace(tmp, real)  # under the lock: no writer is filling it
        documents.fsync_dir(real.parent)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        os.close(lock)
