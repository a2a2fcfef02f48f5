"""Drill results as the rows charts take and the tables notebooks show (pure functions)."""

import collections

from toolkit.checker import explain
from toolkit.faults import FAULTS
from toolkit.widgets.tables import Table

VERDICTS = {True: "valid", False: "INVALID", None: "undecided"}


def doubles(executions) -> int:
    """Executions beyond one success per task: the billable side effect paid twice.

    ``executions``: provider executions (``checker.Execution``) or jobs
    (``provider.Job``), anything with ``task_key`` and ``status``.
    """
    succeeded = collections.Counter(e.task_key for e in executions
                                    if str(getattr(e.status, "value", e.status)) == "succeeded")
    return sum(n - 1 for n in succeeded.values() if n > 1)


def count_row(result, label=None) -> dict:
    """One ``viz.submit_counts`` row for a DrillResult."""
    strategy = result.drill.strategy
    if label is None and not isinstance(strategy, str):  # a user's class: say whose run it was
        label = f"{result.drill.name}\n{strategy.__qualname__}"
    return {"label": label or result.drill.name, "submit_calls": result.submit_calls,
            "executions": result.executions, "doubles": doubles(result.history.executions or ()),
            "docs": result.drill.docs,
            "parked": result.by_state.get("needs_review", 0)}


# Harm kinds counted from the checker's findings (``parked_paid`` from its costly ones);
# ``doubles`` is counted from the provider's executions. The fields and their order are
# ``viz.harm.HARMS`` (the chart's bars).
FINDINGS = {"poison_sent": "poison_submitted", "lost": "lost_item", "fake_done": "fake_done",
            "blind": "blind_resubmit", "parked_paid": "parked_after_success"}


def harm_row(result, label=None) -> dict:
    """One ``viz.harm_counts`` row: every kind of harm the drill did, counted per item.

    - ``doubles``: executions beyond one success per task (paid twice);
    - ``poison_sent``: poison inputs that reached the provider;
    - ``lost``: inputs that never reached the ledger;
    - ``fake_done``: ``done`` items whose artifact is not the verified one;
    - ``parked_paid``: items parked for a person although their job succeeded (costly);
    - ``blind``: items submitted again without learning what the last submit did: the
      risk, even where this provider did not bill it.
    Also the run's ``submit_calls`` and ``executions`` (written under the chart's label).
    """
    found = {**result.verdict.anomalies, **(getattr(result.verdict, "costly", None) or {})}
    row = {"label": label or result.drill.name, "docs": result.drill.docs,
           "poison": result.drill.poison, "submit_calls": result.submit_calls,
           "executions": result.executions,
           "doubles": doubles(result.history.executions or ())}
    for harm, kind in FINDINGS.items():
        row[harm] = len({a.key for a in found.get(kind, ())})
    row["verdict"] = verdict(result)
    return row


def harm_rows(results, labels=None) -> list[dict]:
    labels = labels or [None] * len(results)
    return [harm_row(result, label) for result, label in zip(results, labels)]


def harm_table(rows) -> Table:
    """The harm rows as a table: calls, executions, then one column per harm kind."""
    from toolkit.viz.harm import HARMS

    kinds = [kind for kind, _, _ in HARMS]
    return Table(rows, ["label", "submit_calls", "executions", *kinds, "verdict"],
                 marked=[i for i, row in enumerate(rows) if any(row[k] for k in kinds)])


FAULT_MARKS = {"torn_jsonl_write": "half a line on disk, no newline",
               "lost_reply": "the job ran, the reply is lost",
               "lookup_unavailable": "a lookup failed", "half_download": "half a file",
               "disk_full": "a write failed", "crash_mid_download": "half a file"}


def run_marks(result) -> list[dict]:
    """``viz.timeline``/``viz.page_progress`` marks of a drill: each fault where it fired
    (repeats counted: ``lookup_unavailable ×4``), the crash it caused, each restart.

    x is the last ledger event's seq + 0.3 for a fault or crash, + 0.7 for a restart
    (the next run's first event is seq + 1).
    """
    from toolkit.widgets.moments import moments

    seq, marks = 0, []
    for moment in moments(result):
        if moment.event is not None:
            seq = moment.event.seq
        elif moment.kind == "fault":
            name = moment.text.split(" ")[1]
            last = marks[-1] if marks else None
            if last and last["x"] == seq + 0.3 and last["name"] == name:
                last["times"] += 1
                last["label"] = f"FAULT {name} \u00d7{last['times']}" + (
                    f" ({FAULT_MARKS[name]}, each time)" if name in FAULT_MARKS else "")
            else:
                what = f" ({FAULT_MARKS[name]})" if name in FAULT_MARKS else ""
                marks.append({"x": seq + 0.3, "label": f"FAULT {name}{what}", "kind": "fault",
                              "name": name, "times": 1})
        elif moment.kind == "end" and "process died" in moment.text:
            last = marks[-1] if marks else None
            if last and last["x"] == seq + 0.3 and last["kind"] == "fault":
                last["label"] += f": the process dies (run {moment.run + 1})"
                last["kind"] = "crash"
            else:
                marks.append({"x": seq + 0.3, "label": f"crash (run {moment.run + 1})",
                              "kind": "crash", "name": "crash", "times": 1})
        elif moment.kind == "restart":
            marks.append({"x": seq + 0.7, "label": f"restart: run {moment.run + 1} opens the "
                          "ledger fresh", "kind": "restart", "name": "restart", "times": 1})
    return [{key: mark[key] for key in ("x", "label", "kind")} for mark in marks]


def count_rows(results) -> list[dict]:
    return [count_row(result) for result in results]


def verdict(result) -> str:
    """``valid``, ``INVALID`` or ``undecided``: what the checker said."""
    return VERDICTS[result.verdict.valid]


def verdict_table(results, title=None) -> Table:
    """Per drill: strategy, counts, how the batch ended, the checker's verdict and findings."""
    rows = [{"drill": r.drill.name, "strategy": r.row()["strategy"], "contract": r.drill.contract,
             "submits": r.submit_calls, "execs": r.executions,
             "doubles": doubles(r.history.executions or ()), "outcome": r.outcome,
             "verdict": verdict(r), "anomalies": ", ".join(sorted(r.verdict.anomalies)) or "-"}
            for r in results]
    return Table(rows, title=title)


def catalogue_table(results) -> Table:
    """The whole catalogue: every drill, its summary, and whether it went as expected."""
    rows = [{"drill": r.drill.name, "strategy": r.drill.strategy, "submits": r.submit_calls,
             "execs": r.executions, "outcome": r.outcome, "verdict": verdict(r),
             "expected": VERDICTS[r.drill.expect_valid],
             "as expected": "yes" if r.passed else "NO"} for r in results]
    return Table(rows, marked=[i for i, r in enumerate(results) if not r.passed])


def explain_table(result) -> Table:
    """Every anomaly of a drill's verdict, one sentence each (``checker.explain``)."""
    rows = [{"kind": kind, "item": anomaly.key, "what happened": explain(anomaly)}
            for kind, anomalies in sorted(result.verdict.anomalies.items())
            for anomaly in anomalies]
    return Table(rows, ["kind", "item", "what happened"],
                 title=f"{result.drill.name}: {verdict(result)}")


def items_table(result) -> Table:
    """The client ledger at the end of a drill: one row per document."""
    rows = [{"key": item.key, "source": item.source, "state": item.state.value,
             "attempt": item.attempt, "failure": item.failure or "",
             "reason": item.reason or ""}
            for item in sorted(result.history.items.values(),
                               key=lambda item: (item.source or "", item.key))]
    return Table(rows, title=f"{result.drill.name}: the ledger after the last run")


# -- crash points ------------------------------------------------------------------
# Where an item's path can be cut, in the order an item meets them. Ledger faults
# (they replace a ledger write) have no hook point of their own: named here.
PATH = ("after_intent", "after_submit", "ocr_executed", "before_commit", "during_fetch",
        "after_checkpoint", "ledger_write", "during_state_write")  # ocr_executed: at the provider
LEDGER_FAULT_POINTS = {"torn_jsonl_write": "ledger_write", "disk_full": "ledger_write"}
CRASHES = frozenset({"crash", "truncate_crash"})
# A half download cuts the item's path at during_fetch without killing the process: the
# safe design's answer there (refetch, verify) belongs on the same map as the crashes.
CUTS = CRASHES | {"truncate"}
CRASH_FAULTS = frozenset({"torn_jsonl_write"} | {name for name, fault in FAULTS.items()
                                                 if fault.action in CRASHES})


def crash_point(drill) -> str | None:
    """The point at which the drill's first crash-like fault (or a half download) cuts the
    item's path, if any."""
    for fault in drill.faults:
        if fault in LEDGER_FAULT_POINTS:
            return LEDGER_FAULT_POINTS[fault]
        if fault in FAULTS and FAULTS[fault].action in CUTS:
            return FAULTS[fault].point
    return None


def crash_verdict(result) -> str:
    """``violation`` (checker: invalid), ``parked`` (valid, with items left in
    needs_review for an operator), ``valid``, or ``undecided`` (the checker cannot tell)."""
    if result.verdict.valid is None:
        return "undecided"
    if not result.verdict.valid:
        return "violation"
    return "parked" if result.by_state.get("needs_review", 0) else "valid"


def crash_rows(results) -> list[dict]:
    """``viz.crash_map`` rows (one lane per drill) for the drills that cut a run somewhere,
    in path order; the others are skipped."""
    rows = []
    for result in results:
        point = crash_point(result.drill)
        if point is not None:
            rows.append({"step": PATH.index(point), "point": point,
                         "verdict": crash_verdict(result), "lane": result.drill.name,
                         "strategy": result.drill.strategy})
    return sorted(rows, key=lambda row: row["step"])  # stable: catalogue order within a point


# The pre-launch checklist: a claim about the safe runner, and the drill that proves it.
CHECKLIST = (
    ("Intent is committed before every submit; a crash there is never resubmitted blindly",
     "crash-after-intent"),
    ("A lost reply is recovered by lookup, never by resubmitting", "lost-reply"),
    ("The same over real HTTP: a socket read timeout while the job runs on", "http-lost-reply"),
    ("A crash after the provider accepted the job does not execute it twice",
     "crash-after-submit"),
    ("A crash with the reply in hand does not execute it twice", "crash-before-commit"),
    ("A torn ledger write loses nothing and repeats nothing", "torn-write"),
    ("A half download is never recorded as done", "half-download"),
    ("With the status API down, nothing is resubmitted: items stay unknown", "lookup-unavailable"),
    ("A lagging lookup is asked again, not answered with a resubmit", "lookup-lag"),
    ("A full disk stops the intake; the next run reconciles", "disk-full"),
    ("Two workers never execute one document twice", "concurrent-workers"),
    ("Poison is quarantined, transient errors retried within budget", "poison-storm"),
    ("A live owner keeps its lease, even past expiry", "owner-recovery"),
    ("A job still running is attached to, never created again", "active-conflict"),
    ("A cancelled item is never retried", "cancel"),
    ("When the ledger cannot record, no new work is taken", "health-fail-closed"),
    ("Other options are other work: an old output is never reused for them", "identity-change"),
    ("A long document resumes at its next page, never at page 1", "partial-resume"),
)


def checklist(results) -> Table:
    """PASS/FAIL per checklist line, from the named drills among ``results``.

    A line whose drill is not among ``results`` is ``not run``, never a pass.
    """
    by_name = {result.drill.name: result for result in results}
    rows = []
    for claim, name in CHECKLIST:
        result = by_name.get(name)
        status = "not run" if result is None else "PASS" if result.passed else "FAIL"
        rows.append({"check": claim, "drill": name, "result": status})
    return Table(rows, ["result", "check", "drill"],
                 marked=[i for i, row in enumerate(rows) if row["result"] != "PASS"])
