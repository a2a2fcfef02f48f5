"""Line 1 of a JSONL ledger: format, version, and what a compaction or a salvage wrote.

``{"format": FORMAT, "version": 1}``, and after a compaction or a salvage also
``"snapshots": {"count": n, "seq": s}`` (the ``n`` snapshot lines that follow, all at seq
``s``: ``gaps.snapshot_damage`` holds the file to it) and, on a salvaged ledger,
``"salvaged": {"from": name, "lost": what, "earlier": [marks of earlier salvages]}``.
Readers that check only format and version (older toolkits, the audit's format check)
read any of them as a version-1 header. A header without ``snapshots`` (or with
``"snapshots": null``) counts none: snapshot lines below it are damage (a plain header put
over a salvage's lines drops its mark); a ledger compacted before the count existed is
salvaged once (``ledger --salvage``), as a headerless compacted one is.
"""

import json
import os
from pathlib import Path

from toolkit.advice import absolute, salvaged_name, toolkit_command

# Line 1 of every ledger this toolkit writes; a file without it whose lines are all
# toolkit events (every ledger written before the header existed) is upgraded by the
# next writer, in one atomic rewrite. A newer version is refused.
FORMAT, VERSION = "resume-toolkit-ledger-jsonl", 1
HEADER_LINE = json.dumps({"format": FORMAT, "version": VERSION}, sort_keys=True).encode() + b"\n"
SALVAGED = "salvaged"  # a salvaged ledger's mark (``salvage.py``), kept by compaction
SNAPSHOTS = "snapshots"  # {"count", "seq"} of the snapshot lines below the header
TORN = "torn"  # [{"key", "after"}] of torn tails cut not yet spent (``torn.py``)


def header_version(raw: bytes) -> int | None:
    """The version a header line names, or None when ``raw`` is not a header line."""
    header = read_header(raw)
    return None if header is None else header["version"]


def read_header(raw: bytes) -> dict | None:
    """The header line as an object (format, version, a salvage mark), or None."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if isinstance(obj, dict) and obj.get("format") == FORMAT and type(obj.get("version")) is int:
        return obj
    return None


def header_line(salvaged: dict | None = None, snapshots: tuple[int, int] | None = None,
                torn: dict | None = None) -> bytes:
    """Line 1 of a ledger: ``HEADER_LINE``, or with the mark of a salvage, the
    ``(count, seq)`` of the snapshot lines that follow it and the cuts not yet spent
    (``torn``: ``{key: after}``, ``torn.py``)."""
    if salvaged is None and snapshots is None and not torn:
        return HEADER_LINE
    header = {"format": FORMAT, "version": VERSION}
    if salvaged is not None:
        header[SALVAGED] = salvaged
    if snapshots is not None:
        header[SNAPSHOTS] = {"count": snapshots[0], "seq": snapshots[1]}
    if torn:
        header[TORN] = torn_words(torn)
    return json.dumps(header, sort_keys=True).encode() + b"\n"


def torn_words(marks: dict) -> list:
    """The header's form of the marks ``{key: after}``: sorted, so the same marks are the
    same bytes."""
    return [{"after": after, "key": key} for key, after in sorted(marks.items())]


def header_problem(where: str, header: dict | None) -> str | None:
    """The one check of line 1's version, or None when this toolkit reads it: a newer one
    (``newer_version``) or one below 1 (no toolkit wrote it: line 1 edited). ``run``,
    ``ledger`` and salvage refuse it in these words; the audit reports them."""
    version = None if header is None else header["version"]
    if version is None or 1 <= version <= VERSION:
        return None
    if version > VERSION:
        return newer_version(where, version)
    return (f"{where!r} names format version {version} in line 1, and versions start at 1: "
            f"line 1 was edited; set \"version\": {VERSION} in line 1 and run "
            f"{toolkit_command('audit', absolute(where))}, then "
            f"{toolkit_command('ledger', absolute(where), '--salvage', salvaged_name(where))}")


# A file holding only the start of a header line. No writer of this toolkit leaves one (the
# header is written whole: temp file, fsync, rename), so the file was cut by hand inside
# line 1 and its events, if it had any, went with it: damage (salvage marks the new ledger,
# as for a ledger cut to its header), never a new ledger.
CUT_HEADER = ("holds only the start of a header line (no writer leaves one: the file was cut "
              "inside line 1, and its events, if it had any, are lost)")


def cut_header(data: bytes) -> bool:
    """Is ``data`` (a whole file) a header line cut short (``CUT_HEADER``)?"""
    return 0 < len(data) < len(HEADER_LINE) and HEADER_LINE.startswith(data)


def newer_version(where: str, version: int) -> str:
    """The one refusal of a header naming a version above ours (``run``, ``ledger``,
    ``--salvage``; the audit notes it): what to do, whichever way it came to be."""
    return (f"{where!r} is a JSONL ledger of format version {version}; this toolkit reads "
            f"version {VERSION}: open it with the newer toolkit that wrote it; if none did "
            f"(line 1 edited), set \"version\": {VERSION} in line 1 and run "
            f"{toolkit_command('audit', absolute(where))}, then "
            f"{toolkit_command('ledger', absolute(where), '--salvage', salvaged_name(where))}")


def no_history(ledger_path) -> bool:
    """True for a ledger file that holds no event line: missing, 0 bytes, (JSONL) its
    header alone, blank lines aside, of our version, or (SQLite) its tables with no row,
    not marked as salvaged -- whatever made it (a run on no inputs, ``head -1 L > L``,
    ``delete from events``), nothing in it shows what the witness saw. A marked one
    already looks everything up; a newer version, a damaged file, the open's to refuse."""
    try:
        if os.stat(ledger_path).st_size == 0:
            return True
        if Path(ledger_path).suffix.lower() != ".jsonl":
            return _sqlite_rowless(ledger_path)
        with open(ledger_path, "rb") as handle:
            lines = [line for line in handle.read(1 << 16).split(b"\n") if line.strip()]
    except FileNotFoundError:
        return True
    except OSError:
        return False  # there, but not readable: the open says why
    header = read_header(lines[0]) if len(lines) == 1 else None
    return header is not None and header["version"] == VERSION and not header.get(SALVAGED)


# An SQLite ledger with no history: no event, no item, no salvage mark (its schema alone).
ROWLESS = ("SELECT NOT EXISTS (SELECT 1 FROM events) AND NOT EXISTS (SELECT 1 FROM items) "
           "AND NOT EXISTS (SELECT 1 FROM meta WHERE name = ?)")


def _sqlite_rowless(ledger_path) -> bool:
    """An SQLite ledger whose items, events and meta hold no row but the schema's own (no
    salvage mark): read-only; anything else -- not SQLite, damaged, busy -- is False.

    Raises:
        LedgerBusyError: its -shm or -wal was deleted under a live process (as its open)."""
    import sqlite3
    import urllib.parse

    from toolkit.storage import refuse_deleted_wal_shm

    # mode=ro would rebuild a deleted -shm too: LedgerBusyError, as the ledger's open
    refuse_deleted_wal_shm(ledger_path, f"SQLite ledger {str(ledger_path)!r}")
    uri = f"file:{urllib.parse.quote(os.path.abspath(ledger_path))}?mode=ro"
    try:
        db = sqlite3.connect(uri, uri=True, timeout=1.0)
        try:
            return bool(db.execute(ROWLESS, (SALVAGED,)).fetchone()[0])
        finally:
            db.close()
    except sqlite3.Error:
        return False
