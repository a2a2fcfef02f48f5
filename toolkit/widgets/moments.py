"""Every moment of a drill, in order: ledger events, faults, provider events, restarts.

A drill records a ``Step`` after each ledger event and at the end of each
run, and a ``Shot`` the moment a fault (or another actor) acts. Between two
recorded moments the provider's job table may have changed: each new job is
an *accepted* moment, each job that reached a final status an *executed*
one. ``moments(result)`` merges all of these into one list, so that a
stepper has a frame for the fault (named, where, when), for each thing the
provider did, and for each process restart.

Service faults of the HTTP drills are done by the provider process, which
reports them only at the end; they are placed by their rule: ``slow_submit``
at the first submit, ``cut_fetch`` at the first download (just before the
first ``done``).
"""

import dataclasses

from toolkit.drills.conclusive import CANCEL, RACE
from toolkit.faults import FAULTS, LEDGER_FAULTS

KINDS = ("event", "fault", "provider", "actor", "restart", "end")
LEDGER_FAULT_WORDS = {
    "torn_jsonl_write": ("ledger_write", "the process dies halfway through appending a ledger "
                         "line: a torn line without its newline stays on disk"),
    "disk_full": ("ledger_write", "a ledger write fails: no space left on device"),
}
SERVICE_FAULT_WORDS = {
    "slow_submit": ("submit", "the service holds the reply past the client's socket timeout: "
                    "the job was accepted, the reply is lost"),
    "cut_fetch": ("download", "the service cuts the artifact response halfway"),
}
ACTOR_WORDS = {
    RACE: "two workers reach {doc} at the same moment (the race window)",
    CANCEL: "the operator cancels {doc}, in flight",
    "slow_owner": "the slow owner process ends ({key})",
    "nothing_in_flight": "the operator finds nothing in flight to cancel",
    "pipeline_error": "the pipeline raised: it dies like a crashed process ({key})",
}
FINAL = ("succeeded", "failed", "cancelled")


@dataclasses.dataclass(frozen=True)
class Moment:
    """One frame's worth: what happened (``text``), of which ``kind`` (``KINDS``), on which
    side (client or provider), and the ledger and provider as they stood right after."""

    kind: str
    run: int
    text: str
    items: tuple
    jobs: tuple
    submit_calls: int
    executions: int
    event: object = None  # the ledger event, for kind "event"
    key: str | None = None  # the item concerned, marked in both tables
    side: str = "client"


def sources(result) -> dict:
    """Task key -> source file name, from the history and the drill's ``add`` events."""
    return {key: item.source for key, item in result.history.items.items()} | {
        step.event.key: step.event.detail.get("source") for step in result.steps
        if step.event is not None and step.event.op == "add"}


def _doc(names, key) -> str:
    if key is None:
        return "-"
    return names.get(key) or str(key)[:12]


def shot_words(name, key, names) -> tuple[str, str, str]:
    """``(kind, side, text)`` for a shot: a named fault with where it struck, or an actor."""
    doc = _doc(names, key)
    if name in FAULTS:
        fault = FAULTS[name]
        side = "provider" if fault.point.startswith("ocr_") or fault.action in (
            "timeout", "unavailable") else "client"
        return "fault", side, f"FAULT {name} at {fault.point} on {doc}: {fault.summary}"
    if name in LEDGER_FAULT_WORDS:
        point, words = LEDGER_FAULT_WORDS[name]
        return "fault", "client", f"FAULT {name} at {point}: {words}"
    if name in SERVICE_FAULT_WORDS:
        point, words = SERVICE_FAULT_WORDS[name]
        return "fault", "provider", f"FAULT {name} at the service's {point}: {words}"
    words = ACTOR_WORDS.get(name, name + " ({key})")
    return "actor", "client", words.format(doc=doc, key=key)


def _job_changes(before: dict, after) -> list:
    """``(job, what)`` per change from ``before`` (job_id -> job) to the jobs ``after``:
    accepted first (in job order), then the ones that reached a final status."""
    accepted, finished = [], []
    for job in after:
        old = before.get(job.job_id)
        status = str(job.status)
        if old is None:
            accepted.append((job, "accepted"))
        if status in FINAL and (old is None or str(old.status) != status):
            finished.append((job, status))
    return accepted + finished


def _provider_words(job, what, names) -> str:
    attempt = job.idem_key.rpartition(":")[2]
    doc = _doc(names, job.task_key)
    if what == "accepted":
        return f"provider accepts {job.job_id} for {doc} (attempt {attempt}) and stores it"
    if what == "succeeded":
        return f"provider executes {job.job_id} for {doc}: succeeded (a billed execution)"
    why = f", {job.failure}" if job.failure else ""
    return f"provider ends {job.job_id} for {doc}: {what}{why}"


class _Builder:
    def __init__(self, result):
        self.names = sources(result)
        self.out = []
        self.jobs = {}
        self.items, self.submits, self.execs = (), 0, 0
        self.service = [shot for shot in result.fired if shot[1] in SERVICE_FAULT_WORDS]

    def provider(self, run, jobs, submits, execs):
        """The provider's changes since the last moment, one moment each."""
        for job, what in _job_changes(self.jobs, jobs):
            self.jobs[job.job_id] = job
            if what == "accepted":
                self.submits = min(self.submits + 1, submits)
            elif what == "succeeded":
                self.execs = min(self.execs + 1, execs)
            self.add("provider", run, _provider_words(job, what, self.names), key=job.task_key,
                     side="provider")
            if what == "accepted":
                self.service_fault(run, "slow_submit")
        self.jobs = {job.job_id: job for job in jobs}
        self.submits, self.execs = submits, execs

    def service_fault(self, run, name):
        for shot in [s for s in self.service if s[1] == name]:
            self.service.remove(shot)
            kind, side, text = shot_words(name, shot[2], self.names)
            self.add(kind, run, text, side=side)

    def add(self, kind, run, text, event=None, key=None, side="client", items=None):
        self.out.append(Moment(kind, run, text, self.items if items is None else items,
                               tuple(self.jobs.values()), self.submits, self.execs, event, key,
                               side))


def moments(result) -> tuple[Moment, ...]:
    """Every moment of ``result`` (a DrillResult) in the order it happened."""
    from toolkit.widgets.scenario import describe

    b = _Builder(result)
    shots = list(getattr(result, "shots", ()))
    # Events another process wrote (a slow owner) reach the ledger but not this drill's
    # recorder: each is shown where its seq puts it, said to be another process's.
    recorded = {step.event.seq for step in result.steps if step.event is not None}
    foreign = sorted((e for e in result.history.events if e.seq not in recorded),
                     key=lambda e: e.seq)
    starts = tuple(getattr(result, "run_starts", ())) + (float("inf"),)

    def flush(run, before_seq=None):
        while foreign and (foreign[0].seq < before_seq if before_seq is not None
                           else foreign[0].ts < starts[run + 1]):
            event = foreign.pop(0)
            b.add("event", run, describe(event, b.names, result.drill.strategy)
                  + " [written by another process]", event=event, key=event.key)

    for i, step in enumerate(result.steps):
        if i and step.run != result.steps[i - 1].run:
            b.add("restart", step.run, f"restart: a new process, run {step.run + 1}, opens the "
                  "ledger fresh and starts from what is on disk")
        while shots and shots[0].after <= i:
            shot = shots.pop(0)
            b.provider(shot.run, shot.jobs, shot.submit_calls, shot.executions)
            kind, side, text = shot_words(shot.name, shot.key, b.names)
            b.add(kind, shot.run, text, key=shot.key if isinstance(shot.key, str) else None,
                  side=side)
        b.provider(step.run, step.jobs, step.submit_calls, step.executions)
        b.items = step.items
        event = step.event
        if event is None:
            flush(step.run)
            b.add("end", step.run, _end_of_run(result, step.run, b.names))
            continue
        flush(step.run, event.seq)
        if event.op == "move" and event.to.value == "done":
            b.service_fault(step.run, "cut_fetch")
        b.add("event", step.run, describe(event, b.names, result.drill.strategy), event=event,
              key=event.key)
    for shot in shots:  # after the last step (none in the catalogue; kept, never dropped)
        kind, side, text = shot_words(shot.name, shot.key, b.names)
        b.add(kind, shot.run, text, side=side)
    return tuple(b.out)


def _end_of_run(result, run, names) -> str:
    shots = [f"{name} ({key})" if name in SERVICE_FAULT_WORDS else f"{name} on {_doc(names, key)}"
             for fired_run, name, key in result.fired if fired_run == run]
    crashed = any(name in FAULTS and FAULTS[name].action in ("crash", "truncate_crash")
                  or name == "torn_jsonl_write"
                  for fired_run, name, _ in result.fired if fired_run == run)
    how = "the process died" if crashed else "the process exits"
    fate = f"faults and actors: {'; '.join(dict.fromkeys(shots))}" if shots else "no fault fired"
    return f"end of run {run + 1}: {how} ({fate})"


__all__ = ["Moment", "moments", "sources", "shot_words", "KINDS", "LEDGER_FAULTS"]
