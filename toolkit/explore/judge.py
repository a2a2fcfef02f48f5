"""What one crash point came to: where its child died, whether the batch rested, the verdict.

``_note_kill`` names the step the killed child died at; ``_rested`` reads
whether a run ended with every item at rest; ``_judge`` collects the whole
history the point left (both ledgers, the provider's call and execution logs,
the disk) and asks ``toolkit.checker.check``, giving one of ``VERDICTS``
(see ``toolkit.explore``) with the anomalies and a one-line detail.
"""

import collections

from toolkit.explore.child import killed_by_sigkill

VERDICTS = ("valid", "parked", "violation", "undecided", "not-reached", "diverged")


def _note_kill(row, field, messages, status, kill_at) -> bool:
    """Name the step where the child died; False when it should have died and did not."""
    kill = next((m for m in messages if m["t"] == "kill"), None)
    if kill is not None:
        row[field] = kill["label"]
        if field == "step":
            row["kind"] = kill["kind"]
    return kill_at is None or (kill is not None and killed_by_sigkill(status))


def _rested(messages) -> bool:
    end = next((m for m in messages if m["t"] == "end"), None)
    return end is not None and not end["unsettled"] and not end["halted"]


def _judge(plan, paths, inputs, rested, lost, reached) -> dict:
    from toolkit.checker import check, explain
    from toolkit.drills import collect_history
    from toolkit.provider import FakeProvider

    contract = plan.contract_object()
    provider = FakeProvider(paths.provider_db, paths.provider_out, contract)
    try:
        history = collect_history(paths.ledger, provider, inputs, contract, ({},),
                                  plan.page_by_page_from)
        stats = provider.stats()
    finally:
        provider.close()
    verdict = check(history)
    by_state = collections.Counter(item.state.value for item in history.items.values())
    anomalies = sorted(verdict.anomalies) + ["not_at_rest"] * (not rested) + \
        ["lost_acknowledged"] * bool(lost)
    first = next((found[0] for found in verdict.anomalies.values()), None)
    detail = explain(first) if first else (
        f"{len(lost)} acknowledged transition(s) gone after the power cut" if lost else
        "the batch did not rest after the reruns" if not rested else "")
    parked = by_state.get("needs_review", 0)
    name = ("not-reached" if not reached else "violation" if anomalies else
            "undecided" if verdict.valid is None else "parked" if parked else "valid")
    return {"outcome": " ".join(f"{state}={n}" for state, n in sorted(by_state.items())),
            "submits": stats["submit_calls"], "executions": stats["executions"],
            "verdict": name, "anomalies": anomalies, "parked": parked, "detail": detail}
