"""An operator decides parked items: what ``review`` lists, what ``resolve`` records.

``parked`` lists every ``needs_review`` item with the evidence a person needs: why it
was parked, its job, how many lookups answered for it (moves out of ``unknown``), its
artifact and its history. ``resolve`` records one decision as one move of the transition
table (``ledger/transitions.py``), with the operator's note in the event:

  release  needs_review -> unknown    the next run reconciles it by lookup (never a blind
                                       resubmit: ``unknown`` means "look up first")
  cancel   needs_review -> cancelled
  accept   needs_review -> done       only with a whole, readable PDF (the documents
                                       module's preflight), recorded by size and SHA-256
                                       relative to the batch's outputs root
  resend   needs_review -> unknown    only for an item parked as ``NO_JOB_NO_RESEND`` (an
                                       intent, no job found, keys not idempotent), with the
                                       reason ``RESEND_DECIDED``: the next run looks it up
                                       once more (found: adopted) and, not found, sends it
                                       once (``Salvaged._released_unfound``)
  cancel   failed(permanent) -> cancelled   a permanent failure closed by a person
                                       (``audit`` plans review for it; ``parked`` lists it)

A key may be given as a unique prefix of the task key (``unique_key``), as ``cancel``
takes it.

``resolve_all`` records one decision for every parked item whose reason starts with a
prefix (``salvaged``: what a salvage parked), item by item, each exactly as ``resolve``
records it; ``parked`` also names the files under the outputs root that carry an item's
key, which ``accept`` may take.

Against a live run: a decision takes the item's lease like any worker (claim, re-read
under the lease, move with its fencing token, release). A live owner's lease is never
taken (``LeaseHeldError``: "run again later", exit 1); the runner never moves a
``needs_review`` item itself, so an SQLite or PostgreSQL ledger may be resolved while a
batch runs. A JSONL ledger has one writer process: while a run holds it, ``resolve`` is
refused (exit 1) and nothing is written.
"""

import contextlib
import os
from pathlib import Path

from toolkit import documents, roots
from toolkit.errors import LeaseHeldError, NotReadyError, StaleTokenError, ToolkitError
from toolkit.ledger import TRANSIENT, State

S = State
DECISIONS = {"release": S.UNKNOWN, "cancel": S.CANCELLED, "accept": S.DONE,
             "resend": S.UNKNOWN}
REASONS = {"release": "released by operator", "cancel": "cancelled by operator"}
SHOWN = 3  # keys named in an error, at most
# Why the runner parks an intent whose lookups found no job where keys are not idempotent
# (``Salvaged._released_unfound``); the one reason ``resend`` decides.
NO_JOB_NO_RESEND = "intent recorded, provider has no job, contract forbids a resubmit"
# The reason a ``resend`` records: the next run reads it (once) as the person's leave to send.
RESEND_DECIDED = "resend decided by operator"
RECORDED = {**REASONS, "resend": RESEND_DECIDED}  # the reason each decision's move records


def _step(event) -> str:
    frm = event.frm.value if event.frm is not None else "-"
    said = "; ".join(f"{name} {event.detail[name]}" for name in ("job_id", "reason", "note")
                     if event.detail.get(name))
    return f"{event.op} {frm} -> {event.to.value}, attempt {event.attempt}" + \
        (f" ({said})" if said else "")


def parked(ledger, out=None) -> list[dict]:
    """Every ``needs_review`` item with its evidence, ordered by key; ``outputs``: the files
    under the outputs root ``out`` named for its key (``_outputs``), each a candidate for
    ``--accept-artifact``."""
    items = [item for item in ledger.items() if item.state is S.NEEDS_REVIEW]
    wanted = {item.key for item in items}
    history: dict[str, list] = {key: [] for key in wanted}
    for event in ledger.events() if wanted else ():
        if event.key in wanted:
            history[event.key].append(event)
    outputs = _outputs(out) if items and out is not None else lambda key: []
    return [{"key": item.key, "source": item.source, "attempt": item.attempt,
             "reason": item.reason, "job_id": item.job_id,
             "lookups": sum(1 for e in history[item.key] if e.op == "move" and e.frm is S.UNKNOWN),
             "artifact_path": item.artifact_path, "artifact_size": item.artifact_size,
             "artifact_sha256": item.artifact_sha256, "outputs": outputs(item.key),
             "history": [_step(event) for event in history[item.key] if event.op in ("add", "move")]}
            for item in items]


def failed_for_good(ledger) -> list[dict]:
    """Every ``failed`` item no run retries (permanent, or unclassified), ordered by key:
    ``audit`` plans review for them, and the one decision is ``resolve --cancel``."""
    return [{"key": item.key, "source": item.source, "attempt": item.attempt,
             "failure": item.failure, "reason": item.reason}
            for item in ledger.items() if item.state is S.FAILED and item.failure != TRANSIENT]


def unique_key(ledger, key: str) -> str:
    """The task key ``key`` names: itself, or the one key it is a prefix of (``ledger``
    prints 12 characters).

    Raises:
        ToolkitError: no item, or a prefix of several (one line naming them).
    """
    if ledger.get(key) is not None:
        return key
    matches = sorted(item.key for item in ledger.items() if item.key.startswith(key)) \
        if key else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ToolkitError(f"no item {key!r} in the ledger (a key or a unique prefix of one, "
                           "as ledger and review print them)")
    shown = ", ".join(matches[:SHOWN]) + (f" and {len(matches) - SHOWN} more"
                                          if len(matches) > SHOWN else "")
    raise ToolkitError(f"key {key!r} is a prefix of {len(matches)} items ({shown}): give "
                       "more characters")


def _outputs(out):
    """``key -> [path]``: the whole outputs under ``out`` named for a key the way the toolkit
    names them (``<stem>.<key8>.pdf``, any subfolder, any case), found as a salvaged run
    finds them (``salvaged.traces``, one walk); page checkpoints are no whole output. Where
    such a file exists, ``--accept-artifact`` is the way out: a release is looked up again,
    and a contract without idempotent keys parks an item the provider has no job for again."""
    from toolkit.runner.salvaged import _index, traces

    checkpoints = Path(out) / ".checkpoints"
    index = _index([Path(out)], checkpoints)
    return lambda key: [str(path) for path in traces(index, key, None)
                        if path.parent != checkpoints]


def accepted_artifact(path, ledger_path, out=None) -> dict:
    """The artifact fields of ``path`` if it is a whole, readable PDF inside the outputs
    root (``out``, else the root recorded beside the ledger), stored relative to it.

    Raises:
        ToolkitError: not a regular file, not a whole PDF, or outside the root (or no root).
    """
    from toolkit.documents.preflight import preflight
    from toolkit.runner.inputs import require_regular

    require_regular(path, "--accept-artifact")  # a FIFO or a device is never opened
    if not os.path.isfile(path):
        raise ToolkitError(f"--accept-artifact {str(path)!r}: no such file")
    verdict = preflight(path)
    if not verdict.ok:
        raise ToolkitError(f"--accept-artifact {str(path)!r} is not a whole, readable PDF: "
                           f"{verdict.reason}")
    recorded = roots.recorded(ledger_path).get("out")
    if out is not None and recorded is not None and \
            os.path.realpath(out) != os.path.realpath(recorded):
        # the path is stored relative to the root and read back relative to the recorded one
        raise ToolkitError(f"--out {str(out)!r} is not the outputs root the ledger records "
                           f"({str(recorded)!r}): leave --out out, or copy the file there")
    root = Path(out) if out is not None else recorded
    if root is None or not root.is_dir():
        raise ToolkitError("the ledger records no outputs root: give --out DIR, the folder "
                           "the batch's outputs are in (the artifact must be inside it)")
    real, base = os.path.realpath(path), os.path.realpath(root)
    if os.path.commonpath([real, base]) != base:
        raise ToolkitError(f"--accept-artifact {str(path)!r} is outside the outputs root "
                           f"{str(root)!r}: copy it there first")
    found = documents.artifact_of(real)
    return {"artifact_path": roots.relative(real, base), "artifact_size": found.size,
            "artifact_sha256": found.sha256}


def _not_shared(ledger, key: str, stored: str) -> None:
    """Refuse a file that is already another item's recorded artifact: two done items
    would share one output, and whichever is redone would overwrite the other's."""
    for other in ledger.items():
        if other.key != key and other.artifact_path == stored:
            raise ToolkitError(f"--accept-artifact {stored!r} is already the artifact of item "
                               f"{other.key!r}: give this item its own file")


def decidable(item, decision: str) -> str | None:
    """Why ``decision`` does not fit ``item`` as it is, or None (it does). The one rule for
    ``resolve`` (checked before, and again under the lease)."""
    if item.state is S.FAILED and item.failure != TRANSIENT:
        # a permanent failure a person closes (no run retries it, nothing to release)
        return None if decision == "cancel" else (
            f"item {item.key!r} is failed({item.failure}): no run retries it; --cancel "
            "closes it (a fixed input is new work, its own item)")
    if item.state is not S.NEEDS_REVIEW:
        what = f"failed({item.failure})" if item.state is S.FAILED else item.state.value
        return f"item {item.key!r} is {what}, not needs_review: nothing to resolve"
    if decision == "resend" and item.reason != NO_JOB_NO_RESEND:
        return (f"--resend decides only an item parked as {NO_JOB_NO_RESEND!r}; item "
                f"{item.key!r} is parked as {item.reason!r}: --release, --cancel or "
                "--accept-artifact decide it")
    return None


def _check(ledger, key: str, decision: str, artifact: dict | None):
    """Raise ToolkitError (nothing written) unless ``key`` names an item ``decision`` fits."""
    item = ledger.get(unique_key(ledger, key))
    why = decidable(item, decision)
    if why is not None:
        raise ToolkitError(why)
    if decision == "accept":
        _not_shared(ledger, item.key, artifact["artifact_path"])
    return item


def resolve(ledger, key: str, decision: str, note: str, artifact: dict | None = None,
            worker: str = "operator", dry_run: bool = False):
    """Record ``decision`` (``DECISIONS``) for the parked item ``key`` (or a unique prefix
    of it); return the new item (with ``dry_run``, the item as it is: nothing is claimed
    or written).

    Raises:
        ToolkitError: no such item, or ``decidable`` refuses it (nothing is written).
        NotReadyError: a live worker holds its lease, or it moved meanwhile: run again.
    """
    item = _check(ledger, key, decision, artifact)
    if dry_run:
        return item
    key, before = item.key, (item.state, item.reason)

    def chosen(current) -> bool:  # as checked, and unchanged since
        return (current.state, current.reason) == before

    current, moved = _decided(ledger, key, decision, note, artifact, worker, chosen)
    if not moved:
        raise NotReadyError(f"item {key!r} moved to {current.state.value} meanwhile: "
                            "review it again")
    return current


def _parked(item) -> bool:
    return item.state is S.NEEDS_REVIEW


def _decided(ledger, key, decision, note, artifact, worker, chosen):
    """``(item, True)`` once ``decision`` is recorded for ``key``; ``(item, False)`` with
    nothing moved when the item, read again under our lease, is no longer ``chosen``.

    JSONL: claim, move and release stand or fall together (a full disk at the move leaves
    no claim behind); the other ledgers commit each write whole on their own. A kill -9
    between them leaves the item parked as it was but for our claim (which the next claim
    takes: its owner's process is gone, or it is ours by name), or decided with our lease
    left on it (an item at rest: no run claims it): never halfway."""
    together = getattr(ledger, "all_or_nothing", contextlib.nullcontext)
    with together():
        try:
            token = ledger.claim(key, worker, ttl=60.0)
        except LeaseHeldError as exc:
            held = exc  # nothing written: leave the block whole (an error would close it)
        else:
            return _move_held(ledger, key, decision, note, artifact, worker, chosen, token)
    raise NotReadyError(f"{held}: a live worker holds it; resolve it later")


def _move_held(ledger, key, decision, note, artifact, worker, chosen, token):
    try:
        current = ledger.get(key)  # decided on the item as it is under our lease
        if not chosen(current):
            return current, False
        fields = dict(artifact or {}) if decision == "accept" else {}
        return ledger.move(key, current.state, DECISIONS[decision], token=token,
                           worker=worker, note=note, reason=RECORDED.get(decision),
                           **fields), True
    finally:
        try:
            ledger.release(key, token, worker)
        except StaleTokenError:
            pass  # another owner took it meanwhile: the lease is theirs (fenced)


def resolve_all(ledger, reason: str, decision: str, note: str, worker: str = "operator",
                dry_run: bool = False):
    """Record ``decision`` (release or cancel) for every parked item whose recorded reason
    starts with ``reason``, one item at a time, each exactly as ``resolve`` records one
    (claim, one move with the note, release). Yields ``(key, outcome, why)`` as it goes:

      decided   the move is recorded (``why``: the new state)
      would     ``dry_run``: it would be decided; nothing is claimed or written
      skipped   parked for another reason, or no longer parked under our lease (moved
                meanwhile, its reason changed): never changed (``why`` says which)
      later     a live worker holds its lease: run again later

    Items are listed once, by key; each is decided on the item as read again under its
    lease, never on the listing. One item's decision is whole or absent (``_decided``), so
    a kill -9 midway leaves the ones before it decided and the rest parked: a rerun lists
    only those and decides them. A fault of the ledger itself stops the loop (raised).

    Raises:
        ToolkitError: (at the call, before any item) ``check_bulk`` refuses the arguments.
    """
    check_bulk(reason, decision)
    return _each(ledger, reason, decision, note, worker, dry_run)


def check_bulk(reason: str | None, decision: str) -> None:
    """Raise ToolkitError unless a bulk decision can be made: release or cancel (an artifact
    is one item's own file), and a reason to select by (so an item parked for another
    cause is never decided in bulk by accident)."""
    if decision == "accept":
        raise ToolkitError("--accept-artifact decides one item (its own file): give --key")
    if decision not in REASONS:
        raise ToolkitError(f"--{decision} decides one item (a send a person vouches for): "
                           "give --key")
    if not (reason or "").strip():
        raise ToolkitError("--all needs --reason PREFIX, the start of the reasons to decide "
                           "(review lists them): an item parked for another reason is never "
                           "decided in bulk")


def _each(ledger, reason, decision, note, worker, dry_run):
    def chosen(item) -> bool:
        return item.state is S.NEEDS_REVIEW and (item.reason or "").startswith(reason)
    listed = sorted((item for item in ledger.items() if item.state is S.NEEDS_REVIEW),
                    key=lambda item: item.key)
    for item in listed:
        if not chosen(item):
            yield item.key, "skipped", f"parked for another reason: {item.reason}"
        elif dry_run:
            yield item.key, "would", DECISIONS[decision].value
        else:
            try:
                current, moved = _decided(ledger, item.key, decision, note, None, worker,
                                          chosen)
            except NotReadyError as exc:
                yield item.key, "later", str(exc)
                continue
            yield item.key, ("decided" if moved else "skipped"), (
                current.state.value if moved else
                f"now {current.state.value}, moved meanwhile" if not _parked(current) else
                f"its reason changed meanwhile: {current.reason}")
