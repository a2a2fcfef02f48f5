"""Evidence tables for the course: what each side holds, read from a drill's history.

- ``ledger_and_jobs(result)``: each document's ledger state beside the
  provider's job for it (why ``cancel`` ends with items ``submitted``: their
  jobs are still running at the provider);
- ``provider_calls(result)``: the provider's own call log in order, documents by
  name, each call with the run that made it (over HTTP: the submit whose reply
  was lost, then the lookup that found it). No sequence numbers: over HTTP
  their count depends on how many polls real time needed;
- ``page_bills(results)``: executions per page of each long document, one
  column per run design (the resume at the next page, or the pages paid twice).
"""

import collections

from toolkit.identity import PAGE_MARK, document_of
from toolkit.widgets.tables import Table


def _names(result) -> dict:
    """Task key -> the input's file name, from the history (no wall clock, no temp path)."""
    return {key: info.get("source") or key for key, info in result.history.inputs.items()}


def _unit(key, names) -> str:
    document, mark, page = str(key).partition(PAGE_MARK)
    return (names.get(document) or document) + (f" page {page}" if mark else "")


def ledger_and_jobs(result) -> Table:
    """Per document: the client's last state and the status of every provider job for it."""
    names = _names(result)
    jobs = collections.defaultdict(list)
    for job in result.steps[-1].jobs if result.steps else ():
        # Statuses only: a job's number depends on when a racing process submitted it.
        jobs[document_of(job.task_key)].append(job.status.value)
    rows = [{"document": names.get(item.key, item.source), "ledger": item.state.value,
             "reason": item.reason or "", "provider jobs": ", ".join(jobs[item.key]) or "-"}
            for item in sorted(result.history.items.values(), key=lambda i: i.source or i.key)]
    return Table(rows, title=f"{result.drill.name}: client ledger and provider, side by side")


def provider_calls(result, ops=None) -> Table:
    """The provider's call log in order (``ops``: only these operations)."""
    names = _names(result)
    starts = result.run_starts or (float("-inf"),)
    # A call's run: the last run that started before it (wall-clock starts of each run).
    rows = [{"run": sum(start <= call.ts for start in starts) or 1, "op": call.op, "unit": _unit(call.task_key, names),
             "attempt": (call.idem_key or "").rpartition(":")[2] or "-",
             "job": call.job_id or "-", "outcome": call.outcome}
            for call in result.history.calls or () if ops is None or call.op in ops]
    return Table(rows, title=f"{result.drill.name}: the provider's call log")


def page_bills(results, labels=None) -> Table:
    """Executions per page (rows) for each result (columns); pages paid twice are marked."""
    labels = labels or [result.drill.strategy for result in results]
    counts = []
    for result in results:
        names = _names(result)
        counts.append(collections.Counter(_unit(x.task_key, names)
                                          for x in result.history.executions or ()
                                          if x.status == "succeeded"))
    units = sorted(set().union(*counts), key=lambda u: (u.split(" page ")[0],
                                                        int(u.split(" page ")[1])
                                                        if " page " in u else 0))
    rows = [{"unit": unit, **{label: count[unit] for label, count in zip(labels, counts)}}
            for unit in units]
    return Table(rows, ["unit", *labels],
                 marked=[i for i, row in enumerate(rows) if any(row[l] > 1 for l in labels)],
                 title="successful executions per unit (a page billed twice is marked)")
