"""Costly, not unsafe: findings that waste money but break no safety invariant.

``parked_after_success``: an item in ``needs_review`` although the provider
executed its job successfully. The document was paid for and not
delivered; an operator will look at something that needed no look. The safe
design parks only when nothing succeeded remotely (an intent with no job,
under a contract that forbids a blind resubmit): that parking costs nothing
and is not reported.
"""

from toolkit.identity import document_of
from toolkit.ledger import State

COSTLY_KINDS = ("parked_after_success",)


def parked_after_success(history):
    """Items parked in ``needs_review`` whose task (or one of its pages) succeeded remotely."""
    from toolkit.checker import Anomaly  # the vocabulary lives in the package

    if history.executions is None:
        return
    succeeded = {}
    for x in sorted(history.executions, key=lambda x: x.seq):
        if x.status == "succeeded":
            succeeded.setdefault(document_of(x.task_key), []).append(x)
    parks = {}
    for e in sorted(history.events, key=lambda e: e.seq):
        if e.op == "move" and str(getattr(e.to, "value", e.to)) == State.NEEDS_REVIEW.value:
            parks[e.key] = e
    for key, item in sorted(history.items.items()):
        if item.state is not State.NEEDS_REVIEW or not succeeded.get(key):
            continue
        xs = succeeded[key]
        jobs = ", ".join(dict.fromkeys(str(x.job_id) for x in xs))
        park = parks.get(key)
        yield Anomaly("parked_after_success", key,
                      f"parked for review although job(s) {jobs} succeeded at the provider: "
                      "paid for, not delivered", (*xs, *((park,) if park else ())))


COSTLY_RULES = (parked_after_success,)


def costly(history) -> dict:
    """``{kind: [Anomaly]}`` of the costly findings; never raises (an odd history finds none)."""
    found = {}
    for rule in COSTLY_RULES:
        try:
            for anomaly in rule(history):
                found.setdefault(anomaly.kind, []).append(anomaly)
        except Exception:  # noqa: BLE001 - a costly rule never turns a verdict into a crash
            continue
    return found
