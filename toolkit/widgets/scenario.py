"""The scenario stepper's logic, without a widget: a cursor, a pure ``step``, and frames.

``step(cursor, action) -> cursor`` moves through a drill's steps; ``frame(result,
index)`` is everything the stepper shows at one step (the event in words, the
counters, the client ledger and the provider's jobs as tables, the history so
far for the state graph). ``widgets.Stepper`` only wires these to buttons.
"""

import collections
import dataclasses

from toolkit.widgets.results import doubles
from toolkit.widgets.tables import Table

ACTIONS = ("first", "prev", "next", "last")


@dataclasses.dataclass(frozen=True, slots=True)
class Cursor:
    """Position ``index`` among ``count`` steps (0-based)."""

    index: int
    count: int


def step(cursor: Cursor, action) -> Cursor:
    """The cursor after ``action``: first, prev, next, last, or an index (clamped).

    Prev at the first step and next at the last stay put.

    Raises:
        ValueError: an action that is none of these.
    """
    last = max(cursor.count - 1, 0)
    if isinstance(action, bool) or not isinstance(action, (int, str)):
        raise ValueError(f"unknown stepper action {action!r}")
    if isinstance(action, int):
        target = action
    elif action in ACTIONS:
        target = {"first": 0, "prev": cursor.index - 1, "next": cursor.index + 1,
                  "last": last}[action]
    else:
        raise ValueError(f"unknown stepper action {action!r}; one of {ACTIONS} or an index")
    return dataclasses.replace(cursor, index=min(max(target, 0), last))


@dataclasses.dataclass(frozen=True)
class Frame:
    """What the stepper shows at one step."""

    index: int
    count: int
    run: int
    headline: str
    submit_calls: int
    executions: int
    doubles: int
    ledger: Table
    jobs: Table
    events: tuple  # the history up to this step, for the state graph
    current: object  # this step's event (None at the end of a run)
    occupancy: dict

    def counters(self) -> str:
        text = f"submit calls {self.submit_calls} · executions {self.executions}"
        return text + (f" · DOUBLE EXECUTIONS {self.doubles}" if self.doubles else "")


def _sources(result) -> dict:
    return {key: item.source for key, item in result.history.items.items()} | {
        step.event.key: step.event.detail.get("source") for step in result.steps
        if step.event is not None and step.event.op == "add"}


def describe(event, sources) -> str:
    """One event in words: the op, the document, the transition and what it carried."""
    who = sources.get(event.key) or event.key[:8]
    frm = event.frm.value if event.frm is not None else "-"
    detail = event.detail or {}
    if event.op == "add":
        return f"add {who}: a new item, pending"
    if event.op in ("claim", "release"):
        owner = f" by {event.worker}" if event.worker else ""
        return f"{event.op} {who}{owner} (lease, token {event.token}); state stays {event.to.value}"
    extra = [f"{label} {detail[name]}" for name, label in (
        ("note", ""), ("job_id", "job"), ("failure", "failure"), ("reason", "reason"))
        if detail.get(name)]
    words = f"move {who}: {frm} \u2192 {event.to.value} (attempt {event.attempt}"
    return words + "".join(f", {e.strip()}" for e in extra) + ")"


def _end_of_run(result, run) -> str:
    shots = [f"{name} on {_sources(result).get(key) or (key or '?')[:8]}"
             for fired_run, name, key in result.fired if fired_run == run]
    fate = f"fault fired: {'; '.join(shots)}" if shots else "no fault fired"
    return f"end of run {run + 1} ({fate}); the next run starts from what is on disk"


def ledger_table(items, focus=None) -> Table:
    """The client ledger at one moment: one row per item; the ``focus`` key marked."""
    items = sorted(items, key=lambda item: (item.source or "", item.key))
    rows = [{"key": item.key[:8], "source": item.source, "state": item.state.value,
             "attempt": item.attempt, "token": item.token, "job": item.job_id or "",
             "lease": item.lease_owner or ""} for item in items]
    return Table(rows, ["key", "source", "state", "attempt", "token", "job", "lease"],
                 marked=[i for i, item in enumerate(items) if item.key == focus],
                 title="client ledger")


def jobs_table(jobs, focus=None) -> Table:
    """The provider's job table: one row per job, the ``focus`` task's jobs marked.

    ``twice`` flags every job of a task that succeeded more than once.
    """
    succeeded = collections.Counter(job.task_key for job in jobs if job.status == "succeeded")
    rows = [{"job": job.job_id, "task": job.task_key[:8],
             "attempt": job.idem_key.rpartition(":")[2], "status": str(job.status),
             "failure": job.failure or "",
             "twice": "DOUBLE" if succeeded[job.task_key] > 1 else ""} for job in jobs]
    return Table(rows, ["job", "task", "attempt", "status", "failure", "twice"],
                 marked=[i for i, job in enumerate(jobs) if job.task_key == focus],
                 title="provider jobs")


def frame(result, index: int) -> Frame:
    """Everything shown at step ``index`` of ``result`` (a DrillResult).

    Raises:
        IndexError: ``index`` is outside the drill's steps.
    """
    steps = result.steps
    if not 0 <= index < len(steps):
        raise IndexError(f"step {index} of a drill with {len(steps)} steps")
    here = steps[index]
    event = here.event
    sources = _sources(result)
    what = describe(event, sources) if event is not None else _end_of_run(result, here.run)
    occupancy = collections.Counter(item.state.value for item in here.items)
    return Frame(
        index=index, count=len(steps), run=here.run,
        headline=f"step {index + 1}/{len(steps)} · run {here.run + 1} · {what}",
        submit_calls=here.submit_calls, executions=here.executions, doubles=doubles(here.jobs),
        ledger=ledger_table(here.items, event and event.key),
        jobs=jobs_table(here.jobs, event and event.key),
        events=tuple(s.event for s in steps[:index + 1] if s.event is not None),
        current=event, occupancy=dict(occupancy))
