"""Two pipelines under test, written against the toolkit's ``Pipeline`` protocol.

``HopefulPipeline`` is what many batch scripts look like: it records that it
started, submits, and when the call times out it simply sends the document
again. ``CarefulPipeline`` is the same script with the one habit that
matters: after a timeout (or a crash) it asks the provider before sending
anything again. Drill them:

    python -m toolkit drill all --strategy examples.my_pipeline:HopefulPipeline
    python -m toolkit drill lost-reply --strategy examples.my_pipeline:CarefulPipeline
"""

import hashlib
import os

from toolkit.errors import ToolkitError
from toolkit.identity import idem_key
from toolkit.ledger import State
from toolkit.runner import Pipeline

S = State


class HopefulPipeline(Pipeline):
    """Submit, wait, download; on a timeout, try again."""

    def process(self, key):
        item = self.ledger.get(key)
        if item.state is S.PENDING:
            self.hook("before_intent", key)
            item = self.ledger.move(key, S.PENDING, S.UNKNOWN, worker=self.worker)
            self.hook("after_intent", key)
        if item.state is not S.UNKNOWN:
            return item
        for _ in range(3):
            try:
                job = self.submit(item)
                break
            except TimeoutError:
                continue  # "it timed out, so it did not happen": send it again
            except ToolkitError:
                return item
        else:
            return item
        return self.finish(item, job)

    def submit(self, item):
        job = self.provider.submit(idem_key(item.key, item.attempt), self._paths[item.key],
                                   self.options)
        self.hook("after_submit", item.key, job=job)
        return job

    def finish(self, item, job):
        item = self.ledger.move(item.key, S.UNKNOWN, S.SUBMITTED, worker=self.worker,
                                job_id=job.job_id)
        return self.download(item, job)

    def download(self, item, job):
        while job.status in ("queued", "running"):
            job = self.provider.poll(job.job_id)
        out = self.out_dir / f"{item.key[:16]}.pdf"
        out.parent.mkdir(parents=True, exist_ok=True)
        self.provider.fetch(job.job_id, out)  # straight into place, never checked
        self.hook("during_fetch", item.key, path=out)
        self.hook("before_commit", item.key, to=S.DONE)
        return self.ledger.move(item.key, S.SUBMITTED, S.DONE, worker=self.worker,
                                artifact_path=str(out), artifact_size=job.artifact_size,
                                artifact_sha256=job.artifact_sha256)


class CarefulPipeline(HopefulPipeline):
    """The same script, but an unanswered submit is looked up, never repeated,
    and a download is verified before it is called done."""

    def process(self, key):
        item = self.ledger.get(key)
        if item.state is S.SUBMITTED:  # accepted earlier; its artifact is not verified yet
            return self.download(item, self.provider.poll(item.job_id))
        if item.state is S.UNKNOWN:  # a crash or a timeout left us not knowing
            job = self.provider.lookup(idem_key(key, item.attempt))
            if job is not None:
                return self.finish(item, job)
            return self.ledger.move(key, S.UNKNOWN, S.NEEDS_REVIEW, worker=self.worker,
                                    reason="no job found; not resubmitting blindly")
        if item.state is not S.PENDING:
            return item
        self.hook("before_intent", key)
        item = self.ledger.move(key, S.PENDING, S.UNKNOWN, worker=self.worker)
        self.hook("after_intent", key)
        try:
            job = self.submit(item)
        except TimeoutError:
            return self.process(key)  # look it up, right now
        except ToolkitError:
            return item
        return self.finish(item, job)

    def download(self, item, job):
        while job.status in ("queued", "running"):
            job = self.provider.poll(job.job_id)
        out = self.out_dir / f"{item.key[:16]}.pdf"
        part = out.with_suffix(".part")
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.provider.fetch(job.job_id, part)  # to a temporary name first
        except (TimeoutError, ToolkitError):
            return item  # still submitted: the next run fetches again
        self.hook("during_fetch", item.key, path=part)
        if hashlib.sha256(part.read_bytes()).hexdigest() != job.artifact_sha256:
            part.unlink()
            return item  # a cut or damaged download is never done
        os.replace(part, out)
        self.hook("before_commit", item.key, to=S.DONE)
        return self.ledger.move(item.key, S.SUBMITTED, S.DONE, worker=self.worker,
                                artifact_path=str(out), artifact_size=job.artifact_size,
                                artifact_sha256=job.artifact_sha256)
