"""A batch written the way a real team would: its own SQLite table, its own retry loop.

Nothing of the toolkit is in here: the team's code only knows a provider with
``submit``, ``poll`` and ``fetch``. ``examples/team_adapter.py`` drills it.
"""

import sqlite3
import time
from pathlib import Path


class TeamBatch:
    """One row per file in ``docs``; a document is sent, awaited, downloaded, marked done."""

    def __init__(self, db_path, provider, out_dir, options=None):
        self.provider, self.out_dir, self.options = provider, Path(out_dir), options or {}
        self.db = sqlite3.connect(db_path, isolation_level=None)
        self.db.execute("CREATE TABLE IF NOT EXISTS docs (name TEXT PRIMARY KEY, status TEXT, "
                        "job_id TEXT, output TEXT, size INTEGER, sha256 TEXT)")

    def status(self, name):
        row = self.db.execute("SELECT status, job_id, output, size, sha256 FROM docs WHERE name=?",
                              (name,)).fetchone()
        return dict(zip(("status", "job_id", "output", "size", "sha256"), row)) if row else None

    def process(self, path, request_id):
        """Translate one file; skipped when the table says done."""
        path = Path(path)
        if (self.status(path.name) or {}).get("status") == "done":
            return
        for attempt in range(1, 4):  # "the API is flaky: retry a few times"
            try:
                job = self.provider.submit(f"{request_id}:{attempt}", path, self.options)
                break
            except (TimeoutError, OSError):
                time.sleep(0)  # back off (shortened for the drills)
        else:
            return
        while job.status in ("queued", "running"):
            job = self.provider.poll(job.job_id)
        out = self.out_dir / f"{path.stem}.translated.pdf"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.provider.fetch(job.job_id, out)
        self.db.execute("INSERT OR REPLACE INTO docs VALUES (?, 'done', ?, ?, ?, ?)",
                        (path.name, job.job_id, str(out), job.artifact_size, job.artifact_sha256))

    def close(self):
        self.db.close()
