"""Per-item error boundaries: one item's trouble never aborts the batch; leases are renewed."""

import pytest

from conftest import FakeClock
from toolkit.documents import make_corpus
from toolkit.errors import LeaseHeldError
from toolkit.ledger import State, open_ledger
from toolkit.provider import Contract, FakeProvider
from toolkit.runner import RetryPolicy, Runner

S = State
TTL = 10.0
SLOW_JOBS = Contract(run_polls=3)  # every job runs on its third poll: the runner sleeps between


@pytest.fixture
def docs(tmp_path):
    return make_corpus(tmp_path / "in", docs=4, poison=0, seed=5)


def make_runner(tmp_path, provider, clock, sleep, worker="w1"):
    ledger = open_ledger(tmp_path / "l.sqlite", clock=clock)
    return Runner(ledger, provider, tmp_path / "out", policy=RetryPolicy(base_delay=0.0),
                  worker=worker, sleep=sleep, lease_ttl=TTL)


def test_slow_item_renews_its_lease_so_another_worker_cannot_take_it_while_polling(tmp_path, docs):
    """An item outlasts its lease while the runner polls (the clock passes 3/4 of the TTL
    at each backoff): the runner renews before each provider call, so a second worker's
    claim is refused (LeaseHeldError) every time, and the batch ends done, unshared."""
    clock = FakeClock()
    provider = FakeProvider(tmp_path / "p.db", tmp_path / "jobs", SLOW_JOBS)
    refused = []

    def sleep(seconds):  # a backoff during polling: time passes, another worker tries
        clock.advance(TTL * 0.75)
        with open_ledger(tmp_path / "l.sqlite", clock=clock) as other:
            for item in other.items():
                if item.lease_owner == "w1":
                    with pytest.raises(LeaseHeldError):
                        other.claim(item.key, "w2", TTL)
                    refused.append(item.key)

    runner = make_runner(tmp_path, provider, clock, sleep)
    try:
        counts = runner.run(docs)
    finally:
        runner.close()
    assert counts["done"] == 4 and not runner.lost_leases
    assert len(refused) >= 4  # at least one refused takeover per document
    assert provider.stats()["executions"] == 4


def test_lost_lease_leaves_the_item_to_its_new_owner_and_the_batch_goes_on(tmp_path, docs):
    """While the first document is polled, its lease expires and worker w2 claims it (a
    real claim on the same ledger file): the runner's next fenced write is refused, the
    item is left to w2 and noted in ``lost_leases``, and every other document is done."""
    clock = FakeClock()
    provider = FakeProvider(tmp_path / "p.db", tmp_path / "jobs", SLOW_JOBS)
    stolen = []

    def sleep(seconds):
        clock.advance(TTL * 2)  # w1 sleeps past its whole lease
        if stolen:
            return
        with open_ledger(tmp_path / "l.sqlite", clock=clock) as other:
            item = next(i for i in other.items() if i.lease_owner == "w1")
            other.claim(item.key, "w2", TTL * 100)
            stolen.append(item.key)

    runner = make_runner(tmp_path, provider, clock, sleep)
    try:
        counts = runner.run(docs)  # old code: StaleTokenError escaped and aborted the batch
        item = runner.ledger.get(stolen[0])
    finally:
        runner.close()
    assert runner.lost_leases == stolen
    assert counts["done"] == 3 and item.lease_owner == "w2" and item.state is S.SUBMITTED
    assert provider.stats()["executions"] <= 4


def test_job_unknown_to_the_provider_is_reconciled_by_key_not_a_batch_abort(tmp_path, docs):
    """The provider's database is lost between runs (replaced by a fresh one) while the
    ledger holds submitted items: polling their job ids answers "no job" (PermanentError).
    Each such item goes to ``unknown`` and is reconciled by lookup (an idempotent key may
    be resubmitted); the batch finishes with every document done."""
    clock = FakeClock()
    first = FakeProvider(tmp_path / "p1.db", tmp_path / "jobs1", Contract(run_polls=50))
    runner = Runner(open_ledger(tmp_path / "l.sqlite", clock=clock), first, tmp_path / "out",
                    policy=RetryPolicy(base_delay=0.0, polls=1), sleep=lambda s: None)
    try:
        runner.run(docs)
        assert runner.ledger.counts()["submitted"] == 4
    finally:
        runner.close()
    fresh = FakeProvider(tmp_path / "p2.db", tmp_path / "jobs2", Contract())
    runner = Runner(open_ledger(tmp_path / "l.sqlite", clock=clock), fresh, tmp_path / "out",
                    policy=RetryPolicy(base_delay=0.0), sleep=lambda s: None)
    try:
        counts = runner.run(docs)  # old code: PermanentError("no job ...") aborted the batch
        events = runner.ledger.events()
    finally:
        runner.close()
    assert counts["done"] == 4
    assert sum(e.detail.get("note") == "job unknown" for e in events) == 4
    assert fresh.stats()["executions"] == 4
