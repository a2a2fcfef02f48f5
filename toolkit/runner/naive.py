"""The designs people actually write, kept on purpose so the drills can show them failing.

Each is the safe ``Runner`` with one habit changed, so a drill compares them
on identical input, provider and documents. Each docstring names the input
on which it goes wrong and what the user then sees.
"""

import dataclasses
import json
from pathlib import Path

from toolkit import documents
from toolkit.errors import (LedgerError, StaleTokenError, StateConflictError, ToolkitError,
                            TransientError)
from toolkit.identity import file_task_key, idem_key
from toolkit.ledger import TRANSITIONS, State
from toolkit.provider import JobStatus
from toolkit.runner import CONTINUE, REST, Runner

S = State


class BlindRetry(Runner):
    """Retry on timeout: an ``unknown`` item is resubmitted at once, never looked up.

    Harmless against idempotent, retained keys (the provider dedupes); against
    any other contract a lost reply or a crash after submit executes twice.
    """

    name = "blind-retry"

    def _unknown(self, item, token, budget):
        return self._submit(item, token, budget)


class OutputExists(Runner):
    """Skip an item when its output file exists; download straight into place.

    A crash or a cut connection during the download leaves a partial file
    under the final name; the next run sees it and calls the item done
    (a fake done: the artifact does not match what the provider produced).
    The output is named after the input, not the request: after an option
    changes (another target language), the old output is taken for the new.
    """

    name = "output-exists"
    sends_pages = False  # it sends whole documents its own way

    def _output_path(self, item):
        # The usual naive name: the input's name, not the request's identity.
        return self.out_dir / f"{Path(item.source or item.key).stem}.out.pdf"

    def process(self, key):
        item = self.ledger.get(key)
        out = self._output_path(item)
        if out.exists() and item.state is not S.DONE and S.DONE in TRANSITIONS[item.state]:
            found = documents.artifact_of(out)  # "it exists, so it is done"
            return self.ledger.move(key, item.state, S.DONE, token=item.token, worker=self.worker,
                                    artifact_path=str(out), artifact_size=found.size,
                                    artifact_sha256=found.sha256, note="output exists")
        if item.state is S.DONE and out.exists():
            return item
        return super().process(key)

    def _fetch(self, item, job, token, budget):
        out = self._output_path(item)
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.provider.fetch(job.job_id, out)  # in place, no temp file, no verification
        except (TransientError, TimeoutError):
            return REST  # "try again next run"; whatever reached the final name stays there
        self.hook("during_fetch", item.key, path=out)
        found = documents.artifact_of(out)
        self.hook("before_commit", item.key, to=S.DONE)
        self._move(item, S.DONE, token, job_id=job.job_id, artifact_path=str(out),
                   artifact_size=found.size, artifact_sha256=found.sha256)
        return REST


class NoLease(Runner):
    """Check, then act, with no lease: read ``pending``, submit, then record.

    Two workers that read the same ``pending`` item both submit it: against a
    non-idempotent provider the document executes twice.
    """

    name = "no-lease"
    sends_pages = False  # it sends whole documents its own way

    def process(self, key):
        item = self.ledger.get(key)
        if item.state is not S.PENDING:
            return item if item.resting else super().process(key)
        self._current = key
        self.hook("before_intent", key)  # the race window: both workers are here
        try:
            job = self.provider.submit(idem_key(key, 1), self._paths[key], self.options)
        except ToolkitError:
            return self.ledger.get(key)
        try:  # the side effect came first; now try to record it
            self.ledger.move(key, S.PENDING, S.UNKNOWN, token=item.token, worker=self.worker)
            self.ledger.move(key, S.UNKNOWN, S.SUBMITTED, token=item.token, worker=self.worker,
                             job_id=job.job_id)
        except (StateConflictError, StaleTokenError):
            # The other worker recorded first (and may hold the item's lease by now, after
            # our first record): our job ran anyway.
            return self.ledger.get(key)
        return super().process(key)


class BatchCommit(Runner):
    """Keep progress in memory and write the ledger every ``every`` items.

    No intent is written before the submit. A crash loses the progress of the
    uncommitted items; the next run finds them ``pending`` and submits them
    again: against a non-idempotent provider they execute twice.
    """

    name = "batch-commit"
    sends_pages = False  # it sends whole documents its own way
    every = 5

    def run(self, inputs):
        self._buffer = []
        counts = super().run(inputs)
        self._flush()
        return self._recount(counts)

    def _recount(self, counts):
        counts = {state: 0 for state in counts}
        self.unsettled = 0
        for key in self._seen:  # every key of this run (the base forgets each chunk's paths)
            item = self.ledger.get(key)
            counts[item.state.value] += 1
            self.unsettled += not item.resting
        return counts

    def process(self, key):
        item = self.ledger.get(key)
        if item.state is not S.PENDING:
            return item if item.resting else super().process(key)
        self._current = key
        try:
            job = self.provider.submit(idem_key(key, 1), self._paths[key], self.options)
            while job.status in (JobStatus.QUEUED, JobStatus.RUNNING):
                job = self.provider.poll(job.job_id)
        except (ToolkitError, TimeoutError):
            return item  # the naive loop just moves on
        self._buffer.append((key, job, self._download(item, job)))
        if len(self._buffer) >= self.every:
            self._flush()
        return item

    def _download(self, item, job):
        out = self._output_path(item)
        out.parent.mkdir(parents=True, exist_ok=True)
        if job.status is JobStatus.SUCCEEDED:
            self.provider.fetch(job.job_id, out)
        return out

    def _flush(self):
        """Write the buffered progress: intent, submit and result, item after item."""
        for key, job, out in self._buffer:
            self.hook("before_commit", key, to=S.DONE)
            self.ledger.move(key, S.PENDING, S.UNKNOWN, worker=self.worker)
            self.ledger.move(key, S.UNKNOWN, S.SUBMITTED, worker=self.worker, job_id=job.job_id)
            if job.status is JobStatus.SUCCEEDED:
                self.ledger.move(key, S.SUBMITTED, S.DONE, worker=self.worker,
                                 artifact_path=str(out), artifact_size=job.artifact_size,
                                 artifact_sha256=job.artifact_sha256)
            else:
                self.ledger.move(key, S.SUBMITTED, S.FAILED, worker=self.worker,
                                 failure=job.failure or "permanent", reason=job.reason)
        self._buffer = []


class TimeoutAsFailed(Runner):
    """A timeout is recorded as a failure and retried with a new attempt (a new key).

    The job of the lost reply keeps running at the provider; the retry starts a
    second one under another key, which no provider can deduplicate.
    """

    name = "timeout-as-failed"

    def _after_timeout(self, item, token):
        self._move(item, S.FAILED, token, failure="transient", reason="timeout")
        return CONTINUE


class StealExpired(Runner):
    """Take over any expired lease, even one held by a live, merely slow process.

    The slow owner still submits what it started; the thief, finding the
    intent but no job yet, parks or repeats the work.
    """

    name = "steal-expired"

    def _claim(self, key):
        return self.ledger.claim(key, self.worker, self.lease_ttl, respect_live_owner=False)

    def _renew(self, item, token):
        pass  # naive lease code: never renews, never checks its lease before a call


class IgnoreWriteErrors(Runner):
    """Log a failed ledger write and carry on as if it had been recorded.

    With a full disk it keeps submitting work whose intent and result it cannot
    record: executions nobody can account for, repeated on every retry.
    """

    name = "ignore-write-errors"

    def _move(self, item, to, token, **fields):
        try:
            return super()._move(item, to, token, **fields)
        except (LedgerError, StateConflictError):  # "log it; we have it in memory"
            fields.pop("note", None)
            fields.pop("sync", None)
            new_attempt = to is S.UNKNOWN and item.state in (S.PENDING, S.FAILED)
            return dataclasses.replace(item, state=to, attempt=item.attempt + new_attempt,
                                       **fields)


class RestartLongDocs(Runner):
    """A long document that stopped halfway starts over at page 1.

    The finished pages are thrown away and every page before the failure is
    sent again. A provider that dedupes the page keys hands back the old
    jobs; any other bills each re-sent page twice (the checker sees a page
    executed twice), so a 300-page document that fails near its end costs
    nearly double.
    """

    name = "restart-long-docs"

    def __init__(self, *args, **options):
        super().__init__(*args, **options)
        self._started: set[str] = set()  # documents this run has begun (from page 1)

    def _resume_pages(self, item):
        if item.pages_done is None or item.key in self._started:
            return item.pages_done  # within one run it goes page after page
        self._started.add(item.key)
        return 0

    def _pending(self, item, token, budget):
        self._started.add(item.key)
        return super()._pending(item, token, budget)


class JsonStateFile:
    """The whole state as one JSON object, rewritten in place after every change.

    ``open(path, "w")`` truncates first and ``json.dump`` writes in pieces: a
    crash in between leaves an empty or cut file, and the naive reader then
    starts from nothing. Only what ``RewriteState`` needs of a ledger.
    """

    def __init__(self, path, hook):
        self.path, self.hook = Path(path), hook
        try:
            self.state = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.state = {}  # "could not read the progress file: start over"

    def save(self):
        with open(self.path, "w") as handle:  # in place: truncated from here on
            self.hook("during_state_write", None, path=self.path)
            json.dump(self.state, handle)

    def close(self):
        pass


class RewriteState(Runner):
    """Progress in a JSON file rewritten in place on every item (no temp file, no fsync).

    A kill during the rewrite loses the whole file; the next run starts over
    and submits every document again: against a non-idempotent provider,
    everything done so far executes twice. It also sends every file as it
    is, without a preflight: poison reaches the provider.
    """

    name = "rewrite-state"
    sends_pages = False  # it sends whole documents its own way

    def __init__(self, ledger_path, provider, out_dir, **options):
        super().__init__(None, provider, out_dir, **options)
        self.ledger = JsonStateFile(ledger_path, lambda *a, **k: self.hook(*a, **k))

    def enqueue(self, inputs):
        keys = []
        for path in sorted(Path(p) for p in inputs):
            key = file_task_key(path, self.options)
            self._paths[key] = path
            keys.append(key)
        return keys

    def run(self, inputs):
        keys = self.enqueue(inputs)
        for key in keys:
            self.process(key)
        counts = {state.value: 0 for state in State}
        for key in keys:
            counts[self.ledger.state.get(key, {}).get("state", "pending")] += 1
        self.unsettled = counts["pending"] + counts["unknown"] + counts["submitted"]
        return counts

    def process(self, key):
        entry = self.ledger.state.get(key, {})
        if entry.get("state") in ("done", "failed"):
            return entry
        self._current = key
        path = self._paths[key]  # no preflight: every file is sent, poison included
        try:
            job = self.provider.submit(idem_key(key, 1), path, self.options)
            while job.status in (JobStatus.QUEUED, JobStatus.RUNNING):
                job = self.provider.poll(job.job_id)
        except (ToolkitError, TimeoutError):
            return entry
        out = self.out_dir / f"{path.stem}.{key[:8]}.pdf"
        out.parent.mkdir(parents=True, exist_ok=True)
        if job.status is JobStatus.SUCCEEDED:
            self.provider.fetch(job.job_id, out)
            entry = {"state": "done", "job_id": job.job_id, "artifact_path": str(out),
                     "artifact_size": job.artifact_size, "artifact_sha256": job.artifact_sha256}
        else:
            entry = {"state": "failed", "job_id": job.job_id, "reason": job.reason}
        self.ledger.state[key] = entry
        self.ledger.save()
        return entry
