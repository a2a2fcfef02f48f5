"""Each naive strategy, on the input where it goes wrong, shows the user the wrong outcome.

Every scenario runs the safe runner too: the same fault must leave it correct.
A scenario the naive design passes would be a broken test.
"""

import threading

import pytest

from conftest import Crash
from toolkit.documents import verify
from toolkit.ledger import State, open_ledger
from toolkit.roots import artifact_file
from toolkit.provider import Contract, FakeProvider
from toolkit.runner import RetryPolicy, Runner
from toolkit.runner.registry import STRATEGIES, open_strategy

S = State
STRICT = Contract(idempotent_keys=False)  # where only the client's discipline prevents doubles


def batch(tmp_path, name, contract, corpus, hooks, ledger_suffix=".sqlite", workers=1):
    """Run ``name`` once per hook (None = no fault), each run a fresh process-like start."""
    provider = FakeProvider(tmp_path / f"{name}.db", tmp_path / f"{name}-jobs", contract)
    ledger_path = tmp_path / f"{name}{'.json' if name == 'rewrite-state' else ledger_suffix}"
    counts = None
    for hook in hooks:
        runners = [open_strategy(name, ledger_path, provider, tmp_path / f"{name}-out",
                                 policy=RetryPolicy(base_delay=0.0), hook=hook,
                                 worker=f"w{n}", sleep=lambda s: None) for n in range(workers)]
        try:
            if workers == 1:
                counts = runners[0].run(corpus)
            else:
                threads = [threading.Thread(target=r.run, args=(corpus,)) for r in runners]
                [thread.start() for thread in threads]
                [thread.join() for thread in threads]
        except Crash:
            pass
        finally:
            [runner.close() for runner in runners]
    return provider.stats(), counts, ledger_path


def doubled(stats):
    return sorted(key for key, row in stats["per_task"].items() if row["executions"] > 1)


def once(point_wanted, action):
    fired = []

    def hook(point, key, **context):
        if point == point_wanted and not fired:
            fired.append(key)
            action(context)
    return hook


def raise_(error):
    def action(context):
        raise error
    return action


@pytest.mark.parametrize("name, expect_double", [("safe", False), ("blind-retry", True)])
def test_lost_reply_with_blind_retry_executes_twice_and_safe_once(tmp_path, small_corpus, name,
                                                                  expect_double):
    hook = once("after_submit", raise_(TimeoutError("read timed out")))
    stats, counts, _ = batch(tmp_path, name, STRICT, small_corpus, [hook])
    assert counts["done"] == 4
    assert bool(doubled(stats)) is expect_double


def test_blind_retry_is_harmless_against_idempotent_retained_keys(tmp_path, small_corpus):
    hook = once("after_submit", raise_(TimeoutError("read timed out")))
    stats, counts, _ = batch(tmp_path, "blind-retry", Contract(), small_corpus, [hook])
    assert counts["done"] == 4 and doubled(stats) == []


@pytest.mark.parametrize("name, expect_fake", [("safe", False), ("output-exists", True)])
def test_crash_mid_download_makes_output_exists_report_a_fake_done(tmp_path, small_corpus, name,
                                                                   expect_fake):
    def cut_and_die(context):
        data = context["path"].read_bytes()
        context["path"].write_bytes(data[: len(data) // 3])
        raise Crash()

    stats, counts, ledger_path = batch(tmp_path, name, Contract(), small_corpus,
                                       [once("during_fetch", cut_and_die), None])
    assert counts["done"] == 4  # both claim success...
    with open_ledger(ledger_path) as ledger:
        done = [item for item in ledger.items() if item.state is S.DONE]
    provider = FakeProvider(tmp_path / f"{name}.db", tmp_path / f"{name}-jobs", Contract())
    produced = {job.job_id: job.artifact_sha256 for job in provider.jobs()}
    fake = [item.key for item in done if produced[item.job_id] != item.artifact_sha256
            or not verify(artifact_file(ledger_path, item.artifact_path), item.artifact_size, produced[item.job_id])]
    assert bool(fake) is expect_fake  # ...but one of output-exists' "done" is half a file


@pytest.mark.parametrize("name, expect_double", [("safe", False), ("batch-commit", True)])
def test_crash_between_batch_commits_reexecutes_uncommitted_items(tmp_path, corpus, name,
                                                                  expect_double):
    stats, counts, _ = batch(tmp_path, name, STRICT, corpus[:12],
                             [once("before_commit", raise_(Crash())), None])
    assert counts["done"] + counts["needs_review"] == 12
    assert bool(doubled(stats)) is expect_double


@pytest.mark.parametrize("name, expect_double", [("safe", False), ("rewrite-state", True)])
def test_kill_during_state_rewrite_loses_progress_and_reexecutes(tmp_path, small_corpus, name,
                                                                 expect_double):
    fired = []

    def crash_on_third_save(point, key, **context):
        if point in ("during_state_write", "before_commit") and len(fired) < 3:
            fired.append(point)
            if len(fired) == 3:
                raise Crash()

    stats, counts, _ = batch(tmp_path, name, STRICT, small_corpus, [crash_on_third_save, None])
    assert counts["done"] + counts["needs_review"] == 4
    assert bool(doubled(stats)) is expect_double


@pytest.mark.parametrize("name, expect_double", [("safe", False), ("no-lease", True)])
def test_two_workers_on_one_item_without_leases_execute_it_twice(tmp_path, small_corpus, name,
                                                                 expect_double):
    barrier = threading.Barrier(2)

    def meet(point, key, **context):
        if point == "before_intent":
            try:
                barrier.wait(timeout=1)
            except threading.BrokenBarrierError:
                pass

    stats, _, _ = batch(tmp_path, name, STRICT, small_corpus, [meet], workers=2)
    assert bool(doubled(stats)) is expect_double


def test_every_registered_strategy_is_one_the_cli_accepts():
    """One registry: every name the CLI's ``--strategy`` takes resolves to its class there."""
    from toolkit.runner.registry import resolve_strategy

    assert all(resolve_strategy(name) is cls for name, cls in STRATEGIES.items())
    assert STRATEGIES["safe"] is Runner


def test_no_lease_worker_whose_item_is_claimed_between_its_two_records_goes_on_without_a_crash(
        tmp_path, small_corpus):
    """Race (CI, stop 30): worker A records ``unknown`` for its submit; worker B reads the
    item ``unknown`` and claims it (token 1) before A records ``submitted`` with token 0.

    A's second record is fenced (stale token): the naive worker must take that as "the
    other worker recorded first" and go on, as it does for a changed state, not crash."""
    provider = FakeProvider(tmp_path / "p.db", tmp_path / "jobs", STRICT)
    ledger_path = tmp_path / "l.sqlite"
    runner = open_strategy("no-lease", ledger_path, provider, tmp_path / "out",
                           policy=RetryPolicy(base_delay=0.0), worker="w1", sleep=lambda s: None)
    claimed = []
    move = runner.ledger.move

    def move_then_other_claims(key, frm, to, **kw):
        move(key, frm, to, **kw)
        if to is S.UNKNOWN and not claimed:
            with open_ledger(ledger_path) as other:  # worker B, its own connection
                claimed.append(other.claim(key, "w2", 60.0, pid=1, host="elsewhere"))

    runner.ledger.move = move_then_other_claims
    try:
        counts = runner.run(small_corpus)
    finally:
        runner.close()
    assert claimed == [1]  # the race happened: A's next record carries a stale token
    assert counts["done"] == 3 and counts["unknown"] == 1  # B's item: B's to finish
