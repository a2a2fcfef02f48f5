"""Long documents page by page: the half of the safe runner that checkpoints and resumes.

A document routed page by page (``page_by_page_from``) is a chain of page
requests, each with its own key (``<task>#p<n>:<attempt>``) and the same
intent → submit → lookup → fetch-and-verify path as a whole document. After
each verified page the runner appends it to a checkpoint and commits
``partial`` with the page count, the checkpoint's size and SHA-256; a later
run resumes at the next page, never at page 1. The last page turns the
checkpoint into the output and commits ``done``.

Order, and why it is crash-safe:

    fetch page n to a temp file, verify it against the job
    write checkpoint n (a new file: <key>.<n>.pdf; temp, fsync, rename)
    commit partial(n) pointing at checkpoint n    <- a crash before: checkpoint n-1 intact
    delete the other checkpoints of this key      <- a crash before: a stale file, no harm

A page is sent only on an intact checkpoint of the pages before it. A damaged
or missing one (``rm -rf out/.checkpoints``) is first rebuilt from the finished
pages' jobs (``_restored``): each page fetched again, never executed again,
joined as the checkpoints were, and kept only with the SHA-256 ``partial``
recorded; the provider cannot answer now: the item rests as it is for a later
run; it no longer holds a page, or they join to other bytes: the item is parked
(the finished pages are no longer proven). A page's job is looked up under the
contract's lag like any request (``Runner._look_up``): a job the lookup cannot
see yet is asked again, and only "not found" after the lag is "no such job".
"""

import hashlib
import os
from pathlib import Path

from toolkit import documents, roots
from toolkit.errors import PermanentError, TransientError
from toolkit.identity import idem_key, page_key
from toolkit.ledger import State
from toolkit.provider import JobStatus
from toolkit.runner.artifacts import stat_fields
from toolkit.runner.pipeline import PAGE_BY_PAGE, _Budget
from toolkit.runner.salvaged import UNANSWERED

S = State
CONTINUE, REST = True, False
DAMAGED = "checkpoint of the finished pages is damaged or missing"
LATER = object()  # ``_restored``: the provider did not answer; the item rests as it is


class PageByPage:
    """Mixed into ``Runner``: it uses the runner's ``_move``, ``_intent`` and ``_output_path``."""

    def _paged(self, item) -> bool:
        return item.key in self._pages

    def _request(self, item) -> tuple[str, dict]:
        """The idempotency key and options of the request in flight: the document or a page."""
        if item.pages_done is None:
            return item.request_key, self.options
        return item.request_key, {**self.options, PAGE_BY_PAGE: True,
                                  "page": item.pages_done + 1}

    def _all_pages_done(self, item) -> bool:
        """Whether every page of a long document is done (a page-by-page ``done`` released
        by ``resolve``: ``unknown`` with ``pages_done`` its page count): no page is left to
        send or look up, only its output to verify or assemble again (``_reassemble``)."""
        return item.pages_done is not None and item.key in self._pages and \
            item.pages_done >= self._pages[item.key]

    def _unsendable(self, item) -> str | None:
        """Why the next page of a long document must not be sent (None: send it).
        "No page left" comes first: a checkpoint rebuilt never makes a page past the last."""
        if item.pages_done is None:
            return None  # a whole document
        if item.pages_done >= self._pages.get(item.key, 0):
            return "no page left to send: the pages are done, their assembly is not verified"
        if item.pages_done and not self._artifact_intact(item):
            return DAMAGED
        return None

    def _resume_pages(self, item) -> int | None:
        """Pages kept when a long document goes on: all that are checkpointed."""
        return item.pages_done

    def _partial(self, item, token, budget):
        """Resume a long document at its next page, from an intact checkpoint only (rebuilt
        from its pages' jobs if it was lost or damaged: ``_restored``)."""
        why = self._held_back(item, token)
        if why is not None:
            if why is not LATER:
                self._move(item, S.NEEDS_REVIEW, token, reason=why)
            return REST
        return self._intent(item, token, budget, pages_done=self._resume_pages(item))

    def _held_back(self, item, token):
        """``_unsendable``, once a lost or damaged checkpoint was rebuilt if it could be:
        None (send), ``LATER`` (the provider did not answer: rest as it is), or why not."""
        why = self._unsendable(item)
        if why != DAMAGED:
            return why
        restored = self._restored(item, token)
        return restored if restored is None or restored is LATER else f"{why}: {restored}"

    def _restored(self, item, token):
        """Rebuild the checkpoint of pages 1..``pages_done`` at its recorded path from the
        pages' finished jobs (``_rejoin``). None once it is there with the recorded SHA-256;
        ``LATER`` when the provider did not answer or a file under --out could not be
        written (nothing changed: a later run tries again); else why not (parks the item)."""
        target = self._artifact_file(item)
        try:
            whole = self._rejoin(item, target, token)
        except (TransientError, TimeoutError):
            return LATER
        except OSError as exc:  # e.g. .checkpoints removed meanwhile: nothing recorded changed
            self._unwritable(target, exc)  # full or failing storage: re-raised, the run halts
            return LATER
        except PermanentError as exc:
            return f"its pages could not be fetched again: {exc}"
        return None if whole else "its pages fetched again join to other bytes"

    def _checkpoint_dir(self) -> Path:
        return self.out_dir / ".checkpoints"

    def _checkpoint(self, item, job, part, token, budget):
        """Append a verified page to the checkpoint; commit ``partial``, or ``done`` at the end."""
        page, total = item.pages_done + 1, self._pages[item.key]
        if item.pages_done and not self._artifact_intact(item):
            # the page in hand waits: a later run fetches it
            restored = self._restored(item, token)
            if restored is LATER:
                part.unlink(missing_ok=True)
                return REST
            if restored is not None:
                part.unlink(missing_ok=True)
                self._move(item, S.NEEDS_REVIEW, token, reason="checkpoint damaged before page "
                           f"{page}: the finished pages are not proven; {restored}")
                return REST
        last = page == total
        target = self._output_path(item) if last else \
            self._checkpoint_dir() / f"{item.key}.{page:04d}.pdf"
        earlier = [self._artifact_file(item)] if item.pages_done else []
        try:
            mode = os.stat(part).st_mode & 0o777  # what a new file gets here (the umask's)
            made = documents.concat([*earlier, part], target)  # temp file, fsync, rename
            os.chmod(made.path, mode)  # the temp file was 0600: outputs look alike either way
        except OSError as exc:  # the checkpoint removed since it was checked: still submitted,
            return self._unstored(target, part, exc)  # a later run rebuilds, fetches this page
        part.unlink(missing_ok=True)
        to = S.DONE if last else S.PARTIAL
        self.hook("before_commit", item.key, to=to)
        self._move(item, to, token, job_id=job.job_id, pages_done=page,
                   artifact_path=roots.relative(made.path, self.out_dir),
                   artifact_size=made.size, artifact_sha256=made.sha256,
                   **stat_fields(made.path))
        self._drop_checkpoints(item, keep=None if last else made.path)
        if last:
            return REST
        self.hook("after_checkpoint", item.key, page=page)
        budget.reset()  # the next page is a new request
        return CONTINUE

    def _drop_checkpoints(self, item, keep: str | None) -> None:
        """Delete this document's checkpoints but ``keep`` (the ledger's; after the commit)."""
        for path in self._checkpoint_dir().glob(f"{item.key}.*.pdf"):
            if str(path) != keep:
                path.unlink(missing_ok=True)

    def _reassemble(self, item, token):
        """A page-by-page ``done`` whose file is damaged (or such a ``done`` released to
        ``unknown``, ``_all_pages_done``): fetch every page again, join them as the
        checkpoints did, and accept only the recorded SHA-256 (``_rejoin``); ``done`` with
        the file written. Never re-executed."""
        final = self._output_path(item)
        try:
            whole = self._rejoin(item, final, token)
        except (TransientError, TimeoutError):
            return REST  # try again in a later run
        except OSError as exc:  # still done with its old file: a later run assembles again
            self._unwritable(final, exc)  # full or failing storage: re-raised, the run halts
            return REST
        except PermanentError as exc:
            self._move(item, S.NEEDS_REVIEW, token, reason=f"assembled artifact damaged: {exc}")
            return REST
        if not whole:
            self._move(item, S.NEEDS_REVIEW, token, reason="assembled artifact damaged and its "
                       "pages join to other bytes")
            return REST
        self._move(item, S.DONE, token, note="assembled again from its pages' jobs",
                   artifact_path=roots.relative(final, self.out_dir), **stat_fields(final))
        return REST

    def _rejoin(self, item, target, token) -> bool:
        """Pages 1..``pages_done`` fetched from their finished jobs and joined (``_join_pages``),
        placed at ``target`` only with the recorded size and SHA-256: True; False when they
        join to other bytes (nothing placed).

        The join is held in memory, never in a working file under ``.checkpoints``: an
        operator cleaning that folder (or another run rebuilding the same key) cannot take
        it away halfway, and bytes that vanished are never mistaken for "other bytes".

        Raises:
            PermanentError: a page has no finished job, or came damaged.
            TransientError, TimeoutError: the provider did not answer now.
            OSError: a file under --out could not be written or vanished while it was read
                (``_unwritable`` decides: a halt, or this item's error).
        """
        folder = self._checkpoint_dir()
        folder.mkdir(parents=True, exist_ok=True)
        data = self._join_pages(item, folder, token)
        if len(data) != item.artifact_size or \
                hashlib.sha256(data).hexdigest() != item.artifact_sha256:
            return False
        documents.write_atomic(data, target)  # temp, fsync, rename, fsync of the folder
        return True

    def _join_pages(self, item, folder, token) -> bytes:
        """Fetch pages 1..``pages_done`` from their finished jobs and join them page after
        page, exactly as the checkpoints were (the same bytes). Each page's file is read
        once, verified in memory and removed.

        Raises:
            PermanentError: a page has no finished job, or came damaged.
            TransientError, TimeoutError: the provider did not answer now.
            OSError: a page's file could not be written, or vanished before it was read.
        """
        joined = None
        for page in range(1, item.pages_done + 1):
            job = self._finished_page(item, page, token)
            if job is None:
                raise PermanentError(f"page {page} has no finished job to fetch")
            part = folder / f"{item.key}.p{page:04d}.part"
            try:
                self.provider.fetch(job.job_id, part)
                data = part.read_bytes()
            finally:
                part.unlink(missing_ok=True)
            if len(data) != job.artifact_size or \
                    hashlib.sha256(data).hexdigest() != job.artifact_sha256:
                raise PermanentError(f"page {page} fetched damaged")
            joined = documents.joined([joined, data] if page > 1 else [data])
        return joined

    def _finished_page(self, item, page: int, token):
        """The succeeded job of one page: its key under the newest attempt that has one,
        each key looked up as any request is (``Runner._look_up``, its own lookups): a job
        a lagging lookup cannot see yet is asked again, never taken for "no job".

        Raises:
            TransientError: a lookup got no answer (a later run asks again).
        """
        for attempt in range(item.attempt, 0, -1):
            key = idem_key(page_key(item.key, page), attempt)
            job = self._look_up(item, token, _Budget(), key=key)
            if job is UNANSWERED:
                raise TransientError(f"page {page}: the lookup of its job got no answer")
            if job is not None and job.status is JobStatus.SUCCEEDED:
                return job
        return None
