"""The safe runner: poison quarantine, retry classification, reconcile-then-act."""

import dataclasses
import threading

import pytest

from conftest import Crash, crash_once_at
from toolkit.ledger import State, open_ledger
from toolkit.roots import artifact_file
from toolkit.provider import Contract, FakeProvider
from toolkit.runner import RetryPolicy, Runner

S = State
NO_WAIT = RetryPolicy(base_delay=0.0)


@pytest.fixture
def make(tmp_path):
    """make(contract, ...) -> (runner factory, provider); ledgers reopen fresh per run."""
    def factory(contract=Contract(), ledger_name="ledger.sqlite", **runner_options):
        stem = ledger_name.rsplit(".", 1)[0]
        provider = FakeProvider(tmp_path / f"{stem}-provider.db", tmp_path / f"{stem}-jobs", contract)

        def runner(hook=None, worker="w1", strategy=Runner):
            ledger = open_ledger(tmp_path / ledger_name)
            return strategy(ledger, provider, tmp_path / f"{stem}-out", policy=runner_options.get(
                "policy", NO_WAIT), worker=worker, hook=hook, sleep=lambda seconds: None)
        return runner, provider
    return factory


def run_once(runner, inputs):
    try:
        return runner.run(inputs)
    finally:
        runner.close()


def poison_keys(runner_factory, corpus):
    runner = runner_factory()
    try:
        keys = runner.enqueue(corpus)
        return {key for key in keys if runner.ledger.get(key).source.startswith("poison")}
    finally:
        runner.close()


def test_poison_is_quarantined_before_submit_and_the_rest_completes(make, corpus):
    runner, provider = make()
    counts = run_once(runner(), corpus)
    assert (counts["done"], counts["failed"]) == (27, 3)
    poison = poison_keys(runner, corpus)
    stats = provider.stats()
    assert len(poison) == 3 and not poison & set(stats["per_task"])  # never submitted
    assert stats["submit_calls"] == stats["executions"] == stats["succeeded"] == 27
    with open_ledger(runner().ledger.path) as ledger:
        for key in poison:
            item = ledger.get(key)
            assert item.failure == "permanent" and item.reason.startswith("poison:")


def test_fifteen_percent_transient_errors_are_absorbed_by_in_run_retries(make, corpus):
    runner, provider = make(Contract(transient_rate=0.15, seed=0))
    counts = run_once(runner(), corpus)
    assert (counts["done"], counts["failed"]) == (27, 3)
    stats = provider.stats()
    assert stats["submit_calls"] > 27  # there were transient rejections...
    assert stats["executions"] == stats["succeeded"] == 27  # ...and no double execution


def test_sixty_percent_transient_leaves_retryable_items_that_a_second_run_completes(make, corpus):
    runner, provider = make(Contract(transient_rate=0.6, seed=0))
    first = runner()
    counts = run_once(first, corpus)
    assert counts["failed"] > 3 and first.unsettled == counts["failed"] - 3
    with open_ledger(first.ledger.path) as ledger:
        done_before = {item.key: item for item in ledger.items() if item.state is S.DONE}
        events_before = len(ledger.events())
    counts = run_once(runner(), corpus)
    assert (counts["done"], counts["failed"]) == (27, 3)
    with open_ledger(first.ledger.path) as ledger:
        new_events = ledger.events()[events_before:]
        assert not {event.key for event in new_events} & set(done_before)  # done untouched
        assert all(ledger.get(key) == item for key, item in done_before.items())
    assert provider.stats()["executions"] == provider.stats()["succeeded"] == 27


def test_lost_reply_is_recovered_by_lookup_without_second_execution(make, small_corpus):
    for contract in (Contract(), Contract(idempotent_keys=False)):
        runner, provider = make(contract, ledger_name=f"{contract.describe()}.sqlite")
        lost = []

        def lose_first_reply(point, key, **context):
            if point == "after_submit" and not lost:
                lost.append(key)
                raise TimeoutError("read timed out")  # the provider has the job

        first = runner(hook=lose_first_reply)
        counts = run_once(first, small_corpus)
        assert counts["done"] == 4 and first.lost_replies == 1
        assert provider.stats()["per_task"][lost[0]]["executions"] == 1
        assert provider.stats()["per_task"][lost[0]]["submit_calls"] == 1  # looked up, not resubmitted
        provider.close()


def test_crash_after_intent_then_rerun_resubmits_only_where_the_contract_makes_it_safe(
        make, small_corpus):
    outcomes = {}
    for contract in (Contract(), Contract(idempotent_keys=False)):
        runner, provider = make(contract, ledger_name=f"{contract.describe()}.sqlite")
        crash = crash_once_at("after_intent")
        with pytest.raises(Crash):
            run_once(runner(hook=crash), small_corpus)
        counts = run_once(runner(), small_corpus)
        outcomes[contract.idempotent_keys] = (counts,
                                              provider.stats()["per_task"].get(crash.keys[0]))
        provider.close()
    idempotent_counts, idempotent_task = outcomes[True]
    assert idempotent_counts["done"] == 4 and idempotent_task["executions"] == 1
    strict_counts, strict_task = outcomes[False]
    assert strict_counts["done"] == 3 and strict_counts["needs_review"] == 1
    assert strict_task is None  # parked: never blindly resubmitted


def test_crash_before_done_commit_reuses_the_provider_result_without_reexecuting(
        make, small_corpus):
    runner, provider = make()
    crashed = []

    def crash_before_commit(point, key, to=None, **context):
        if point == "before_commit" and to is S.DONE and not crashed:
            crashed.append(key)
            raise Crash()

    with pytest.raises(Crash):
        run_once(runner(hook=crash_before_commit), small_corpus)
    counts = run_once(runner(), small_corpus)
    assert counts["done"] == 4
    assert provider.stats()["executions"] == 4


def test_half_download_is_never_done_and_is_fetched_again(make, small_corpus):
    runner, provider = make()
    cut = []

    def cut_first_download(point, key, path=None, **context):
        if point == "during_fetch" and not cut:
            cut.append(key)
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2])

    first = runner(hook=cut_first_download)
    counts = run_once(first, small_corpus)
    assert counts["done"] == 4 and provider.stats()["executions"] == 4
    with open_ledger(first.ledger.path) as ledger:
        item = ledger.get(cut[0])
    from toolkit.documents import verify

    assert verify(artifact_file(first.ledger.path, item.artifact_path), item.artifact_size,
                  item.artifact_sha256)


def test_damaged_artifact_of_a_done_item_is_refetched_never_reexecuted(make, small_corpus):
    runner, provider = make()
    first = runner()
    run_once(first, small_corpus)
    with open_ledger(first.ledger.path) as ledger:
        victim = next(item for item in ledger.items() if item.state is S.DONE)
    victim_file = artifact_file(first.ledger.path, victim.artifact_path)
    with open(victim_file, "r+b") as handle:
        handle.truncate(100)
    second = runner()
    counts = run_once(second, small_corpus)
    assert counts["done"] == 4 and second.reused == 3
    assert provider.stats()["executions"] == 4
    from toolkit.documents import verify

    assert verify(victim_file, victim.artifact_size, victim.artifact_sha256)


def test_lookup_unavailable_leaves_unknown_items_unresolved_never_resubmitted(make, small_corpus):
    runner, provider = make(Contract(idempotent_keys=False))
    lost = []

    def lose_reply_then_lookups_fail(point, key, **context):
        if point == "after_submit" and not lost:
            lost.append(key)
            raise TimeoutError()
        if point == "during_lookup":
            from toolkit.errors import TransientError

            raise TransientError("lookup service unavailable")

    first = runner(hook=lose_reply_then_lookups_fail)
    counts = run_once(first, small_corpus)
    assert counts["unknown"] == 1 and first.unsettled == 1
    assert provider.stats()["per_task"][lost[0]]["submit_calls"] == 1
    counts = run_once(runner(), small_corpus)  # lookup is back: reconciled, not resubmitted
    assert counts["done"] == 4 and provider.stats()["per_task"][lost[0]]["submit_calls"] == 1


def test_lagging_lookup_is_asked_again_until_the_lag_is_spent(make, small_corpus):
    runner, provider = make(Contract(idempotent_keys=False, lookup="lagging", lag=2))
    lost = []

    def lose_first_reply(point, key, **context):
        if point == "after_submit" and not lost:
            lost.append(key)
            raise TimeoutError()

    counts = run_once(runner(hook=lose_first_reply), small_corpus)
    assert counts["done"] == 4 and counts["needs_review"] == 0
    assert provider.stats()["per_task"][lost[0]]["executions"] == 1


def test_two_workers_with_leases_execute_each_document_once(make, small_corpus):
    runner, provider = make(Contract(idempotent_keys=False))
    barrier = threading.Barrier(2)

    def meet(point, key, **context):
        if point == "before_intent":
            try:
                barrier.wait(timeout=2)
            except threading.BrokenBarrierError:
                pass

    workers = [runner(hook=meet, worker=f"w{n}") for n in (1, 2)]
    threads = [threading.Thread(target=run_once, args=(w, small_corpus)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = provider.stats()
    assert stats["executions"] == stats["succeeded"] == 4
    assert all(row["executions"] == 1 for row in stats["per_task"].values())


def test_options_that_cannot_be_keyed_are_refused_before_any_work(make, tmp_path):
    provider = FakeProvider(tmp_path / "p.db", tmp_path / "jobs")
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        with pytest.raises(TypeError, match="options"):
            Runner(ledger, provider, tmp_path / "out", options={"dpi": float("nan")})


def test_backoff_is_bounded_exponential_and_seeded():
    import random

    policy = dataclasses.replace(NO_WAIT, base_delay=0.1, max_delay=1.0)
    delays = [policy.delay(n, random.Random(7)) for n in range(8)]
    assert delays == [policy.delay(n, random.Random(7)) for n in range(8)]
    assert all(0.05 * 2 ** n <= d <= 0.1 * 2 ** n for n, d in enumerate(delays[:3]))
    assert max(delays) <= 1.0


def test_observer_snapshot_names_the_current_item_stage_and_counts_while_running(make,
                                                                                 small_corpus):
    runner, provider = make()
    seen = []

    def observe(point, key, **context):
        if point == "after_submit":
            seen.append(current.snapshot())

    current = runner(hook=observe)
    current.run(small_corpus)
    at_rest = current.snapshot()
    current.close()
    first = seen[0]
    assert first.stage == "submit" and first.current is not None
    assert first.counts["unknown"] == 1 and first.counts["failed"] == 1  # intent recorded, poison out
    assert seen[-1].counts["done"] == 3 and first.elapsed >= 0
    assert at_rest.current is None and at_rest.counts["done"] == 4  # at rest: nothing in hand
