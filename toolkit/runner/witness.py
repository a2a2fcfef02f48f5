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

  no history (no file, 0 bytes, JSONL: a new ledger is made *marked as salvaged*
   or a header alone) where     (``from``: the missing path, ``lost``: everything), so
   the witness saw it hold      the run looks up every request before sending it
   some (seq > 0: ``missing``)  (``runner.salvaged``); SQLite: refused,
                                naming ``ledger L --salvage NEW`` (from nothing)
  no history, witnessed at      nothing: no intent was recorded, so none was sent (a run
   seq 0 only                   stopped before its first); the ledger is not behind
  a lower last seq, or a copy   an older copy: refused (exit 2), naming ``ledger L
   of a ledger witnessed at a   --salvage NEW``, which reads this witness and marks
   higher seq elsewhere         the new ledger (``loss``)
  another identity              refused, unless the ledger is salvaged (marked: it looks
                                everything up) or compacted at a seq >= the witness's

then records the entry (so a run killed at once is still witnessed), records the seq the
run reached at its intents (``witness_progress``: the first, then every ~2 s; a run killed
mid-batch leaves no end) and records it again at the end with the seq the ledger reached
in memory, even when the run halted because
the ledger's path was replaced or removed (the file there no longer holds those events).
PostgreSQL ledgers have no file and no witness.

One ledger may be run with several ``--out`` folders in turn; each witness then saw part
of its history. So a run reads, and records into, the witness of every folder this ledger
is known to have used (``circle``): its own ``--out``, the batch's recorded ``out``
(``roots``), and the ``peers`` each of their entries lists, as far as the files say. A
folder gone is skipped; one that cannot be written keeps its older entry (it refuses no
more than it did, and sees less far). A witness file that does not read as one (garbage,
empty, a directory, ``{}``, an entry of wrong types) is refused, naming it: never rewritten
without the entries it held; moved aside, or a roots file damaged, what it held may be lost:
``witness_damaged`` says what a run then refuses. What a witness reads (a ledger's facts,
a witness file's entries) is ``witness_read``; this module records and judges.
"""

import contextlib
import errno
import json
import os
from pathlib import Path

from toolkit import documents, roots
from toolkit.errors import LedgerError, StorageError, ToolkitError
from toolkit.ledger.header import header_line, no_history
from toolkit.runner.witness_damaged import (NAME, aside_refusal, roots_refusal, salvage_advice,
                                            unseen_after_damage)
# What a witness reads (a ledger's facts, a witness file's entries): its own module, its
# names used here and by callers of this module (``witness.facts``, ``witness.read``).
from toolkit.runner.witness_read import facts, read, real_path
from toolkit.storage import LOCK, READ_ONLY, exclusive_lock, take_exclusive


def _locked(out):
    """The witness's lock: the runs (and workers) sharing ``out`` read-modify-write one by one."""
    return exclusive_lock(Path(out) / (NAME + LOCK))


def record(out, seen: dict | None, seq: int | None = None, peers=(), make=True) -> None:
    """Record ``seen`` (``facts`` of a ledger; ``seq``: the seq it reached, if later) in
    ``out``'s witness, with ``peers`` (the other folders of its ``circle``, added to those
    the entry lists). The same ledger keeps the higher seq; another identity replaces it
    (``check`` let it in). ``make=False``: a folder that is gone stays gone.

    Raises:
        StorageError: ``out`` cannot be written.
        LedgerError: its witness file is damaged (``read``).
    """
    if seen is None:
        return
    seq = max(seen["seq"], seq or 0)
    try:
        if make:
            Path(out).mkdir(parents=True, exist_ok=True)
        with _locked(out):
            entries = read(out)
            old = entries.get(seen["real"], {})
            ident = seen["id"] or old.get("id")
            if old.get("id") in (None, ident) and "seq" in old:
                seq = max(seq, old["seq"])  # a seq only grows: keep the max
            known = set(old.get("peers", ())) | {real_path(peer) for peer in peers}
            entries[seen["real"]] = {"id": ident, "seq": seq, "kind": seen["kind"],
                                     "peers": sorted(known - {real_path(out)})}
            documents.write_atomic(json.dumps({"ledgers": entries}, indent=1,
                                              sort_keys=True).encode(), Path(out) / NAME)
    except OSError as exc:
        said = f"{exc.strerror}; {READ_ONLY}" if exc.errno == errno.EROFS else exc
        raise StorageError(f"cannot record the ledger's witness in {str(out)!r}: {said}") \
            from exc


def circle(out, ledger_path, ident: str | None = None) -> list[str]:
    """The folders whose witness speaks for the ledger at ``ledger_path`` (identity
    ``ident``, if known): ``out`` first, then the batch's recorded ``out`` (``roots``),
    then the ``peers`` listed by their entries for its real path or its identity (a copy's),
    transitively. A folder that is gone (not a directory) is left out, but not ``out``.

    Raises:
        LedgerError: a witness in the circle is damaged (``read``).
    """
    real, first = real_path(ledger_path), real_path(out)
    todo, found = [first], []
    recorded = roots.recorded(ledger_path).get("out")
    if recorded is not None:
        todo.append(real_path(recorded))
    while todo:
        folder = todo.pop(0)
        if folder in found or (folder != first and not os.path.isdir(folder)):
            continue
        found.append(folder)
        for path, entry in read(folder).items():
            if path == real or (ident is not None and entry["id"] == ident):
                todo.extend(entry.get("peers", ()))
    return found


def record_all(folders, seen: dict) -> None:
    """Record ``seen`` in the witness of each folder of its circle, each listing the others.
    The first (the run's ``--out``) must take it (StorageError); another that cannot (gone
    since, read-only, full, damaged since) is skipped: it keeps its older entry."""
    for at, folder in enumerate(folders):
        peers = [other for other in folders if other != folder]
        if at == 0:
            record(folder, seen, peers=peers)
            continue
        with contextlib.suppress(ToolkitError, OSError):
            record(folder, seen, peers=peers, make=False)


def record_end(out, seen, ledger) -> None:
    """At a run's end (``seen``: what ``check`` returned at its start, its ``outs`` the
    circle; True: judged but not kept (``--workers``), so the circle is read again; None:
    no witness): the seq the ledger reached, in every folder of the circle. A failure here
    (``--out`` full, read-only, gone) is not the run's to report: the start's entry stays, a
    lower bound, so the witness still refuses only what lost transitions, and sees a little
    less far."""
    if seen:
        with contextlib.suppress(ToolkitError, OSError):
            now = facts(ledger)
            if now is None:
                return
            folders = seen["outs"] if isinstance(seen, dict) else \
                circle(out, ledger.path, now["id"])
            record_all(folders, now)


def loss(out, seen: dict) -> str | None:
    """What the witness of ``out`` says ``seen``'s history lost, in words; None if nothing."""
    entries = read(out)
    name, mine = Path(seen["real"]).name, entries.get(seen["real"])
    if mine is not None:
        same = mine["id"] is None or seen["id"] is None or mine["id"] == seen["id"]
        if seen["salvaged"] and (seen["id"] is None or seen["id"] != mine["id"]):
            pass  # a salvaged ledger in its place: it looks up every request it never recorded
        elif same and seen["seq"] < mine["seq"]:
            return (f"the events after seq {seen['seq']} (runs into {out} saw {name} reach seq "
                    f"{mine['seq']}: this is an older copy)")
        if not same and not seen["salvaged"] and not (
                seen["compacted"] is not None and seen["compacted"] >= mine["seq"]):
            return (f"the history of the ledger that was here (another ledger is at {name}; "
                    f"runs into {out} saw the one there reach seq {mine['seq']})")
    for real, entry in entries.items():  # a copy: the same identity, witnessed further on
        if real != seen["real"] and seen["id"] is not None and entry["id"] == seen["id"] \
                and entry["seq"] > seen["seq"]:
            return (f"the events after seq {seen['seq']} ({name} is a copy of {real}, which "
                    f"runs into {out} saw reach seq {entry['seq']})")
    return None


def _first_loss(folders, seen: dict) -> tuple[str, str] | None:
    """``(folder, what was lost)`` of the first folder whose witness sees a loss; None."""
    for folder in folders:
        lost = loss(folder, seen)
        if lost is not None:
            return folder, lost
    return None


def loss_of(ledger, out=None, path=None) -> str | None:
    """What the witness in ``out`` (default: the ledger's recorded outputs root, ``roots``)
    and the rest of its circle say its history lost, for ``ledger --salvage`` (which marks
    the new ledger with it, JSONL or SQLite alike); None if nothing. ``path``: the ledger's
    own path when ``ledger`` is open on a private copy of it (SQLite salvage): its roots
    file and its witness entries are the original's, not the copy's."""
    path = ledger.path if path is None else path
    seen = facts(ledger)
    if seen is None:
        return None
    seen["real"] = real_path(path)
    why = roots.damaged(path)
    if why is not None:  # the folders it named are unknown: nothing shows what was lost
        return (f"what the witness of its batch's --out saw (its roots file "
                f"{roots.roots_file(path).name} is damaged: {why})")
    out = out if out is not None else roots.recorded(path).get("out")
    if out is None:
        return None
    folders = circle(out, path, seen["id"])
    found = _first_loss(folders, seen)
    if found is not None:
        return found[1]
    aside = unseen_after_damage(folders, seen, read)
    return None if aside is None else (
        f"what the witness of {aside[0]} saw (it was moved aside damaged, {aside[1][-1]}, "
        "and no longer records this ledger)")


def check(out, ledger) -> dict | None:
    """At a run's start, the ledger just opened (before anything is sent): refuse a history
    that lost transitions (the module's table) by the witness of any folder of its circle,
    else record it in each; return its ``facts``, with ``outs``: the circle.

    Raises:
        LedgerError: an older copy, another ledger, a copy of a ledger witnessed further
            on, a damaged witness: one line naming what to do (exit 2).
        StorageError: the witness in ``out`` cannot be written.
    """
    seen = facts(ledger)
    if seen is None:
        return None
    why = roots.damaged(ledger.path)  # a roots file read as none would drop its folder
    if why is not None and not seen["salvaged"]:
        raise roots_refusal(ledger.path, seen["kind"], why, out)
    folders = circle(out, ledger.path, seen["id"])
    out, lost = _first_loss(folders, seen) or (out, None)  # out: the folder that saw it
    if lost is not None:  # SQLite: salvaged from a copy
        raise LedgerError(f"ledger {str(ledger.path)!r} lost transitions: {lost}; "
                          f"{salvage_advice(ledger.path, seen['kind'], out)}")
    aside = unseen_after_damage(folders, seen, read)
    if aside is not None:
        raise aside_refusal(ledger.path, seen["kind"], *aside)
    record_all(folders, seen)
    seen["outs"] = folders
    return seen


def missing(out, ledger_path) -> tuple[str, dict] | None:
    """``(folder, entry)``: the witness entry, in ``out``'s circle, that saw a ledger with
    no history (``no_history``) hold some; None: none did, or the ledger has history: a
    run on it would start an empty history where the witness saw one begin.

    An entry at seq 0 saw no history either: a run records seq 0 at its start, and nothing
    more until its first intent is durable, so a run stopped before then (``kill -9``, a
    refusal) sent nothing. Such a ledger is not behind its witness, and the roots file that
    run may have written says no more. With no entry at all (a batch folder copied
    elsewhere: entries are per real path), the roots file a run writes beside its ledger
    before its first send (``<ledger>.roots.json``) still says runs used it: ``(that file,
    {})``."""
    if "://" in os.fspath(ledger_path) or not no_history(ledger_path):
        return None
    real, seen_at_zero = real_path(ledger_path), False
    for folder in circle(out, ledger_path):
        entry = read(folder).get(real)
        if entry is not None and entry["seq"] > 0:
            return folder, entry
        seen_at_zero = seen_at_zero or entry is not None
    marker = roots.roots_file(ledger_path)
    if not seen_at_zero and os.path.lexists(marker):
        return str(marker), {}
    return None


def lost_words(folder, real: Path, entry: dict) -> str:
    """What a ledger with no history lost (``missing``'s ``(folder, entry)``), in the words
    of the witness that saw it reach a seq (all of it), or of its roots file (which says
    only that runs used it: whatever it held)."""
    if "seq" not in entry:
        return (f"whatever it held ({folder} says runs used {real.name}; it is missing or "
                "empty now)")
    return (f"all of it (runs into {folder} saw {real.name} reach seq {entry['seq']}; it is "
            "missing or empty now)")


def replace_missing(out, ledger_path) -> None:
    """Before a run opens a ledger: a JSONL ledger the witness of ``out``'s circle saw hold
    history and that has none now (missing, empty, its header alone: ``missing``) is made
    anew *marked as salvaged* (``lost_words``), so the run looks up every request first.
    An SQLite one with its tables and no row is marked in place (``mark_rowless``); one
    missing or of 0 bytes is refused (salvaged from nothing, by a person).

    Order: the marked header is written to a temp file, fsynced and linked into place
    (``os.link`` never replaces: a ledger made meanwhile by another run wins, and is then
    judged by ``check``); a file there is replaced only under the ledger's writer lock.

    Raises:
        LedgerError: a missing SQLite ledger (exit 2).
    """
    found = missing(out, ledger_path)
    if found is None:
        return
    folder, entry = found  # the folder whose witness saw it (or the roots file)
    if entry:
        out = folder  # salvage reads that witness
    real = Path(real_path(ledger_path))
    lost = lost_words(folder, real, entry)
    if real.suffix.lower() != ".jsonl":
        # Its tables with no row: marked salvaged in place, as a JSONL ledger is made anew
        # marked; missing or 0 bytes (no tables to mark): salvaged from nothing, by a person.
        from toolkit.ledger.salvage_sqlite import mark_rowless

        if os.path.isfile(real) and os.path.getsize(real) and mark_rowless(real, {
                "from": f"{real.name} (no rows)", "lost": lost}):
            return
        raise LedgerError(f"ledger {str(ledger_path)!r} lost its history: {lost}; put it back, "
                          f"or {salvage_advice(ledger_path, 'sqlite', out)}")
    mark = {"from": f"{real.name} (missing)", "lost": lost}
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
            if no_history(real):  # 0 bytes or its header alone: no history lost by this
                os.replace(tmp, real)  # under the lock: no writer is filling it
        documents.fsync_dir(real.parent)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        os.close(lock)
