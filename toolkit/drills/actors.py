"""The other actors of a drill: a racing second worker, a slow live owner, an operator."""

import threading
from pathlib import Path

from toolkit.errors import ToolkitError
from toolkit.ledger import State, open_ledger
from toolkit.provider import FakeProvider
from toolkit.runner import RetryPolicy
from toolkit.runner.reclaim import cancel


MEET_TIMEOUT = 15.0  # seconds; a guard against a partner that never comes, not a race window


def _barrier_hook(parties, on_meet=None):
    barrier = threading.Barrier(parties)

    def meet(point, key, **context):
        if point == "before_intent":
            try:
                # The partner thread may be late by seconds on a loaded machine (CI runs
                # 3 pytest processes on 2 cores): wait long enough for it; a worker that
                # never comes (it finished, or its claim failed) breaks the barrier once.
                if barrier.wait(timeout=MEET_TIMEOUT) == 0 and on_meet is not None:
                    on_meet(key)  # once per meeting: the workers raced on this item
            except threading.BrokenBarrierError:
                pass  # the other worker is elsewhere: no race on this item
    return meet


def _chain(*hooks):
    def hook(point, key, **context):
        for each in hooks:
            each(point, key, **context)
    return hook


def _slow_owner(ledger_path, db_path, jobs_dir, contract, inputs, options, ready, strategy,
                stolen, owned):
    """A live worker process that holds a short lease and is slow before its submit.

    It runs the drill's own strategy when it is one of ours: a safe worker checks
    (renews) its lease before the call and backs off when it was taken; a worker of
    the naive design does not, and submits what it started although its lease is gone.
    """
    import time

    from toolkit.runner.registry import STRATEGIES

    # one of ours (a user's pipeline is drilled as the recoverer, against a safe owner)
    Runner = STRATEGIES.get(strategy, STRATEGIES["safe"])

    def dawdle(point, key, **context):
        if point == "after_intent":
            owned.value = key.encode()
            ready.set()
            # Slow, not dead: it goes on only once the recoverer has taken its expired
            # lease and committed its own intent (a handshake, not a sleep that a loaded
            # machine outlasts); the timeout only guards a recoverer that never comes.
            stolen.wait(timeout=60)

    provider = FakeProvider(db_path, jobs_dir, contract)
    runner = Runner(open_ledger(ledger_path), provider, Path(ledger_path).parent / "out",
                    options=options, lease_ttl=0.2, hook=dawdle, worker="slow-owner",
                    policy=RetryPolicy(base_delay=0.0), sleep=lambda seconds: None)
    try:
        runner.run(inputs)
    except ToolkitError:
        pass  # its late write was fenced off: exactly what the token is for
    finally:
        runner.close()


def _start_slow_owner(ledger_path, provider, work, inputs, options, strategy="safe"):
    import multiprocessing
    import time

    context = multiprocessing.get_context("fork")
    ready, stolen, owned = context.Event(), context.Event(), context.Array("c", 256)
    child = context.Process(target=_slow_owner, args=(
        ledger_path, provider.db_path, provider.out_dir, provider.contract, inputs, options,
        ready, strategy, stolen, owned))
    child.start()
    if not ready.wait(timeout=30):
        child.kill()
        raise ToolkitError("the slow owner never reached its intent")
    time.sleep(0.3)  # at least 0.3 s: its 0.2 s lease has run out before the recoverer starts

    def release(point, key, **context):
        """The recoverer's hook: its intent on the owner's item lets the owner go on."""
        if point == "after_intent" and key.encode() == owned.value:
            stolen.set()
    child.release, child.stolen = release, stolen  # stolen.set(): free it in any case
    return child


def _cancel_one_in_flight(ledger_path, provider, fired):
    """The operator cancels the first item still in flight (precisely, through the API)."""
    with open_ledger(ledger_path) as ledger:
        flying = [item for item in ledger.items() if item.state in (State.SUBMITTED, State.UNKNOWN)]
        if flying:
            cancel(ledger, provider, flying[0].key)
            fired.append((0, "operator_cancel", flying[0].key))
        else:  # a pipeline that waits for its jobs within a run leaves nothing to cancel
            fired.append((0, "nothing_in_flight", "every item at rest after run 1"))
