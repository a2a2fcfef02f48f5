"""execution_by_lease_loser from a real run: the checker's history comes from the ledger
and the provider's own call log, written by real runners on one ledger file."""

import pytest

from conftest import FakeClock
from toolkit.checker import check
from toolkit.documents import make_corpus
from toolkit.drills.history import collect_history
from toolkit.ledger import open_ledger
from toolkit.provider import Contract, FakeProvider
from toolkit.runner import RetryPolicy, Runner
from toolkit.runner.naive import StealExpired

TTL = 10.0
CONTRACT = Contract(idempotent_keys=False)  # no dedupe: every accepted submit executes


@pytest.mark.parametrize("strategy,loser_submits", [(StealExpired, True), (Runner, False)],
                         ids=["steal-expired", "safe"])
def test_worker_that_lost_its_lease_submitting_is_execution_by_lease_loser(
        tmp_path, strategy, loser_submits):
    """w1 records its intent, then pauses past its lease (the clock jumps 2 TTLs); w2 takes
    the expired lease and reconciles the item (non-idempotent: nothing found, it parks it).
    When w1 resumes, steal-expired submits anyway with its superseded token: the provider
    executes for a lease loser, and the checker names it from the real call log. The safe
    runner checks (and renews) its lease before every provider call: it stops, nothing is
    executed for a loser, and the same rule stays silent."""
    docs = make_corpus(tmp_path / "in", docs=1, poison=0, seed=4)
    clock = FakeClock()
    provider = FakeProvider(tmp_path / "p.db", tmp_path / "jobs", CONTRACT, clock=clock)
    policy = RetryPolicy(base_delay=0.0)

    def make(worker, hook=None):
        return strategy(open_ledger(tmp_path / "l.sqlite", clock=clock), provider,
                        tmp_path / "out", policy=policy, worker=worker, hook=hook,
                        sleep=lambda s: None, lease_ttl=TTL)

    def pause_after_intent(point, key, **context):
        if point == "after_intent" and not paused:
            paused.append(key)
            clock.advance(TTL * 2)  # w1 stalls: its lease expires
            thief = make("w2")
            try:
                thief.run(docs)
            finally:
                thief.close()

    paused = []
    first = make("w1", hook=pause_after_intent)
    try:
        first.run(docs)
    finally:
        first.close()
    history = collect_history(tmp_path / "l.sqlite", provider, docs, CONTRACT)
    verdict = check(history)
    losers = verdict.anomalies.get("execution_by_lease_loser", [])
    submits = [c for c in history.calls if c.op == "submit"]
    assert all(c.worker is not None and c.token is not None for c in submits)
    if loser_submits:
        [anomaly] = losers
        assert anomaly.witnesses[1].worker == "w1" and provider.stats()["executions"] == 1
    else:
        assert losers == [] and provider.stats()["executions"] == 0
        assert first.lost_leases == paused
