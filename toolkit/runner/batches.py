"""Which ledgers have run an inputs folder: a small per-user registry for the CLI ``run``.

A batch is its ledger. A rerun from another working directory with a relative
``--ledger`` names another file: a new, empty ledger that knows nothing was sent,
and a provider that does not dedupe executes every document again. So ``run``
remembers, per inputs folder (its real path), the real paths of the ledgers that
ran it, in ``$XDG_STATE_HOME/resume-toolkit/batches/`` (default
``~/.local/state/resume-toolkit/batches/``), one JSON file per folder; and a run
about to CREATE a ledger for a folder that another ledger has run (a different real
path, still there, holding items) is refused: ``run --new-batch`` starts another
batch deliberately. Only the CLI ``run`` consults it (not the library ``Runner``).
The check and the record are one step under the registry's lock (``claim``), and a
ledger claimed by a run still running counts before it holds an item: of two first runs
at once with two new ledgers, the second is refused.

The registry is a convenience, not state: a file that does not read is warned
about and rewritten, a registry that cannot be written is warned about; neither
stops a run. Each file is rewritten atomically (temp file, fsync, rename) under
an exclusive lock, so two runs registering at once both stay recorded.
"""

import contextlib
import hashlib
import json
import os
import sqlite3
import sys
from pathlib import Path

from toolkit import liveness
from toolkit.advice import shell_words
from toolkit.errors import ToolkitError
from toolkit.storage import exclusive_lock

FILE_SUFFIXES = (".sqlite", ".db", ".sqlite3", ".jsonl")  # file ledgers; a URL is not kept


def registry_folder() -> Path:
    """``$XDG_STATE_HOME/resume-toolkit/batches`` (XDG's default: ``~/.local/state``)."""
    base = os.environ.get("XDG_STATE_HOME") or ""
    if not os.path.isabs(base):  # XDG: a relative value is invalid and ignored
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "resume-toolkit" / "batches"


def entry_file(inputs) -> Path:
    """The registry file of the inputs folder ``inputs``: named by its real path's digest."""
    real = os.path.realpath(inputs)
    return registry_folder() / f"{hashlib.sha256(os.fsencode(real)).hexdigest()[:32]}.json"


def claim(inputs, ledger, refuse: bool = True) -> None:
    """Before a run creates the ledger ``ledger``: refuse it when another ledger has run
    ``inputs`` (``refuse``; ``--new-batch`` passes False), else record it as this run's.

    The check and the record are one step under the registry's lock: two first runs at
    once, each with its own new ledger, would both pass a check made before either had
    recorded (check, then create, then record). The record names this process too
    (``claims``): until its ledger holds an item -- created, then filled by the run --
    another ledger is refused while this process lives; a run that ended with none
    refuses nothing.

    Raises:
        ToolkitError: one line naming that ledger, shell-quoted, and the two ways on.
    """
    if not _is_file_ledger(ledger):
        return
    target, ours = entry_file(inputs), os.path.realpath(ledger)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(target.with_suffix(".lock")):
            entry = _read(target)
            if refuse:
                _refuse_other(inputs, ledger, entry, ours)
            _write(target, inputs, entry, ours, claimant=_me())
    except OSError as exc:  # a registry that cannot be written still refuses what it names
        _unguarded(target, exc)
        if refuse:
            _refuse_other(inputs, ledger, _read(target, quiet=True), ours)


def _refuse_other(inputs, ledger, entry: dict, ours: str) -> None:
    """Refuse ``ledger`` when another ledger of ``entry`` has run ``inputs`` (one holding
    an item, or claimed by a run still running)."""
    for other in entry["ledgers"]:
        if other != ours and (_holds_items(other) or _live_claim(entry, other)):
            raise ToolkitError(
                f"--inputs {shell_words(inputs)} was run with the ledger {shell_words(other)}, "
                f"and {shell_words(ledger)} would be a new, empty one that knows nothing it "
                f"sent: rerun with --ledger {shell_words(other)}, or add --new-batch to start "
                "another batch deliberately")


def remember(inputs, ledger) -> None:
    """Record that ``ledger`` runs ``inputs`` (ledgers no longer there are dropped)."""
    if not _is_file_ledger(ledger):
        return
    target = entry_file(inputs)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(target.with_suffix(".lock")):  # one read-modify-write at a time
            _write(target, inputs, _read(target), os.path.realpath(ledger))
    except OSError as exc:
        _unguarded(target, exc)


def _write(target: Path, inputs, entry: dict, ours: str, claimant=None) -> None:
    """``entry`` with ``ours`` among its ledgers (claimed by ``claimant``, if given), the
    ledgers no longer there and the claims of processes gone dropped; no write when
    nothing changes. Under the registry's lock."""
    # A ledger claimed by a live run stays though its file is not made yet (the claim
    # comes first: ``claim``); one that is gone and claimed by nobody alive is dropped.
    known = [path for path in entry["ledgers"]
             if os.path.exists(path) or _live_claim(entry, path)]
    claims = {path: owner for path, owner in entry["claims"].items()
              if path in known and _alive(owner)}
    if claimant is not None:
        claims[ours] = claimant
    ledgers = sorted(set(known) | {ours})
    if ledgers == entry["ledgers"] and claims == entry["claims"]:
        return  # already recorded, nothing to prune: no write
    from toolkit.documents import write_atomic

    record = {"inputs": os.path.realpath(inputs), "ledgers": ledgers}
    if claims:
        record["claims"] = claims
    write_atomic(json.dumps(record, indent=1).encode(), target)


def _me() -> list:
    """This process as a claim records it: ``[host, pid, start ticks]`` (``liveness``)."""
    return [liveness.host_id(), os.getpid(), liveness.my_start()]


def _alive(owner) -> bool:
    """Is the process a claim names still running? (Another host's: taken as alive.)"""
    try:
        host, pid, started = owner
        return liveness.alive(host, int(pid), started) is not False
    except (TypeError, ValueError):
        return False  # not a claim of ours: ignored, and dropped at the next write


def _live_claim(entry: dict, ledger: str) -> bool:
    """Was ``ledger`` claimed by a run that is still running (its ledger maybe not yet
    holding an item)?"""
    owner = entry["claims"].get(ledger)
    return owner is not None and _alive(owner)


def _unguarded(target: Path, exc: OSError) -> None:
    _warn(f"the batch registry {shell_words(target)} cannot be written "
          f"({exc.strerror or exc}): a rerun from another folder is not guarded")


def _read(target: Path, quiet: bool = False) -> dict:
    """The entry ``target`` holds: ``ledgers`` (real paths) and ``claims`` (ledger -> its
    claimant); empty when there is none, and when it does not read (damaged: warned
    about unless ``quiet``; the next write rewrites it)."""
    try:
        data = json.loads(target.read_bytes())
        ledgers, claims = data["ledgers"], data.get("claims", {})
        if not isinstance(ledgers, list) or not all(isinstance(p, str) for p in ledgers):
            raise TypeError("ledgers is not a list of paths")
        if not isinstance(claims, dict):
            raise TypeError("claims is not an object")
        return {"ledgers": ledgers, "claims": claims}
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        if not quiet:
            _warn(f"the batch registry {shell_words(target)} is damaged ({exc}): "
                  "ignored, and rewritten by this run")
    return {"ledgers": [], "claims": {}}


def _holds_items(ledger: str) -> bool:
    """True when the ledger file at ``ledger`` is there and holds an item (read only).

    JSONL: a line after its header. SQLite: a WAL with bytes in it (a run's commits
    not yet checkpointed), else a row in ``items`` read with ``immutable=1``: no lock,
    no ``-wal`` or ``-shm`` created beside another batch's ledger (a refused run leaves
    every folder as it found it). A file that cannot be read so is taken as holding
    items (the refusal names it, and --new-batch is the way past it)."""
    try:
        if os.stat(ledger).st_size == 0:
            return False
    except OSError:
        return False
    if ledger.lower().endswith(".jsonl"):
        with contextlib.suppress(OSError), open(ledger, "rb") as handle:
            lines = [line for line in handle.read(1 << 16).splitlines() if line.strip()]
            return len(lines) > 1
        return True
    with contextlib.suppress(OSError):
        if os.stat(f"{ledger}-wal").st_size > 0:
            return True
    try:
        connection = sqlite3.connect(f"{Path(ledger).as_uri()}?immutable=1", uri=True)
        try:
            return connection.execute("SELECT EXISTS(SELECT 1 FROM items)").fetchone()[0] == 1
        finally:
            connection.close()
    except sqlite3.Error:
        return True


def _is_file_ledger(ledger) -> bool:
    return "://" not in str(ledger) and str(ledger).lower().endswith(FILE_SUFFIXES)


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr)
