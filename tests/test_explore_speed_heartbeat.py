"""The lease's heartbeat: one thread per run, parked between provider calls, same guarantee.

A heartbeat thread started and joined around every provider call cost ~80 µs of
CPU each, several per item, at every crash point's recovery. ``lease.Heartbeat``
starts one thread at a run's first call, arms it around each call and parks it
between them, and stops and joins it when the run ends. What must hold: every
call of a run is watched by that one thread, none outlives the run, and a call
slower than the lease (a later call, on the re-armed thread) still keeps the live
owner's lease, so a claim by expiry from another connection is refused. Real
threads, a real ledger and a real fake provider, a call really slowed; no timer
is asserted on.
"""

import threading
import time

import pytest

from toolkit.documents import make_corpus
from toolkit.errors import LeaseHeldError
from toolkit.ledger import State, open_ledger
from toolkit.provider import FakeProvider
from toolkit.runner import RetryPolicy, Runner

TTL = 0.4  # the lease; the slow call lasts several of them


def _lease_threads():
    return [t for t in threading.enumerate() if t.name.startswith("lease-")]


class Watched:
    """The fake provider, noting the lease threads alive at each call; ``slow`` names a
    call (``poll``) that sleeps ``SLOW`` seconds while ``during`` runs in another thread."""

    def __init__(self, provider, slow=None, during=None):
        self._provider, self.slow, self.during = provider, slow, during
        self.seen = []  # (call, [lease threads alive]): the objects, kept (an ident is reused)

    def __getattr__(self, name):
        attr = getattr(self._provider, name)
        if name not in ("submit", "lookup", "poll", "fetch"):
            return attr

        def call(*args, **kwargs):
            self.seen.append((name, _lease_threads()))
            if name == self.slow:
                self.slow = None  # once
                thief = threading.Thread(target=self.during)
                thief.start()
                thief.join()  # the claim runs while this call is in flight
            return attr(*args, **kwargs)
        return call


def test_provider_calls_of_one_run_share_one_heartbeat_thread_and_none_outlives_the_run(
        tmp_path):
    docs = make_corpus(tmp_path / "in", docs=2, poison=0, seed=3)
    with FakeProvider(tmp_path / "p.db", tmp_path / "jobs") as provider:
        watched = Watched(provider)
        runner = Runner(open_ledger(tmp_path / "l.sqlite"), watched, tmp_path / "out",
                        policy=RetryPolicy(base_delay=0.0), sleep=lambda s: None)
        before = _lease_threads()
        runner.run(docs)
        after = _lease_threads()
        runner.close()
    assert len(watched.seen) >= 4  # submits, polls, fetches of two documents
    mine = [[t for t in alive if t not in before] for _, alive in watched.seen]
    assert all(len(alive) == 1 for alive in mine)  # each call is watched by one thread
    assert all(alive[0] is mine[0][0] for alive in mine)  # the same one, every call
    assert [t for t in after if t not in before] == []  # joined when run() ended


@pytest.mark.slow
def test_slow_later_call_on_the_parked_heartbeat_keeps_the_lease_so_an_expiry_claim_is_refused(
        tmp_path):
    """The poll (a call after the submit: the heartbeat thread re-armed, not new) lasts
    several leases. Two leases into it another connection tries to claim the item by
    expiry: refused (LeaseHeldError), the owner finishes, nothing lost."""
    docs = make_corpus(tmp_path / "in", docs=1, poison=0, seed=6)
    refused = []

    def thief():
        time.sleep(2 * TTL)  # expired by now, without a heartbeat
        with open_ledger(tmp_path / "l.sqlite") as other:
            [item] = other.items()
            assert item.state is State.SUBMITTED
            try:
                other.claim(item.key, "thief", TTL)
            except LeaseHeldError:
                refused.append(item.key)

    with FakeProvider(tmp_path / "p.db", tmp_path / "jobs") as provider:
        watched = Watched(provider, slow="poll", during=thief)
        runner = Runner(open_ledger(tmp_path / "l.sqlite"), watched, tmp_path / "out",
                        policy=RetryPolicy(base_delay=0.0), sleep=lambda s: None, lease_ttl=TTL)
        runner.run(docs)
        runner.close()
        stats = provider.stats()
    assert refused and runner.lost_leases == []
    assert stats["executions"] == 1
    submit, poll = watched.seen[0], next(seen for seen in watched.seen if seen[0] == "poll")
    assert len(poll[1]) == 1 and poll[1][0] is submit[1][0]  # the same, parked thread
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        [item] = ledger.items()
        assert item.state is State.DONE and item.lease_owner is None


def test_lost_lease_ends_the_calls_renewals_and_the_heartbeat_lives_on_for_the_next_call():
    """Fault: the lease is lost during a call (another worker claimed the item: renew raises
    StaleTokenError), as in the ``owner-recovery/steal-expired`` drill. Property: the
    heartbeat stops renewing for that call and parks (no thread exception: the test suite
    turns one into an error), and the next armed call is renewed again by the same thread."""
    from toolkit.errors import StaleTokenError
    from toolkit.runner.lease import Heartbeat

    beats, renewed = [], threading.Event()

    def beat(item, token):
        beats.append(item)
        if item == "stolen":
            raise StaleTokenError(item, token, token + 1)
        renewed.set()

    heartbeat = Heartbeat(beat, every=0.01)
    heartbeat.arm("stolen", 1)
    while "stolen" not in beats:
        time.sleep(0.005)
    time.sleep(0.05)  # the thread goes round its loop with the ended call in hand
    heartbeat.disarm()
    heartbeat.arm("next", 2)
    assert renewed.wait(30)  # the same thread renews the next call
    thread = heartbeat._thread
    heartbeat.stop()
    assert beats.count("stolen") == 1 and not thread.is_alive()
