"""Operator rules: fail-closed health, precise cancellation, recovery of dead owners only."""

import subprocess
import sys

import pytest

from toolkit.errors import ToolkitError
from toolkit.faults import fill_disk
from toolkit.ledger import State, open_ledger
from toolkit.provider import Contract, FakeProvider
from toolkit.runner import RetryPolicy, Runner
from toolkit.runner.ops import clear_health, health
from toolkit.runner.reclaim import cancel, recover_abandoned

S = State


def cli(*args):
    return subprocess.run([sys.executable, "-m", "toolkit", *map(str, args)], capture_output=True,
                          text=True)


@pytest.fixture
def batch(tmp_path, small_corpus):
    provider = FakeProvider(tmp_path / "p.db", tmp_path / "p-jobs",
                            Contract(idempotent_keys=False, run_polls=50))

    def runner(ledger=None, **options):
        ledger = ledger or open_ledger(tmp_path / "l.sqlite")
        return Runner(ledger, provider, tmp_path / "out", policy=RetryPolicy(base_delay=0, polls=2),
                      sleep=lambda s: None, worker="w1", **options)
    return runner, provider, tmp_path / "l.sqlite"


def test_full_disk_halts_the_batch_marks_it_not_ready_and_later_runs_refuse(batch, small_corpus):
    runner, provider, path = batch
    first = runner(fill_disk(open_ledger(path), after=10))  # 5 adds, a quarantine, claim, intent
    first.run(small_corpus)
    first.close()
    assert first.halted and "No space left" in first.halted
    assert provider.stats()["submit_calls"] == 1  # stopped right after the unrecordable reply
    assert health(path) == {"ready": False, "reason": first.halted}
    result = cli("health", "--ledger", path)
    assert result.returncode == 1 and "not ready" in result.stdout
    second = runner()
    with pytest.raises(ToolkitError, match="not ready"):
        second.run(small_corpus)
    second.close()
    assert provider.stats()["submit_calls"] == 1  # refused before any submit
    assert cli("health", "--ledger", path, "--clear").returncode == 0
    third = runner()
    third.run(small_corpus)
    third.close()
    assert health(path)["ready"]


def test_cancel_stops_only_that_job_and_no_later_run_retries_it(batch, small_corpus):
    runner, provider, path = batch
    first = runner()
    first.run(small_corpus)  # run_polls=50: every job is still running when polls run out
    first.close()
    with open_ledger(path) as ledger:
        victim, other = [item for item in ledger.items() if item.state is S.SUBMITTED][:2]
    result = cli("cancel", "--ledger", path, "--key", victim.key[:10], "--provider-db",
                 provider.db_path)
    assert result.returncode == 0, result.stderr
    jobs = {job.job_id: job for job in provider.jobs()}
    assert jobs[victim.job_id].status == "cancelled" and jobs[other.job_id].status != "cancelled"
    with open_ledger(path) as ledger:
        seen = len(ledger.events())
    second = runner()
    second.run(small_corpus)
    second.close()
    with open_ledger(path) as ledger:
        assert ledger.get(victim.key).state is S.CANCELLED
        assert not [e for e in ledger.events()[seen:] if e.key == victim.key]  # untouched
    assert provider.stats()["per_task"][victim.key]["submit_calls"] == 1


def test_cancel_of_a_terminal_or_ambiguous_item_is_a_one_line_error(batch, small_corpus):
    runner, provider, path = batch
    first = runner()
    first.run(small_corpus)
    first.close()
    with open_ledger(path) as ledger:
        poison = next(item for item in ledger.items() if item.state is S.FAILED)
    result = cli("cancel", "--ledger", path, "--key", poison.key, "--provider-db", provider.db_path)
    assert result.returncode == 2 and "nothing to cancel" in result.stderr
    assert cli("cancel", "--ledger", path, "--key", "", "--provider-db",
               provider.db_path).returncode == 2


def test_dead_owner_item_goes_back_to_unknown_and_a_live_slow_owner_keeps_it(tmp_path):
    path = tmp_path / "l.sqlite"
    with open_ledger(path) as ledger:
        for key in ("dead", "alive"):
            ledger.add(key)
            ledger.move(key, S.PENDING, S.UNKNOWN)
            ledger.move(key, S.UNKNOWN, S.SUBMITTED, job_id=f"job-{key}")
    children = {key: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                for key in ("dead", "alive")}
    try:
        with open_ledger(path) as ledger:
            for key, child in children.items():
                ledger.claim(key, f"worker-{key}", ttl=0.0, pid=child.pid)  # expired at once
            children["dead"].kill()
            children["dead"].wait()
            assert recover_abandoned(ledger, "restarted") == ["dead"]
            dead, alive = ledger.get("dead"), ledger.get("alive")
        assert (dead.state, dead.reason, dead.lease_owner) == (S.UNKNOWN, "owner_exited", None)
        assert (alive.state, alive.lease_owner) == (S.SUBMITTED, "worker-alive")
    finally:
        for child in children.values():
            child.kill()
            child.wait()


def test_recovery_at_start_leaves_an_owner_on_another_host_alone(tmp_path):
    """Its pid is not in our process table; it is not dead for that: no owner_exited move."""
    path = tmp_path / "l.sqlite"
    with open_ledger(path) as ledger:
        ledger.add("remote")
        ledger.move("remote", S.PENDING, S.UNKNOWN)
        ledger.move("remote", S.UNKNOWN, S.SUBMITTED, job_id="job-remote")
        ledger.claim("remote", "worker-on-b", ttl=0.0, pid=2 ** 22 + 12_345, host="host-b")
        assert recover_abandoned(ledger, "restarted") == []
        item = ledger.get("remote")
    assert (item.state, item.lease_owner, item.lease_host) == (S.SUBMITTED, "worker-on-b",
                                                                "host-b")


def test_runner_recovers_a_killed_runs_lease_and_reconciles_by_lookup(tmp_path, small_corpus):
    """A real run is SIGKILLed holding a lease; the next run takes it over and looks it up."""
    provider_db = tmp_path / "p.db"
    code = ("import os, signal, sys\n"
            "from toolkit.ledger import open_ledger\n"
            "from toolkit.provider import FakeProvider, Contract\n"
            "from toolkit.runner import Runner, RetryPolicy\n"
            "def hook(point, key, **ctx):\n"
            "    if point == 'before_commit' and ctx.get('to') == 'done':\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            "p = FakeProvider(sys.argv[2], sys.argv[3], Contract(idempotent_keys=False))\n"
            "Runner(open_ledger(sys.argv[1]), p, sys.argv[4], hook=hook,\n"
            "       policy=RetryPolicy(base_delay=0)).run(sys.argv[5:])\n")
    child = subprocess.run([sys.executable, "-c", code, tmp_path / "l.sqlite", provider_db,
                            tmp_path / "jobs", tmp_path / "out", *small_corpus])
    assert child.returncode == -9
    provider = FakeProvider(provider_db, tmp_path / "jobs", Contract(idempotent_keys=False))
    runner = Runner(open_ledger(tmp_path / "l.sqlite"), provider, tmp_path / "out",
                    policy=RetryPolicy(base_delay=0), sleep=lambda s: None)
    counts = runner.run(small_corpus)
    runner.close()
    assert len(runner.recovered) == 1 and counts["done"] == 4
    assert provider.stats()["executions"] == 4  # reconciled, never re-executed
