"""A salvaged ledger: a request it never recorded may have been sent already.

``ledger --salvage`` writes a new ledger from what was readable and, when lines were lost,
marks it in its header (``ledger.salvage``; the mark outlives compaction). A key every
line of which was lost is not in that ledger at all: a run takes its input up as new work,
and a provider without idempotent keys would execute the document again. So on a marked
ledger every request the ledger never recorded -- a document's first, a long document's
next page, a retry's new attempt -- is looked up at the provider after its intent and
before it is sent, the way an ``unknown`` item is reconciled:

  found                           adopted: ``submitted`` with that job, then polled and
                                  fetched as usual; never executed a second time
  not found (the lag used up)     new work: sent -- unless a file under the outputs root
                                  carries the key in its name (an output, a page
                                  checkpoint): then ``needs_review``, naming it
  no answer (lookup unavailable)  ``needs_review``, with that reason and such files

The rule lasts as long as the ledger: one lookup per new request, never a guess (a retry
too: a key the lost lines held may have been adopted at an attempt they had retried). A
ledger never salvaged sends new work without a lookup.
"""

import os
from pathlib import Path

from toolkit.ledger import State
from toolkit.ledger.salvage import lost_lines

S = State
CONTINUE, REST = True, False
UNANSWERED = object()  # ``Runner._look_up``: the lookups got no answer
SHOWN = 3  # files named in a reason, at most


def _index(outputs, checkpoints) -> dict[str, list[tuple[Path, bool]]]:
    """Files by the first 8 characters of the key their name carries, each with whether it
    is a checkpoint: outputs ``<stem>.<key8>.pdf`` in the folders ``outputs``
    (``roots.output_path``), page checkpoints ``<key>.<page:04d>.pdf`` in ``checkpoints``
    (``pages.py``). One listing per run, not one per new key."""
    found: dict[str, list[tuple[Path, bool]]] = {}
    for where, is_checkpoint in [*((Path(f), False) for f in outputs), (checkpoints, True)]:
        try:
            names = os.listdir(where)
        except OSError:  # no such folder (yet): nothing there carries a key
            continue
        for name in names:
            if name.endswith(".pdf") and len(name) > 12:
                key8 = name[:8] if is_checkpoint else name[-12:-4]
                found.setdefault(key8, []).append((where / name, is_checkpoint))
    return found


def traces(index, key: str, pages_done: int | None) -> list[Path]:
    """The files of ``index`` named by ``key``: its output, and checkpoints of pages after
    the ``pages_done`` the ledger records (those are its own)."""
    out = []
    for path, is_checkpoint in index.get(key[:8], ()):
        page = path.name[len(key) + 1:-4]
        if (path.name.endswith(f".{key[:8]}.pdf") if not is_checkpoint else
                path.name.startswith(f"{key}.") and page.isdigit() and
                int(page) > (pages_done or 0)):
            out.append(path)
    return sorted(out)


class Salvaged:
    """Mixed into ``Runner``: it uses the runner's ``_look_up``, ``_move`` and ``_submit``."""

    def _send_new(self, item, token, budget):
        """Send the request whose intent was just written (a first send, a page, a retry):
        at once, or on a salvaged ledger after a lookup (the table above)."""
        if getattr(self.ledger, "salvaged", None) is None:
            return self._submit(item, token, budget)
        budget.lookups = 0  # a new request: its own lookups, as a new page gets its own
        job = self._look_up(item, token, budget)
        if job is not None and job is not UNANSWERED:
            self._move(item, S.SUBMITTED, token, job_id=job.job_id, sync=False,
                       note="found by lookup before a first send (salvaged ledger)")
            return CONTINUE
        files = self._traces_of(item)
        if job is None and not files:
            return self._submit(item, token, budget)  # "not found" answered: new work
        said = ("no lookup answered" if job is UNANSWERED else
                "the provider has no job for it (not found), yet")
        named = ", ".join(map(str, files[:SHOWN])) + (
            f" and {len(files) - SHOWN} more" if len(files) > SHOWN else "")
        found = f"{'; ' if job is UNANSWERED else ' '}{named} under the outputs root " \
            f"carr{'ies' if len(files) == 1 else 'y'} its key" if files else ""
        self._move(item, S.NEEDS_REVIEW, token, reason=(
            f"{lost_lines(self.ledger.salvaged)}: this request was never recorded, so it may "
            f"have been sent before the lines were lost; {said}{found}; check it at the "
            "provider, then release or cancel it"))
        return REST

    def _traces_of(self, item) -> list[Path]:
        """Files under --out (and the recorded outputs root) named by the item's key."""
        if getattr(self, "_traces", None) is None:
            self._traces = _index([self.out_dir, *self.other_roots], self._checkpoint_dir())
        return traces(self._traces, item.key, item.pages_done)
