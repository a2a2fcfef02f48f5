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

The registry is a convenience, not state: a file that does not read is warned
about and rewritten, a registry that cannot be written is warned about; neither
stops a run. Each file is rewritten atomically (temp file, fsync, rename) under
an exclusive lock, so two runs registering at once both stay recorded.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import sqlite3
import sys
from pathlib import Path

from toolkit.errors import ToolkitError

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


def refuse_other_batch(inputs, ledger) -> None:
    """Before a run creates the ledger ``ledger``: refuse it when another ledger has run
    ``inputs`` (a different real path, still there, holding items).

    Raises:
        ToolkitError: one line naming that ledger, shell-quoted, and the two ways on.
    """
    if not _is_file_ledger(ledger):
        return
    ours = os.path.realpath(ledger)
    for other in _read(entry_file(inputs), quiet=True):  # damage: said by ``remember``
        if other != ours and _holds_items(other):
            raise ToolkitError(
                f"--inputs {shlex.quote(str(inputs))} was run with the ledger "
                f"{shlex.quote(other)}, and {shlex.quote(str(ledger))} would be a new, empty "
                f"one that knows nothing it sent: rerun with --ledger {shlex.quote(other)}, "
                "or add --new-batch to start another batch deliberately")


def remember(inputs, ledger) -> None:
    """Record that ``ledger`` runs ``inputs`` (ledgers no longer there are dropped)."""
    if not _is_file_ledger(ledger):
        return
    target = entry_file(inputs)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _locked(target):  # two runs registering at once: one read-modify-write each
            recorded = _read(target)
            known = [path for path in recorded if os.path.exists(path)]
            ours = os.path.realpath(ledger)
            if ours in known and known == recorded:
                return  # already recorded, nothing to prune: no write
            entry = {"inputs": os.path.realpath(inputs),
                     "ledgers": sorted(set(known) | {ours})}
            from toolkit.documents import write_atomic

            write_atomic(json.dumps(entry, indent=1).encode(), target)
    except OSError as exc:
        _warn(f"the batch registry {shlex.quote(str(target))} cannot be written "
              f"({exc.strerror or exc}): a rerun from another folder is not guarded")


def _read(target: Path, quiet: bool = False) -> list[str]:
    """The ledgers ``target`` names; [] when there is none, and when it does not read
    (damaged: warned about unless ``quiet``; the next ``remember`` rewrites it)."""
    try:
        data = json.loads(target.read_bytes())
        ledgers = data["ledgers"]
        if not isinstance(ledgers, list) or not all(isinstance(p, str) for p in ledgers):
            raise TypeError("ledgers is not a list of paths")
        return ledgers
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError, KeyError) as exc:
        if not quiet:
            _warn(f"the batch registry {shlex.quote(str(target))} is damaged ({exc}): "
                  "ignored, and rewritten by this run")
        return []


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


@contextlib.contextmanager
def _locked(target: Path):
    with open(target.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _is_file_ledger(ledger) -> bool:
    return "://" not in str(ledger) and str(ledger).lower().endswith(FILE_SUFFIXES)


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr)
