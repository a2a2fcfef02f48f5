"""`python -m toolkit run` stopped by a real signal (``kill -TERM``, SIGHUP), then run again.

SIGTERM is what ``kill``, systemd, ``docker stop`` and CI timeouts send. The run stops at
the end of the step under way (its move committed), releases the item's lease, records the
witness's end and exits 1 ("run again"); the rerun finishes the batch with no document
executed twice and, where keys are not idempotent, nothing parked for a person: a stop
never falls between an intent and its send. A second signal stops at once (exit 130).
So from the run's first instant (a signal while Python imports the command line) and with
``--workers`` (each worker stops at its step's end). Real processes, real signals, a non-idempotent provider whose counters say whether any
document ran twice; the checker judges the whole history.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import run_cli
from toolkit.checker import check, explain
from toolkit.documents import make_corpus
from toolkit.drills import collect_history
from toolkit.ledger import open_ledger
from toolkit.provider import FakeProvider, parse_contract, provider_stats

pytestmark = pytest.mark.slow

# Slow on purpose: each job runs at its 3rd poll, so a run spends most of its time in the
# backoff between polls (an item in ``submitted``) and a signal lands mid-batch.
CONTRACT = "non-idempotent,run-polls=3"

# The real CLI, whose runner hook sends this process a real signal at the run's first
# ``after_intent`` (the instant after an intent is durable, before its request is sent):
# ``argv[1]`` names the signal, ``argv[2]`` how many times. The hook seam the CLI's own
# witness hook sits on, as the drills inject their faults.
SIGNAL_AFTER_FIRST_INTENT = """
import os, signal, sys
from toolkit.runner import witness_progress
recording, sent = witness_progress.Progress.__call__, []
SIGNUM, TIMES = signal.Signals[sys.argv.pop(1)], int(sys.argv.pop(1))
def call(self, point, key, **context):
    recording(self, point, key, **context)
    if point == "after_intent" and not sent:
        sent.append(key)
        for _ in range(TIMES):
            os.kill(os.getpid(), SIGNUM)
witness_progress.Progress.__call__ = call
from toolkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _args(tmp_path, suffix=".sqlite"):
    return ["run", "--inputs", tmp_path / "in", "--ledger", tmp_path / f"L{suffix}",
            "--provider-db", tmp_path / "p.db", "--out", tmp_path / "out",
            "--contract", CONTRACT, "--no-progress"]


def _executions(db) -> int:
    try:
        return provider_stats(db)["executions"]
    except Exception:  # not created yet
        return 0

def _until_two_executions(child, provider_db) -> None:
    """Wait until the run ``child`` has executed two documents; it must still be running."""
    deadline = time.monotonic() + 120
    while _executions(provider_db) < 2 and child.poll() is None and \
            time.monotonic() < deadline:
        time.sleep(0.005)
    assert child.poll() is None, "the run ended before the signal: too few documents"


def _leases_and_seq(ledger_path):
    with open_ledger(ledger_path) as ledger:
        held = [item.key for item in ledger.items() if item.lease_owner is not None]
        return held, max(event.seq for event in ledger.events())


def _witnessed_seq(tmp_path, ledger_path) -> int:
    entries = json.loads((tmp_path / "out" / ".witness.json").read_text())["ledgers"]
    return entries[str(ledger_path.resolve())]["seq"]


def _rerun_rests_with_no_double_and_nothing_parked(tmp_path, ledger_path, docs):
    rerun = run_cli(*_args(tmp_path, ledger_path.suffix), "--json")
    assert rerun.returncode == 0, rerun.stderr
    by_state = json.loads(rerun.stdout)["by_state"]
    assert (by_state["done"], by_state["needs_review"]) == (docs, 0)
    per_task = provider_stats(tmp_path / "p.db")["per_task"].values()
    assert all(row["submit_calls"] == 1 and row["executions"] == 1 for row in per_task)
    verdict = checked(tmp_path, ledger_path, CONTRACT)
    assert verdict.valid is True, [explain(a) for found in verdict.anomalies.values()
                                   for a in found] + list(verdict.notes)


def checked(tmp_path, ledger_path, contract: str):
    """The checker's verdict on the whole history: the ledger, the provider at
    ``tmp_path/p.db`` (its calls and executions), the inputs in ``in``, the outputs in ``out``."""
    contract = dataclasses.replace(parse_contract(contract), seed=0)
    db = tmp_path / "p.db"
    inputs = sorted((tmp_path / "in").iterdir())
    with FakeProvider(db, db.with_name(db.stem + "-jobs"), contract) as provider:
        return check(collect_history(ledger_path, provider, inputs, contract,
                                     out=tmp_path / "out"))


@pytest.mark.parametrize("name,suffix", [("SIGTERM", ".sqlite"), ("SIGTERM", ".jsonl"),
                                         ("SIGHUP", ".sqlite"), ("SIGINT", ".sqlite")])
def test_sigterm_mid_batch_stops_at_a_step_end_releases_leases_and_rerun_has_no_double(
        tmp_path, name, suffix):
    """Fault: a real ``kill -TERM`` (or SIGHUP, or SIGINT: Ctrl-C) of a real ``run`` process
    mid-batch, once the provider executed 2 documents. Property: exit 1 with one line saying
    to run again, no traceback; no lease left held; the witness recorded the end (its seq
    is the ledger's); the rerun ends every document done, none executed or sent twice,
    none parked, and the checker finds nothing. Before: the process died of the signal
    (-15, -1), its lease held; Ctrl-C stopped it wherever it was (exit 130)."""
    signum = signal.Signals[name]
    docs = 10
    make_corpus(tmp_path / "in", docs=docs, poison=0, seed=5)
    ledger_path = tmp_path / f"L{suffix}"
    child = subprocess.Popen(
        [sys.executable, "-m", "toolkit", *map(str, _args(tmp_path, suffix))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # the signal as a foreground job has it, even under a test run started with it
        # ignored (``nohup``; ``&`` in a shell without job control ignores SIGINT)
        preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL))
    _until_two_executions(child, tmp_path / "p.db")
    child.send_signal(signum)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 1, err
    assert "Traceback" not in err
    assert f"stopped by {name}" in err and "run the same command" in err
    assert _executions(tmp_path / "p.db") < docs  # it stopped mid-batch
    held, seq = _leases_and_seq(ledger_path)
    assert held == []
    assert _witnessed_seq(tmp_path, ledger_path) == seq
    _rerun_rests_with_no_double_and_nothing_parked(tmp_path, ledger_path, docs)


def _signalled_after_first_intent(tmp_path, name, times):
    return subprocess.run([sys.executable, "-c", SIGNAL_AFTER_FIRST_INTENT, name, str(times),
                           *map(str, _args(tmp_path))], capture_output=True, text=True,
                          timeout=300,
                          preexec_fn=lambda: signal.signal(signal.Signals[name], signal.SIG_DFL))


def test_sigterm_between_intent_and_send_lets_the_send_happen_and_rerun_parks_nothing(
        tmp_path):
    """Fault: SIGTERM delivered the instant the run's first intent is durable, before its
    request is sent (the worst instant for a non-idempotent provider). Property: the step
    is not cut: the request is sent, the run stops at that step's end (exit 1), and the
    rerun sends nothing twice and parks nothing (a kill there leaves an intent that may
    have been sent: looked up, not found, parked for a person)."""
    docs = 4
    make_corpus(tmp_path / "in", docs=docs, poison=0, seed=6)
    stopped = _signalled_after_first_intent(tmp_path, "SIGTERM", 1)
    assert stopped.returncode == 1, stopped.stderr
    assert "Traceback" not in stopped.stderr
    sent = [row["submit_calls"] for row in provider_stats(tmp_path / "p.db")["per_task"].values()]
    assert sent == [1]  # the request in hand was sent, and no other
    assert _leases_and_seq(tmp_path / "L.sqlite")[0] == []
    _rerun_rests_with_no_double_and_nothing_parked(tmp_path, tmp_path / "L.sqlite", docs)


def test_second_sigterm_stops_at_once_with_130_and_rerun_sends_nothing_twice(tmp_path):
    """Fault: two SIGTERMs at once, right after the first intent (an impatient supervisor).
    Property: the second stops the run at once, as Ctrl-C did before: exit 130, one line,
    no traceback, nothing sent (the intent's request included); the rerun sends no document
    twice (the intent's request, maybe sent for all it knows, is parked, never resent)."""
    make_corpus(tmp_path / "in", docs=3, poison=0, seed=6)
    stopped = _signalled_after_first_intent(tmp_path, "SIGTERM", 2)
    assert stopped.returncode == 130, stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert _executions(tmp_path / "p.db") == 0
    rerun = run_cli(*_args(tmp_path), "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["by_state"]["done"] + \
        json.loads(rerun.stdout)["by_state"]["needs_review"] == 3
    assert all(row["submit_calls"] <= 1
               for row in provider_stats(tmp_path / "p.db")["per_task"].values())


def _sigterm_by_strace(tmp_path, path, syscalls, when, extra=(), stderr=None):
    """``python -m toolkit run`` (this batch) under strace, which delivers a real SIGTERM as
    the run makes its ``when``-th call of ``syscalls`` on ``path`` (``-P``: a file, or a
    descriptor of it)."""
    return subprocess.run(
        ["strace", "-f", "-qq", "-o", "/dev/null", "-P", str(path), "-e", f"trace={syscalls}",
         "-e", f"inject={syscalls}:signal=SIGTERM:when={when}", sys.executable, "-m",
         "toolkit", *map(str, _args(tmp_path)), *extra],
        stdout=subprocess.PIPE, stderr=stderr if stderr is not None else subprocess.PIPE,
        text=True, timeout=300, preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))


def test_sigterm_while_python_imports_the_command_line_stops_cleanly_before_any_send(tmp_path):
    """Fault: a real SIGTERM that arrives while ``python -m toolkit run`` is still importing
    its command line (strace delivers it as the process first stats ``cli/batch.py``), long
    before ``run`` could set a handler. Property: the run stops as a mid-batch stop does:
    exit 1, its one line, no traceback, nothing sent, no item ``unknown``; the rerun finishes
    with every document executed once. Before: the process died of the signal (143)."""
    import toolkit.cli.batch

    make_corpus(tmp_path / "in", docs=3, poison=0, seed=6)
    stopped = _sigterm_by_strace(tmp_path, toolkit.cli.batch.__file__,
                                 "stat,newfstatat,openat", 1)
    assert stopped.returncode == 1, stopped.stderr
    assert "Traceback" not in stopped.stderr and "stopped by SIGTERM" in stopped.stderr
    assert _executions(tmp_path / "p.db") == 0
    if (tmp_path / "L.sqlite").exists():
        with open_ledger(tmp_path / "L.sqlite") as ledger:
            assert [item.key for item in ledger.items() if item.state.value == "unknown"] == []
    _rerun_rests_with_no_double_and_nothing_parked(tmp_path, tmp_path / "L.sqlite", 3)


def _tracee(strace_pid) -> int:
    """The process strace started (its one child)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(f"/proc/{strace_pid}/task/{strace_pid}/children") as children:
            found = children.read().split()
        if found:
            return int(found[0])
        time.sleep(0.01)
    raise AssertionError("strace started no process")


def test_second_sigterm_as_the_stop_is_reported_exits_130_never_the_default_143(tmp_path):
    """Fault: a real SIGTERM mid-batch, then a second one as the run writes its "stopped
    by" line (strace delivers it at the second write to stderr, a file: the first is the
    handler's own line). Property: the second signal stops at once as the README says:
    exit 130, "interrupted", no traceback; no lease held; the rerun sends nothing twice.
    Before: the line was written after the handlers were given back, and the second
    signal ended the process by its default (143)."""
    docs = 10
    make_corpus(tmp_path / "in", docs=docs, poison=0, seed=5)
    err = tmp_path / "stderr.txt"
    with open(err, "w") as sink:
        child = subprocess.Popen(
            ["strace", "-f", "-qq", "-o", "/dev/null", "-P", str(err), "-e", "trace=write",
             "-e", "inject=write:signal=SIGTERM:when=2", sys.executable, "-m", "toolkit",
             *map(str, _args(tmp_path))], stdout=subprocess.PIPE, stderr=sink, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
        deadline = time.monotonic() + 120
        while _executions(tmp_path / "p.db") < 2 and child.poll() is None and \
                time.monotonic() < deadline:
            time.sleep(0.005)
        assert child.poll() is None, "the run ended before the signal: too few documents"
        os.kill(_tracee(child.pid), signal.SIGTERM)  # the run's, not strace's
        child.communicate(timeout=120)
    said = err.read_text()
    assert child.returncode == 130, said
    assert "Traceback" not in said and said.rstrip().endswith("interrupted")
    assert _leases_and_seq(tmp_path / "L.sqlite")[0] == []
    _rerun_rests_with_no_double_and_nothing_parked(tmp_path, tmp_path / "L.sqlite", docs)


@pytest.mark.parametrize("name,to_group", [("SIGTERM", False), ("SIGINT", True)])
def test_signal_to_run_with_workers_stops_each_at_a_step_end_and_leaves_nothing_unknown(
        tmp_path, name, to_group):
    """Fault: a real ``kill -TERM`` of ``run --workers 2`` mid-batch (2 documents executed),
    or Ctrl-C (SIGINT to the whole process group, the workers included), non-idempotent
    keys. Property: every worker stops at the end of its step under way: exit 1 with the
    one line, no traceback, no lease held, no item ``unknown`` (a request that may or may
    not have been sent); the rerun ends every document done, none sent twice, none parked,
    and the checker finds nothing. Before: SIGTERM killed the run (143) and its workers
    with it, mid-step; Ctrl-C interrupted each worker wherever it was, with tracebacks."""
    signum = signal.Signals[name]
    docs = 10
    make_corpus(tmp_path / "in", docs=docs, poison=0, seed=5)
    child = subprocess.Popen(
        [sys.executable, "-m", "toolkit", *map(str, _args(tmp_path)), "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=to_group,
        preexec_fn=lambda: signal.signal(signum, signal.SIG_DFL))
    _until_two_executions(child, tmp_path / "p.db")
    if to_group:
        os.killpg(child.pid, signum)  # as a terminal's Ctrl-C: to every process of the job
    else:
        child.send_signal(signum)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 1, err
    assert "Traceback" not in err and f"stopped by {name}" in err
    assert _executions(tmp_path / "p.db") < docs  # it stopped mid-batch
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        items = ledger.items()
        assert [item.key for item in items if item.lease_owner is not None] == []
        assert [item.key for item in items if item.state.value == "unknown"] == []
    _rerun_rests_with_no_double_and_nothing_parked(tmp_path, tmp_path / "L.sqlite", docs)
