"""A salvaged ledger: a request it never recorded may have been sent already.

``ledger --salvage`` writes a new ledger from what was readable and, when lines were lost,
marks it: a JSONL ledger in its header (``ledger.salvage``; the mark outlives compaction),
an SQLite one in a meta row (``ledger.salvage_sqlite``). Each backend reads its mark at
open into ``Ledger.salvaged``, the one thing asked here (``marked``). A key every
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
too: a key the lost lines held may have been adopted at an attempt they had retried). And
the lost lines may have held a retry: when the lookup of attempt n finds nothing (an
``unknown`` item the salvage parked and a person released, or any new request) the later
attempts n+1, n+2, ... are looked up before deciding, until 2 x ``submits`` + 1 in a row
(more than two runs start) are not found, and the job of the latest attempt found is
adopted (``_look_up_later``). A ledger never salvaged sends new work without a lookup.
An item the salvage parked and a person released (``unknown``, no intent since) whose
lookups find nothing is decided as a new request by the same table, not parked again
(``_released_unfound``).
"""

import dataclasses
import os
from pathlib import Path

from toolkit.ledger import TRANSIENT, State
from toolkit.provider import JobStatus
from toolkit.ledger.salvage import DECIDE, lost_lines
from toolkit.runner.review import NO_JOB_NO_RESEND, REASONS, RESEND_DECIDED

RELEASED = REASONS["release"]  # the reason ``resolve --release`` records (needs_review -> unknown)

S = State
CONTINUE, REST = True, False
UNANSWERED = object()  # ``Runner._look_up``: the lookups got no answer
SHOWN = 3  # files named in a reason, at most


def _index(outputs, checkpoints) -> dict[str, list[tuple[Path, bool]]]:
    """Files by the first 8 characters of the key their name carries (lower case), each with
    whether it is a checkpoint: outputs ``<stem>.<key8>.pdf`` anywhere under the folders
    ``outputs`` (``roots.output_path``; a person may have moved one into a subfolder or
    renamed it in upper case), page checkpoints ``<key>.<page:04d>.pdf`` in ``checkpoints``
    (``pages.py``). One walk per run, not one per new key; a symlinked folder is not
    followed (it may lead out of the outputs root, or round in a loop)."""
    found: dict[str, list[tuple[Path, bool]]] = {}

    def add(where, names, is_checkpoint):
        for name in names:
            low = name.lower()
            if low.endswith(".pdf") and len(name) > 12:
                key8 = low[:8] if is_checkpoint else low[-12:-4]
                found.setdefault(key8, []).append((Path(where) / name, is_checkpoint))

    for root in outputs:
        # os.walk: an unreadable folder (or none yet) is skipped; a symlink to a folder is
        # never entered (followlinks=False)
        for where, folders, names in os.walk(root):
            if Path(where) == Path(checkpoints):
                folders[:] = []
                continue  # indexed below, as checkpoints
            add(where, names, False)
    try:
        add(checkpoints, os.listdir(checkpoints), True)
    except OSError:  # no such folder (yet): nothing there carries a key
        pass
    return found


def traces(index, key: str, pages_done: int | None) -> list[Path]:
    """The files of ``index`` named by ``key`` (in any case): its output, and checkpoints
    of pages after the ``pages_done`` the ledger records (those are its own)."""
    out, key = [], key.lower()
    for path, is_checkpoint in index.get(key[:8], ()):
        name = path.name.lower()
        page = name[len(key) + 1:-4]
        if (name.endswith(f".{key[:8]}.pdf") if not is_checkpoint else
                name.startswith(f"{key}.") and page.isdigit() and
                int(page) > (pages_done or 0)):
            out.append(path)
    return sorted(set(out))  # one file under two roots (one inside the other) named once


def marked(ledger) -> bool:
    """Whether ``ledger`` is salvaged: the one rule (a JSONL header's mark, an SQLite meta
    row, as the backend read it at open; a PostgreSQL ledger: never)."""
    return getattr(ledger, "salvaged", None) is not None


class Salvaged:
    """Mixed into ``Runner``: it uses the runner's ``_look_up``, ``_move`` and ``_submit``."""

    def _send_new(self, item, token, budget):
        """Send the request whose intent was just written (a first send, a page, a retry):
        at once, or on a salvaged ledger after a lookup (the table above)."""
        if not marked(self.ledger):
            marks = getattr(self.ledger, "torn_marks", None)  # cuts not yet spent (torn.py)
            if marks and marks.pop(item.key, None) is not None:
                return self._look_up_cut(item, token, budget)
            return self._submit(item, token, budget)
        if getattr(budget, "clear_to", 0) >= item.attempt:
            # This run looked this attempt up already (the later-attempt search before an
            # earlier attempt's send) and found nothing; only our own refused sends came
            # since, which leave no job: asking again would ask the same question.
            return self._submit(item, token, budget)
        budget.lookups = 0  # a new request: its own lookups, as a new page gets its own
        job = self._look_up(item, token, budget)
        self._checked = (item.attempt, item.attempt)
        if job is None:
            # None of this attempt's: perhaps a retry the lost lines held was sent (attempt
            # n refused, n+1 executed), its output since deleted: the later attempts are
            # looked up too, whether or not a file under --out carries the key.
            later = self._look_up_later(item, token, budget)
            job = later if later is not UNANSWERED else job
        if job is not None and job is not UNANSWERED:
            self._move(item, S.SUBMITTED, token, job_id=job.job_id, sync=False,
                       note="found by lookup before a first send (salvaged ledger)")
            return CONTINUE
        return self._unfound(item, token, budget, job)

    def _page_one(self, item):
        """``(item, fields)`` for ``Runner._unknown``: a long document released before any
        intent of it was read (salvage parked it ``pending``: no ``pages_done``) is asked
        for and sent as its first page, as its lost intent would have been (``_pending``
        records ``pages_done`` 0), never as one whole-document request; ``fields`` make the
        move that adopts or sends it record that. Any other item: itself, no fields."""
        if item.pages_done is None and self._paged(item):
            return dataclasses.replace(item, pages_done=0), {"pages_done": 0}
        return item, {}

    def _released_unfound(self, item, token, budget, page):
        """``Runner._unknown`` after its lookups found no job (the later attempts too) where
        keys are not idempotent: REST in ``needs_review`` as on any ledger, unless this is
        an item a person released (``resolve --release``, one or ``--all``) on a salvaged
        ledger and no run has recorded an intent for it since. Its parking said only that
        the lost lines MAY hold a request of it; the release is no intent this ledger
        recorded (nothing was sent on it), so it is decided as a new request is: a file
        under --out that carries its key parks it, naming the file; else it is new work,
        sent. (Parking it again would loop: every release parked it once more, for a
        reason ``--reason salvaged`` no longer matches.) An intent a run recorded on this
        ledger keeps the rule of any ledger (DESIGN: not idempotent -> ``needs_review``);
        ``Runner._intent`` clears a reason left from before, so RELEASED here means the
        release is the item's last move.

        An item a person decided to send again (``resolve --resend``: ``RESEND_DECIDED``,
        only ever recorded on an item parked as ``NO_JOB_NO_RESEND``) whose lookups still
        find no job is sent once: ``failed(transient)`` first, durable, which spends the
        decision (its reason is no longer ``RESEND_DECIDED``), then ``_failed_transient``'s
        retry: a new attempt's intent, then its send. A crash or a lost reply after that
        intent leaves an ``unknown`` item the rule above parks again: one send per decision."""
        if marked(self.ledger) and item.reason == RELEASED:
            return self._unfound(item, token, budget, None, page)
        if item.reason == RESEND_DECIDED:
            self._move(item, S.FAILED, token, failure=TRANSIENT, **page, reason=(
                "sent again on an operator's decision (resolve --resend): the provider has "
                f"no job for attempt {item.attempt}"))
            return CONTINUE
        self._move(item, S.NEEDS_REVIEW, token, reason=NO_JOB_NO_RESEND)
        return REST

    def _unfound(self, item, token, budget, job, page=None):
        """No job found for a request this ledger never recorded (``job`` None: the
        provider said "not found" for attempts ``self._checked``; ``UNANSWERED``: no lookup
        answered): sent (``page``: ``_page_one``'s fields), unless no lookup answered or a
        file under --out carries its key (then ``needs_review``, naming what was asked and
        the files)."""
        files = self._traces_of(item)
        if job is None and not files:
            budget.clear_to = self._checked[1]  # none of these attempts has a job (above)
            return self._submit(item, token, budget, **(page or {}))  # new work
        first, last = self._checked
        tried = f"attempt {first}" if first == last else f"attempts {first}-{last}"
        said = ("no lookup answered" if job is UNANSWERED else
                f"the provider has no job for {tried} (not found), yet")
        named = ", ".join(map(str, files[:SHOWN])) + (
            f" and {len(files) - SHOWN} more" if len(files) > SHOWN else "")
        found = f"{'; ' if job is UNANSWERED else ' '}{named} under the outputs root " \
            f"carr{'ies' if len(files) == 1 else 'y'} its key" if files else ""
        self._move(item, S.NEEDS_REVIEW, token, reason=(
            f"{lost_lines(self.ledger.salvaged)}: this request was never recorded, so it may "
            f"have been sent before the lines were lost; {said}{found}; check it at the "
            "provider, then " + DECIDE))
        return REST

    def _look_up_cut(self, item, token, budget):
        """The first request of a key whose line the ledger cut as torn (``ledger.torn``):
        that line may have been its intent, sent. Found: adopted; not found: sent; no
        answer: left ``unknown`` (its intent is on disk), which the next run looks up.
        Only the one request: the cut took one line, so no later attempt is searched."""
        budget.lookups = 0  # a new request: its own lookups
        job = self._look_up(item, token, budget)
        if job is UNANSWERED:
            return REST
        if job is None:
            return self._submit(item, token, budget)
        self._move(item, S.SUBMITTED, token, job_id=job.job_id, sync=False,
                   note="found by lookup before a first send (its ledger line was cut as torn)")
        return CONTINUE

    def _look_up_later(self, item, token, budget):
        """After "not found" for the item's attempt n, on a salvaged ledger: the job of the
        latest later attempt found (n+1, n+2, ...: each request with its own lookups), the
        search ending at a job not failed (no retry follows one) or at ``window`` misses in
        a row (a failed job found restarts the count); else None, or ``UNANSWERED`` if one
        got no answer. A retry's request may have been sent (and have succeeded) in lines since lost, and a
        transient refusal leaves no job at all. One run starts up to ``policy.submits``
        requests, so ``window`` = 2 x that + 1 misses in a row: two whole runs refused
        every request (a storm run, then a second one; attempt 9 executed after 8 refusals
        is found). A third such run in a row is past it (README).
        ``self._checked`` holds the attempts asked, for the reason. A ledger never
        salvaged: None at once (its history is whole)."""
        if not marked(self.ledger):
            return None
        window = 2 * self.policy.submits + 1
        found, unanswered, misses, attempt = None, False, 0, item.attempt
        while misses < window:
            attempt += 1
            budget.lookups = 0  # another request: its own lookups
            job = self._look_up(dataclasses.replace(item, attempt=attempt), token, budget)
            if job is UNANSWERED:
                unanswered, misses = True, misses + 1
            elif job is None:
                misses += 1
            elif job.status is not JobStatus.FAILED:
                found = job  # queued, running or succeeded: no later attempt was sent after it
                break
            else:
                found, misses = job, 0  # failed: a later attempt may have been sent: go on
        self._checked = (item.attempt, attempt)
        return found if found is not None else UNANSWERED if unanswered else None

    def _traces_of(self, item) -> list[Path]:
        """Files under --out (and the recorded outputs root) named by the item's key."""
        if getattr(self, "_traces", None) is None:
            self._traces = _index([self.out_dir, *self.other_roots], self._checkpoint_dir())
        return traces(self._traces, item.key, item.pages_done)
