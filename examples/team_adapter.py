"""Drill the team's batch (``team_pipeline.TeamBatch``) without changing a line of it.

The adapter is a ``toolkit.runner.Pipeline``. It hands the team's code a
provider whose calls pass through the drill's fault points, and after each
document it mirrors the team's own table into the toolkit's ledger, so the
checker judges what the team's design recorded, and when:

    python -m toolkit drill all --strategy examples.team_adapter:TeamAdapter
"""

from toolkit.ledger import State
from toolkit.runner import Pipeline

from examples.team_pipeline import TeamBatch

S = State


class HookedProvider:
    """The provider as the team's code sees it, with the drill's fault points on its calls."""

    def __init__(self, provider, pipeline):
        self._provider, self._pipeline = provider, pipeline
        self.contract = provider.contract

    def submit(self, request_id, path, options):
        key = self._pipeline.current
        job = self._provider.submit(request_id, path, options)
        self._pipeline.hook("after_submit", key, job=job)  # a lost reply or a crash lands here
        return job

    def poll(self, job_id):
        return self._provider.poll(job_id)

    def fetch(self, job_id, dest):
        job = self._provider.fetch(job_id, dest)
        self._pipeline.hook("during_fetch", self._pipeline.current, path=dest)
        return job


class TeamAdapter(Pipeline):
    name = "team"

    def __init__(self, ledger, provider, out_dir, **options):
        super().__init__(ledger, provider, out_dir, **options)
        self.team = None  # opened in the thread that runs the batch (sqlite3's rule)
        self.current = None

    def process(self, key):
        if self.team is None:
            self.team = TeamBatch(self.out_dir.parent / "team.db",
                                  HookedProvider(self.provider, self), self.out_dir, self.options)
        self.current = key
        path = self._paths[key]
        self.team.process(path, request_id=key)  # the team's own identity: content + options
        self._mirror(key, self.team.status(path.name))
        return self.ledger.get(key)

    def _mirror(self, key, row):
        """The team's table, as ledger transitions (recorded after the fact, as it was)."""
        item = self.ledger.get(key)
        if row is None or row["status"] != "done" or item.state is S.DONE:
            return
        for frm, to, fields in ((S.PENDING, S.UNKNOWN, {}),
                                (S.UNKNOWN, S.SUBMITTED, {"job_id": row["job_id"]}),
                                (S.SUBMITTED, S.DONE, {"artifact_path": row["output"],
                                                       "artifact_size": row["size"],
                                                       "artifact_sha256": row["sha256"]})):
            if self.ledger.get(key).state is frm:
                self.ledger.move(key, frm, to, worker=self.worker, **fields)

    def run(self, inputs):
        counts = super().run(inputs)
        if self.team is not None:  # closed in the thread that opened it
            self.team.close()
            self.team = None
        return counts
