"""The black-box oracle: the provider's own records and the outputs, nothing from the program.

* **double execution**: the same document content with the same options
  executed successfully twice, whatever idempotency keys the program sent
  (a job's input is its content-addressed upload, ``uploads/<sha256>.pdf``);
* **fake done**: a file in ``TOOLKIT_OUT`` whose bytes are no artifact the
  provider produced (a half download, a stale result);
* **lost**: a healthy input executed successfully but with no output equal
  to one of its artifacts once the program rests (``lost_item``); with no
  execution at all it is ``never_processed`` (the program came to rest, exit
  0 twice, without ever sending it: ``true`` passes for nothing); if the
  program never rests, ``unresolved`` (whether that is legitimate is the
  scenario's call: ``BlackboxResult.status``);
* **poison submitted**: an input that fails preflight reached the provider.
"""

import bisect
import collections
import dataclasses
import hashlib
import sqlite3
from pathlib import Path

from toolkit import documents
from toolkit.errors import ToolkitError


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str
    file: str | None
    detail: str
    witnesses: tuple = ()  # dicts: what, run, attempt, idem_key, seconds
    remedy: str = ""  # filled from the one remedy table (checker.findings.REMEDY)

    def __post_init__(self):
        if not self.remedy:
            from toolkit.checker.findings import DEFAULT_REMEDY, REMEDY

            object.__setattr__(self, "remedy", REMEDY.get(self.kind, DEFAULT_REMEDY))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _hidden(relative: Path) -> bool:
    """A file under a hidden name (its own or a folder's: ``.witness.json``, ``.tmp-*``,
    ``.cache/x.pdf``) that is no artifact is a program's bookkeeping or a temp file, never
    a fake done (no user takes a dot file for a result). One with an artifact's bytes is a
    delivery as any (an input named ``.doc.pdf`` gives a hidden output name)."""
    return any(part.startswith(".") for part in relative.parts)


def _records(db_path: Path):
    try:
        return _read_records(db_path)
    except sqlite3.Error as exc:  # never the drill's own doing: something removed or changed it
        raise ToolkitError(f"the drill's provider records {str(db_path)!r} cannot be read "
                           f"({exc}): did the drilled program remove or change them?") from None


def _read_records(db_path: Path):
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        executions = db.execute(
            "SELECT e.seq, e.ts, e.job_id, e.idem_key, e.status, e.artifact_sha256, j.upload, "
            "j.options FROM executions e JOIN jobs j ON j.job_id = e.job_id ORDER BY e.seq"
        ).fetchall()
        calls = db.execute("SELECT seq, ts, op, idem_key, job_id, outcome FROM calls "
                           "ORDER BY seq").fetchall()
        uploads = {Path(row[0]).stem for row in db.execute("SELECT upload FROM jobs")}
    finally:
        db.close()
    return executions, calls, uploads


def _witness(row, what, starts) -> dict:
    tail = str(row["idem_key"] or "").rpartition(":")[2]
    return {"what": what, "run": max(1, bisect.bisect_right(starts, row["ts"])),
            "attempt": int(tail) if tail.isdigit() else None, "idem_key": row["idem_key"],
            "seconds": round(row["ts"] - starts[0], 3)}


def judge(inputs_dir, out_dir, provider_db, run_starts, rested: bool) -> list[Finding]:
    """The findings of a black-box scenario (empty: valid)."""
    executions, calls, uploads = _records(Path(provider_db))
    inputs = sorted(Path(inputs_dir).glob("*.pdf"))
    digest = {path: _sha(path) for path in inputs}
    healthy = {path: documents.preflight(path).ok for path in inputs}
    made = collections.defaultdict(set)  # content digest -> artifacts the provider produced
    runs = collections.defaultdict(list)  # (content digest, options) -> succeeded executions
    for row in executions:
        if row["status"] == "succeeded":
            made[Path(row["upload"]).stem].add(row["artifact_sha256"])
            runs[(Path(row["upload"]).stem, row["options"])].append(row)
    submits = collections.defaultdict(list)
    by_job = {row["job_id"]: Path(row["upload"]).stem for row in executions}
    for call in calls:
        if call["op"] == "submit" and call["job_id"] in by_job:
            submits[by_job[call["job_id"]]].append(call)
    jobs_of = collections.defaultdict(set)  # content digest -> its job ids
    for row in executions:
        jobs_of[Path(row["upload"]).stem].add(row["job_id"])

    def witnesses(path) -> tuple:
        """What the provider's log holds for this input: its executions and the calls on them."""
        jobs = jobs_of.get(digest[path], set())
        rows = [(r["ts"], _witness(r, f"execution {r['status']}, job {r['job_id']}", run_starts))
                for r in executions if r["job_id"] in jobs]
        rows += [(c["ts"], _witness(c, f"{c['op']} ({c['outcome']}), job {c['job_id']}",
                                    run_starts)) for c in calls if c["job_id"] in jobs]
        return tuple(w for _, w in sorted(rows, key=lambda pair: pair[0]))

    found = []
    for path in inputs:
        for (content, options), rows in sorted(runs.items()):
            if content == digest[path] and len(rows) > 1:
                found.append(Finding(
                    "double_execution", path.name,
                    f"{len(rows)} succeeded executions of the same content and options "
                    f"{options}, jobs {', '.join(r['job_id'] for r in rows)}",
                    tuple(_witness(r, f"execution succeeded, job {r['job_id']}", run_starts)
                          for r in rows)))
        if not healthy[path] and digest[path] in uploads:
            found.append(Finding("poison_submitted", path.name,
                                 "an input that fails preflight was sent to the provider",
                                 witnesses(path)))
    outputs = [p for p in sorted(Path(out_dir).rglob("*")) if p.is_file()] \
        if Path(out_dir).is_dir() else []
    every = set().union(*made.values()) if made else set()
    delivered, fakes = set(), []
    for out in outputs:
        sha = _sha(out)
        owners = [path for path in inputs if sha in made.get(digest[path], ())]
        delivered.update(owners)
        if sha not in every and not _hidden(out.relative_to(out_dir)):
            fakes.append(out)
    for out in fakes:
        named = [p for p in inputs if p.stem in out.name]
        found.append(Finding("fake_done", named[0].name if named else None,
                             f"{out.relative_to(out_dir)} ({out.stat().st_size} bytes) is no "
                             "artifact the provider produced: a half download or a stale "
                             "result (a file that is no output, a manifest or a log, belongs "
                             "outside TOOLKIT_OUT)",
                             witnesses(named[0]) if named else ()))
    for path in inputs:
        if healthy[path] and path not in delivered:
            if not rested:
                kind, why = "unresolved", " (the program never came to rest)"
            elif made.get(digest[path]):
                kind, why = "lost_item", ", although it was executed: paid for, not delivered"
            else:  # it rested (exit 0, nothing left to do) and never sent it: lost work
                kind, why = ("never_processed", " and no execution: the program rested without "
                             "ever sending it")
            found.append(Finding(kind, path.name, "no output equal to an artifact the provider "
                                 "produced for it" + why, witnesses(path)))
    return found
