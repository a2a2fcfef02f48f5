"""The provider as a real HTTP service on loopback: real timeouts, real kills, real cuts.

Every test starts its own ``serve-provider`` process on a free 127.0.0.1
port and stops it (the ``service`` fixture); the runner talks to it through
``HttpProvider``. Faults are real: a socket read timeout while the job runs
on in the service, SIGKILL of the service mid-job, a refused connection, a
download that stops halfway. The checker is the oracle wherever a whole batch
ran. Timeouts below are configuration, never assertions.
"""

import json
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing

import pytest

from toolkit.checker import check
from toolkit.documents import make_corpus, verify
from toolkit.drills import collect_history
from toolkit.errors import KeyReuseError, PermanentError, ToolkitError, TransientError
from toolkit.ledger import State, open_ledger
from toolkit.provider import (
    ACTIVE,
    FakeProvider,
    JobStatus,
    ProviderConflict,
    parse_contract,
)
from toolkit.provider.client import HttpProvider, ServiceProcess
from toolkit.provider.service import ServiceFaults
from toolkit.roots import artifact_file
from toolkit.runner import RetryPolicy
from toolkit.runner.registry import open_strategy

READ_TIMEOUT = 2.0  # the read timeout of the tests whose submit is slow on purpose
# Every other test waits this long for a reply: under load (CI runs three test files at
# once on two cores) an ordinary reply can take longer than 2 s, and a test that is not
# about lost replies must not lose one.
CALM_TIMEOUT = 30.0
SLOW = 3.0  # a slow submit keeps its job running this long: longer than READ_TIMEOUT
POLICY = RetryPolicy(lookups=40, polls=200, base_delay=0.01, max_delay=0.05)


@pytest.fixture
def service(tmp_path):
    """``start(contract, **faults) -> ServiceProcess``; every process is stopped afterwards."""
    started = []

    def start(contract="idempotent", **faults):
        n = len(started)
        process = ServiceProcess(tmp_path / f"provider{n}.db", tmp_path / f"provider{n}-jobs",
                                 contract, faults=ServiceFaults(**faults))
        started.append(process)
        process.start()
        return process

    yield start
    for process in started:
        process.stop()
    assert not any(process.alive for process in started)


@pytest.fixture
def client():
    """``connect(url, **timeouts) -> HttpProvider`` (calm timeouts unless given), closed
    afterwards."""
    opened = []

    def connect(url, **timeouts):
        opened.append(HttpProvider(url, **{"read_timeout": CALM_TIMEOUT, **timeouts}))
        return opened[-1]

    yield connect
    for each in opened:
        each.close()


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("docs"), docs=3, poison=0, seed=5)


def run_batch(strategy, provider, tmp_path, inputs, policy=POLICY):
    runner = open_strategy(strategy, tmp_path / "ledger.sqlite", provider, tmp_path / "out",
                           policy=policy, sleep=time.sleep)
    try:
        counts = runner.run(inputs)
    finally:
        runner.close()
    return runner, counts


def settle(provider, seconds=30.0):
    """Wait (bounded) until no job is queued or running at the service."""
    deadline = time.monotonic() + seconds
    while any(job.status in ACTIVE for job in provider.jobs()):
        assert time.monotonic() < deadline, "jobs still running at the service"
        time.sleep(0.05)


def verdict(tmp_path, provider, inputs):
    return check(collect_history(tmp_path / "ledger.sqlite", provider, inputs, provider.contract))


def executions_per_task(provider):
    counts = {}
    for row in provider.executions():
        counts[row["task_key"]] = counts.get(row["task_key"], 0) + 1
    return counts


def test_read_timeout_while_job_runs_is_reconciled_by_lookup_without_second_execution(
        tmp_path, service, client, docs):
    """The first submit's job runs longer than the client's read timeout: the client
    gives up, the service finishes the job anyway. The safe runner must look the key
    up (finding the job still running), wait for it and fetch it: one submit and one
    execution per document, against a provider that does not dedupe."""
    provider = client(service("non-idempotent", slow_submits=1, slow_seconds=SLOW).url,
                      read_timeout=READ_TIMEOUT)
    runner, counts = run_batch("safe", provider, tmp_path, docs)

    assert runner.lost_replies == 1  # the socket read timeout really fired
    assert counts["done"] == len(docs)
    stats = provider.stats()
    assert all(row["submit_calls"] == row["executions"] == 1 for row in stats["per_task"].values())
    first, calls = provider.jobs()[0], provider.calls()
    assert [c["outcome"] for c in calls if c["op"] == "lookup"] == ["found"]
    polled = [c["outcome"] for c in calls if c["op"] == "poll" and c["job_id"] == first.job_id]
    assert polled[0] == "running" and polled[-1] == "succeeded"  # it ran on after the timeout
    assert verdict(tmp_path, provider, docs).valid is True


def test_blind_retry_over_http_double_executes_when_the_reply_is_lost_non_idempotent(
        tmp_path, service, client, docs):
    """The same lost reply; the blind-retry strategy resubmits at once. The service
    runs both jobs to the end: the checker must find the double execution."""
    provider = client(service("non-idempotent", slow_submits=1, slow_seconds=SLOW).url,
                      read_timeout=READ_TIMEOUT)
    run_batch("blind-retry", provider, tmp_path, docs)
    settle(provider)  # the abandoned first job commits in the service after the client left

    assert sorted(executions_per_task(provider).values()) == [1] * (len(docs) - 1) + [2]
    result = verdict(tmp_path, provider, docs)
    assert result.valid is False and "double_execution" in result.anomalies


def running_jobs(db_path) -> int:
    try:
        with closing(sqlite3.connect(db_path.resolve().as_uri() + "?mode=ro", uri=True)) as db:
            return db.execute("SELECT COUNT(*) FROM jobs WHERE status='running'").fetchone()[0]
    except sqlite3.Error:
        return 0  # not created yet


def test_service_sigkilled_mid_job_and_restarted_finishes_batch_with_one_execution_each(
        tmp_path, service, client, docs):
    """SIGKILL hits the service while it executes the first job (the reply is not sent
    yet); it restarts on the same port. The client's connection breaks after sending:
    outcome unknown. The lookup after the restart finds the orphaned job, the service
    runs it again under its own recovery, and no document is executed twice."""
    process = service("non-idempotent", slow_submits=1, slow_seconds=60)
    provider = client(process.url, read_timeout=READ_TIMEOUT)
    outcome = {}
    patient = RetryPolicy(lookups=300, polls=200, base_delay=0.01, max_delay=0.05)  # outlasts a restart
    worker = threading.Thread(target=lambda: outcome.update(
        zip(("runner", "counts"), run_batch("safe", provider, tmp_path, docs, patient))),
        daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    while running_jobs(process.db_path) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    process.kill()
    process.restart()
    worker.join(timeout=60)
    assert not worker.is_alive()

    assert outcome["runner"].lost_replies == 1
    assert outcome["counts"]["done"] == len(docs)
    with closing(sqlite3.connect(process.db_path)) as db:  # the killed execution was redone once
        assert db.execute("SELECT MAX(exec_no) FROM jobs").fetchone()[0] == 2
    assert set(executions_per_task(provider).values()) == {1}
    assert verdict(tmp_path, provider, docs).valid is True


def test_connection_refused_is_a_definite_not_now_and_a_later_run_finishes(
        tmp_path, service, client, docs):
    """With the service down every connection is refused before anything is sent: the
    client must say TransientError (nothing accepted), the runner parks the items as
    failed(transient), never unknown; after the restart a rerun finishes them."""
    process = service("non-idempotent")
    provider = client(process.url)
    process.stop()
    with pytest.raises(TransientError):
        provider.submit("k:1", docs[0], {})
    with pytest.raises(TransientError):
        provider.lookup("k:1")

    _, counts = run_batch("safe", provider, tmp_path, docs, RetryPolicy(base_delay=0.001))
    assert counts["failed"] == len(docs)
    with open_ledger(tmp_path / "ledger.sqlite") as ledger:
        assert {(item.state, item.failure) for item in ledger.items()} == {(State.FAILED, "transient")}
    process.start()
    assert provider.stats()["submit_calls"] == 0  # nothing reached the provider

    _, counts = run_batch("safe", provider, tmp_path, docs)
    assert counts["done"] == len(docs)
    assert set(executions_per_task(provider).values()) == {1}
    assert verdict(tmp_path, provider, docs).valid is True


def test_response_cut_mid_body_is_never_accepted_and_items_end_done_with_verified_artifacts(
        tmp_path, service, client, docs):
    """The service announces the artifact's full Content-Length and stops halfway. The
    client must refuse it and leave no file; the runner fetches again and records done
    only with the provider's bytes."""
    probe = client(service("idempotent", cut_fetches=1).url)
    job = probe.submit("probe:1", docs[0], {"lang": "de"})
    dest = tmp_path / "probe.pdf"
    with pytest.raises(TimeoutError):
        probe.fetch(job.job_id, dest)
    assert not dest.exists()
    assert verify(probe.fetch(job.job_id, dest).artifact_path and dest, job.artifact_size,
                  job.artifact_sha256)

    provider = client(service("idempotent", cut_fetches=2).url)
    _, counts = run_batch("safe", provider, tmp_path, docs)
    assert counts["done"] == len(docs)
    with open_ledger(tmp_path / "ledger.sqlite") as ledger:
        items = list(ledger.items())
    jobs = {job.job_id: job for job in provider.jobs()}
    for item in items:
        assert verify(artifact_file(tmp_path / "ledger.sqlite", item.artifact_path),
                      jobs[item.job_id].artifact_size, jobs[item.job_id].artifact_sha256)
    assert provider.stats()["executions"] == len(docs)
    assert sum(call["op"] == "fetch" for call in provider.calls()) == len(docs) + 2  # 2 were cut
    assert verdict(tmp_path, provider, docs).valid is True


def test_health_is_not_ready_and_submits_are_refused_while_the_job_table_cannot_be_written(
        service, client, docs):
    """Another process holds the provider database's write lock: health must say
    not-ready, and a submit must be refused as transient before anything is accepted."""
    process = service("idempotent")
    provider = client(process.url)
    assert provider.health()["ready"] is True
    blocker = sqlite3.connect(process.db_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        health = provider.health()
        assert health["ready"] is False and "locked" in health["reason"]
        with pytest.raises(TransientError, match="not ready"):
            provider.submit("k:1", docs[0], {})
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert provider.stats()["submit_calls"] == 0
    assert provider.health()["ready"] is True
    assert provider.submit("k:1", docs[0], {}).status is JobStatus.SUCCEEDED


def test_active_key_answers_409_naming_its_job_and_cancel_hits_only_that_job(service, client, docs):
    """Under a conflict contract a second submit of a running key is a 409 naming the
    job (never a second job); cancel stops exactly the job named and no other."""
    provider = client(service("non-idempotent,conflict,run-polls=3").url)
    first = provider.submit("a:1", docs[0], {})
    other = provider.submit("b:1", docs[1], {})
    with pytest.raises(ProviderConflict) as conflict:
        provider.submit("a:1", docs[0], {})
    assert conflict.value.job.job_id == first.job_id
    assert provider.cancel(first.job_id).status is JobStatus.CANCELLED
    assert provider.poll(other.job_id).status in ACTIVE
    assert [job.job_id for job in provider.jobs()] == [first.job_id, other.job_id]


def normalized(job):
    if job is None:
        return None
    data = job.to_dict()
    for field in ("created", "updated", "artifact_path"):
        data.pop(field)
    return data


def script(provider, docs, dest):
    """The same calls in the same order; every answer, or the error's type."""
    answers = []
    steps = [lambda: provider.submit("x:1", docs[0], {"lang": "fr"}),
             lambda: provider.lookup("x:1"), lambda: provider.lookup("missing:1"),
             lambda: provider.poll("job-000001"), lambda: provider.poll("job-000001"),
             lambda: provider.fetch("job-000001", dest),
             lambda: provider.submit("x:1", docs[0], {"lang": "fr"}),
             lambda: provider.submit("x:1", docs[1], {"lang": "fr"}),
             lambda: provider.fetch("job-000099", dest), lambda: provider.cancel("job-000001")]
    for step in steps:
        try:
            answers.append(normalized(step()))
        except (KeyReuseError, PermanentError, TransientError) as exc:
            answers.append(type(exc).__name__)
    return answers, provider.stats()


def test_http_client_and_in_process_provider_agree_call_for_call(tmp_path, service, client, docs):
    """Backend agreement: submit, dedupe, lookup (found and missing), deferred
    execution by polls, fetch, key reuse, a missing job, cancel of a finished job."""
    contract = "idempotent,run-polls=2"
    with FakeProvider(tmp_path / "local.db", tmp_path / "local-jobs", parse_contract(contract)) as local:
        expected = script(local, docs, tmp_path / "local.pdf")
    remote = client(service(contract).url)
    assert script(remote, docs, tmp_path / "remote.pdf") == expected
    assert "KeyReuseError" in expected[0] and "PermanentError" in expected[0]
    assert (tmp_path / "remote.pdf").read_bytes() == (tmp_path / "local.pdf").read_bytes()


def run_cli(*args, **options):
    return subprocess.run([sys.executable, "-m", "toolkit", *map(str, args)], capture_output=True,
                          text=True, **options)


def test_run_cli_client_sigkilled_then_rerun_against_the_live_service_executes_nothing_twice(
        tmp_path, service):
    """``run --provider-url`` is killed with SIGKILL mid-batch while the service keeps
    running; reruns of the same command finish the batch by lookup, no double execution."""
    inputs = make_corpus(tmp_path / "in", docs=8, poison=1, seed=2)
    process = service("non-idempotent")
    command = [sys.executable, "-m", "toolkit", "run", "--inputs", tmp_path / "in", "--ledger",
               tmp_path / "ledger.sqlite", "--provider-url", process.url, "--out", tmp_path / "out",
               "--json"]
    child = subprocess.Popen(list(map(str, command)), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    with HttpProvider(process.url) as provider:
        deadline = time.monotonic() + 30
        while provider.stats()["executions"] < 3 and child.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.005)
        killed = child.poll() is None
        child.kill()
        child.wait(timeout=30)
        assert killed  # the batch really was interrupted
        for _ in range(3):
            final = run_cli(*command[3:])
            if final.returncode == 0:
                break
        assert final.returncode == 0, final.stderr
        by_state = json.loads(final.stdout)["by_state"]
        assert by_state["done"] + by_state["needs_review"] == 8 and by_state["failed"] == 1
        stats = provider.stats()
        assert all(row["submit_calls"] == 1 and row["executions"] <= 1
                   for row in stats["per_task"].values())
        assert verdict(tmp_path, provider, inputs).valid is True


def test_run_refuses_a_foreign_url_both_providers_and_a_contract_the_service_does_not_state(
        tmp_path, service):
    """Only http://127.0.0.1:PORT; --provider-db and --provider-url exclude each other; a
    --contract that differs from the service's is refused before any work."""
    make_corpus(tmp_path / "in", docs=1, poison=0, seed=0)
    common = ["run", "--inputs", tmp_path / "in", "--ledger", tmp_path / "l.sqlite", "--out",
              tmp_path / "out"]
    foreign = run_cli(*common, "--provider-url", "http://example.com:80")
    assert foreign.returncode == 2 and "loopback only" in foreign.stderr
    assert foreign.stderr.count("\n") == 1
    both = run_cli(*common, "--provider-url", "http://127.0.0.1:9", "--provider-db", tmp_path / "p.db")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    process = service("idempotent")
    differs = run_cli(*common, "--provider-url", process.url, "--contract", "non-idempotent")
    assert differs.returncode == 2 and "differs from the service's contract" in differs.stderr
    assert not (tmp_path / "l.sqlite").exists()
    with pytest.raises(ToolkitError, match="loopback only"):
        HttpProvider("http://localhost:80")
