"""Checks every format shares: artifacts, inputs (``forensics.inputs``), stuck items, and
the plan.

Paths named by a ledger are untrusted. An artifact path is resolved (symlinks included)
and must stay inside the folder the user named; one that escapes is reported and never
opened (an input name is looked for as ``run`` finds inputs: ``forensics.inputs``). Only
regular files are opened (never a FIFO or a device), and only when ``--artifacts`` /
``--inputs`` name the folder: without it the audit opens nothing but the ledger.
"""

import datetime
import hashlib
import os
import stat

from toolkit import roots
from toolkit.forensics.model import Anomaly, Worded

_CHUNK = 1 << 20


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def unnamable(recorded: str) -> str | None:
    """Why no file can have the name ``recorded`` (a NUL byte; a lone surrogate such as a
    JSON "\\ud800", which no file system encoding holds), else None: never opened."""
    if "\0" in recorded:
        return "the path contains a NUL byte"
    try:
        os.fsencode(recorded)  # a surrogate-escaped byte (\udcff: 0xff) is one, as run reads it
    except UnicodeEncodeError as exc:
        return (f"the path holds {recorded[exc.start:exc.end]!r}, a lone surrogate no file "
                "name can hold")
    return None


def locate(root: str | None, recorded: str) -> tuple[str | None, str | None]:
    """(real path to open, None) or (None, why it escapes ``root``).

    Without a root only the lexical check is possible: a relative path that
    climbs out with ``..``; nothing is resolved and nothing will be opened.
    """
    why = unnamable(recorded)
    if why:
        return None, why
    if root is None:
        if ".." in recorded and not os.path.isabs(recorded) \
                and os.path.normpath(recorded).split(os.sep)[0] == "..":
            return None, f"{roots.quoted(recorded)} climbs out of the artifacts folder"
        return None, None
    base, real_root = os.path.abspath(root), os.path.realpath(root)
    full = os.path.normpath(os.path.join(base, recorded))  # an absolute recorded path wins
    if not (inside(full, base) or inside(full, real_root)):
        return None, f"{roots.quoted(recorded)} is outside {root!r}"
    real = os.path.realpath(full)
    if not inside(real, real_root):
        # Named relative to the folder, never absolute: a report (or a committed notebook)
        # must not carry the auditing machine's own directories.
        return None, (f"{roots.quoted(recorded)} resolves to {os.path.relpath(real, real_root)!r} "
                      f"from {root!r}, outside it")
    return real, None


def file_digest(path: str, follow: bool = False) -> tuple[int | None, str | None, str | None]:
    """(size, sha256, None) of a regular file, or (None, None, why it cannot be read).
    ``follow``: a symlink at ``path`` is followed (an input entry: run reads it so)."""
    nofollow = 0 if follow else getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | nofollow)
    except OSError as exc:
        return None, None, exc.strerror or str(exc)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, None, "not a regular file"
        digest = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
        return info.st_size, digest.hexdigest(), None
    except OSError as exc:
        return None, None, exc.strerror or str(exc)
    finally:
        os.close(fd)


OUTPUT_FIELDS = ("key", "name", "stem", "relstem")


def output_path(item, rule: str) -> str:
    """The artifact name ``rule`` gives ``item`` (``'{stem}.pdf'``): {key}; {name}, {stem}
    and {relstem} of its source (the key when none is recorded): the file name, without its
    suffix, and the recorded path without its suffix."""
    source = item.source if type(item.source) is str and item.source else str(item.key)
    name = os.path.basename(source)
    return rule.format(key=item.key, name=name, stem=os.path.splitext(name)[0],
                       relstem=os.path.splitext(source)[0])


def shared_outputs(items, root: str, rule: str) -> list[Anomaly]:
    """One ``shared_output`` per done item whose output ``rule`` finds in a file that the
    rule also gives another done item (``jan/report.pdf`` and ``feb/report.pdf`` by
    ``'{stem}.pdf'``): one file cannot be the output of two documents, so whichever
    wrote it last, the other's is not there. Files are told apart as the file system
    tells them, by device and inode when the file exists (so ``Report.pdf`` and
    ``report.pdf`` are one file on a case-insensitive file system, two on this one, and a
    hard link is the file it links), by resolved path when it does not (then it is
    ``artifact_missing`` too). Items that record their own artifact path are not named by
    the rule and not compared."""
    holders: dict = {}
    for item in items:
        if item.state != "done" or (type(item.artifact_path) is str and item.artifact_path):
            continue
        path = output_path(item, rule)
        real, _ = locate(root, path)
        if real is None:  # escapes the folder or no name: its own finding says so
            continue
        try:
            info = os.stat(real)
            identity = (info.st_dev, info.st_ino)
        except OSError:
            identity = real
        holders.setdefault(identity, []).append((item.key, path))
    found = []
    for named in holders.values():
        for key, path in named if len(named) > 1 else ():
            others = [str(other) for other, _ in named if other != key]
            listed = ", ".join(map(repr, others[:3])) + (" …" if len(others) > 3 else "")
            found.append(Anomaly(key, "shared_output", (
                f"{roots.quoted(path)} is also the output --output-name gives {len(others)} other "
                f"item(s) ({listed}): one file cannot be the output of {len(named)} "
                "documents; a person decides whose it is")))
    return found


def check_whole_pdf(key, path: str, real: str) -> list[Anomaly]:
    """No recorded digest to compare: the file itself must be a whole, readable PDF
    (the documents module's preflight: header, tail, MuPDF's open and every page)."""
    from toolkit.documents.preflight import preflight

    verdict = preflight(real)
    if verdict.ok:
        return []
    return [Anomaly(key, "artifact_missing", f"{roots.quoted(path)} is not a whole, readable PDF: "
                    f"{verdict.reason}")]


NOT_CHECKED = "recorded but not checked"


# The words of a done item's artifact not looked at, worded when read (``model.Worded``): a
# batch copied without its outputs has one per done item.
def _no_folder(path) -> str:
    return f"{roots.quoted(path)} {NOT_CHECKED}: no artifacts folder (give --artifacts to " \
        "verify its size and SHA-256)"


def _no_root(path) -> str:
    return (f"{roots.quoted(path)} {NOT_CHECKED}: no artifacts folder (no outputs root recorded in "
            f"<ledger>{roots.SUFFIX}; give --artifacts to verify its size and SHA-256)")


# The words that say NOT_CHECKED of a path (``Worded``): no need to word them to know it.
UNCHECKED_WORDS = frozenset({_no_folder, _no_root})


def check_artifact(item, root: str | None, output_name: str | None = None,
                   lookup: bool = True) -> list[Anomaly]:
    """``output_name`` (a rule for ``output_path``) turns on the check by content: an item
    whose format records no artifact path (or no SHA-256) is verified as a whole PDF.
    ``lookup`` False (a format without lookup) and no ``root``: a recorded artifact cannot
    be looked at, so it is not verified (``done_without_artifact``: ``verify``, never
    ``skip``)."""
    key, path = item.key, item.artifact_path
    size, sha = item.artifact_size, item.artifact_sha256
    if (type(path) is not str or not path) and (output_name is None or root is None):
        return [Anomaly(key, "done_without_artifact", "no artifact path recorded")]
    if root is None and not lookup:
        return [Worded(key, "done_without_artifact", _no_folder, path)]
    if type(path) is not str or not path:
        path = output_path(item, output_name)
    real, unsafe = locate(root, path)
    if unsafe:
        return [Anomaly(key, "unsafe_artifact_path", f"{unsafe}; not opened")]
    if root is None and item.state == "done":
        # Nothing to look in (no --artifacts, no <ledger>.roots.json beside a copied ledger):
        # the artifact is not verified, so never "skip" (done and verified).
        return [Worded(key, "done_without_artifact", _no_root, path)]
    found = []
    if (type(sha) is not str or not sha) and output_name is not None and real is not None:
        if not os.path.isfile(real):
            return [Anomaly(key, "artifact_missing", f"{roots.quoted(path)}: no such file")]
        return check_whole_pdf(key, path, real)
    if type(sha) is not str or not sha:
        found.append(Anomaly(key, "done_without_artifact",
                             f"{roots.quoted(path)} has no SHA-256 recorded: nothing to "
                             "verify against"))
    if real is None:
        return found
    actual_size, actual_sha, problem = file_digest(real)
    if problem:
        return found + [Anomaly(key, "artifact_missing", f"{roots.quoted(path)}: {problem}")]
    if type(size) is int and size != actual_size:
        found.append(Anomaly(key, "artifact_mismatch",
                             f"{roots.quoted(path)}: size {actual_size}, recorded {size}"))
    elif type(sha) is str and sha and sha.lower() != actual_sha:
        found.append(Anomaly(key, "artifact_mismatch",
                             f"{roots.quoted(path)}: sha256 {actual_sha[:12]}…, "
                             f"recorded {sha[:12]}…"))
    return found


def _when(value) -> str:
    """A recorded time for people: ISO UTC when it is a plausible epoch, else as given."""
    if type(value) in (int, float) and 0 < value < 1e11:
        stamp = datetime.datetime.fromtimestamp(value, datetime.UTC)
        return stamp.isoformat(timespec="seconds").replace("+00:00", "Z")
    return str(value)


def check_stuck(item, now: float) -> list[Anomaly]:
    expires = item.lease_expires
    if type(expires) in (int, float) and expires > now:
        return []  # a live lease: someone is working on it
    facts = [f"recorded as {item.raw_state!r}" if item.raw_state != "unknown" else "",
             f"since {_when(item.updated)}" if item.updated is not None else "",
             f"attempt {item.attempt}" if item.attempt is not None else ""]
    said = ", ".join(fact for fact in facts if fact)
    return [Anomaly(item.key, "stuck_unknown", (f"{said}: " if said else "") +
                    "no reply recorded and no live lease; look up its key before anything")]


def check_items(items: dict, artifacts: str | None, inputs: str | None, now: float,
                output_name: str | None = None, lookup: bool = True):
    # inputs imports this module's file helpers: imported here, when both are loaded
    from toolkit.forensics.inputs import Folder, unchecked

    if artifacts is None and inputs is None:
        return _unlooked(items.values(), now, lookup)
    found = []
    folder = Folder(inputs, items, lookup) if inputs is not None else None
    for item in items.values():
        state = item.state
        if state == "done":
            found += check_artifact(item, artifacts, output_name, lookup)
        elif state == "partial":  # a partial item's artifact is its checkpoint
            found += check_artifact(item, artifacts)
        elif state == "unknown":
            found += check_stuck(item, now)
        if folder is not None:
            found += folder.check(item)
    if folder is not None:
        found += unchecked(items, lookup)
    if output_name is not None and artifacts is not None:
        found += shared_outputs(items.values(), artifacts, output_name)
    return found


def _unlooked(items, now: float, lookup: bool) -> list:
    """``check_items`` with no folder to look in (a ledger audited without its outputs and
    inputs). A done item whose artifact path cannot escape (text, no NUL, no "..") is
    then always the one ``Worded`` finding ``check_artifact`` gives, made for all of them
    at once (``Worded.many``); every other item is checked as ``check_items`` does. The
    findings come in another order than item by item: ``forensics._ordered`` sorts them
    (each item has at most one of a kind here)."""
    found, keys, paths = [], [], []
    for item in items:
        state = item.state
        if state == "done":
            path = item.artifact_path
            if path.__class__ is str and path and "\0" not in path and ".." not in path:
                keys.append(item.key)
                paths.append(path)
            else:
                found += check_artifact(item, None, None, lookup)
        elif state == "partial":  # a partial item's artifact is its checkpoint
            found += check_artifact(item, None)
        elif state == "unknown":
            found += check_stuck(item, now)
    return found + Worded.many(keys, "done_without_artifact", _no_root if lookup else _no_folder,
                               paths)


# Findings that leave an item undecidable for automation, whatever its state.
UNDECIDABLE = {
    "duplicate_key": "conflicting records",
    "illegal_transition": "its history breaks the transition table",
    "missing_history": "part of its history is lost",
    "history_mismatch": "its row disagrees with its events",
    "unsafe_artifact_path": "its artifact path escapes the artifacts folder",
    "shared_output": "--output-name gives its output file to other items too",
    "unknown_state": "its state is no word of its format",
}
ARTIFACT_DAMAGE = frozenset({"done_without_artifact", "artifact_missing", "artifact_mismatch"})
INPUT_CHANGED = {"stale_input": "the input changed since it was recorded",
                 "unsafe_input_path": "its input path escapes the inputs folder"}
# In a stale_input detail when another item of the ledger holds the input's new content (an
# item already there, or a later run took it up): a done item is then history, its artifact
# standing on its own.
SUPERSEDED = "its new content is item"
# A missing input blocks only what would be sent again: pending, partial, a transient failure,
# and unknown or submitted (a lookup that finds nothing leads to a submit). A done item's
# artifact stands on its own (skip when verified; a re-fetch by lookup reads no input);
# cancelled, needs_review and the other failures keep their own plan.
INPUT_MISSING = "its input cannot be read in the inputs folder (removed, renamed or unreadable)"


# Our formats: the provider's job is found again by the item's idempotency key (a lookup).
# Every other format has no lookup: re-fetching is impossible, running again executes twice.
LOOKUP_FORMATS = frozenset({"toolkit-jsonl", "toolkit-sqlite", "toolkit-postgres"})
VERIFY_WHY = ("done, but its output was not verified (no artifact recorded, or no artifacts "
              "folder given): see that it exists and is a whole PDF, or audit again with "
              "--artifacts (and --output-name)")


def plan_item(item, kinds, lookup: bool = True) -> tuple[str, str]:
    """(action, why) for one item from its state and the kinds found for it.

    ``kinds``: a set, or a {kind: detail} mapping; given a detail, a ``missing_history``
    why names its evidence (the damaged line), so a person sees which line to look at.

    ``lookup``: the format's jobs can be looked up (``LOOKUP_FORMATS``); without it a
    done whose artifact is unrecorded is ``verify`` and one found missing or damaged is
    ``review`` (a person decides: there is nothing to re-fetch from).
    With no findings the answer depends on ``state`` and ``failure`` alone
    (the report relies on that to plan a million items quickly).
    """
    state = item.state
    details = kinds if isinstance(kinds, dict) else {}
    kinds = kinds.keys() if isinstance(kinds, dict) else kinds
    blocking = [f"{why}: {details[kind]}" if kind == "missing_history" and details.get(kind)
                else why for kind, why in UNDECIDABLE.items() if kind in kinds]
    if blocking:
        return "review", "; ".join(blocking)
    # Before done: a done item whose input changed holds the work of bytes the file no
    # longer has; skip is "done and verified", and the changed input is not (a person
    # decides: run it as new work, or put the old bytes back). Once another item holds the
    # new content (taken up before the change, or by a later run) the done one is history:
    # its artifact's plan, the finding kept. A cancelled item stays cancelled whatever its input now holds.
    changed = [why for kind, why in INPUT_CHANGED.items() if kind in kinds]
    superseded = state == "done" and changed and "unsafe_input_path" not in kinds \
        and SUPERSEDED in details.get("stale_input", "")
    if changed and state != "cancelled" and not superseded:
        if state == "done" and "unsafe_input_path" not in kinds:
            return "review", ("done, but the input changed since it was recorded and no item "
                              "holds its new content: a run takes it up as a new item (this one "
                              "stays done), or put the recorded content back")
        return "review", "; ".join(changed) + ": its key no longer names this work"
    if "input_missing" in kinds and (state in ("pending", "partial", "unknown", "submitted")
                                     or (state == "failed" and item.failure == "transient")):
        if state in ("unknown", "submitted"):  # it may have been sent: the lookup comes first
            return "review", (f"{state}: {INPUT_MISSING}; a run cannot take it up: look up "
                              "its key before anything, then a person decides")
        return "review", f"{state}: {INPUT_MISSING}: it cannot run; put it back or cancel it"
    if state == "done":
        unchecked = details.get("done_without_artifact", "")
        if lookup and kinds & ARTIFACT_DAMAGE == {"done_without_artifact"} \
                and NOT_CHECKED in unchecked:
            # not looked at, not found bad: a person (or --artifacts) checks; nothing to re-fetch
            return "verify", f"done, artifact not checked: {unchecked}"
        if kinds & ARTIFACT_DAMAGE:
            if lookup:
                return "reconcile", "artifact not verified: look up and re-fetch, never re-execute"
            if kinds & ARTIFACT_DAMAGE == {"done_without_artifact"}:
                return "verify", VERIFY_WHY
            return "review", ("artifact missing or damaged, and the format has no lookup: "
                              "running it again is a second execution; a person decides")
        if superseded:
            return "skip", ("done (history): its input changed since, and another item "
                            "holds the new content (see stale_input)")
        return "skip", "done"
    if state == "cancelled":
        return "skip", "cancelled"
    if state == "needs_review":
        return "review", "parked for an operator"
    if "torn_line" in kinds and (state in ("pending", "partial") or (
            state == "failed" and item.failure == "transient")):  # (ledger.torn, rule 1)
        return "reconcile", (f"{state}, but the torn final line names it (maybe its intent, "
                             "sent): a run looks its request up before sending it")
    if state == "partial":
        if kinds & ARTIFACT_DAMAGE:
            return "review", "checkpoint of the finished pages not verified: never resume on it"
        return "run", "partial: resume at the next page from the checkpoint, never from page 1"
    if state == "pending":
        return "run", "pending: nothing was sent"
    if state in ("unknown", "submitted"):
        return "reconcile", f"{state}: look up before anything"
    failure = item.failure
    if failure == "transient":
        return "retry", "transient failure: new attempt"
    if failure == "permanent":
        return "review", "permanent failure"
    return "review", "failed without a transient/permanent class"
