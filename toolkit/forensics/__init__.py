"""Ledger forensics: what happened to a batch, and what each item needs next.

``audit(path)`` detects the ledger's format by content, reads it without ever
writing (SQLite read-only, JSONL by plain reads, a ``postgresql://`` URL in a
read-only transaction), normalizes it to one pandas
table of items (and events where the format has a history), lists findings
(``Anomaly``) and plans one next action per item. It reports; it never
repairs (diskcache ``check(fix=False)``).

Formats are adapters registered in ``model.ADAPTERS`` (see ``jsonl.py`` and
``sqlite.py``): adding one is one function and one ``@register`` line.

Plan (``checks.plan_item``; the first rule that fits an item decides):

- ``review`` any item whose history cannot be trusted (duplicate_key, illegal_transition,
  missing_history, history_mismatch, unsafe_artifact_path, shared_output), and any item but a cancelled
  one whose input changed (stale_input, unsafe_input_path; a done one too, until another
  item holds the new content: then it is history, planned by its artifact). An item whose
  content is in --inputs under another name (input_renamed) keeps its own plan: run finds
  it by content;
- ``review`` a pending, partial, unknown, submitted or transiently failed item whose input
  is missing (input_missing, with ``inputs``: gone, renamed or unreadable, so its content
  was never read): it cannot be sent again without its bytes (unknown or submitted: look
  its key up first). Any other state keeps its own plan below (a done item's artifact
  stands on its own; a re-fetch by lookup reads no input);
- done: ``skip`` when its artifact is verified; ``verify`` when its recorded artifact was
  not checked (no artifacts folder) or, in a format without lookup, none is recorded;
  ``reconcile`` in our formats when it is unrecorded, missing or damaged (look up and
  re-fetch, never re-execute); ``review`` when missing or damaged in a format without
  lookup (running it again would be a second execution);
- ``skip`` cancelled; ``review`` needs_review;
- partial: ``run`` (resume at the next page from the checkpoint), ``review`` when the
  checkpoint is not verified;
- ``run`` pending; ``reconcile`` unknown or submitted (look up before anything);
- ``retry`` a transient failure; ``review`` a permanent or unclassified one.

Over that, our JSONL ledger with corrupt lines or a gap in its events' seq (``_damage``;
the gap is its own ``seq_gap`` finding, naming the missing seqs) plans every pending,
unknown, submitted, partial or failed item but a permanent failure ``review``: any key's
last event may be lost, and salvage parks them.

pandas is imported only when ``Report.items`` or ``Report.events`` is first read: importing
this package, and ``audit --json``, stay cheap.
"""

import array
import collections
import operator
import os
import sqlite3
import stat
import time

from toolkit import roots
from toolkit.errors import LedgerBusyError, ToolkitError
from toolkit.forensics import jsonl as _jsonl  # noqa: F401  (registers its adapters)
# queues before sqlite: its sniffs are exact table shapes, tried before the loose "a jobs /
# task_items table" ones (a litequeue named "jobs" is litequeue)
from toolkit.forensics import queues as _queues  # noqa: F401  (registers its adapters)
from toolkit.forensics import sqlite as _sqlite
from toolkit.forensics.checks import LOOKUP_FORMATS, check_items
from toolkit.forensics.lines import MAX_LINE
from toolkit.forensics.planner import WORDS_READ, Planner
from toolkit.ledger.header import HEADER_LINE, cut_header, no_history
from toolkit.forensics.private import CopyError, ScratchFull
from toolkit.forensics.model import (
    ACTIONS,
    ADAPTERS,
    KINDS,
    STATES,
    Anomaly,
    Raw,
    Report,
    Rows,
    Worded,
    gc_paused,
    supported,
)
from toolkit.forensics.render import render_text

SQLITE_MAGIC = b"SQLite format 3\0"


def _fail(path, why, formats: bool = True) -> ToolkitError:
    """One line; ``formats=False`` when the cause is the storage's (an I/O error), where a
    list of supported formats would wrongly suggest the file is of none of them."""
    why = " ".join(str(why).split())[:400]  # one short line, whatever the cause said
    tail = f"; {supported()}" if formats else " (a storage error, not a format problem)"
    return ToolkitError(f"cannot audit {str(path)!r}: {why}{tail}")


# SQLite's answers that are about the disk, not about what the file holds.
IO_ERRORS = ("SQLITE_IOERR", "SQLITE_FULL", "SQLITE_CANTOPEN", "SQLITE_READONLY", "SQLITE_BUSY",
             "SQLITE_PERM", "SQLITE_LOCKED")


def _storage_fault(exc) -> bool:
    if isinstance(exc, OSError):
        return True
    return getattr(exc, "sqlite_errorname", "").startswith(IO_ERRORS)


def _folder(path, flag) -> str | None:
    if path is None:
        return None
    if not os.path.isdir(path):
        raise ToolkitError(f"{flag} {str(path)!r} is not a readable directory")
    return os.fspath(path)


# Byte order marks of UTF-16 LE (and UTF-32 LE, which starts alike), UTF-16 BE, UTF-32 BE.
WIDE_BOMS = (b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")


def detect(path) -> str:
    """The name of the format of the file at ``path``.

    Raises:
        ToolkitError: missing, not a regular file, unreadable, or no adapter fits.
    """
    return _detect(path)[0]


def _detect(path):
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:
        raise _fail(path, getattr(exc, "strerror", None) or exc) from exc
    if not stat.S_ISREG(info.st_mode):
        raise _fail(path, "not a regular file")
    try:
        with open(path, "rb") as handle:
            head = handle.read(max(len(SQLITE_MAGIC), len(HEADER_LINE)))
    except OSError as exc:
        raise _fail(path, exc.strerror or exc) from exc
    if head.startswith(SQLITE_MAGIC):
        return "sqlite", None
    if head.startswith(WIDE_BOMS) or head[:2] in (b"{\x00", b"\x00{"):
        raise _fail(path, "UTF-16 or UTF-32 text (Windows PowerShell's default for `>`), not "
                    "UTF-8: convert a copy first, e.g. iconv -f UTF-16 -t UTF-8 FILE > COPY")
    if not head:
        return "empty", None
    if cut_header(head):  # ours, cut inside line 1 (no more bytes: shorter than a header)
        return "toolkit-jsonl", ADAPTERS["toolkit-jsonl"]
    return _sniff_jsonl(path)


def _sniff_jsonl(path, budget: int = 1 << 26):
    """The first line (within ``budget`` bytes) that is an object some adapter claims."""
    import json

    seen = None
    with open(path, "rb") as handle:
        while budget > 0 and (line := handle.readline(MAX_LINE + 1)):
            budget -= len(line)
            if len(line) > MAX_LINE and not line.endswith(b"\n"):
                while (rest := handle.readline(1 << 20)) and not rest.endswith(b"\n"):
                    budget -= len(rest)  # an over-long line: skip to its end
                continue
            try:
                obj = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if type(obj) is dict:
                for adapter in ADAPTERS.values():
                    if adapter.container == "jsonl" and adapter.sniff(obj):
                        return adapter.name, adapter
                seen = seen or sorted(map(str, obj))[:8]
    if seen is not None:
        raise _fail(path, f"JSON lines with unrecognized fields {seen}")
    raise _fail(path, "neither SQLite nor JSON lines")


def audit(path, artifacts=None, inputs=None, *, now: float | None = None,
          output_name: str | None = None) -> Report:
    """Audit the ledger at ``path``; ``artifacts``/``inputs`` are folders to verify against.

    ``now`` (default: the current time) decides whether a lease is still live.
    ``output_name`` (``'{stem}.pdf'``, see ``checks.output_path``): where a done item's
    output is when its format records none; it is then checked as a whole PDF.

    Raises:
        ToolkitError: one line, for a missing, unreadable or unrecognized
            ledger (listing the supported formats) or a bad folder argument.
    """
    gone = None  # a recorded outputs root that is not a folder: nothing done is verifiable
    if artifacts is None:  # the outputs root the batch recorded (paths are relative to it)
        recorded = roots.recorded(path).get("out")
        artifacts = recorded if recorded is not None and recorded.is_dir() else None
        gone = recorded if recorded is not None and artifacts is None else None
    artifacts, inputs = _folder(artifacts, "--artifacts"), _folder(inputs, "--inputs")
    from toolkit.ledger.postgres import postgres_url, redact

    url = postgres_url(path)
    if url is not None:  # a PostgreSQL ledger: its schema, read-only, one snapshot
        from toolkit.forensics.postgres import NAME, read_postgres

        try:
            raw = read_postgres(url)
        except ToolkitError as exc:
            raise _fail(redact(url), exc) from exc
        return _report(redact(url), NAME, raw, _ordered(raw.anomalies + check_items(
            raw.items, artifacts, inputs, time.time() if now is None else now, output_name)))
    name, adapter = _detect(path)
    with gc_paused():
        return _audit(path, name, adapter, artifacts, inputs, now, gone, output_name)


def _root_gone(items: dict, gone) -> list:
    """The recorded outputs root is missing (deleted, or moved apart from the ledger): every
    done or partial item's artifact is ``artifact_missing`` (planned ``reconcile`` or
    ``review``, never ``skip``): what cannot be looked at is not verified."""
    return [Anomaly(key, "artifact_missing", f"the recorded outputs root {str(gone)!r} is not "
                    "a folder: artifact not verifiable (give --artifacts, or rerun)")
            for key, item in items.items() if item.state in ("done", "partial")]


def _audit(path, name, adapter, artifacts, inputs, now, gone=None, output_name=None) -> Report:
    try:
        if name == "sqlite":
            sqlite_adapters = [a for a in ADAPTERS.values() if a.container == "sqlite"]
            name, raw = _sqlite.read_database(path, sqlite_adapters)
        elif name == "empty":
            raw = Raw()
        else:
            raw = adapter.read(path)
    except (ScratchFull, LedgerBusyError):  # TMPDIR full; in use by a live process whose
        raise  # -wal or -shm was deleted: the storage's or the run's (exit 1), one line each
    except ToolkitError as exc:  # a failed private copy is the disk's fault, not the format's
        raise _fail(path, exc, not isinstance(exc, CopyError)) from exc
    except (OSError, sqlite3.Error, MemoryError) as exc:
        raise _fail(path, f"{type(exc).__name__}: {exc}", not _storage_fault(exc)) from exc
    anomalies = raw.anomalies + check_items(raw.items, artifacts, inputs,
                                            time.time() if now is None else now, output_name,
                                            name in LOOKUP_FORMATS)
    if gone is not None:
        anomalies += _root_gone(raw.items, gone)
    marker = roots.roots_file(path)  # written by a run before its first send
    if not raw.items and os.path.lexists(marker) and no_history(path):  # run's own rule
        # (the witness that tells the two apart is in the batch's --out, the run's to read)
        raw.notes.append(f"no_history: no item, yet {os.fspath(marker)!r} beside it says runs "
                         "used this ledger: either its first run stopped before its first "
                         "event (nothing was sent, nothing lost) or its history was lost "
                         "(emptied, or deleted and made anew); `run` with the batch's --out "
                         "tells them apart by its witness (OUT/.witness.json): a witness that "
                         "saw it at seq 0 goes on as on a new ledger; one that saw more, or "
                         "none, treats it as missing: marked salvaged, every request looked "
                         "up first (JSONL: made anew; SQLite: its tables marked in place, a "
                         "file of 0 bytes refused: salvage it, "
                         "`ledger PATH --salvage NEW --out OUT`)")
    return _report(os.fspath(path), name, raw, _ordered(anomalies))


_RANK = {kind: index for index, kind in enumerate(KINDS)}


def _ordered(anomalies):
    """Line findings first (already in line order), then by key and kind's rank: two stable
    sorts, by rank then by key (C compares the keys; no (key, rank) tuple per finding)."""
    lines = [a for a in anomalies if a.key is None]
    keyed = [a for a in anomalies if a.key is not None]
    keyed.sort(key=lambda a: _RANK[a.kind])
    keyed.sort(key=operator.attrgetter("key"))
    return lines + keyed


UNSETTLED = ("pending", "unknown", "submitted", "partial", "failed")
# line-level findings of a JSONL history not whole (forensics.jsonl: the ledger's gaps.py)
HISTORY_DAMAGE = ("seq_gap", "seq_disorder", "missing_header", "snapshot_mismatch")


def _damage(raw) -> str | None:
    """Why no unsettled item can be trusted, or None: a lost line or a missing seq may
    have been any key's last event (an intent already sent), so salvage parks them all."""
    lines = sorted(raw.corrupt_lines)
    if lines and any(anomaly.kind == "torn_line" for anomaly in raw.anomalies):
        del lines[-1]  # the torn tail, the file's last line: a run cuts it, no damage (torn.py)
    if lines:
        return (f"ledger has corrupt lines {', '.join(map(str, lines[:10]))}"
                ": any key's last event may be lost; salvage parks it for review")
    # the seq_gap finding is line-level and comes after every other line's (lines.seq_gaps)
    gap = next((a for a in reversed(raw.anomalies) if a.kind in HISTORY_DAMAGE), None)
    if gap is not None:
        return f"ledger history is not whole (see the {gap.kind} finding): any key's last " \
               "event may be lost; review"
    return None


def _report(path, name, raw, anomalies) -> Report:
    """``anomalies`` in ``_ordered``'s order: a key's findings are next to each other, and
    the keys in the order ``sorted`` gives the items'. So one walk down both finds each
    item's findings (no {key: {kind: detail}} of a quarter-million dicts: ~40 MB; no
    lookup by key at all), and items planned alike share one answer."""
    # without a lookup, a done with no artifact is "verify"; items alike share one answer
    plan = Planner(name in LOOKUP_FORMATS).plan
    damaged = _damage(raw) if name == "toolkit-jsonl" else None  # the ledger salvage reads
    parked = ("review", damaged, None)  # what salvage parks: never run on a guess
    records = sorted(raw.items.values(), key=operator.attrgetter("key"))
    at, end = 0, len(anomalies)
    while at < end and anomalies[at].key is None:  # the line findings come first
        at += 1
    named = list(map(operator.attrgetter("key"), anomalies))
    first, counts = array.array("q"), array.array("i")
    for key in map(operator.attrgetter("key"), records):
        while at < end and named[at] < key:  # a key no item has (sorted: before this one)
            at += 1
        first.append(at)
        start = at
        while at < end and named[at] == key:
            at += 1
        counts.append(at - start)
    del named
    plans, alike = [], {}  # alike: (state, failure, the finding's kind and words) -> answer
    for item, start, count in zip(records, first, counts):
        failure = item.failure
        if failure.__class__ is not str:
            failure = None  # (as Planner.plan reads it)
        if count == 0:
            alike_key = (item.state, failure)
        elif count == 1 and (anomaly := anomalies[start]).__class__ is Worded \
                and anomaly.kind not in WORDS_READ:
            alike_key = (item.state, failure, anomaly.kind, anomaly.words)
        else:
            found = {}  # its findings, in report order: plan_item reads the first of a kind
            for anomaly in anomalies[start:start + count]:
                found.setdefault(anomaly.kind, anomaly)
            alike_key = None
        if alike_key is None:
            answer = plan(item, found)
        elif (answer := alike.get(alike_key)) is None:
            answer = alike[alike_key] = plan(item, {anomaly.kind: anomaly} if count else None)
        if damaged and item.state in UNSETTLED and not (item.state == "failed"
                                                         and item.failure == "permanent"):
            answer = parked
        plans.append(answer)
    plan, by_state = dict.fromkeys(ACTIONS, 0), dict.fromkeys(STATES, 0)
    for action, count in collections.Counter(map(operator.itemgetter(0), plans)).items():
        plan[action] += count
    for state, count in collections.Counter(map(operator.attrgetter("state"), records)).items():
        by_state[state] += count  # a state outside STATES fails here, as it always did
    return Report(path, name, Rows(records, plans, first, counts, anomalies), raw.events,
                  sorted(raw.corrupt_lines), anomalies, plan, by_state, list(raw.notes))


__all__ = [
    "ACTIONS",
    "ADAPTERS",
    "KINDS",
    "Anomaly",
    "Report",
    "audit",
    "detect",
    "render_text",
    "supported",
]
