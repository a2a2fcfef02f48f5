"""The fake provider: each contract knob changes what a client can observe."""

import multiprocessing
import os
import sqlite3
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolkit.documents import make_corpus, verify
from toolkit.errors import KeyReuseError, PermanentError, ToolkitError, TransientError
from toolkit.provider import (Contract, FakeProvider, JobStatus, ProviderConflict, parse_contract,
                              provider_records, provider_stats)

OPTIONS = {"target": "de"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"), docs=3, poison=1, seed=0)


@pytest.fixture
def doc(corpus):
    return corpus[0]


@pytest.fixture
def open_provider(tmp_path, clock):
    opened = []

    def _open(contract=Contract(), **kwargs):
        provider = FakeProvider(tmp_path / "provider.db", tmp_path / "out", contract,
                                clock=kwargs.pop("clock", clock), **kwargs)
        opened.append(provider)
        return provider

    yield _open
    for provider in opened:
        provider.close()


def _executions(provider, key):
    return provider.key_stats().get(key, {}).get("executions", 0)


def test_idempotent_provider_executes_once_for_two_submits_with_one_key(open_provider, doc):
    provider = open_provider()
    first = provider.submit("T:1", doc, OPTIONS)
    second = provider.submit("T:1", doc, OPTIONS)
    assert first.job_id == second.job_id and second.status == JobStatus.SUCCEEDED
    assert provider.key_stats()["T:1"] == {"submit_calls": 2, "executions": 1, "succeeded": 1}


def test_non_idempotent_provider_executes_twice_for_two_submits_with_one_key(open_provider, doc):
    provider = open_provider(Contract(idempotent_keys=False))
    first = provider.submit("T:1", doc, OPTIONS)
    second = provider.submit("T:1", doc, OPTIONS)
    assert first.job_id != second.job_id
    assert provider.key_stats()["T:1"] == {"submit_calls": 2, "executions": 2, "succeeded": 2}


def test_lagging_lookup_misses_a_job_that_exists_for_its_first_lag_lookups(open_provider, doc):
    lagging = open_provider(Contract(lookup="lagging", lag=2))
    job = lagging.submit("T:1", doc, OPTIONS)
    assert [lagging.lookup("T:1"), lagging.lookup("T:1")] == [None, None]
    assert [j.job_id for j in lagging.jobs()] == [job.job_id]  # it exists all along
    assert lagging.lookup("T:1").job_id == job.job_id


def test_consistent_lookup_finds_a_new_job_at_once(open_provider, doc):
    provider = open_provider()
    job = provider.submit("T:1", doc, OPTIONS)
    assert provider.lookup("T:1") == job and provider.lookup("T:2") is None


def test_retention_expiry_makes_a_job_unfindable_and_its_key_new_again(open_provider, doc, clock):
    provider = open_provider(Contract(key_retention=60))
    job = provider.submit("T:1", doc, OPTIONS)
    clock.advance(59)
    assert provider.lookup("T:1").job_id == job.job_id
    clock.advance(2)
    assert provider.lookup("T:1") is None
    again = provider.submit("T:1", doc, OPTIONS)  # the provider forgot the key: new work
    assert again.job_id != job.job_id and _executions(provider, "T:1") == 2


def test_conflict_on_an_active_key_names_the_active_job(open_provider, doc):
    provider = open_provider(Contract(active_conflict=True, run_polls=2))
    job = provider.submit("T:1", doc, OPTIONS)
    with pytest.raises(ProviderConflict) as caught:
        provider.submit("T:1", doc, OPTIONS)
    assert caught.value.job.job_id == job.job_id and job.job_id in str(caught.value)
    provider.poll(job.job_id), provider.poll(job.job_id)
    assert provider.submit("T:1", doc, OPTIONS).status == JobStatus.SUCCEEDED  # done: no conflict
    assert provider.key_stats()["T:1"] == {"submit_calls": 3, "executions": 1, "succeeded": 1}


def test_without_conflict_knob_a_submit_on_an_active_key_returns_the_active_job(open_provider, doc):
    provider = open_provider(Contract(run_polls=2))
    job = provider.submit("T:1", doc, OPTIONS)
    assert provider.submit("T:1", doc, OPTIONS) == job and job.status == JobStatus.QUEUED


def test_non_idempotent_conflict_refuses_a_second_job_while_the_first_is_active(open_provider, doc):
    provider = open_provider(Contract(idempotent_keys=False, active_conflict=True, run_polls=1))
    job = provider.submit("T:1", doc, OPTIONS)
    with pytest.raises(ProviderConflict):
        provider.submit("T:1", doc, OPTIONS)
    assert len(provider.jobs()) == 1 and provider.poll(job.job_id).status == JobStatus.SUCCEEDED


def test_same_key_with_another_payload_is_key_reuse_and_still_counted(open_provider, corpus):
    provider = open_provider()
    provider.submit("T:1", corpus[0], OPTIONS)
    with pytest.raises(KeyReuseError):
        provider.submit("T:1", corpus[1], OPTIONS)
    with pytest.raises(KeyReuseError):
        provider.submit("T:1", corpus[0], {"target": "fr"})
    assert provider.key_stats()["T:1"] == {"submit_calls": 3, "executions": 1, "succeeded": 1}


def _transient_pattern(provider, doc, keys):
    pattern = {}
    for key in keys:
        try:
            provider.submit(key, doc, OPTIONS)
            pattern[key] = False
        except TransientError:
            pattern[key] = True
    return pattern


def test_transient_rate_fails_the_same_calls_for_a_seed_whatever_the_order(tmp_path, doc):
    keys = [f"T{i}:1" for i in range(16)]
    contract = Contract(transient_rate=0.5, seed=7, run_polls=1)  # deferred: no PDF work needed
    with FakeProvider(tmp_path / "a.db", tmp_path / "a", contract) as a, \
            FakeProvider(tmp_path / "b.db", tmp_path / "b", contract) as b:
        forward = _transient_pattern(a, doc, keys)
        backward = _transient_pattern(b, doc, keys[::-1])
    assert forward == backward and 0 < sum(forward.values()) < len(keys)
    with FakeProvider(tmp_path / "c.db", tmp_path / "c", Contract(transient_rate=0.5, seed=8,
                                                                  run_polls=1)) as c:
        assert _transient_pattern(c, doc, keys) != forward


def test_transient_failure_accepts_nothing_but_counts_the_call(open_provider, doc):
    provider = open_provider(Contract(transient_rate=1.0))
    with pytest.raises(TransientError):
        provider.submit("T:1", doc, OPTIONS)
    assert provider.jobs() == [] and provider.key_stats()["T:1"] == {"submit_calls": 1}


def test_unavailable_lookup_raises_transient_error(open_provider):
    with pytest.raises(TransientError):
        open_provider(Contract(lookup="unavailable")).lookup("T:1")


def test_run_polls_defers_execution_to_the_nth_poll(open_provider, doc):
    provider = open_provider(Contract(run_polls=2))
    job = provider.submit("T:1", doc, OPTIONS)
    assert job.status == JobStatus.QUEUED and _executions(provider, "T:1") == 0
    assert provider.poll(job.job_id).status == JobStatus.RUNNING
    assert _executions(provider, "T:1") == 0
    done = provider.poll(job.job_id)
    assert done.status == JobStatus.SUCCEEDED and _executions(provider, "T:1") == 1
    assert provider.poll(job.job_id) == done


def test_poison_document_becomes_a_permanent_failure_that_counts_as_execution(open_provider, corpus):
    provider = open_provider()
    job = provider.submit("P:1", corpus[-1], OPTIONS)
    assert (job.status, job.failure) == (JobStatus.FAILED, "permanent")
    assert "truncated" in job.reason and job.artifact_path is None
    assert provider.stats()["failed"] == 1 and provider.stats()["executions"] == 1


def test_lossy_translation_is_a_failed_job_not_a_done_one(open_provider, doc):
    job = open_provider().submit("T:1", doc, {**OPTIONS, "drop_codes": True})
    assert (job.status, job.failure) == (JobStatus.FAILED, "permanent")
    assert "lost protected tokens" in job.reason


def test_fetch_copies_the_exact_artifact_and_refuses_unfinished_or_missing_ones(open_provider, doc,
                                                                                tmp_path):
    provider = open_provider(Contract(run_polls=1))
    job = provider.submit("T:1", doc, OPTIONS)
    with pytest.raises(PermanentError, match="queued"):
        provider.fetch(job.job_id, tmp_path / "early.pdf")
    job = provider.poll(job.job_id)
    fetched = provider.fetch(job.job_id, tmp_path / "got.pdf")
    assert verify(tmp_path / "got.pdf", fetched.artifact_size, fetched.artifact_sha256)
    os.remove(job.artifact_path)
    with pytest.raises(PermanentError, match="gone"):
        provider.fetch(job.job_id, tmp_path / "again.pdf")


def test_cancel_touches_only_the_named_job_and_a_cancelled_job_never_executes(open_provider, corpus):
    provider = open_provider(Contract(run_polls=1))
    one = provider.submit("A:1", corpus[0], OPTIONS)
    two = provider.submit("B:1", corpus[1], OPTIONS)
    assert provider.cancel(one.job_id).status == JobStatus.CANCELLED
    assert provider.poll(one.job_id).status == JobStatus.CANCELLED
    assert provider.poll(two.job_id).status == JobStatus.SUCCEEDED
    assert provider.cancel(two.job_id).status == JobStatus.SUCCEEDED  # finished: nothing to cancel
    assert provider.stats()["executions"] == 1


def test_call_log_records_every_call_with_its_outcome_in_order(open_provider, corpus, tmp_path):
    provider = open_provider(Contract(lookup="lagging", lag=1, run_polls=1, active_conflict=True))
    assert provider.lookup("T:1") is None
    job = provider.submit("T:1", corpus[0], OPTIONS)
    with pytest.raises(ProviderConflict):
        provider.submit("T:1", corpus[0], OPTIONS)
    assert provider.lookup("T:1") is None and provider.lookup("T:1").job_id == job.job_id
    provider.poll(job.job_id)
    provider.fetch(job.job_id, tmp_path / "got.pdf")
    provider.submit("T:1", corpus[0], OPTIONS)
    with pytest.raises(KeyReuseError):
        provider.submit("T:1", corpus[1], OPTIONS)
    provider.cancel(job.job_id)
    calls = provider.calls()
    assert [(c["op"], c["outcome"]) for c in calls] == [
        ("lookup", "not_found"), ("submit", "created"), ("submit", "conflict"),
        ("lookup", "not_found"), ("lookup", "found"), ("poll", "succeeded"), ("fetch", "fetched"),
        ("submit", "deduped"), ("submit", "rejected"), ("cancel", "succeeded")]
    assert [c["seq"] for c in calls] == sorted(c["seq"] for c in calls)
    assert {c["task_key"] for c in calls} == {"T"}
    (execution,) = provider.executions()
    assert (execution["job_id"], execution["status"], execution["artifact_sha256"]) == (
        job.job_id, "succeeded", provider.poll(job.job_id).artifact_sha256)


def test_refused_calls_are_logged_before_they_raise(open_provider, doc):
    with pytest.raises(TransientError):
        open_provider(Contract(transient_rate=1.0)).submit("T:1", doc, OPTIONS)
    with pytest.raises(TransientError):
        open_provider(Contract(lookup="unavailable")).lookup("T:1")
    assert [c["outcome"] for c in open_provider().calls()] == ["transient", "unavailable"]


def test_provider_records_read_only_match_the_live_logs_and_the_checker_types(open_provider, doc,
                                                                               tmp_path):
    from toolkit.checker import Call, Execution

    provider = open_provider()
    provider.submit("T:1", doc, OPTIONS)
    provider.lookup("T:1")
    records = provider_records(tmp_path / "provider.db")
    assert records == {"calls": provider.calls(), "executions": provider.executions()}
    assert [Call(**c).outcome for c in records["calls"]] == ["created", "found"]
    assert [Execution(**e).status for e in records["executions"]] == ["succeeded"]


def test_cancel_during_execution_discards_the_result_but_counts_the_work(tmp_path, doc):
    def cancel_midway(phase, job_id):
        if phase == "executed":
            with FakeProvider(tmp_path / "p.db", tmp_path / "out") as other:
                other.cancel(job_id)

    with FakeProvider(tmp_path / "p.db", tmp_path / "out", on_phase=cancel_midway) as provider:
        job = provider.submit("T:1", doc, OPTIONS)
        assert job.status == JobStatus.CANCELLED and job.artifact_path is None
        assert not (tmp_path / "out" / f"{job.job_id}.pdf").exists()
        assert provider.key_stats()["T:1"] == {"submit_calls": 1, "executions": 1}
        assert [e["status"] for e in provider.executions()] == ["cancelled"]


def test_task_counters_group_attempt_keys_by_task_key(open_provider, corpus):
    provider = open_provider()
    provider.submit("T:1", corpus[-1], OPTIONS)  # poison: failed
    provider.submit("T:2", corpus[0], OPTIONS)
    provider.submit("X:1", corpus[0], OPTIONS, task_key="custom")
    stats = provider.stats()
    assert stats == {"submit_calls": 3, "executions": 3, "succeeded": 2, "failed": 1, "per_task": {
        "T": {"submit_calls": 2, "executions": 2, "succeeded": 1},
        "custom": {"submit_calls": 1, "executions": 1, "succeeded": 1}}}


def test_counters_survive_reopening_the_db_and_read_only_stats_agree(open_provider, doc, tmp_path):
    first = open_provider()
    first.submit("T:1", doc, OPTIONS)
    first.submit("T:1", doc, OPTIONS)
    before = first.stats()
    first.close()
    assert open_provider().stats() == before == provider_stats(tmp_path / "provider.db")
    assert before["submit_calls"] == 2 and before["executions"] == 1


def test_provider_stats_refuses_what_is_not_a_provider_db(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite at all" * 10)
    foreign = tmp_path / "ledger.db"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE items (key TEXT)")
    for path in (junk, foreign, tmp_path / "missing.db"):
        with pytest.raises(ToolkitError, match="not a provider database"):
            provider_stats(path)
    with pytest.raises(ToolkitError, match="not a provider database"):
        FakeProvider(foreign, tmp_path / "out")
    assert not (tmp_path / "missing.db").exists()  # read-only: nothing created


def _submit_after_barrier(db, out, doc, barrier, results):
    with FakeProvider(db, out) as provider:
        barrier.wait(timeout=60)
        results.put(provider.submit("T:1", doc, OPTIONS).job_id)


def test_two_processes_submitting_one_key_concurrently_execute_once(tmp_path, doc):
    """Both processes pass a barrier and submit the same key; the claim lets one execute."""
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    workers = [ctx.Process(target=_submit_after_barrier,
                           args=(tmp_path / "p.db", tmp_path / "out", doc, barrier, results))
               for _ in range(2)]
    for worker in workers:
        worker.start()
    job_ids = {results.get(timeout=60) for _ in workers}
    for worker in workers:
        worker.join(timeout=60)
    assert [w.exitcode for w in workers] == [0, 0] and len(job_ids) == 1
    stats = provider_stats(tmp_path / "p.db")
    assert (stats["submit_calls"], stats["executions"], stats["succeeded"]) == (2, 1, 1)


def _die_before_commit(db, out, doc):
    def crash(phase, job_id):
        if phase == "executed":
            os._exit(9)  # work done, result never committed

    FakeProvider(db, out, on_phase=crash).submit("T:1", doc, OPTIONS)


def test_job_left_running_by_a_dead_provider_process_is_executed_by_the_next_call(tmp_path, doc):
    child = multiprocessing.get_context("fork").Process(
        target=_die_before_commit, args=(tmp_path / "p.db", tmp_path / "out", doc))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 9
    with FakeProvider(tmp_path / "p.db", tmp_path / "out") as provider:
        (orphan,) = provider.jobs()
        assert orphan.status == JobStatus.RUNNING and provider.stats()["executions"] == 0
        recovered = provider.poll(orphan.job_id)
        assert recovered.status == JobStatus.SUCCEEDED and provider.stats()["executions"] == 1
        assert verify(recovered.artifact_path, recovered.artifact_size, recovered.artifact_sha256)


class _Crash(BaseException):
    """Stands for an interpreter dying mid-execution inside this process."""


def test_execution_abandoned_by_an_exception_in_this_process_is_recovered(tmp_path, doc):
    def crash(phase, job_id):
        if phase == "claimed":
            raise _Crash

    with FakeProvider(tmp_path / "p.db", tmp_path / "out", on_phase=crash) as crashing:
        with pytest.raises(_Crash):
            crashing.submit("T:1", doc, OPTIONS)
    with FakeProvider(tmp_path / "p.db", tmp_path / "out") as provider:
        assert provider.lookup("T:1").status == JobStatus.SUCCEEDED
        assert provider.key_stats()["T:1"] == {"submit_calls": 1, "executions": 1, "succeeded": 1}


@pytest.mark.parametrize("spec", ["idempotent", "non-idempotent", "idempotent,lag=2",
                                  "non-idempotent,retention=86400,conflict,run-polls=3",
                                  "idempotent,unavailable,transient=0.15,seed=4"])
def test_contract_specs_round_trip_through_describe(spec):
    assert parse_contract(spec).describe() == spec


_lookups = st.sampled_from([("consistent", 0), ("unavailable", 0)]) | st.tuples(
    st.just("lagging"), st.integers(0, 9))


@given(_lookups, st.builds(dict, idempotent_keys=st.booleans(), active_conflict=st.booleans(),
                           key_retention=st.none() | st.floats(0.5, 1e6), run_polls=st.integers(0, 5),
                           transient_rate=st.floats(0, 1), seed=st.integers(0, 99)))
def test_every_contract_round_trips_through_its_spec(lookup, knobs):
    contract = Contract(lookup=lookup[0], lag=lookup[1], **knobs)
    assert parse_contract(contract.describe()) == contract


@pytest.mark.parametrize("spec", ["", "maybe", "idempotent,lag=x", "lag=2,unavailable",
                                  "transient=2", "idempotent,idempotent"])
def test_bad_contract_spec_is_a_one_line_error_listing_the_valid_forms(spec):
    with pytest.raises(ToolkitError) as caught:
        parse_contract(spec)
    assert "\n" not in str(caught.value) and "non-idempotent" in str(caught.value)


def test_importing_provider_does_not_import_pymupdf():
    code = "import sys, toolkit.provider; print('pymupdf' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
