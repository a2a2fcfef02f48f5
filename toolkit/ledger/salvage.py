"""``python -m toolkit ledger PATH --salvage NEW``: a new JSONL ledger from what is readable.

The model is diskcache's ``check(fix=False)``: a damaged ledger is never repaired in
place or silently. Salvage reads the old file (refusing nothing it can read), writes
a *new* ledger of snapshot lines, and parks every key a corrupt line may belong to
in ``needs_review`` with the reason, so that nobody acts on a state we cannot prove.
The old file is left exactly as it was, for the audit.

What no salvage can know is a key every line of which was lost: the new ledger does not
name it at all. So a salvage that lost anything marks the new ledger (``salvaged`` in its
header line, kept by compaction; a later salvage that loses more keeps it as ``earlier``),
and the runner looks up every request such a ledger never recorded before sending it
(``runner.salvaged``). Damage that loses no line (lines copied or moved, snapshot lines
the header does not count, a header deleted: ``gaps.py``) marks it too: a header deleted
may have taken an earlier mark with it, and a history out of order folds to states
nobody wrote. The new ledger gets the old one's file mode.
"""

import contextlib
import dataclasses
import errno
import json
import os
import stat
from pathlib import Path

from toolkit.errors import LedgerBusyError, LedgerError, StorageError, ToolkitError
from toolkit.ledger import LEASE_FIELDS, PERMANENT, Item, State, canonical_path
from toolkit.ledger.gaps import describe, describe_disorder
from toolkit.ledger.jsonl import SNAPSHOT, JsonlLedger, header_line, item_to_json
from toolkit.ledger.transitions import ARTIFACT_FIELDS
from toolkit.storage import LOCK, open_exclusive, take_exclusive

# What a person does with a parked item, in every reason salvage and a salvaged ledger's run
# write (``review`` shows it): the output, when it exists, is the way out that sends nothing.
DECIDE = ("release or cancel it, or accept its output if one exists (resolve --accept-artifact "
          "FILE)")


def salvage(path, new_path, loss=None) -> dict:
    """Write ``new_path`` from the readable part of the JSONL ledger ``path``.

    Returns ``{"items", "needs_review": [keys], "corrupt_lines": [n], "unattributed": [n],
    "seq_gaps": [(first, last)], "salvaged": mark, "lost": text}`` (``unattributed``: corrupt
    lines in which no key can be read at all; ``seq_gaps``: the ranges of missing seqs,
    ``JsonlLedger.missing_seqs``; ``salvaged``: the new ledger's mark, or None when
    nothing was lost and the old ledger had none; ``lost``: what this salvage found lost,
    its mark's words, or None). ``loss(old)``, given the old ledger open for reading, may
    name a loss its file cannot show (``runner.witness``: an older copy): it marks too.
    ``new_path`` is a JSONL ledger, or an SQLite one by its suffix (``write_new``).

    Raises:
        ToolkitError: ``new_path`` exists or has no folder, or ``path`` is no JSONL ledger
            of ours, or (``LedgerError``) has more than one hard link.
        LedgerBusyError: a live writer holds ``path`` (its lines are still being written).
        StorageError: ``path`` is on a read-only file system (its lock cannot be taken).
    """
    path, new_path = Path(path), Path(new_path)
    check_new(new_path)
    if path.suffix.lower() != ".jsonl":
        raise ToolkitError("--salvage reads a .jsonl ledger here (an SQLite one: salvage_sqlite)")
    with _writer_excluded(path) as real:
        old = JsonlLedger(real, view=True)  # reads only; refuses a foreign or newer file
        try:
            found = Found(
                items={**old.orphans, **{item.key: item for item in old.items()}},
                affected=sorted(old.affected_keys), lines=list(old.corrupt_lines),
                seq=old._seq, unattributed=list(old.unattributed_lines),
                gaps=list(old.missing_seqs),  # (first, last) ranges: the ledger's own rule
                disorder=old.disorder, snapshots=old.snapshot_damage,  # gaps.py too
                mark=old.salvaged,  # an earlier salvage's mark stays: its keys are still lost
                # cuts not yet spent, and the keys a torn tail names (a view records no
                # cut): the new ledger looks them up before sending them (torn.py)
                torn={**old.torn_marks, **dict.fromkeys(old.torn_keys, old._seq)},
                mode=stat.S_IMODE(os.fstat(old._fd).st_mode),  # the new one gets the old one's
                # No line read at all (0 bytes, or the header alone): a ledger emptied or
                # cut in place while a run wrote it (its halt says to salvage) reads as a
                # new one; only a mark keeps the next run from resending what was sent.
                empty=(not old._events_read and not old.orphans and not old.corrupt_lines)
                and "every event line, if it had any (it held none: emptied, or cut to its "
                    "header)",
                witnessed=loss(old) if loss is not None else None)  # under the writer lock
        finally:
            old.close()
    return conclude(path.name, new_path, found)


@dataclasses.dataclass
class Found:
    """What a salvage read of the old ledger (``salvage``; ``salvage_sqlite``: SQLite, or
    nothing at all): its items, and each kind of loss it shows (empty: none)."""
    items: dict
    mark: dict | None = None  # the old ledger's own mark: kept, as ``earlier``
    mode: int = 0o644
    seq: int = 0
    affected: list = dataclasses.field(default_factory=list)  # keys corrupt lines name
    lines: list = dataclasses.field(default_factory=list)  # corrupt line numbers
    unattributed: list = dataclasses.field(default_factory=list)
    gaps: list = dataclasses.field(default_factory=list)
    disorder: list | None = None
    snapshots: list = dataclasses.field(default_factory=list)
    empty: str | None = None  # the words for "it held nothing", when that is a loss
    witnessed: str | None = None  # what the witness says was lost (``runner.witness``)
    torn: dict = dataclasses.field(default_factory=dict)  # {key: after}: ``ledger.torn``


def check_new(new_path: Path) -> None:
    """Refuse, before anything is read, a ``new_path`` that exists or has no folder."""
    if new_path.exists() or new_path.is_symlink():
        raise ToolkitError(f"{str(new_path)!r} exists: salvage writes a new ledger, never over one")
    if not new_path.parent.is_dir():  # a typo, as run's --provider-db is refused: none made
        raise ToolkitError(f"--salvage {str(new_path)!r}: no folder {str(new_path.parent)!r} "
                           "to hold it")
    if new_path.suffix.lower() not in (".jsonl", ".sqlite", ".db", ".sqlite3"):
        raise ToolkitError(f"--salvage {str(new_path)!r}: name a new .jsonl, .sqlite or .db "
                           "ledger")


def edited_record(path, key: str, attempt: int) -> LedgerError:
    """What ``Ledger.move`` raises for the intent of an item recorded ``pending`` after an
    attempt. No run writes that (no edge enters pending, and each intent counts an
    attempt): its record was edited by hand (a line's ``"to"``, a row's state), and that
    attempt may have been sent. Sending again could execute it twice, so the run halts
    before the intent (exit 2), and ``conclude`` parks the item, its new ledger marked to
    look every attempt up."""
    from toolkit.advice import absolute, salvaged_name, toolkit_command
    from toolkit.ledger.sqlite_damage import DamagedLedgerError
    from toolkit.storage import recorded

    out = recorded(os.path.realpath(path)).get("out")  # the runs' --out, as damaged() names
    command = toolkit_command("ledger", absolute(path), "--salvage", salvaged_name(path),
                              *(("--out", absolute(out)) if out else ()))
    return DamagedLedgerError(
        f"ledger {str(path)!r} records item {key} as pending after attempt {attempt}, "
        "which no run writes (its record was edited); nothing was sent for it now, and "
        "that attempt may have been sent: salvage it, which parks the item for review "
        f"({command}), then run with the new ledger")


def conclude(name: str, new_path: Path, found: Found) -> dict:
    """Park and mark what ``found`` says was lost, write ``new_path``; ``salvage``'s result.
    ``name``: the old ledger's, for the mark and the reasons."""
    items, affected, lines, gaps = found.items, found.affected, found.lines, found.gaps
    disorder, snapshots, mark = found.disorder, found.snapshots, found.mark
    lost = None
    # Pending after an attempt: no run writes that, so the record was
    # edited and the attempt may have been sent (``edited_record``). Parked, and the ledger
    # marked: a release then looks every attempt up before anything is sent.
    edited = sorted(key for key, item in items.items()
                    if item.state == State.PENDING and item.attempt)
    # An SQLite ledger holds no torn mark (``ledger.torn``): the keys it names are a loss.
    torn = found.torn and new_path.suffix.lower() != ".jsonl" and \
        f"a final line cut as torn, naming keys {', '.join(k[:12] for k in found.torn)}"
    reason = (f"salvaged from {name}: corrupt lines {', '.join(map(str, lines))} may hold "
              "events of this item; check it at the provider, then " + DECIDE)
    edits = edited and (f"item {edited[0][:12]}" + (f" and {len(edited) - 1} more" if
                                                     len(edited) > 1 else "")
                        + " recorded pending after an attempt (an edited record)")
    if lines or gaps or disorder or snapshots or found.empty or found.witnessed or torn or edits:
        named = ", ".join(map(str, lines[:10])) + (f" and {len(lines) - 10} more"
                                                   if len(lines) > 10 else "")
        lost = " and ".join(filter(None, [
            lines and f"corrupt lines {named}", gaps and f"the events of {describe(gaps)}",
            disorder and f"the order of event lines ({describe_disorder(disorder)})",
            snapshots and _SNAPSHOTS_LOST[snapshots[0]], found.empty, found.witnessed, torn,
            edits]))
        # A chain, oldest first: each salvage's own loss stays named (a header deleted
        # took an earlier mark with it: ``missing_header`` says it may have been there).
        chain = mark.get("earlier") if isinstance(mark, dict) else None
        earlier = [*(chain if isinstance(chain, list) else []),
                   {k: v for k, v in mark.items() if k != "earlier"}] \
            if isinstance(mark, dict) else []
        mark = {"from": name, "lost": lost, **({"earlier": earlier} if earlier else {})}
        if not lines and not gaps:
            reason = (f"salvaged from {name} ({lost}): this item's state or events may be "
                      "wrong or lost; check it at the provider, then " + DECIDE)
        # A lost line (or a missing seq) may have been any key's last event: an intent
        # already sent, for instance, whose key now reads as pending. So every item not
        # settled for good (done, cancelled, needs_review, failed permanent) is parked,
        # not only the keys a corrupt line still names: never resend on a guess.
        affected = sorted(set(affected) | {key for key, item in items.items()
                                           if not _settled(item)})
        if gaps and not lines:
            reason = (f"salvaged from {name}: the events of {describe(gaps)} are missing "
                      "and may be this item's; check it at the provider, then " + DECIDE)
    # A done the lost lines rebuilt without its artifact (only its release line was read,
    # say) is no done a run can verify: parked with that reason, whatever else was lost.
    hollow = {key for key, item in items.items() if item.state is State.DONE and not _whole(item)}
    for key in sorted(set(affected) | hollow):
        items[key] = dataclasses.replace(
            items.get(key) or Item(key=key), state=State.NEEDS_REVIEW,
            reason=reason if key not in hollow else (
                f"salvaged from {name}: a done without its artifact fields (path, size, "
                "sha256), the lines that recorded them lost; check it at the provider (its "
                "output may be under the outputs root), then " + DECIDE),
            **dict.fromkeys(LEASE_FIELDS))
    affected = sorted(set(affected) | hollow)
    write_new(new_path, items, mark, found.seq, found.mode, found.torn)
    return {"items": len(items), "needs_review": affected, "corrupt_lines": lines,
            "unattributed": found.unattributed, "seq_gaps": gaps, "salvaged": mark,
            "lost": lost}


def write_new(new_path: Path, items: dict, mark, seq: int, mode: int, torn=None) -> None:
    """Write the salvaged ledger ``new_path`` (JSONL, or SQLite by its suffix: ``salvage_sqlite``)
    whole or not at all, with the old ledger's ``mode``, and prove it reads back whole."""
    if new_path.suffix.lower() != ".jsonl":
        from toolkit.ledger.salvage_sqlite import write_sqlite

        return write_sqlite(new_path, items, mark, mode)
    from toolkit.documents import write_atomic

    # Seq 1 at least: a header deleted from a salvage of nothing readable then shows as a
    # gap before the next run's first event, never as an older headerless ledger.
    seq = max(seq, 1)
    body = b"".join(json.dumps({SNAPSHOT: item_to_json(item), "seq": seq}, sort_keys=True)
                    .encode() + b"\n" for item in items.values())
    write_atomic(header_line(mark, (len(items), seq), torn) + body, new_path)
    with contextlib.suppress(OSError):  # written 0600 (a temp file): the old ledger's mode
        os.chmod(new_path, mode)
    try:  # prove the new file reads back as an intact ledger of ours
        check = JsonlLedger(new_path, view=True)
        intact = not check.damaged and len(check.items()) == len(items) and \
            check.salvaged == mark
        check.close()
    except LedgerError as exc:
        raise ToolkitError(f"salvaged ledger does not read back: {exc}") from exc
    finally:
        Path(f"{new_path}.lock").unlink(missing_ok=True)
    if not intact:
        raise ToolkitError(f"salvaged ledger {str(new_path)!r} does not read back whole")


def _settled(item: Item) -> bool:
    """No automation moves it again, whatever a lost event said: nothing to resend."""
    return item.state in (State.DONE, State.CANCELLED, State.NEEDS_REVIEW) or (
        item.state is State.FAILED and item.failure == PERMANENT)


def _whole(item: Item) -> bool:
    """A done as ``Ledger.move`` writes one: its artifact's path, size and SHA-256 all there."""
    return all(getattr(item, name) not in (None, "") for name in ARTIFACT_FIELDS)


@contextlib.contextmanager
def _writer_excluded(path: Path):
    """Yield the ledger's real path while we hold its writer locks (``<real path>.lock``, then
    the ledger file's own: ``storage.open_exclusive``; taken as ``run`` and ``resolve`` take
    them: exclusive, never waiting; a writer whose lock file was deleted still holds the
    second), so the file is read
    whole and no writer starts until we are done; a live writer refuses the salvage
    (``LedgerBusyError``, exit 1, naming its pid): its lines are still being written, so a
    salvage would read an unfinished history as a finished one.

    A ledger with more than one hard link is refused first, by ``run``'s own rule
    (``canonical_path``), before any lock: its writer's lock is named after the other name,
    so ours would be free while that writer is alive, and we would copy its unfinished
    history as a finished one.

    A lock file we created is removed while we still hold it, as ``run`` removes the one it
    created beside a corrupt ledger it refuses (``registry._tidy``): an opener that got the
    file before the unlink is refused as busy, a later one makes a new file (and an opener
    that takes the unlinked file's lock after we close it still meets the ledger file's
    lock, held by whoever made the new one). One that was there stays."""
    real = canonical_path(path)  # a symlink alias meets the writer's lock; a hard link: refused
    lock = f"{real}{LOCK}"
    made = not os.path.lexists(lock)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.EROFS:  # a storage state (README), not bad input: exit 1
            raise StorageError(f"cannot take the lock of JSONL ledger {str(path)!r}: read-only "
                               "file system; copy the ledger to a writable folder and salvage "
                               "the copy") from None
        raise ToolkitError(f"cannot open the lock of JSONL ledger {str(path)!r}: "
                           f"{exc.strerror or exc}") from None
    held = None  # the ledger file's own lock, as every writer takes it after the lock file's
    try:
        holder = take_exclusive(fd)
        if holder is None:
            try:
                held, holder = open_exclusive(real, os.O_RDONLY)
            except OSError:  # not there, or not readable: the read below says which
                pass
        if holder is not None:
            raise LedgerBusyError(f"JSONL ledger {str(path)!r} is busy: open in another writer "
                                  f"({holder}); salvage it when that run ends")
        try:
            yield real
        finally:
            if made:
                Path(lock).unlink(missing_ok=True)  # still ours: see above
    finally:
        if held is not None:
            os.close(held)
        os.close(fd)


_SNAPSHOTS_LOST = {"cut_header": "the header line (cut inside it)",
                   "missing_header": "the header line (it may have held an earlier salvage's mark)",
                   "snapshot_mismatch": "snapshot lines the header did not count"}


def salvaged_note(mark) -> str:
    """The audit's note on a salvaged ledger (JSONL's header mark, SQLite's meta row)."""
    return (f"{lost_lines(mark)}: a run looks up every request this ledger never recorded "
            "before sending it")


def lost_lines(mark) -> str:
    """A salvage mark in words: ``'salvaged from L.jsonl (the events of seq 3-9 (7 events))'``,
    then each earlier salvage's (``', earlier from K.jsonl (corrupt lines 4)'``)."""
    if not isinstance(mark, dict):
        return "salvaged ledger"
    chain = [mark, *reversed([m for m in mark.get("earlier") or () if isinstance(m, dict)])]
    return ", earlier ".join(
        f"{'salvaged ' if at == 0 else ''}from {m.get('from', 'a damaged ledger')}"
        + (f" ({m['lost']})" if m.get("lost") else "") for at, m in enumerate(chain))
