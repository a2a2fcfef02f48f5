"""The scenario stepper's logic, without a widget: a cursor, a pure ``step``, and frames.

``step(cursor, action) -> cursor`` moves through a drill's steps; ``frame(result,
index)`` is everything the stepper shows at one step (the event in words, the
counters, the client ledger and the provider's jobs as tables, the history so
far for the state graph). ``widgets.Stepper`` only wires these to buttons.
"""

import collections
import dataclasses

from toolkit.widgets.moments import moments
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
    """What the stepper shows at one step: one ``moments.Moment`` of the drill."""

    index: int
    count: int
    run: int
    kind: str  # moments.KINDS: event, fault, provider, actor, restart, end
    side: str  # client or provider: who did it
    headline: str
    submit_calls: int
    executions: int
    doubles: int
    ledger: Table
    jobs: Table
    events: tuple  # the ledger's history up to this step, for the state graph
    current: object  # this step's ledger event (None for the other kinds)
    occupancy: dict

    def counters(self) -> str:
        text = f"submit calls {self.submit_calls} \u00b7 executions {self.executions}"
        return text + (f" \u00b7 DOUBLE EXECUTIONS {self.doubles}" if self.doubles else "")

    @property
    def graph_title(self) -> str:
        """The graph's title names its step: graph, headline and tables show the same one."""
        return f"step {self.index + 1}/{self.count} \u00b7 run {self.run + 1} \u00b7 {self.kind}"


# How a design without leases for its submit shows the leases its fetch still takes.
LEASE_NOTES = {"no-lease": "a lease for the fetch only: the submit went out with none"}


def describe(event, sources, strategy="safe") -> str:
    """One event in words: the op, the document, the transition and what it carried."""
    who = sources.get(event.key) or event.key[:8]
    frm = event.frm.value if event.frm is not None else "-"
    detail = event.detail or {}
    if event.op == "add":
        return f"add {who}: a new item, pending"
    if event.op in ("claim", "release"):
        owner = f" by {event.worker}" if event.worker else ""
        lease = LEASE_NOTES.get(strategy, "lease") if isinstance(strategy, str) else "lease"
        return f"{event.op} {who}{owner} ({lease}, token {event.token}); state stays " \
               f"{event.to.value}"
    extra = [f"{label} {detail[name]}" for name, label in (
        ("note", ""), ("job_id", "job"), ("failure", "failure"), ("reason", "reason"))
        if detail.get(name)]
    words = f"move {who}: {frm} \u2192 {event.to.value} (attempt {event.attempt}"
    return words + "".join(f", {e.strip()}" for e in extra) + ")"


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


def frames(result) -> tuple:
    """Every moment of ``result`` (``moments.moments``): what ``frame`` indexes."""
    return moments(result)


def frame(result, index: int, all_moments=None) -> Frame:
    """Everything shown at step ``index`` of ``result`` (a DrillResult).

    ``all_moments``: ``frames(result)``, when the caller keeps them (a stepper does).

    Raises:
        IndexError: ``index`` is outside the drill's moments.
    """
    shown = all_moments if all_moments is not None else moments(result)
    if not 0 <= index < len(shown):
        raise IndexError(f"step {index} of a drill with {len(shown)} steps")
    here = shown[index]
    occupancy = collections.Counter(item.state.value for item in here.items)
    return Frame(
        index=index, count=len(shown), run=here.run, kind=here.kind, side=here.side,
        headline=f"step {index + 1}/{len(shown)} \u00b7 run {here.run + 1} \u00b7 {here.text}",
        submit_calls=here.submit_calls, executions=here.executions, doubles=doubles(here.jobs),
        ledger=ledger_table(here.items, here.key), jobs=jobs_table(here.jobs, here.key),
        events=tuple(m.event for m in shown[:index + 1] if m.event is not None),
        current=here.event, occupancy=dict(occupancy))
