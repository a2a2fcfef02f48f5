"""One contract, every backend: the `ledger` fixture runs each test on SQLite and JSONL."""

import os

import pytest

from toolkit.errors import (IllegalTransitionError, LeaseHeldError, LedgerError,
                            StaleTokenError, StateConflictError)
from toolkit.ledger import Event, Item, State, apply_event, open_ledger

S = State


def fold(events):
    items = {}
    for event in events:
        items[event.key] = apply_event(items.get(event.key), event)
    return sorted(items.values(), key=lambda item: item.key)


def test_add_records_pending_once_and_a_second_add_writes_nothing(ledger):
    assert ledger.add("k1", source="a.pdf") is True
    assert ledger.add("k1", source="renamed.pdf") is False
    assert ledger.get("k1").state is S.PENDING and ledger.get("k1").source == "a.pdf"
    assert [event.op for event in ledger.events()] == ["add"]


def test_intent_starts_attempt_one_and_records_event_with_every_field(ledger):
    ledger.add("k1")
    item = ledger.move("k1", S.PENDING, S.UNKNOWN, worker="w", note="intent")
    assert (item.state, item.attempt) == (S.UNKNOWN, 1)
    event = ledger.events()[-1]
    assert (event.op, event.frm, event.to, event.attempt, event.worker, event.token) == \
        ("move", S.PENDING, S.UNKNOWN, 1, "w", 0)
    assert event.detail == {"note": "intent"} and event.seq == 2


def test_transition_from_wrong_state_is_rejected_and_writes_nothing(ledger):
    ledger.add("k1")
    with pytest.raises(StateConflictError) as caught:
        ledger.move("k1", S.UNKNOWN, S.SUBMITTED, job_id="j1")
    assert caught.value.actual is S.PENDING
    assert ledger.get("k1").state is S.PENDING and len(ledger.events()) == 1


def test_transition_of_missing_item_is_a_state_conflict(ledger):
    with pytest.raises(StateConflictError) as caught:
        ledger.move("nope", S.PENDING, S.UNKNOWN)
    assert caught.value.actual is None


@pytest.mark.parametrize("frm, to", [(S.PENDING, S.DONE), (S.PENDING, S.SUBMITTED),
                                     (S.CANCELLED, S.UNKNOWN), (S.DONE, S.UNKNOWN)])
def test_edge_missing_from_the_table_is_an_illegal_transition(ledger, frm, to):
    ledger.add("k1")
    with pytest.raises(IllegalTransitionError):
        ledger.move("k1", frm, to)
    assert len(ledger.events()) == 1


def test_permanent_failure_is_never_retried_but_transient_starts_a_new_attempt(ledger):
    for key, failure in (("perm", "permanent"), ("tran", "transient")):
        ledger.add(key)
        ledger.move(key, S.PENDING, S.UNKNOWN)
        ledger.move(key, S.UNKNOWN, S.FAILED, failure=failure, reason="503")
    with pytest.raises(IllegalTransitionError):
        ledger.move("perm", S.FAILED, S.UNKNOWN)
    retried = ledger.move("tran", S.FAILED, S.UNKNOWN)
    assert (retried.attempt, retried.failure, retried.reason) == (2, None, None)
    assert ledger.get("perm").resting and not ledger.get("tran").resting


def test_failure_needs_a_class_and_moves_set_only_known_fields(ledger):
    ledger.add("k1")
    ledger.move("k1", S.PENDING, S.UNKNOWN)
    with pytest.raises(IllegalTransitionError, match="transient' or 'permanent"):
        ledger.move("k1", S.UNKNOWN, S.FAILED, reason="no class")
    with pytest.raises(TypeError):
        ledger.move("k1", S.UNKNOWN, S.SUBMITTED, state="done")
    assert ledger.get("k1").state is S.UNKNOWN


def test_done_records_artifact_and_refetch_keeps_the_attempt(ledger):
    ledger.add("k1")
    ledger.move("k1", S.PENDING, S.UNKNOWN)
    ledger.move("k1", S.UNKNOWN, S.SUBMITTED, job_id="job-1")
    done = ledger.move("k1", S.SUBMITTED, S.DONE, artifact_path="out/k1.pdf",
                       artifact_size=10, artifact_sha256="ab" * 32)
    assert (done.job_id, done.artifact_size, done.attempt) == ("job-1", 10, 1)
    again = ledger.move("k1", S.DONE, S.DONE, artifact_size=11, note="refetched")
    assert (again.artifact_size, again.attempt) == (11, 1)


def test_claim_issues_increasing_tokens_and_stale_token_write_is_rejected(ledger, clock):
    ledger.add("k1")
    first = ledger.claim("k1", "w1", ttl=5)
    clock.advance(10)  # w1's lease expires
    second = ledger.claim("k1", "w2", ttl=5)
    assert second == first + 1
    with pytest.raises(StaleTokenError) as caught:
        ledger.move("k1", S.PENDING, S.UNKNOWN, token=first, worker="w1")
    assert (caught.value.token, caught.value.current) == (first, second)
    assert ledger.get("k1").state is S.PENDING
    assert ledger.move("k1", S.PENDING, S.UNKNOWN, token=second, worker="w2").state is S.UNKNOWN


def test_live_lease_of_another_worker_cannot_be_claimed(ledger):
    ledger.add("k1")
    ledger.claim("k1", "w1", ttl=60)
    with pytest.raises(LeaseHeldError) as caught:
        ledger.claim("k1", "w2", ttl=60)
    assert caught.value.owner == "w1"
    assert ledger.claim("k1", "w1", ttl=60) == 2  # renewal by the owner advances the token


def test_release_frees_the_lease_but_keeps_older_tokens_stale(ledger):
    ledger.add("k1")
    token = ledger.claim("k1", "w1", ttl=60)
    ledger.release("k1", token, worker="w1")
    assert ledger.get("k1").lease_owner is None
    newer = ledger.claim("k1", "w2", ttl=60)
    assert newer == token + 1
    with pytest.raises(StaleTokenError):
        ledger.release("k1", token)


def test_lease_records_owner_host_boot_pid_and_start_ticks(ledger):
    """The owner: host and boot id, pid, and its start in clock ticks since boot (field 22
    of /proc/<pid>/stat: an integer fixed at fork, independent of the wall clock)."""
    import socket

    ledger.add("k1")
    ledger.claim("k1", "w1", ttl=60)
    item = ledger.get("k1")
    stat = open(f"/proc/{os.getpid()}/stat", "rb").read()
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    assert item.lease_pid == os.getpid()
    assert item.lease_host == f"{socket.gethostname()}/{boot}"
    assert item.lease_started == int(stat[stat.rfind(b")") + 2:].split()[19])


def test_items_are_exactly_the_fold_of_events_and_survive_reopen(ledger_path, clock):
    with open_ledger(ledger_path, clock=clock) as ledger:
        for key in ("a", "b", "c"):
            ledger.add(key, source=f"{key}.pdf")
        token = ledger.claim("a", "w", ttl=30)
        ledger.move("a", S.PENDING, S.UNKNOWN, token=token)
        ledger.move("a", S.UNKNOWN, S.SUBMITTED, token=token, job_id="j")
        ledger.move("b", S.PENDING, S.FAILED, failure="permanent", reason="truncated")
        before_items, before_events = ledger.items(), ledger.events()
        assert fold(before_events) == before_items
    with open_ledger(ledger_path, clock=clock) as reopened:
        assert reopened.items() == before_items
        assert reopened.events() == before_events
        assert [event.seq for event in before_events] == list(range(1, len(before_events) + 1))


def test_on_event_hook_sees_each_committed_event_once(ledger):
    seen: list[Event] = []
    ledger.on_event = seen.append
    ledger.add("k1")
    ledger.move("k1", S.PENDING, S.UNKNOWN)
    with pytest.raises(StateConflictError):
        ledger.move("k1", S.PENDING, S.UNKNOWN)
    assert seen == ledger.events()


def test_items_handed_out_are_frozen_items_equal_to_what_a_reopen_reads(ledger, ledger_path,
                                                                         clock):
    """The transaction reads and folds an item as a cheap named tuple (``ItemRow``);
    what leaves the ledger -- move's return, get, items -- must still be a frozen
    ``Item``, equal to the fold of the events and to what a fresh open reads."""
    ledger.add("k1", source="a.pdf")
    token = ledger.claim("k1", "w", 60.0)
    moved = ledger.move("k1", S.PENDING, S.UNKNOWN, token=token, worker="w", note="intent")
    ledger.release("k1", token, "w")
    for item in (moved, ledger.get("k1"), *ledger.items(), *ledger.get_many(["k1"]).values()):
        assert type(item) is Item and type(item.state) is State
    with pytest.raises(AttributeError):
        moved.state = S.DONE
    assert (moved.state, moved.attempt, moved.token, moved.lease_owner) == (S.UNKNOWN, 1, 1, "w")
    before = ledger.items()
    assert before == fold(ledger.events())
    ledger.close()
    with open_ledger(ledger_path, clock=clock) as reopened:
        assert reopened.items() == before


def test_counts_name_every_state(ledger):
    ledger.add("a")
    ledger.add("b")
    ledger.move("b", S.PENDING, S.CANCELLED)
    counts = ledger.counts()
    assert set(counts) == {state.value for state in State}
    assert (counts["pending"], counts["cancelled"], counts["done"]) == (1, 1, 0)


@pytest.mark.parametrize("name", ["ledger.txt", "ledger", "ledger.json"])
def test_unknown_suffix_is_a_clear_ledger_error(tmp_path, name):
    with pytest.raises(LedgerError, match="unknown ledger type"):
        open_ledger(tmp_path / name)


@pytest.mark.parametrize("suffix", [".sqlite", ".jsonl"])
def test_unreadable_ledger_is_a_clear_ledger_error(tmp_path, suffix):
    path = tmp_path / f"missing-dir/ledger{suffix}"
    with pytest.raises(LedgerError):
        open_ledger(path)


def test_sqlite_file_that_is_not_a_ledger_is_refused_untouched(tmp_path):
    path = tmp_path / "other.db"
    path.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(LedgerError):
        open_ledger(path)
    assert path.read_bytes() == b"this is not sqlite at all" * 100


def test_item_is_frozen():
    with pytest.raises(AttributeError):
        Item("k").state = S.DONE


def test_foreign_sqlite_database_is_refused_without_being_modified(tmp_path):
    import sqlite3

    path = tmp_path / "batch.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE task_items (seq INTEGER, biz_no TEXT, status TEXT)")
        db.execute("INSERT INTO task_items VALUES (1, 'A-1', 'timeout')")
    db.close()
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="not a resume-toolkit ledger"):
        open_ledger(path)
    assert path.read_bytes() == before


def test_lease_of_a_dead_owner_process_is_taken_over_but_a_live_one_is_not(ledger):
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    ledger.add("k1")
    ledger.claim("k1", "child-worker", ttl=3600, pid=child.pid)
    with pytest.raises(LeaseHeldError):
        ledger.claim("k1", "me", ttl=60)  # the owner is alive: its lease stands, however long
    child.kill()
    child.wait()
    token = ledger.claim("k1", "me", ttl=60)  # the owner is gone: the lease is orphaned
    assert ledger.get("k1").lease_owner == "me" and token == 2


def test_owner_on_another_host_keeps_its_lease_until_expiry_whatever_its_pid_looks_like_here(
        ledger, clock):
    """Another machine's pid means nothing in this process table: only expiry frees it."""
    ledger.clock = clock
    ledger.add("k1")
    gone_here = 2 ** 22 + 12_345  # above any pid this machine hands out
    first = ledger.claim("k1", "worker-on-b", ttl=30, pid=gone_here, host="host-b")
    assert ledger.get("k1").lease_host == "host-b"
    with pytest.raises(LeaseHeldError):
        ledger.claim("k1", "me", ttl=60)  # a dead-looking pid on another host proves nothing
    clock.advance(31)
    token = ledger.claim("k1", "me", ttl=60)  # expired: taken over, fenced
    assert token == first + 1 and ledger.get("k1").lease_host not in (None, "host-b")
    with pytest.raises(StaleTokenError):
        ledger.move("k1", S.PENDING, S.UNKNOWN, token=first, worker="worker-on-b")


def test_same_dead_pid_on_this_host_is_taken_over_at_once(ledger):
    ledger.add("k1")
    ledger.claim("k1", "ghost", ttl=3600, pid=2 ** 22 + 12_345)  # this host, no such process
    assert ledger.claim("k1", "me", ttl=60) == 2
