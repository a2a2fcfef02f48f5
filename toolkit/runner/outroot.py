"""A run's end: its ``--out`` holds every item it calls done, and may become the recorded root.

Two runs with different ``--out`` may share one ledger: an item of this batch
can turn ``done`` in the other run, its artifact in the other run's ``--out``.
At its end a run therefore (under ``roots.locked``, so that no other run
replaces the recorded root between the check and the write):

1. re-reads the recorded outputs root (another run may have replaced it);
2. for each item of its batch that was not at rest when its chunk ended and is
   ``done`` now, verifies its artifact under ``--out``, else copies it verified
   from the recorded root (``roots.materialize``); one found in neither is an
   error: the run does not claim rest (exit 1, "run again": a rerun copies it
   once the other run has recorded its ``--out``);
3. if its ``--out`` is not the recorded root: records it when it holds every
   ``done`` item of the whole ledger verified (``roots.record``'s rule), else says
   which one it lacks (an operator's accept recorded meanwhile): run again.
"""

from pathlib import Path

from toolkit import roots
from toolkit.ledger import State
from toolkit.runner import artifacts


def settle(ledger, out_dir: Path, keys, verify: bool = False, replace: bool = True) -> list:
    """Check (and fill) ``out_dir`` for the batch's ``keys``; maybe record it. Return errors."""
    where = getattr(ledger, "path", None)
    errors = []
    with roots.locked(where):
        recorded = roots.recorded(where).get("out")
        other = recorded is not None and recorded.resolve() != Path(out_dir).resolve()
        for item in ledger.get_many(keys).values():
            if item.state is not State.DONE or not item.artifact_path:
                continue
            if not _placed(item, out_dir, [recorded] if other else [], verify):
                errors.append(f"{item.source}: done by another run; its artifact is neither in "
                              f"--out nor under the recorded outputs root ({recorded})")
        if other and replace and not errors:
            missing = next((item for item in ledger.items() if item.state is State.DONE
                            and not artifacts.intact(roots.resolve(out_dir, item.artifact_path
                                                                   or ""), item, verify)), None)
            if missing is None:
                roots.record(where, replace=True, out=out_dir)
            else:  # e.g. an operator's ``resolve --accept-artifact`` recorded meanwhile,
                # relative to the recorded root: not at rest here, run again (exit 1)
                errors.append(f"{missing.key[:12]}: its artifact {missing.artifact_path!r} "
                              f"is not in {out_dir} yet")
    return errors


def _placed(item, out_dir, elsewhere, verify) -> bool:
    """``item``'s artifact is verified under ``out_dir``, or now copied there verified."""
    if artifacts.intact(roots.resolve(out_dir, item.artifact_path), item, verify):
        return True
    if Path(item.artifact_path).is_absolute():
        return False
    try:
        return roots.materialize(item.artifact_path, item.artifact_size, item.artifact_sha256,
                                 Path(out_dir) / item.artifact_path, elsewhere)
    except OSError:  # a directory where the artifact goes: said by the caller's error
        return False
