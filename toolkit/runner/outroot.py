"""A run's end: its ``--out`` holds every item it calls done, and may become the recorded root.

Two runs with different ``--out`` may share one ledger: an item of this batch
can turn ``done`` in the other run, its artifact in the other run's ``--out``,
after this run let it go (its lease was the other's) and before this run read it
again (at its chunk's end, or here). At its end a run therefore, under
``roots.locked`` (no other run replaces the recorded root between the check and
the write, nor checks its own meanwhile):

1. re-reads the recorded outputs root (another run may have replaced it);
2. checks ``suspects``: the items of its batch it did not see come to rest itself
   (not at rest when it let them go, or a lease another owner took over). One
   ``done`` now is verified under ``--out`` (stat, else SHA-256), else copied there
   verified (``roots.materialize``: size and SHA-256) from the folders this ledger
   is known to have used: the recorded root, then the other ``--out`` folders its
   witnesses name (``witness.circle``: a run that has not replaced the root yet);
3. when another run has worked on this ledger into another folder (the recorded
   root is another folder, or a suspect's artifact was not under ``--out``), checks
   every ``done`` item of the whole ledger the same way: once no run is active the
   recorded root holds every done artifact, since the last run to end checks
   (and fills) its ``--out`` from the others before it names it the root;
4. one found nowhere is an error naming it (exit 1, "run again"): the run does not
   claim rest, and the recorded root is not replaced; else, if its ``--out`` is not
   the recorded root, records it (``roots.record``'s rule).

A run alone on its ledger has no suspect ``done``: its end reads nothing more than
before (a rerun's cost is what is left to do).
"""

import contextlib
from pathlib import Path

from toolkit import roots
from toolkit.errors import ToolkitError
from toolkit.ledger import State
from toolkit.runner import artifacts, witness

SHOWN = 5  # items named in the error line; the rest are counted


def settle(ledger, out_dir: Path, suspects, verify: bool = False, replace: bool = True) -> list:
    """Check (and fill) ``out_dir`` for ``suspects`` (and, when another run worked into
    another folder, for every done item of the ledger); maybe record it. Return errors."""
    where = getattr(ledger, "path", None)
    out_dir = Path(out_dir)
    with roots.locked(where):
        recorded = roots.recorded(where).get("out")
        other = recorded is not None and recorded.resolve() != out_dir.resolve()
        sources = _Sources(where, out_dir, recorded if other else None)
        missing, foreign = [], other
        if not other:  # else the whole ledger, below, suspects included
            missing, foreign = _fill(ledger.get_many(suspects).values(), out_dir, sources,
                                     verify)
        if foreign:  # another run worked into another folder: every done item of the ledger
            checked = set() if other else set(suspects)  # each file hashed once at most
            missing += _fill((item for item in ledger.items() if item.key not in checked),
                             out_dir, sources, verify)[0]
        if missing:
            return [_missing_line(missing, out_dir, sources)]
        if other and replace:
            roots.record(where, replace=True, out=out_dir)
    return []


class _Sources:
    """The folders a missing artifact is copied from, in order: the recorded root (when it
    is another folder), then the other folders of the ledger's witness circle (read only
    when the first do not hold an artifact: a run alone never reads them)."""

    def __init__(self, where, out_dir: Path, recorded):
        self.where, self.out_dir = where, out_dir
        self.first = [recorded] if recorded is not None else []
        self._circle = None

    def more(self) -> list:
        if self._circle is None:
            self._circle = []
            if self.where is not None:
                with contextlib.suppress(ToolkitError, OSError, ValueError):  # a damaged
                    # witness: the run's start refused it already; here it adds no folder
                    mine = {str(folder.resolve()) for folder in [self.out_dir, *self.first]}
                    self._circle = [Path(folder) for folder in
                                    witness.circle(self.out_dir, self.where)
                                    if str(Path(folder).resolve()) not in mine]
        return self._circle

    def named(self) -> str:
        folders = [*self.first, *(self._circle or ())]
        return ", ".join(map(str, folders)) or "no other folder known"


def _fill(items, out_dir, sources, verify) -> tuple[list, bool]:
    """Each done item of ``items`` verified under ``out_dir``, or copied there verified from
    ``sources``; return those placed nowhere, and whether any was not there already."""
    missing, foreign = [], False
    for item in items:
        if item.state is not State.DONE or not item.artifact_path:
            continue
        if artifacts.intact(roots.resolve(out_dir, item.artifact_path), item, verify):
            continue
        foreign = True
        if not (_copied(item, out_dir, sources.first) or _copied(item, out_dir, sources.more())):
            missing.append(item)
    return missing, foreign


def _copied(item, out_dir, folders) -> bool:
    """``item``'s artifact copied into ``out_dir`` verified from one of ``folders``."""
    if not folders or Path(item.artifact_path).is_absolute():
        return False
    try:
        return roots.materialize(item.artifact_path, item.artifact_size, item.artifact_sha256,
                                 out_dir / item.artifact_path, folders)
    except OSError:  # a directory where the artifact goes: named by the caller's error
        return False


def _missing_line(missing, out_dir, sources) -> str:
    shown = ", ".join(f"{item.key[:12]} ({item.source or item.artifact_path})"
                      for item in missing[:SHOWN])
    more = f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
    return (f"{len(missing)} done item(s) not verified in {out_dir} and found verified in "
            f"no other folder of this ledger ({sources.named()}): {shown}{more}; another "
            "run may still be placing them: run again once it has ended")
