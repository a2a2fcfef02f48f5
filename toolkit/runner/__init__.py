"""The safe runner: reconcile, then act (DESIGN.md, "What the safe runner does").

For each item the runner reads the ledger state and decides; every provider
call is preceded by a committed intent and followed by a committed reply.
Errors are classified by type: ``TimeoutError`` (no reply: the outcome is
unknown), ``TransientError`` (a definite "not now" reply: nothing was done),
``PermanentError`` (poison, rejection). Nothing catches ``Exception``.

Fault injectors plug in through ``hook(point, key, **context)``, called at
the named ``HOOK_POINTS``; a hook may raise (a lost reply, a crash) or damage
a file. The runner never imports ``toolkit.faults``. The plumbing shared with
every other strategy (keying, preflight, health, the loop) is ``Pipeline``;
long documents page by page (checkpoints, ``partial``, resume) are ``PageByPage``;
the lease kept alive around provider calls is ``Lease``; the reuse of done items, ``Reuse``.
"""

import contextlib
import errno
import os
from pathlib import Path

from toolkit import documents, roots
from toolkit.errors import (KeyReuseError, LeaseHeldError, LedgerError, PermanentError,
                            StaleTokenError, StateConflictError, TransientError)
from toolkit.ledger import PERMANENT, TRANSIENT, Item, State
from toolkit.provider import JobStatus, ProviderConflict
from toolkit.runner import artifacts, other_options
from toolkit.runner.lease import Lease
from toolkit.runner.pages import LATER, PageByPage
from toolkit.runner.reuse import Reuse
from toolkit.runner.salvaged import UNANSWERED, Salvaged
from toolkit.runner.pipeline import (HOOK_POINTS, Pipeline, RetryPolicy, Snapshot, _Budget,
                                     default_worker, resubmit_is_safe)
from toolkit.storage import FULL_OR_FAILING

S = State
CONTINUE, REST = True, False
__all__ = ["HOOK_POINTS", "CONTINUE", "REST", "Pipeline", "RetryPolicy", "Runner", "Snapshot",
           "StopAsked", "default_worker", "resubmit_is_safe"]


class StopAsked(KeyboardInterrupt):
    """A stop asked of a run (``Runner.stop_asked``: SIGTERM, SIGHUP, Ctrl-C, as the CLI sets
    it), raised where the run holds no lease and no step is under way. An interruption,
    like Ctrl-C: ``finally`` blocks run, nothing catches it as an error."""


class Runner(Salvaged, Reuse, PageByPage, Lease, Pipeline):
    """Drive a batch to rest with the safe strategy: reconcile, then act.

    Run it again after any crash: it reconciles what it finds.
    """

    name = "safe"
    sends_pages = True  # long documents page by page (``PageByPage``)
    # Set (the CLI's signal handler does) to stop the run at the end of the step under way:
    # that step's move is committed, the item's lease released, then ``StopAsked`` before
    # the next item or chunk. A step is never cut: an intent and its send are one step.
    stop_asked: str | None = None

    def _stop_if_asked(self) -> None:
        if self.stop_asked is not None:
            raise StopAsked(self.stop_asked)

    def enqueue(self, inputs) -> list[str]:
        self._stop_if_asked()  # before keying (and recording) another chunk
        return super().enqueue(inputs)

    def process(self, key: str) -> Item:
        """Advance one item until it rests for this run; return where it ended."""
        self._stop_if_asked()  # before this item's claim: no lease of ours is held here
        self._current, self._stage = key, "verify"
        item = self._known.pop(key, None) or self.ledger.get(key)  # read by enqueue just now
        if item.state is S.DONE and self._artifact_intact(item):
            self.reused += 1
            return item  # reuse needs no lease: verifying reads only
        if item.key in self._unplaced:
            return item  # done, its verified copy could not be placed here: a rerun does
        if item.resting and item.state is not S.DONE:
            return item  # terminal or parked: no later run touches it
        try:
            token = self._claim(key)
        except LeaseHeldError:
            return item  # a live worker owns it
        # No try/finally: after a crash the lease stays, exactly as after kill -9.
        budget = _Budget()
        try:
            item = self.ledger.get(key)  # as the claim left it
            while True:
                step = self._steps().get((item.state, item.failure if item.state is S.FAILED
                                          else None))
                self._in_hand = None
                if step is None or step(item, token, budget) is REST or self.stop_asked:
                    break  # a stop asked: at this step's end, its move committed (above)
                # The item the step's last move committed is what a read would return now
                # (a later change by anyone else fails our next fenced write): no re-read.
                item = self._in_hand or self.ledger.get(key)
        except (StaleTokenError, StateConflictError):
            # Our lease expired and another owner took the item: it is theirs now (every
            # write of ours was fenced). Note it and go on with the next item.
            self.lost_leases.append(key)
            return self.ledger.get(key)
        try:
            self.ledger.release(key, token, self.worker, sync=False)  # a lease: deferred
        except StaleTokenError:
            pass  # someone took the lease over; our writes were fenced anyway
        return self.ledger.get(key)

    def _claim(self, key: str) -> int:
        # Deferred sync (Ledger, "DEFERRED SYNC"): a claim guards against live workers,
        # who see it at commit; the intent's fsync makes it durable before any submit.
        return self.ledger.claim(key, self.worker, self.lease_ttl, sync=False)

    def run(self, inputs) -> dict[str, int]:
        """``Pipeline.run``, then the barrier: what the run reports is durable."""
        self._traces = None  # this run's files under --out named by a key (``salvaged``)
        counts = super().run(inputs)
        if not self.halted:
            try:
                self.ledger.barrier()
            except LedgerError as exc:
                self.halt(exc)
        return counts

    def _steps(self):
        return {(S.PENDING, None): self._pending, (S.UNKNOWN, None): self._unknown,
                (S.SUBMITTED, None): self._submitted, (S.DONE, None): self._done,
                (S.FAILED, TRANSIENT): self._failed_transient, (S.PARTIAL, None): self._partial}

    # -- one step per state --------------------------------------------------------
    def _move(self, item, to, token, **fields) -> Item:
        """``ledger.move`` from where ``item`` is; its result is the item in hand (``process``
        reads it instead of the ledger; ``_renew`` trusts the fence it passed)."""
        self._in_hand = self.ledger.move(item.key, item.state, to, token=token,
                                         worker=self.worker, **fields)
        self._fenced = self._in_hand
        return self._in_hand

    def _caller(self, token) -> dict:
        """Who submits (worker, fencing token), for a provider that records it: the fake
        provider and its HTTP client do; a wrapper or a user's provider may not."""
        if not hasattr(self, "_records_callers"):
            import inspect

            try:
                self._records_callers = "worker" in inspect.signature(self.provider.submit).parameters
            except (TypeError, ValueError):
                self._records_callers = False
        return {"worker": self.worker, "token": token} if self._records_callers else {}

    def _backoff(self, tries: int):
        self.sleep(self.policy.delay(tries, self._rng))

    def _pending(self, item, token, budget):
        return self._intent(item, token, budget, **({"pages_done": 0} if self._paged(item) else {}))

    def _intent(self, item, token, budget, **fields):
        self.hook("before_intent", item.key)
        if item.reason is not None:  # a reason left from before (a release, say) is not this
            fields["reason"] = None  # intent's: ``Salvaged._released_unfound`` reads it
        item = self._move(item, S.UNKNOWN, token, note="intent", **fields)  # before the side effect
        self.hook("after_intent", item.key)
        return self._send_checked(item, token, budget)

    def _send_checked(self, item, token, budget):
        """``_send_new`` (a salvaged ledger looks it up first), unless the same content under
        the other routing intended first (``other_options.backs_off``): then not sent."""
        if other_options.backs_off(self, item, token):
            return REST
        return self._send_new(item, token, budget)

    def _submit(self, item, token, budget, **fields):
        """Submit the current attempt's key; the item is ``unknown`` while we wait.
        ``fields`` go with the move the reply makes (``Salvaged._page_one``)."""
        if budget.submits >= self.policy.submits:
            return REST
        why = self._held_back(item, token)  # a page goes out only on an intact checkpoint
        if why is not None:
            if why is not LATER:
                self._move(item, S.NEEDS_REVIEW, token, reason=why)
            return REST
        budget.submits += 1
        self._stage = "submit"
        key, options = self._request(item)
        self._renew(item, token)
        try:
            with self._in_flight(item, token):
                job = self.provider.submit(key, self._paths[item.key], options,
                                           **self._caller(token))
            self.hook("after_submit", item.key, job=job)
        except TimeoutError:
            self.lost_replies += 1
            return self._after_timeout(item, token)
        except ProviderConflict as conflict:
            job = conflict.job  # the key is running already: attach, never duplicate
        except TransientError as exc:  # a definite "not now": nothing was accepted
            self._move(item, S.FAILED, token, failure=TRANSIENT, reason=str(exc), **fields)
            return CONTINUE
        except (PermanentError, KeyReuseError) as exc:
            self._move(item, S.FAILED, token, failure=PERMANENT, reason=str(exc), **fields)
            return CONTINUE
        self.hook("before_commit", item.key, to=S.SUBMITTED)
        # Deferred: lost to a power cut, the job id is found again by lookup (the intent
        # is durable), never submitted twice.
        self._move(item, S.SUBMITTED, token, job_id=job.job_id, sync=False, **fields)
        return CONTINUE

    def _after_timeout(self, item, token):
        return CONTINUE  # no reply proves nothing: stay unknown, reconcile by lookup

    def _look_up(self, item, token, budget, key=None):
        """The provider's job of ``key`` (default: the item's request key); None when "not
        found" is the answer (the contract's lag used up); ``UNANSWERED`` when the lookup
        budget went on tries that got no answer (lookup unavailable, no reply) or on a lag
        not yet used up. The one rule for "not visible yet" against "no such job": every
        lookup of the runner asks here (a finished page's too, ``PageByPage._finished_page``)."""
        self._stage = "lookup"
        key = key or item.request_key
        misses = 0
        limit = max(self.policy.lookups, self.contract.lag + 1)
        while True:
            if budget.lookups >= limit:
                return UNANSWERED
            budget.lookups += 1
            self._renew(item, token)
            try:
                self.hook("during_lookup", item.key)
                with self._in_flight(item, token):
                    job = self.provider.lookup(key)
            except (TransientError, TimeoutError):
                self._backoff(budget.lookups)
                continue
            if job is not None:
                return job
            misses += 1
            if misses > self.contract.lag:
                return None  # the contract's lag is used up: "not found" is now an answer
            self._backoff(budget.lookups)

    def _unknown(self, item, token, budget):
        """Query before resubmitting: the provider's answer, then its contract, decide."""
        if self._all_pages_done(item):  # a page-by-page done, released: no request in flight
            return self._reassemble(item, token)
        item, page = self._page_one(item)  # a long document released before its first page
        job = self._look_up(item, token, budget)
        if job is None:  # a salvaged ledger: a later attempt's, a retry the lost lines held
            job = self._look_up_later(item, token, budget)
        if job is UNANSWERED:
            return REST  # e.g. lookup unavailable: rest unresolved, never guess
        if job is not None:
            self._move(item, S.SUBMITTED, token, job_id=job.job_id, note="found by lookup",
                       sync=False, **page)
            return CONTINUE
        if resubmit_is_safe(self.contract):  # the same key: the provider dedupes
            return self._submit(item, token, budget, **page)
        return self._released_unfound(item, token, budget, page)  # parked, or a release sent

    def _submitted(self, item, token, budget):
        self._stage = "poll"
        self._renew(item, token)
        try:
            with self._in_flight(item, token):
                job = self.provider.poll(item.job_id)
        except (TransientError, TimeoutError):
            job = None
        except PermanentError as exc:  # the provider does not know the job: reconcile by key
            self._move(item, S.UNKNOWN, token, reason=f"job unknown to the provider: {exc}",
                       note="job unknown")
            return CONTINUE
        if job is None or job.status in (JobStatus.QUEUED, JobStatus.RUNNING):
            budget.polls += 1
            if budget.polls > self.policy.polls:
                return REST
            self._backoff(min(budget.polls, 5))
            return CONTINUE
        if job.status is JobStatus.SUCCEEDED:
            return self._fetch(item, job, token, budget)
        if job.status is JobStatus.CANCELLED:
            self._move(item, S.CANCELLED, token, reason="cancelled at the provider")
            return REST
        self._move(item, S.FAILED, token, failure=job.failure or PERMANENT, reason=job.reason)
        return CONTINUE

    def _output_path(self, item) -> Path:
        return roots.output_path(self.out_dir, Path(item.source or item.key).stem, item.key)

    def _fetch(self, item, job, token, budget):
        """Fetch to a temp file, verify, rename, fsync, and only then commit ``done``."""
        self._stage = "fetch"
        final = self._output_path(item)
        part = final.with_name(f"{documents.temp_prefix(final)}{item.key[:12]}.part")
        while budget.fetches < self.policy.fetches:
            budget.fetches += 1
            self._renew(item, token)
            try:
                final.parent.mkdir(parents=True, exist_ok=True)
                with self._in_flight(item, token):
                    self.provider.fetch(job.job_id, part)
            except (TransientError, TimeoutError):
                self._backoff(budget.fetches)
                continue
            except PermanentError as exc:
                self._move(item, S.NEEDS_REVIEW, token, reason=f"artifact not fetchable: {exc}")
                return REST
            except OSError as exc:  # --out not writable here: the job is fine, a rerun fetches
                return self._unstored(final, part, exc)
            self.hook("during_fetch", item.key, path=part)
            if documents.verify(part, job.artifact_size, job.artifact_sha256):
                if self._paged(item):
                    return self._checkpoint(item, job, part, token, budget)
                try:
                    with open(part, "rb") as handle:  # the bytes on disk before the name
                        os.fsync(handle.fileno())
                    os.replace(part, final)
                    documents.fsync_dir(final.parent)
                except OSError as exc:
                    return self._unstored(final, part, exc)
                self.hook("before_commit", item.key, to=S.DONE)
                # Deferred: the artifact is fsynced and nothing is deleted after this
                # commit, so its loss costs a re-fetch (``submitted``), never an execution.
                self._move(item, S.DONE, token, job_id=job.job_id, sync=False,
                           artifact_path=roots.relative(final, self.out_dir),
                           artifact_size=job.artifact_size, artifact_sha256=job.artifact_sha256,
                           **artifacts.stat_fields(final))  # after the rename: it sets ctime
                return REST
            part.unlink(missing_ok=True)  # a half download is never done
        return REST

    def _unstored(self, final, part, exc) -> bool:
        """A local write under --out failed: the item stays ``submitted`` (the provider's
        result is safe and a rerun fetches it, never executes it again).

        Raises:
            OSError: ``exc`` itself when the storage is full or failing (``_unwritable``):
                the batch halts before it starts (and pays for) any other document.
        """
        with contextlib.suppress(OSError):  # first: a halt leaves no half artifact either
            part.unlink(missing_ok=True)
        self._unwritable(final, exc)
        return REST

    def _unwritable(self, target, exc) -> None:
        """The one rule for an artifact that cannot be written under --out.

        Full, failing or read-only storage (``storage.FULL_OR_FAILING``: no space, a quota,
        a file-size limit, EIO; and EROFS) is re-raised: ``Pipeline.run`` halts the batch
        with one line and marks health not-ready, as for the ledger's storage, since every
        further document would be executed and then fail to land. Anything else (a
        directory in the way, no permission) is this item's: named on stderr, the run goes
        on and exits 1.
        """
        if exc.errno in FULL_OR_FAILING or exc.errno == errno.EROFS:  # no write can land
            raise exc
        self.local_errors.append(f"cannot write {target}: {exc.strerror or exc}")

    def _done(self, item, token, budget):
        """A done item whose artifact is damaged is re-fetched, never re-executed."""
        if self._artifact_intact(item):
            self.reused += 1
            return REST
        if item.pages_done is not None:  # assembled from many page jobs
            return self._reassemble(item, token)
        self._renew(item, token)
        try:
            job = self.provider.poll(item.job_id) if item.job_id else None
        except (TransientError, TimeoutError):
            return REST
        except PermanentError:  # the provider does not know the job: nothing to re-fetch
            job = None
        if job is not None and job.status is JobStatus.SUCCEEDED:
            return self._fetch(item, job, token, budget)
        self._move(item, S.NEEDS_REVIEW, token, reason="artifact damaged and not fetchable")
        return REST

    def _failed_transient(self, item, token, budget):
        if budget.submits >= self.policy.submits:
            return REST  # budget spent: a later run retries
        self._backoff(budget.submits)
        fields = {}
        if item.pages_done is not None:  # a long document goes on where its checkpoint ends
            fields["pages_done"] = self._resume_pages(item)
        item = self._move(item, S.UNKNOWN, token, note="retry", **fields)  # new attempt, new key
        return self._send_checked(item, token, budget)


Runner._own_process = Runner.process  # what ``Reuse._reused`` stands in for
