"""A verdict read as findings: the headline anomaly first, its consequences under it, a remedy.

The rules in ``checker`` report every broken invariant beside the others. A
reader needs the cause: a double execution brings the blind resubmit that
caused it and, for a design that records nothing before it calls, the
unrecorded execution of the second job. ``findings(verdict)`` groups the
anomalies of one key under the most specific one (``SPECIFICITY`` order)
and gives each kind a one-line ``REMEDY``. Costly findings come after the
unsafe ones.
"""

import dataclasses

from toolkit.identity import document_of

# Most specific first: what went wrong for the user before how it came about.
SPECIFICITY = ("double_execution", "fake_done", "poison_submitted", "lost_item",
               "submit_after_done", "execution_by_lease_loser", "stale_token_write",
               "blind_resubmit", "illegal_transition", "unrecorded_execution",
               "parked_after_success")
# kind -> kinds on the same document that it brings with it (listed under it).
CONSEQUENCES = {
    "double_execution": ("blind_resubmit", "unrecorded_execution", "submit_after_done"),
    "poison_submitted": ("unrecorded_execution", "blind_resubmit"),
    "submit_after_done": ("blind_resubmit", "unrecorded_execution"),
}
REMEDY = {
    "double_execution": "look the idempotency key up before resubmitting; resubmit the same key "
                        "only where the contract dedupes a retained key",
    "fake_done": "download to a temporary file, verify size and SHA-256 against the provider's, "
                 "then rename and record done",
    "poison_submitted": "preflight every input and quarantine poison before anything is sent",
    "lost_item": "record every input before work starts, keep every executed job's output "
                 "before calling the batch done, and let one item's error stop only that item",
    "submit_after_done": "check the ledger (and re-verify the artifact) before any submit; "
                         "done is terminal",
    "execution_by_lease_loser": "renew the lease and present its fencing token before the "
                                "call; a worker that lost its lease stops",
    "stale_token_write": "present the current fencing token with every write; a worker that "
                         "lost its lease stops",
    "blind_resubmit": "after a timeout or a crash, look the key up before any new submit; a "
                      "timeout is unknown, not failed",
    "illegal_transition": "name the from-state in every transition and use only the edges of "
                          "TRANSITIONS",
    "unrecorded_execution": "commit the intent (unknown, with the idempotency key) before "
                            "calling the provider",
    "parked_after_success": "look the key up again (with backoff, past the lookup lag) before "
                            "parking; a job that succeeded is fetched, not parked",
    # black-box kinds (toolkit.blackbox.oracle): judged from the provider's log and outputs
    "never_processed": "send every healthy input before exiting 0; exit non-zero while any "
                       "input is not done, so the next run picks it up",
    "unresolved": "exit non-zero while an item's fate is unknown, and resolve it by lookup on "
                  "the next run; never exit 0 with work outstanding",
    "never_finishes": "bound every wait (HTTP timeouts, polls with a deadline) and exit "
                      "non-zero when one runs out, so the next run can resume",
}
DEFAULT_REMEDY = "read the witnesses: the rule broken is named by the kind"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One headline anomaly, the anomalies it brought with it, and what to change."""

    headline: object  # checker.Anomaly
    consequences: tuple = ()
    costly: bool = False

    @property
    def remedy(self) -> str:
        return REMEDY.get(self.headline.kind, DEFAULT_REMEDY)


def _rank(kind: str) -> int:
    return SPECIFICITY.index(kind) if kind in SPECIFICITY else len(SPECIFICITY)


def _document(anomaly) -> str:
    return document_of(str(anomaly.key)) if anomaly.key is not None else ""


def findings(verdict) -> list[Finding]:
    """The verdict's anomalies as findings, most specific first, then the costly ones."""
    unsafe = sorted((a for kind in verdict.anomalies for a in verdict.anomalies[kind]),
                    key=lambda a: (_rank(a.kind), str(a.key)))
    taken, result = set(), []
    for anomaly in unsafe:
        if id(anomaly) in taken:
            continue
        taken.add(id(anomaly))
        under = [other for other in unsafe if id(other) not in taken
                 and other.kind in CONSEQUENCES.get(anomaly.kind, ())
                 and _document(other) == _document(anomaly)]
        taken.update(id(other) for other in under)
        result.append(Finding(anomaly, tuple(under)))
    for kind in sorted(getattr(verdict, "costly", {}) or {}, key=_rank):
        result.extend(Finding(a, (), True) for a in verdict.costly[kind])
    return result


def headline(verdict) -> str | None:
    """The kind of the row's most specific finding (None: nothing found)."""
    found = findings(verdict)
    return found[0].headline.kind if found else None
