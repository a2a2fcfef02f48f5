"""What an operator does around a batch's ledger: its health and its path's checks.

(Taking an item back, from a dead owner or by cancelling it: ``toolkit.runner.reclaim``.)

Health is fail-closed: when the ledger cannot record a state, the runner stops
taking work and leaves a marker beside the ledger (``<ledger>.health``); every
later run refuses to start until ``clear_health`` has proven the ledger
writable again and removed it.
"""

import contextlib
import json
import os
import sqlite3
from pathlib import Path

from toolkit.advice import absolute, toolkit_command
from toolkit.documents import fsync_dir
from toolkit.errors import LedgerBusyError, LedgerError, NotReadyError, StorageError, ToolkitError
from toolkit.ledger import open_ledger, postgres_health
from toolkit.ledger.postgres import postgres_url
from toolkit.storage import FULL_OR_FAILING, LOCK, open_exclusive, take_exclusive


def health_marker(ledger_path) -> Path:
    """``<ledger>.health`` beside the ledger's canonical name: an alias sees the same marker."""
    if postgres_url(ledger_path):
        return Path(f"{ledger_path}.health")
    return Path(f"{os.path.realpath(ledger_path)}.health")


def _marker_reason(ledger_path) -> str | None:
    """Why the health marker beside the ledger says not ready, or None without a marker."""
    marker = health_marker(ledger_path)
    if not marker.exists():
        return None
    try:
        return json.loads(marker.read_text()).get("reason") or "not ready"
    except (OSError, ValueError):
        return "unreadable health marker"


def health(ledger_path, probe: bool = False, view=None) -> dict:
    """``{"ready": bool, "reason": str | None}`` for the ledger at ``ledger_path``.

    ``view(path)`` (the CLI passes ``forensics.private.opened_view``) opens the ledger
    from a private copy, never in place, so nothing is written into it or beside it (no
    schema into an empty file, no migration, no lock, no ``-shm``), and a live batch's
    transactions never wait for it; without it the ledger is opened in place (after
    ``clear_health``'s own write). With ``probe``, the disk the ledger's next write needs
    must also take a small durable write: a temporary file in the ledger's folder, removed.

    Raises:
        ToolkitError: the path is not a ledger (a directory, another file, an unknown suffix).
    """
    if postgres_url(ledger_path):  # a URL has no file beside it: a table in its schema
        return postgres_health.health(ledger_path)
    path = Path(ledger_path)
    require_ledger_shape(path)
    if path.exists():  # first: a file that is no ledger is bad input whatever its marker says
        try:
            damage = _damage(path, view or _open_existing)
        except StorageError as exc:  # the ledger cannot be read
            if not getattr(exc, "about_the_ledger", True):
                raise  # the view's own scratch space (TMPDIR) is full: no verdict on the ledger
            return {"ready": False, "reason": str(exc)}
        if damage is not None:
            return {"ready": False, "reason": damage}
    reason = _marker_reason(ledger_path)
    if reason is not None:
        return {"ready": False, "reason": reason}
    if not path.exists():
        return {"ready": False, "reason": "no ledger at this path"}
    if probe and _read_only_fs(path):
        return {"ready": False, "reason": "cannot be written: read-only file system"}
    if probe:
        try:
            probe_beside(path, "cannot be written")
        except StorageError as exc:
            return {"ready": False, "reason": str(exc)}
    return {"ready": True, "reason": None}


def _damage(path: Path, view) -> str | None:
    """``integrity`` of the ledger as ``view(path)`` opens it, naming ``path`` (not a private
    copy's name); an empty file (0 bytes, or an SQLite file with no schema: a writer killed
    as it created it) is an empty ledger, as ``ledger``, ``review`` and ``audit`` read it.

    Raises:
        ToolkitError: not a ledger of ours (a foreign database or JSONL file).
        StorageError: the ledger cannot be read, or its private copy cannot be written.
    """
    try:
        with view(path) as ledger:
            damage = integrity(ledger, path)
            return None if damage is None else damage.replace(str(ledger.path), str(path))
    except (StorageError, LedgerBusyError):  # the disk's; in use by a live process (exit 1)
        raise
    except LedgerError as exc:
        raise ToolkitError(str(exc)) from exc
    except ToolkitError as exc:  # the private copy failed: its OSError is the cause
        cause = exc.__cause__
        if not isinstance(cause, OSError):
            raise
        if cause.errno in FULL_OR_FAILING:  # a full disk or a file-size limit
            raise StorageError(f"cannot be written: {cause.strerror} (a private copy of "
                               f"{str(path)!r}, to read it without writing into it)") from exc
        raise StorageError(f"cannot be read: {exc}") from exc


def integrity(ledger, path=None) -> str | None:
    """The ledger's own verdict on its file (JSONL corrupt lines), which ``run`` refuses;
    an SQLite ledger's pages that do not read raise ``DamagedLedgerError`` naming ``path``
    (default: the ledger's own)."""
    corruption = getattr(ledger, "corruption", None)
    if corruption is not None:
        return corruption()
    sqlite_pages(ledger, ledger.path if path is None else path)
    return None


def sqlite_pages(ledger, path) -> None:
    """``DamagedLedgerError`` naming ``path`` when an SQLite ledger's pages do not read
    (``PRAGMA quick_check``: a page zeroed that an open, reading only the schema, never
    meets, and a run halted on mid-batch: "run again"). Every page read once: 0.4 s of CPU
    for a 147 MB ledger of 1M rows, a quarter of a run's read of its 200k items."""
    from toolkit.ledger.sqlite import SqliteLedger
    from toolkit.ledger.sqlite_damage import busy_or_damaged, damage_of

    if not isinstance(ledger, SqliteLedger):
        return
    try:
        found = [row[0] for row in ledger._db.execute("PRAGMA quick_check(1)")]
    except sqlite3.Error as exc:
        if not damage_of(exc):
            raise StorageError(f"cannot be read: {exc}") from exc
        found = [str(exc)]
    if found != ["ok"]:  # "*** in database main ***\nPage 4: …": one line, SQLite's words
        raise busy_or_damaged(path, " ".join(found[0].replace("*** in database main ***", "")
                                             .split()))


def pages_at_end(ledger_path) -> None:
    """After a run or its workers, before a word of rest: an SQLite ledger's pages read
    whole from the disk, or ``DamagedLedgerError`` (``sqlite_pages``). Bytes overwritten in
    the file under a live run (by hand, by another program) reach no transition of the
    run's; without this it would end with exit 0 on a file nothing can open. A fresh
    connection: the run's own holds the pages it wrote in its cache. A PostgreSQL or JSONL
    ledger is left alone (a JSONL writer checks its file at each append)."""
    from toolkit.ledger.opening import SQLITE_SUFFIXES

    if postgres_url(ledger_path) or not os.path.isfile(ledger_path) or \
            Path(ledger_path).suffix.lower() not in SQLITE_SUFFIXES:
        return
    with open_ledger(ledger_path) as ledger:  # an SqliteLedger, by its suffix
        sqlite_pages(ledger, ledger_path)


def require_ledger_path(path: Path) -> None:
    """One-line ToolkitError for a path that cannot be a ledger file of ours (for a path
    with no file, or an empty one, only by stat: nothing is created or opened). A
    non-empty file is opened in place (``run`` writes into it next anyway)."""
    if not require_ledger_shape(path):
        return
    if _read_only_fs(path):
        return  # SQLite cannot even open it (its -shm): "not ready", decided by the probe
    try:  # a foreign database or JSONL file: refused without changing it
        _open_existing(path).close()
    except StorageError:
        return  # ours, but the disk fails: that is "not ready", decided by the probe
    except LedgerError as exc:
        raise ToolkitError(str(exc)) from exc


def require_ledger_shape(path: Path) -> bool:
    """What ``require_ledger_path`` refuses by stat and by the first 16 bytes alone, without
    opening the file as a ledger; True when a non-empty file is there to be opened."""
    suffix = path.suffix.lower()
    if suffix not in (".sqlite", ".db", ".sqlite3", ".jsonl"):
        raise ToolkitError(f"{str(path)!r} is not a ledger: use .sqlite, .db, .jsonl or a "
                           "postgresql:// URL")
    from toolkit.runner.inputs import require_regular

    if path.is_dir():
        raise ToolkitError(f"{str(path)!r} is a directory, not a ledger")
    if not path.parent.is_dir():  # a typo in the folder is bad input, not "not ready"
        raise ToolkitError(f"{str(path)!r}: no folder {str(path.parent)!r} to hold a ledger")
    # a FIFO, a device (a symlink to /dev/zero), a dangling link: refused by stat alone,
    # never opened (opening a FIFO blocks; reading /dev/zero never ends)
    require_regular(path, "--ledger")
    _one_name(path)  # a hard-linked ledger: refused as run refuses it, even when empty
    if not path.exists() or path.stat().st_size == 0:
        return False
    if suffix != ".jsonl":
        with open(path, "rb") as handle:
            if handle.read(16) != b"SQLite format 3\x00":  # as SQLite's open words it
                from toolkit.ledger.sqlite_damage import damaged

                raise damaged(path, "file is not a database")
    return True


def _read_only_fs(path: Path) -> bool:
    """The ledger's file system is mounted read-only: a storage state, not bad input."""
    try:
        return bool(os.statvfs(path.parent).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _one_name(path: Path) -> Path:
    """The ledger's one name (``canonical_path``: a symlink alias resolved, so its view's
    lock is the writer's ``<real path>.lock`` and no ``<alias>.lock`` is left behind);
    ToolkitError for a file with a second hard link, which ``run`` refuses."""
    from toolkit.ledger import canonical_path

    try:
        return canonical_path(path)
    except LedgerError as exc:
        raise ToolkitError(str(exc)) from exc


def _open_existing(path: Path):
    if path.suffix.lower() == ".jsonl":
        from toolkit.ledger.jsonl import JsonlLedger

        return JsonlLedger(_one_name(path), view=True)
    return open_ledger(path)


def mark_unhealthy(ledger_path, reason: str) -> bool:
    """Record why the batch stopped; False if even that cannot be written (disk full)."""
    if postgres_url(ledger_path):  # a URL has no file beside it: a table in its schema
        return postgres_health.mark_unhealthy(ledger_path, reason)
    from toolkit.documents import write_atomic

    data = json.dumps({"ready": False, "reason": reason}).encode()
    marker = health_marker(ledger_path)
    try:  # temp file, fsync, rename, fsync of the directory; no temp file left on failure
        write_atomic(data, marker)
        return True
    except OSError:
        pass
    # Syncs fail (an I/O error, not a full disk): a marker in the page cache still stops
    # every later run on this machine, which beats no marker at all.
    tmp = marker.with_name(f".{marker.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, marker)
        return True
    except OSError:
        with contextlib.suppress(OSError):  # a read-only folder refuses the unlink too
            tmp.unlink(missing_ok=True)
        return False


def clear_health(ledger_path) -> dict:
    """Prove the ledger writable (a small durable write), then remove the marker durably.

    Raises:
        ToolkitError: the path is not a ledger.
        StorageError: the ledger still cannot be written (the marker stays).
    """
    if postgres_url(ledger_path):  # a URL has no file beside it: a table in its schema
        return postgres_health.clear_health(ledger_path)
    path = Path(ledger_path)
    require_ledger_path(path)
    marker = health_marker(ledger_path)
    # Under the JSONL writer's lock (when the file is there): no writer starts between
    # the probe and the marker's removal.
    with _writer_excluded(path) as holder:
        if holder is not None:  # our probe proves nothing of another writer's appends
            return {"ready": False, "reason": f"in use by {holder}: its writer holds the lock, "
                    "so --clear cannot prove it writable (the marker stays); run --clear "
                    "again when it ends"}
        if not path.exists():
            if not marker.exists():  # a typo must not create a ledger: nothing to clear
                raise ToolkitError(f"no ledger at {str(path)!r}: nothing to clear")
            # The halted run never created its ledger (its provider's database failed
            # first): nothing was recorded. What must be proven writable is its folder.
            probe_beside(path, "ledger still not writable")
        else:
            if _read_only_fs(path):
                raise StorageError("ledger still not writable: read-only file system")
            try:
                with _open_existing(path) as ledger:
                    # a damaged SQLite ledger raises: exit 2, the marker stays
                    if (damage := integrity(ledger, path)) is not None:
                        return {"ready": False, "reason": damage}  # the marker stays
                    ledger.probe()
            except StorageError as exc:
                raise StorageError(f"ledger still not writable: {exc}") from exc
        if marker.exists():
            marker.unlink()
            fsync_dir(marker.parent)  # the removal is durable too
    if not path.exists():  # cleared; the next run creates the ledger in the proven folder
        return {"ready": True, "reason": None}
    return health(ledger_path)


@contextlib.contextmanager
def _writer_excluded(path: Path):
    """Yield None while we hold a JSONL ledger's writer locks (``<real path>.lock``, then the
    ledger file's own: ``storage.open_exclusive``; taken as the writer takes them: exclusive,
    never waiting), so no writer starts until we are done; else yield who holds one ("live
    process N", or "a live process" when /proc does not say): a writer whose lock file was
    deleted still holds the second. A file not there is held by no one; an SQLite ledger (its
    writers share it): None, nothing taken."""
    if path.suffix.lower() != ".jsonl":
        yield None
        return
    real = os.path.realpath(path)
    held = []  # our descriptors; closing them releases the locks
    try:
        holder = None
        with contextlib.suppress(FileNotFoundError):  # no writer ever opened it
            held.append(os.open(f"{real}{LOCK}", os.O_RDONLY))
            holder = take_exclusive(held[-1])
        if holder is None:
            with contextlib.suppress(OSError):  # no ledger (nobody writes it), or unreadable
                fd, holder = open_exclusive(real, os.O_RDONLY)
                if fd is not None:
                    held.append(fd)
        yield holder
    finally:
        for fd in held:
            os.close(fd)


def probe_beside(path: Path, what: str) -> None:
    """A small durable write (and its removal) in the folder of the ledger ``path``: the
    disk its next write needs, asked without writing into the ledger. 384 bytes, a short
    write retried (a file-size limit then fails it). StorageError naming ``what`` if refused."""
    probe = path.parent / f".{path.name}.probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(b"probe\n" * 64)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)
    except OSError as exc:
        raise StorageError(f"{what}: {exc.strerror or exc}: {path.parent}") from exc


def require_healthy(ledger_path) -> None:
    """Raises ToolkitError when an earlier run failed closed and nobody cleared it.

    Reads the marker only (every run calls this): the probe is ``health``'s.
    """
    if postgres_url(ledger_path):  # a URL has no file beside it: a table in its schema
        return postgres_health.require_healthy(ledger_path)
    reason = _marker_reason(ledger_path)
    if reason is not None:
        raise NotReadyError(f"ledger not ready ({reason}); fix the cause, then run "
                           f"{toolkit_command('health', '--ledger', absolute(ledger_path), '--clear')}")
