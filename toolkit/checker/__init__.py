"""Invariants over a history: the oracle of every drill (DESIGN.md, rules 1-8).

``check(history)`` reads the client ledger's events and final items, the
provider's call log and executions and what is on disk, and returns a
``Verdict`` as data: ``valid`` (True, False, None when it cannot decide) and
anomalies by kind with the witnesses that prove them; ``explain`` says one in
a sentence. These types are ``checker.model``, re-exported here. It never raises on an odd history. Events and calls are each
ordered by ``seq`` and meet by ``ts``; at equal ``ts`` a call counts first.
The JSONL fixture format (``fixtures/histories``) is ``load_history``'s
(``checker.fixtures``).

A document processed page by page is many units of work, one per page
(``<task>#p<n>``, ``identity.page_key``): execution and submit rules count
per unit, ledger rules per document, and its ``done`` must be backed by a
succeeded execution of every page it records.
"""

import collections
import dataclasses

from toolkit.checker.model import (KINDS, Anomaly, ArtifactOnDisk, Call,  # noqa: F401 - re-exported
                                   Execution, History, Verdict)
from toolkit.identity import document_of, page_key
from toolkit.ledger import Event, Item, State, apply_event
from toolkit.ledger.transitions import ARTIFACT_FIELDS, why_illegal

S = State
TURNED_AWAY = frozenset({"transient", "rejected"})  # the provider accepted nothing
ANSWERED = frozenset({"found", "not_found"})  # a lookup that told the client something
SILENT = frozenset({"unavailable", "timeout", "transient"})  # a poll/fetch that told nothing


# -- helpers -----------------------------------------------------------------------
def _is(value, state: State) -> bool:
    return value == state.value  # State is a str enum: true for State and plain strings


def _as_state(value) -> State | None:
    try:
        return State(value)
    except ValueError:
        return None


def _t(ts) -> str:
    return f"t={ts:g}" if isinstance(ts, (int, float)) else f"t={ts}"


def _group(records, key, status=None) -> dict:
    """Records by ``key(record)``, each list ordered by seq."""
    grouped = collections.defaultdict(list)
    for record in sorted(records or (), key=lambda r: r.seq):
        if status is None or record.status == status:
            grouped[key(record)].append(record)
    return grouped


def _calls_by_task(h: History) -> dict[str, list[Call]]:
    """Calls per task key: named, or from ``task:attempt``, or via the job id (polls)."""
    jobs = {c.job_id: c.task_key for c in h.calls or () if c.job_id and c.task_key}
    jobs.update({x.job_id: x.task_key for x in h.executions or () if x.job_id and x.task_key})

    def task(c):
        if c.task_key or (c.idem_key and ":" in c.idem_key):
            return c.task_key or c.idem_key.rpartition(":")[0]
        return jobs.get(c.job_id)
    return _group(h.calls, task)


def _calls_by_item(h: History) -> dict[str, list[Call]]:
    """Calls per ledger item: the pages of a document count as the document's."""
    grouped = collections.defaultdict(list)
    for unit, calls in _calls_by_task(h).items():
        grouped[unit if unit is None else document_of(unit)].extend(calls)
    for calls in grouped.values():
        calls.sort(key=lambda c: c.seq)
    return grouped


def _sorted(grouped: dict):
    return sorted(grouped.items(), key=lambda kv: str(kv[0]))


# -- the invariants ------------------------------------------------------------------
def _double_execution(h: History):
    """No task executes successfully twice (the billable side effect happens once)."""
    for task, xs in _sorted(_group(h.executions, lambda x: x.task_key, "succeeded")):
        if len(xs) > 1:
            jobs = ", ".join(dict.fromkeys(str(x.job_id) for x in xs))
            yield Anomaly("double_execution", task, f"{len(xs)} succeeded executions, "
                          f"jobs {jobs}", tuple(xs))


def _submit_after_done(h: History):
    """Once done, no submit and no new intent -- unless an operator released it from review."""
    events, calls = _group(h.events, lambda e: e.key), _calls_by_item(h)
    for key in sorted(k for k in set(events) | set(calls) if k is not None):
        # at equal ts a call ranks before an event: "after done" means strictly later
        timeline = sorted([(c.ts, 0, i, c) for i, c in enumerate(calls[key]) if c.op == "submit"]
                          + [(e.ts, 1, i, e) for i, e in enumerate(events[key]) if e.op == "move"],
                          key=lambda row: row[:3])
        done = None
        for *_, what in timeline:
            if isinstance(what, Call):
                if done is not None:
                    yield Anomaly("submit_after_done", key, f"submit of {what.idem_key} at "
                                  f"{_t(what.ts)}, done since {_t(done.ts)}", (done, what))
            elif _is(what.to, S.DONE):
                done = done or what
            elif _is(what.frm, S.NEEDS_REVIEW) and _is(what.to, S.UNKNOWN):
                done = None  # an operator released it: it may be reconciled again
            elif _is(what.to, S.UNKNOWN) and done is not None:
                yield Anomaly("submit_after_done", key, f"intent for attempt {what.attempt} "
                              f"at {_t(what.ts)}, done since {_t(done.ts)}", (done, what))


def _fake_done(h: History):
    """Done means a verified artifact: on disk, same size and SHA-256, made by an execution."""
    made = None if h.executions is None else _group(h.executions, lambda x: x.task_key,
                                                    "succeeded")
    events = _group(h.events, lambda e: e.key)
    for key, item in sorted(h.items.items()):
        if not _is(item.state, S.DONE):
            continue
        art, reasons = h.artifacts.get(key), []
        if art is None or not art.exists:
            reasons.append("its artifact is missing on disk")
        else:
            if item.artifact_sha256 is None:
                reasons.append("done records no SHA-256")
            elif art.sha256 != item.artifact_sha256:
                reasons.append("the SHA-256 on disk differs from the recorded one")
            if art.size != item.artifact_size:
                reasons.append(f"{art.size} bytes on disk but {item.artifact_size} recorded")
        if made is not None and isinstance(item.pages_done, int):  # assembled from its pages
            missing = [n for n in range(1, item.pages_done + 1) if not made[page_key(key, n)]]
            pages = (h.inputs.get(key) or {}).get("pages")
            if not item.pages_done:
                reasons.append("done by pages, but no finished page is recorded")
            elif pages is not None and item.pages_done != pages:
                reasons.append(f"done after page {item.pages_done} of {pages}")
            elif missing:
                reasons.append(f"page(s) {missing} of {item.pages_done} have no succeeded "
                               "execution")
        elif made is not None and item.artifact_sha256 not in {
                x.artifact_sha256 for x in made[key] if x.artifact_sha256}:
            reasons.append("the recorded SHA-256 matches no succeeded execution")
        if reasons:
            dones = [e for e in events[key] if e.op == "move" and _is(e.to, S.DONE)]
            claim = dones[-1] if dones else item
            yield Anomaly("fake_done", key, "; ".join(reasons),
                          (claim,) if art is None else (claim, art))


def _inputs(h: History):
    """Every input ends as an item (any state, parked included); poison is never submitted."""
    calls, xs = _calls_by_item(h), _group(h.executions, lambda x: document_of(x.task_key))
    for key, info in sorted(h.inputs.items()):
        info = info or {}
        if key not in h.items:
            yield Anomaly("lost_item", key, f"input {info.get('source') or key} has no item "
                          "in the ledger", (*calls[key], *xs[key]))
        submits = tuple(c for c in calls[key] if c.op == "submit")
        if info.get("poison") and submits:
            yield Anomaly("poison_submitted", key, f"{len(submits)} submit call(s), first "
                          f"with key {submits[0].idem_key}", submits)


def _unrecorded_execution(h: History):
    """Intent before side effect: an execution needs an earlier move to unknown in the ledger."""
    if not h.events or h.executions is None:
        return  # a strategy without a ledger cannot be judged on it
    intents, pages = collections.defaultdict(list), {}
    for e in sorted(h.events, key=lambda e: e.seq):
        if isinstance(e.detail, dict) and "pages_done" in e.detail:
            pages[e.key] = e.detail["pages_done"]
        if e.op == "move" and _is(e.to, S.UNKNOWN):  # the intent of the document or its next page
            done = pages.get(e.key)
            intents[e.key if done is None else page_key(e.key, done + 1)].append(e.ts)
    calls = _calls_by_task(h)
    for task, xs in _sorted(_group(h.executions, lambda x: x.task_key)):
        first = min((c for c in calls[task] if c.op == "submit"), key=lambda c: c.ts, default=None)
        ref = first.ts if first else min(x.ts for x in xs)
        if not any(ts <= ref for ts in intents[task]):
            what = "first submit" if first else "first execution"
            yield Anomaly("unrecorded_execution", task, f"{len(xs)} execution(s), {what} at "
                          f"{_t(ref)}, no intent recorded by then", (first, *xs) if first else xs)


def _learned(calls: list[Call], i: int, j: int, recorded: list) -> bool:
    """Did the client learn what submit ``calls[i]`` did before submit ``calls[j]``?"""
    first = calls[i]
    if first.job_id and any(job == first.job_id and first.ts <= ts <= calls[j].ts
                            for ts, job in recorded):
        return True  # the ledger recorded the job id in between: the reply arrived
    return any((c.idem_key == first.idem_key or (first.job_id and c.job_id == first.job_id))
               and c.op != "submit" and (c.outcome in ANSWERED if c.op == "lookup"
                                         else c.outcome not in SILENT)
               for c in calls[i + 1:j])


def _blind_resubmit(h: History):
    """Query before resubmitting: a submit after one whose outcome is unknown is blind.

    The same key again with no answered lookup between is blind unless the
    contract dedupes forever (idempotent keys, no retention limit). A *new*
    key while an earlier submit's fate is unknown is blind under any contract:
    the provider cannot dedupe two different keys. A submit the provider
    turned away (transient, rejected) accepted nothing and leaves nothing unknown.
    """
    exempt = h.idempotent_keys and h.key_retention is None
    events = _group(h.events, lambda e: e.key)
    for task, calls in _sorted(_calls_by_task(h)):
        jobs = [(e.ts, e.detail.get("job_id")) for e in events[document_of(str(task))]
                if isinstance(e.detail, dict)]
        submits = [i for i, c in enumerate(calls) if c.op == "submit"]
        for n, j in enumerate(submits):
            open_ = [i for i in submits[:n] if calls[i].outcome not in TURNED_AWAY]
            same = [i for i in open_ if calls[i].idem_key == calls[j].idem_key][-1:]
            if same and not exempt and not any(
                    c.op == "lookup" and c.idem_key == calls[j].idem_key
                    and c.outcome in ANSWERED for c in calls[same[0] + 1:j]):
                blind = (same[0], "no lookup of that key in between")
            else:
                other = [i for i in open_ if calls[i].idem_key != calls[j].idem_key
                         and not _learned(calls, i, j, jobs)]
                blind = (other[-1], "its outcome never learned") if other else None
            if blind is not None:
                first, call = calls[blind[0]], calls[j]
                yield Anomaly("blind_resubmit", task, f"submit of {call.idem_key} at "
                              f"{_t(call.ts)} after submit of {first.idem_key} at "
                              f"{_t(first.ts)} ({first.outcome}), {blind[1]}", (first, call))


def _execution_by_lease_loser(h: History):
    """A submit by a worker whose fencing token another claim had already superseded."""
    claims: dict[str, list[Event]] = collections.defaultdict(list)
    for e in h.events:
        if e.op == "claim":
            claims[e.key].append(e)
    for call in h.calls or ():
        if call.op != "submit" or call.token is None or call.worker is None:
            continue
        key = document_of(call.task_key) if call.task_key else None
        newer = [e for e in claims.get(key, ()) if e.token > call.token and e.ts <= call.ts
                 and e.worker != call.worker]
        if newer:
            yield Anomaly("execution_by_lease_loser", key, f"submit of {call.idem_key} by "
                          f"{call.worker} with token {call.token} at {_t(call.ts)}, after "
                          f"{newer[0].worker} claimed token {newer[0].token} at "
                          f"{_t(newer[0].ts)}", (newer[0], call))


def _illegal_transition(h: History):
    """Every move is legal by the ledger's ``why_illegal``, from the state the fold says."""
    items: dict[str, Item] = {}
    for e in sorted(h.events, key=lambda e: e.seq):
        item, frm, to = items.get(e.key), _as_state(e.frm), _as_state(e.to)
        why = None
        if e.op == "move":
            if item is None:
                why = "move before the item was added"
            elif frm is not item.state:
                why = f"move from {e.frm} but the item was {item.state}"
            else:  # the ledger's own policy, applied to what the event did
                after = {name: e.detail.get(name, getattr(item, name))
                         for name in ("failure", *ARTIFACT_FIELDS)}
                why = why_illegal(frm, to, item.failure, after)
        elif e.op in ("claim", "release") and item is not None and (
                frm is not item.state or to is not item.state):
            why = f"{e.op} changed the state {item.state} -> {e.to}"
        if why:
            yield Anomaly("illegal_transition", e.key, f"event {e.seq}: {why}", (e,))
        if to is not None and (item is not None or e.op == "add"):
            try:
                # a copy only when ``to`` was read from a plain string (a JSONL/odd record)
                moved = e if e.to is to else dataclasses.replace(e, to=to)
                items[e.key] = apply_event(item, moved)
            except (TypeError, AttributeError, ValueError):
                pass  # an odd detail: keep the state we knew


RULES = (_double_execution, _submit_after_done, _fake_done, _inputs, _unrecorded_execution,
         _blind_resubmit, _execution_by_lease_loser, _illegal_transition)


def check(history: History) -> Verdict:
    """Judge a history; never raises. ``valid`` is None when the records cannot decide."""
    found: dict[str, list[Anomaly]] = {}
    notes = []
    for rule in RULES:
        try:
            for anomaly in rule(history):
                found.setdefault(anomaly.kind, []).append(anomaly)
        except Exception as exc:  # an odd history makes a rule undecided, never a crash
            notes.append(f"{rule.__name__.strip('_')} could not judge: {exc!r}")
    if history.calls is None:
        notes.append("provider call log unavailable")
    if history.executions is None:
        notes.append("provider executions unavailable")
    # unknown items count as possibly executed; without executions, every one that ever was
    possibly = {k for k, item in history.items.items() if _is(item.state, S.UNKNOWN)}
    if history.executions is None:
        possibly |= {e.key for e in history.events if _is(e.to, S.UNKNOWN)}
    anomalies = {kind: found[kind] for kind in KINDS if kind in found}
    valid = False if anomalies else (None if notes else True)
    return Verdict(valid, anomalies, tuple(notes), tuple(sorted(map(str, possibly))),
                   costly(history))


_SENTENCES = {
    "double_execution": "Task {key} was executed successfully more than once at the provider",
    "submit_after_done": "Task {key} was submitted or retried after the ledger recorded it done",
    "fake_done": "Item {key} is marked done without a verified artifact",
    "lost_item": "Input {key} was lost: the ledger ended with no item for it",
    "unrecorded_execution": "Task {key} executed at the provider before its intent was recorded",
    "blind_resubmit": "Task {key} was submitted again without learning what its last submit did",
    "execution_by_lease_loser": "Task {key} was submitted by a worker that had lost its lease",
    "poison_submitted": "Poison input {key} was submitted to the provider",
    "illegal_transition": "Item {key} made a transition that the state machine forbids",
}


def explain(anomaly: Anomaly) -> str:
    """One plain-English sentence naming the key, for a verdict table or a notebook."""
    head = _SENTENCES.get(anomaly.kind, "Task {key} shows the anomaly " + str(anomaly.kind))
    detail = str(anomaly.detail or "").strip().rstrip(".").replace(". ", "; ")
    return head.format(key=anomaly.key) + (f" ({detail})." if detail else ".")


# Costly findings (checker.costly) and the fixture format use the types above.
from toolkit.checker.costly import costly  # noqa: E402
# The fixture format reads and writes the types above; re-exported for callers.
from toolkit.checker.fixtures import dump_history, load_history  # noqa: E402
