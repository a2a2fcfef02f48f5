"""A batch's roots: paths in the ledger are relative to them, never to the working directory.

An item's ``artifact_path`` is relative to the outputs root (``doc.1a2b3c4d.pdf``,
``.checkpoints/<key>.0002.pdf``); the fake provider's uploads and artifacts are
relative to its jobs folder. The roots themselves are given on the command line
and recorded once, beside a file ledger, in ``<ledger>.roots.json``, each root
relative to the ledger's folder: the batch folder moved as a whole (``mv batch
batch2``) still resolves. A PostgreSQL ledger records none: each machine gives
its own roots on its command line, only the relative paths are shared.

A rerun with another ``--out`` finds an artifact missing there, takes it from
the recorded outputs root, verifies size and SHA-256, and only then gives it
its name in the new folder (``materialize``): no provider call, no new state.
"""

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from toolkit import documents, liveness
from toolkit.storage import (LOCK, ROOTS as SUFFIX, exclusive_lock,  # noqa: F401 (re-exported)
                             recorded, roots_file)


def damaged(ledger_path) -> str | None:
    """Why the roots file beside a file ledger is there and does not read as one (garbage,
    empty, a directory, a dangling link, not an object of folder names); None when it is
    absent or reads whole. ``recorded`` reads such a file as no roots at all; the witness
    must not (it names the folders whose witness saw the ledger)."""
    marker = roots_file(ledger_path)
    if marker is None or not os.path.lexists(marker):
        return None
    try:
        raw = marker.read_bytes()
    except OSError as exc:
        return "a directory in its place" if exc.errno == errno.EISDIR else \
            f"unreadable: {exc.strerror}"
    try:
        saved = json.loads(raw)
    except ValueError:
        return "an empty file" if not raw.strip() else "not JSON"
    if not isinstance(saved, dict) or not all(isinstance(value, str) for value in saved.values()):
        return "not an object of folder names"
    return None


def record(ledger_path, replace: bool = False, **roots) -> None:
    """Record the roots once; ``replace=True`` rewrites the ones given (and keeps the others).

    The rule for ``out``: it names the latest ``--out`` that holds every verified
    artifact. A run records its ``--out`` the first time; a run with another
    ``--out`` replaces it only at its end, once every ``done`` item's artifact is
    verified there (``Pipeline._record_out``), so the roots never name a folder
    that lacks one, and the old folder may then be deleted.
    """
    marker = roots_file(ledger_path)
    if marker is None or (marker.exists() and not replace) or not Path(ledger_path).is_file():
        return  # a URL, an in-memory ledger (":memory:"): no file to record beside
    base = os.path.abspath(Path(ledger_path).parent)
    saved = {name: os.path.relpath(path, base) for name, path in recorded(ledger_path).items()}
    saved.update({name: os.path.relpath(os.path.abspath(path), base)
                  for name, path in roots.items() if path is not None})
    try:
        # Its temp names this process: one left by a kill is removed by the next run
        # (``liveness.remove_dead_temps``, at every run's start), a live writer's kept.
        documents.write_atomic(json.dumps(saved, sort_keys=True).encode(), marker,
                               prefix=liveness.owned_temp_prefix(marker))
    except OSError:
        pass  # a convenience, not state: without it a new --out fetches instead of copying


def escaped_name(raw: bytes) -> str:
    """A file name's bytes as text that always encodes as UTF-8, one to one: a backslash
    doubled, each byte that is not UTF-8 as ``\\xNN`` (``b'bad\\xff.pdf'`` ->
    ``bad\\xff.pdf``, a literal ``bad\\xff.pdf`` -> ``bad\\\\xff.pdf``). ``real_name``
    undoes it."""
    return raw.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")


def shown(text: str) -> str:
    """``text`` (a stored name, a key, a detail) as one printable line, for people: each
    character that does not print escaped -- ``\\n``, ``\\t``, ``\\x01`` below 0x80,
    ``\\u0085`` (``\\udcff`` a lone surrogate) above -- everything else as it is, a backslash
    included. Never escaped twice: a stored name has each literal backslash doubled already
    (``escaped_name``), so shown ``new\\nline.pdf`` is a newline, ``lit\\\\nname.pdf`` a
    backslash and an ``n``, ``bad\\xff.pdf`` a byte that is not UTF-8 (``\\xNN`` is never a
    character below 0x80 here: those print, or are escaped the same way only when they do
    not, and UTF-8 never fails on them)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else
                   repr(ch)[1:-1] if ord(ch) < 0x80 else
                   f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}"
                   for ch in text)


def quoted(text: str) -> str:
    """``text`` in quotes, as a message names a stored name: ``shown``, in the quotes
    ``repr`` would choose (``repr`` itself would double each backslash again). A value
    that is no text (a foreign ledger's number) is its ``repr``."""
    if not isinstance(text, str):
        return repr(text)
    text = shown(text)
    if "'" in text and '"' not in text:
        return f'"{text}"'
    return "'" + text.replace("'", "\\'") + "'"


_ESCAPE = re.compile(r"\\(\\|x[0-9a-fA-F]{2})")


def real_name(stored: str) -> str:
    """The OS name (``str``, surrogate-escaped) that ``escaped_name`` made ``stored`` from.
    A backslash followed by anything else stays as it is (a name stored before backslashes
    were doubled)."""
    if "\\" not in stored:
        return stored
    parts, at = [], 0
    for match in _ESCAPE.finditer(stored):
        parts.append(stored[at:match.start()].encode("utf-8", "surrogateescape"))
        code = match.group(1)
        parts.append(b"\\" if code == "\\" else bytes([int(code[1:], 16)]))
        at = match.end()
    parts.append(stored[at:].encode("utf-8", "surrogateescape"))
    return os.fsdecode(b"".join(parts))


def locked(ledger_path):
    """Hold the exclusive lock of a file ledger's roots (``flock`` on ``<roots>.lock``).

    Runs with different ``--out`` on one ledger decide under it whether their ``--out``
    becomes the recorded root (check, then replace): without it one run could verify
    its folder, another replace the root, and the first then overwrite it with a folder
    that lacks the other's artifacts. The lock dies with its process (kill -9 included);
    in a read-only folder nothing can be recorded, and nothing is locked.
    """
    marker = roots_file(ledger_path)
    if marker is None or not Path(ledger_path).is_file():
        return contextlib.nullcontext()
    return exclusive_lock(f"{marker}{LOCK}", best_effort=True)


NAME_MAX = 255  # bytes in one file name, when the folder cannot tell (os.pathconf)


def name_max(folder) -> int:
    """The longest file name ``folder`` (or its nearest existing parent) takes, in bytes."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return NAME_MAX


def output_path(folder, stem: str, key: str) -> Path:
    """The one rule for an output's name: ``<stem>.<key8>.pdf`` in ``folder``.

    The stem is cut (in bytes, on a UTF-8 character boundary) so that the whole
    name fits the folder's NAME_MAX: a 250-byte input name still gets an output,
    and the key suffix keeps two cut names of different documents apart.
    """
    tail = f".{key[:8]}.pdf"
    room = name_max(folder) - len(tail.encode())
    raw = stem.encode("utf-8", "surrogateescape")
    if len(raw) > room:
        stem = raw[:room].decode("utf-8", "ignore")  # drops a character cut in half
    return Path(folder) / f"{stem}{tail}"


def relative(path, root) -> str:
    """``path`` as stored: relative to ``root`` (the outputs root, the jobs folder)."""
    return os.path.relpath(os.path.abspath(path), os.path.abspath(root))


def resolve(root, stored) -> Path:
    """The file a stored path names under ``root``; an absolute stored path is itself.

    A ledger written before roots stored paths relative to its working
    directory: when nothing is under ``root`` but such a file exists, it is used.
    """
    path = os.path.join(root, stored)  # os.path: every resume calls this once per done item
    if not os.path.isabs(stored) and not os.path.exists(path) and os.path.isfile(stored):
        return Path(stored)
    return Path(path)


def materialize(stored, size, sha256, target: Path, roots) -> bool:
    """Give ``target`` the verified bytes of ``stored`` found under one of ``roots``.

    Copied to a temp file beside ``target``, verified, fsynced, renamed: a half
    copy or another file's bytes never get the name. False when no root holds it.
    """
    for root in roots:
        source = Path(root) / stored
        if source.resolve() == target.resolve() or not documents.verify(source, size, sha256):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, part = tempfile.mkstemp(prefix=documents.temp_prefix(target), suffix=".part",
                                    dir=target.parent)
        try:  # a private temp name: two workers materializing the same file never mix bytes
            with os.fdopen(fd, "wb") as out, open(source, "rb") as data:
                shutil.copyfileobj(data, out)
                out.flush()
                os.fsync(out.fileno())
            if not documents.verify(part, size, sha256):  # changed while we copied
                continue
            os.chmod(part, os.stat(source).st_mode & 0o777)
            os.replace(part, target)
        finally:
            Path(part).unlink(missing_ok=True)  # gone already after the rename
        documents.fsync_dir(target.parent)
        return True
    return False


def artifact_file(ledger_path, stored) -> Path:
    """The file an item's stored ``artifact_path`` names, under the ledger's recorded root."""
    out = recorded(ledger_path).get("out")
    return Path(stored) if out is None else resolve(out, stored)
