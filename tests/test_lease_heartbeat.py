"""A slow provider call must not let a live owner's lease expire: a heartbeat renews
it (fenced) while the call is in flight, and stops when the call returns."""

import threading
import time

import pytest

from toolkit.documents import make_corpus
from toolkit.errors import LeaseHeldError
from toolkit.ledger import State, open_ledger
from toolkit.provider.client import HttpProvider, ServiceProcess
from toolkit.provider.service import ServiceFaults
from toolkit.runner import RetryPolicy, Runner

pytestmark = pytest.mark.slow
TTL = 1.0  # the lease; the service's slow submit lasts several of them
SLOW = 4.0


def test_slow_submit_keeps_the_live_owners_lease_so_an_expiry_claim_cannot_rob_it(tmp_path):
    """A real serve-provider keeps the first submit running SLOW seconds (4 leases long).
    Halfway through, another owner tries to claim the item by expiry (as an owner on
    another host would be judged: only the expiry speaks for it). Without a heartbeat
    the lease has expired and the claim robs the live owner; with it the claim is
    refused, the owner finishes, one execution, no lost lease."""
    docs = make_corpus(tmp_path / "in", docs=1, poison=0, seed=6)
    service = ServiceProcess(tmp_path / "p.db", tmp_path / "jobs", "non-idempotent",
                             faults=ServiceFaults(slow_submits=1, slow_seconds=SLOW))
    service.start()
    submitting = threading.Event()

    def hook(point, key, **context):
        if point == "after_intent":
            submitting.set()
    try:
        with HttpProvider(service.url, read_timeout=30) as provider:
            runner = Runner(open_ledger(tmp_path / "l.sqlite"), provider, tmp_path / "out",
                            policy=RetryPolicy(base_delay=0.01, max_delay=0.05), hook=hook,
                            lease_ttl=TTL)
            worker = threading.Thread(target=runner.run, args=(docs,))
            worker.start()
            try:
                assert submitting.wait(30)
                time.sleep(SLOW / 2)  # two leases into the submit: expired without renewal
                with open_ledger(tmp_path / "l.sqlite") as other:
                    [key] = [item.key for item in other.items()]
                    assert other.get(key).state is State.UNKNOWN  # the submit is in flight
                    with pytest.raises(LeaseHeldError):
                        other.claim(key, "thief", TTL)
            finally:
                worker.join()
                runner.close()
            stats = provider.stats()
    finally:
        service.stop()
    assert runner.lost_leases == []
    assert stats["executions"] == 1
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        [item] = ledger.items()
        assert item.state is State.DONE and item.lease_owner is None
