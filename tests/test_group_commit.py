"""Group commit (toolkit.ledger.group): shared fsyncs, and every ack still follows its own.

The thread tests are made deterministic by a gate in the leader's flush: the
first fsync waits until every other caller has written its transition and
taken its ticket, so the schedule is always "one leader, everyone else
queued behind its fsync". What each test checks is an ordering (an ack never
precedes the fsync covering it), not a time. The process test uses real
SIGKILLs; the explore tests kill at every durable step, with power loss for
JSONL.
"""

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading

import pytest

from toolkit.errors import StaleTokenError
from toolkit.explore import Plan, explore
from toolkit.ledger import State, open_ledger

S = State
WRITERS = 6


def _covered(ledger):
    """The highest event seq already written (so the fsync that starts now covers it)."""
    if ledger.path.suffix == ".jsonl":
        return ledger._seq
    with sqlite3.connect(ledger.path) as db:  # committed rows only, as any reader sees
        return db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]


def gate(ledger, ready):
    """Instrument the ledger's group: count tickets, hold the first flush until ``ready()``,
    and make every ack check that an fsync covering its event has completed."""
    group = ledger._group
    state = {"tickets": 0, "synced": 0, "early_acks": [], "acks": []}
    cond = threading.Condition()
    real_ticket, real_flush = group.ticket, group._flush

    def ticket():
        number = real_ticket()
        with cond:
            state["tickets"] += 1
            cond.notify_all()
        return number

    def flush():
        with cond:
            assert cond.wait_for(lambda: ready(state), timeout=60), "writers never arrived"
        covered = _covered(ledger)
        real_flush()
        with cond:
            state["synced"] = max(state["synced"], covered)

    def on_event(event):  # called after the caller's wait, just before it returns
        with cond:
            state["acks"].append(event.seq)
            if event.seq > state["synced"]:
                state["early_acks"].append(event.seq)

    group.ticket, group._flush, ledger.on_event = ticket, flush, on_event
    return state, cond


def _run(threads):
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive(), "a caller never returned: the group deadlocked"


@pytest.mark.parametrize("suffix", [".sqlite", ".jsonl"])
def test_concurrent_callers_share_one_fsync_and_none_is_acked_before_its_own(tmp_path, suffix):
    """Six threads add an item each while the leader's fsync is in flight.

    The leader's fsync started before the others wrote, so it covers only its
    own transition; the five queued ones share the next: two fsyncs for six
    commits, and no caller returns before an fsync that covers its event."""
    with open_ledger(tmp_path / f"ledger{suffix}", group_commit=True) as ledger:
        state, cond = gate(ledger, lambda s: s["tickets"] == WRITERS)
        _run([threading.Thread(target=ledger.add, args=(f"doc-{n}",)) for n in range(WRITERS)])
        assert ledger._group.flushes == 2
        assert sorted(state["acks"]) == list(range(1, WRITERS + 1))
        assert state["early_acks"] == []
    with open_ledger(tmp_path / f"ledger{suffix}") as again:  # a fresh reader sees them all
        assert [item.key for item in again.items()] == [f"doc-{n}" for n in range(WRITERS)]


@pytest.mark.parametrize("suffix", [".sqlite", ".jsonl"])
def test_a_failing_guard_inside_a_group_fails_only_its_own_caller(tmp_path, suffix):
    """Inside one group, a move with a stale fencing token raises StaleTokenError for its
    caller alone; it writes nothing, and the others' moves commit and are acked durable."""
    with open_ledger(tmp_path / f"ledger{suffix}", group_commit=True) as ledger:
        tokens = {}
        for n in range(WRITERS):
            ledger.add(f"doc-{n}")
            tokens[n] = ledger.claim(f"doc-{n}", "w", 60.0)
        before = len(ledger.events())
        errors, failed = {}, threading.Event()

        def move(n):
            token = tokens[n] + (1 if n == 3 else 0)  # doc-3's caller is fenced out
            try:
                ledger.move(f"doc-{n}", S.PENDING, S.UNKNOWN, token=token, worker="w")
            except StaleTokenError as exc:
                errors[n] = exc
                failed.set()

        state, cond = gate(ledger, lambda s: s["tickets"] == WRITERS - 1 and failed.is_set())
        _run([threading.Thread(target=move, args=(n,)) for n in range(WRITERS)])
        assert list(errors) == [3]
        assert {item.key: item.state for item in ledger.items()} == {
            f"doc-{n}": S.PENDING if n == 3 else S.UNKNOWN for n in range(WRITERS)}
        assert len(ledger.events()) == before + WRITERS - 1
        assert state["early_acks"] == [] and len(state["acks"]) == WRITERS - 1


WORKER = r"""
import sys
from toolkit.ledger import State, open_ledger
name, path, items, victim = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
ledger = open_ledger(path, group_commit=True)
flushes = ledger._flushes
real_flush, real_sync = flushes.flush, ledger._sync_wal

def flush(sync):
    print("flushing", flush=True)
    real_flush(sync)

def sync():  # the victim's third fsync never ends: it holds the flush lock until the SIGKILL
    sync.calls += 1
    if victim and sync.calls == 3:
        print("syncing", flush=True)
        sys.stdin.read()
    real_sync()
sync.calls = 0

flushes.flush, ledger._sync_wal = flush, sync
ledger.on_event = lambda e: print(f"ack {e.seq} {e.op} {e.key} {e.to.value}", flush=True)
for n in range(items):
    key = f"{name}-{n}"
    ledger.add(key)
    token = ledger.claim(key, name, 60.0)
    ledger.move(key, State.PENDING, State.UNKNOWN, token=token, worker=name)
    ledger.release(key, token, name)
print("finished", flush=True)
"""


@pytest.mark.slow
def test_sigkill_of_the_flush_leader_mid_group_blocks_nobody_and_loses_no_ack(tmp_path):
    """Three worker processes share a SQLite ledger with group commit. One is SIGKILLed
    while it leads a flush (inside its fsync, holding the flush lock), after the two
    others have queued behind it. The lock dies with it: the others finish all their
    transitions, and every transition any process acknowledged is in the ledger."""
    path = tmp_path / "ledger.sqlite"
    open_ledger(path).close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def start(name, victim):
        return subprocess.Popen([sys.executable, "-c", WORKER, name, str(path), "4",
                                 "1" if victim else "0"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env)

    victim = start("v", True)
    lines = {"v": []}
    for line in victim.stdout:
        lines["v"].append(line.split())
        if line.startswith("syncing"):
            break
    assert lines["v"][-1] == ["syncing"], lines["v"]
    others = {name: start(name, False) for name in ("a", "b")}
    for name, proc in others.items():  # each reaches its flush and queues on the flush lock
        lines[name] = []
        for line in proc.stdout:
            lines[name].append(line.split())
            if line.startswith("flushing"):
                break
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    lines["v"] += [line.split() for line in victim.stdout.read().splitlines()]
    for name, proc in others.items():
        out, _ = proc.communicate(timeout=120)
        lines[name] += [line.split() for line in out.splitlines()]
        assert proc.returncode == 0 and lines[name][-1] == ["finished"]
    acked = {(int(w[1]), w[2], w[3], w[4]) for ws in lines.values() for w in ws if w[0] == "ack"}
    with open_ledger(path) as ledger:
        present = {(e.seq, e.op, e.key, e.to.value) for e in ledger.events()}
        assert acked <= present
        assert sum(1 for w in lines["v"] if w[0] == "ack") < 16  # it died mid-run
        for name in others:  # each survivor recorded its whole run
            assert all(ledger.get(f"{name}-{n}").state is S.UNKNOWN for n in range(4))


@pytest.mark.slow
def test_explore_with_group_commit_sigkill_at_every_step_and_power_loss_lose_no_ack():
    """Kill -9 at every durable step of a one-document batch with group commit on
    (SQLite), and the same with power loss after each kill (JSONL cut back to its
    last fsync): no violation, and no acknowledged transition lost."""
    sqlite = explore(Plan(docs=1, ledger="sqlite-group"))
    assert sqlite.rows and sqlite.total()["violations"] == 0
    jsonl = explore(Plan(docs=1, ledger="jsonl-group", power_loss=True))
    assert sum(row["acked"] for row in jsonl.rows) > 0
    assert jsonl.total()["violations"] == 0 and jsonl.total()["lost_acknowledged"] == 0
    assert any(row["step"] == "ledger line written, fsync pending" for row in jsonl.rows)


FAILING_FSYNC = r"""
import sys
from toolkit.errors import StorageError
from toolkit.ledger import open_ledger
ledger = open_ledger(sys.argv[1], group_commit=True)
for n in range(4):
    try:
        ledger.add(f"doc-{n}")
        print("acked", n, flush=True)
    except StorageError as exc:
        print("refused", n, flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (fault injection)")
def test_failed_group_fsync_acks_nobody_and_refuses_every_later_write(tmp_path):
    """A real EIO from the group's fdatasync (strace inject) at the second flush: that
    caller gets StorageError, and so does every later one, before writing anything (a
    retried fsync could report success for pages the kernel already dropped)."""
    path = tmp_path / "ledger.sqlite"
    open_ledger(path).close()  # the schema first: the child's syncs are then its flushes
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=fdatasync", "-e",
                           "inject=fdatasync:error=EIO:when=3+", sys.executable, "-c",
                           FAILING_FSYNC, str(path)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.split("\n")[:-1]
    first_refused = lines.index(next(line for line in lines if line.startswith("refused")))
    assert all(line.startswith("acked") for line in lines[:first_refused])
    assert all(line.startswith("refused") for line in lines[first_refused:])
    assert first_refused < 4
    with open_ledger(path) as ledger:  # later callers wrote nothing at all
        keys = [item.key for item in ledger.items()]
    assert keys == [f"doc-{n}" for n in range(first_refused + 1)] or \
        keys == [f"doc-{n}" for n in range(first_refused)]
