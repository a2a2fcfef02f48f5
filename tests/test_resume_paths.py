"""The shortcuts of a rerun and of a run's transitions, each against the fault it must still see.

Resume: a done item whose artifact keeps its recorded stat is reused in one pass
per chunk (``Reuse._reused``), never handed to ``process``; an input's candidate
keys are computed route by route, the second only when the ledger holds items
that no first key names (``keying._joined``). Transitions: the item a committed
move returned is the item in hand (no re-read), and a renewal right after our
own move passed the same fence is not asked of the ledger (``Runner._renew``).
Calls and keys are counted, files are really damaged, leases really taken over;
nothing is timed.
"""

import os

import pytest

from toolkit import documents
from toolkit.identity import content_digest
from toolkit.ledger import State, open_ledger
from toolkit.provider import FakeProvider, provider_stats
from toolkit.roots import artifact_file
from toolkit.runner import RetryPolicy, Runner, keying

from indexed_batch import batch, inputs, keyed, reads, wait_until_settled  # noqa: F401, F811

S = State


@pytest.fixture
def looked_at(monkeypatch):
    """The keys of the done items whose artifact ``process`` (not the chunk's pass) checks."""
    seen = []
    real = Runner._artifact_intact

    def artifact_intact(self, item):
        seen.append(item.key)
        return real(self, item)
    monkeypatch.setattr(Runner, "_artifact_intact", artifact_intact)
    return seen


def done_items(ledger_path):
    with open_ledger(ledger_path) as ledger:
        return [item for item in ledger.items() if item.state is S.DONE]


def test_artifact_rewritten_with_mtime_restored_is_caught_while_intact_ones_skip_process(
        batch, looked_at):
    """Fault: one done artifact's bytes rewritten in place (same size, same inode), its
    mtime set back with ``utime``. Property: the chunk's pass reuses the three intact ones
    without ``process`` (their artifact is not looked at again); the damaged one goes to
    ``process``, is hashed, re-fetched (its bytes are the recorded ones again) and never
    executed again."""
    batch()
    victim = done_items(batch.ledger)[0]
    path = artifact_file(batch.ledger, victim.artifact_path)
    before, data = os.stat(path), path.read_bytes()
    with open(path, "r+b") as handle:
        handle.write(bytes([data[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (os.stat(path).st_size, os.stat(path).st_mtime_ns, os.stat(path).st_ino) == \
        (before.st_size, before.st_mtime_ns, before.st_ino)
    executions = batch.executions()
    looked_at.clear()
    runner, counts = batch()
    assert set(looked_at) == {victim.key}  # the intact three: settled by the pass
    assert counts["done"] == 4 and runner.reused == 3
    assert documents.artifact_of(path).sha256 == victim.artifact_sha256
    assert batch.executions() == executions
    looked_at.clear()
    runner, counts = batch()
    assert looked_at == [] and runner.reused == 4  # the re-fetched one's new stat vouches


@pytest.mark.parametrize("swap", ["in place", "new inode"])
def test_input_swapped_with_same_size_and_mtime_is_read_and_every_route_is_keyed(
        batch, reads, inputs, keyed, swap):
    """Fault: an input's bytes swapped for others of the same size with its mtime restored,
    rewritten in place (same inode) or renamed over it (a new inode). Property: a plain
    rerun keys no input (the first route's keys are the index's; the ledger holds no item
    that no first key names); after the swap, that input is read, keyed as new content and
    executed once, and the rerun keys every input under the second route (the old item is
    now one no first key names: a second route's key could be any input's), deciding the
    others as before."""
    batch()
    reads.clear()
    runner, counts = batch()
    assert reads == [] and keyed == [0, 0] and runner.reused == 4
    victim = next(path for path in inputs if path.read_bytes().startswith(b"%PDF"))
    info, data = os.stat(victim), bytearray(victim.read_bytes())
    data[-1:] = b" " if data[-1:] == b"\n" else b"\n"  # after %%EOF: still the same PDF
    if swap == "in place":
        with open(victim, "r+b") as handle:
            handle.write(data)
    else:
        other = victim.with_suffix(".swap")
        other.write_bytes(data)
        os.replace(other, victim)
    os.utime(victim, ns=(info.st_atime_ns, info.st_mtime_ns))
    after = os.stat(victim)
    assert (after.st_size, after.st_mtime_ns) == (info.st_size, info.st_mtime_ns)
    assert (after.st_ino == info.st_ino) is (swap == "in place")
    wait_until_settled([victim])
    executions = batch.executions()
    reads.clear()
    runner, counts = batch()
    assert set(reads) == {victim.name} and keyed == [1, len(inputs)]
    assert counts["done"] == 4 and runner.reused == 3
    assert batch.executions() == executions + 1


def test_input_keyed_under_both_routes_is_keyed_in_full_in_a_ledger_of_only_the_batch(
        tmp_path, small_corpus):
    """Fault: the bytes of one input were keyed under both routes (plain and OCR), both
    done, in a ledger that holds nothing else but the batch's items. Property: while no
    other item exists the scan keys each input once and vouches for all; with the second
    route's item there, the count says a row was not named, every route is keyed, and
    that input is keyed in full (two candidates), the others still vouched for."""
    paths = sorted(path for path in small_corpus if "poison" not in path.name)
    plain, scanned = keying.keyers({})
    digests = [content_digest(path.read_bytes()) for path in paths]
    counted = []

    class Counting:
        def __init__(self, keyer):
            self.keyer = keyer

        def many(self, digests_):
            counted.append(len(digests_))
            return self.keyer.many(digests_)
    routes = [Counting(plain), Counting(scanned)]
    with open_ledger(tmp_path / "ledger.sqlite") as ledger:
        for digest in digests:
            settle_done(ledger, plain(digest))
        found = keying.vouched(ledger, paths, routes, scan=True)
        assert [row and row.key for row in found] == [plain(d) for d in digests]
        assert counted == [len(paths)]
        settle_done(ledger, scanned(digests[2]))
        counted.clear()
        found = keying.vouched(ledger, paths, routes, scan=True)
        assert counted == [len(paths), len(paths)]
        assert [row and row.key for row in found] == \
            [plain(d) if at != 2 else None for at, d in enumerate(digests)]
        by_lookup = keying.vouched(ledger, paths, routes)  # every route, looked up
        assert [item and item.key for item in by_lookup] == [row and row.key for row in found]


def settle_done(ledger, key):
    ledger.add(key)
    token = ledger.claim(key, "w", 60)
    ledger.move(key, S.PENDING, S.UNKNOWN, token=token)
    ledger.move(key, S.UNKNOWN, S.SUBMITTED, token=token, job_id="j")
    ledger.move(key, S.SUBMITTED, S.DONE, token=token, job_id="j", artifact_path="a.pdf",
                artifact_size=1, artifact_sha256="ab" * 32)
    ledger.release(key, token)


class Calls:
    """A ledger's ``renew`` calls, and its ``get`` calls that read an item again right after
    a ``move`` of it (nothing else asked of that item in between), counted on the instance."""

    def __init__(self, ledger):
        self.renew = self.reread = 0
        last = {}  # key -> the last call about it

        def counted(name, real):
            def call(key, *args, **kwargs):
                if name == "get" and last.get(key) == "move":
                    self.reread += 1
                if name == "renew":
                    self.renew += 1
                last[key] = name
                return real(key, *args, **kwargs)
            return call
        for name in ("get", "move", "claim", "renew", "release"):
            setattr(ledger, name, counted(name, getattr(ledger, name)))


def first_run(tmp_path, name, small_corpus, **options):
    """A first run of the small batch in its own folder; returns (runner, ledger calls,
    each item's history as (op, from, to, attempt, token) in order, provider executions)."""
    folder = tmp_path / name
    provider = FakeProvider(folder / "provider.db", folder / "jobs")
    ledger = open_ledger(folder / "ledger.sqlite", **options.pop("ledger_options", {}))
    calls = Calls(ledger)
    runner = Runner(ledger, provider, folder / "out", worker="w1", sleep=lambda s: None,
                    policy=RetryPolicy(base_delay=0.0), **options)
    try:
        runner.run(small_corpus)
    finally:
        runner.close()
        provider.close()
    with open_ledger(folder / "ledger.sqlite") as reopened:
        history = {}
        for event in reopened.events():
            history.setdefault(event.key, []).append(
                (event.op, event.frm, event.to, event.attempt, event.token))
    return runner, calls, history, provider_stats(folder / "provider.db")["executions"]


def test_renewals_skipped_after_our_own_move_leave_the_history_a_renewal_would(
        tmp_path, small_corpus):
    """Fault: none. Property: a run with no hook asks the ledger for one renewal per
    document (before the fetch, after the provider was called) instead of three, and no
    run reads an item again right after its own move; the ledger history, item by item,
    is the one a run with a (no-op) hook writes, which asks every renewal: what was
    skipped would have written nothing."""
    plain, calls, history, executions = first_run(tmp_path, "plain", small_corpus)
    _, hooked_calls, hooked_history, hooked_executions = first_run(
        tmp_path, "hooked", small_corpus, hook=lambda point, key, **context: None)
    assert history == hooked_history and executions == hooked_executions == 4
    assert calls.renew == 4 and hooked_calls.renew == 3 * 4  # submit, poll, fetch
    assert calls.reread == hooked_calls.reread == 0


def test_lease_half_spent_at_the_intent_is_renewed_before_the_submit(tmp_path, small_corpus):
    """Fault: a slow machine: the ledger's clock moves a quarter lease at every look, so
    that after the intent less than half of the lease is left. Property: the renewal
    before each provider call is asked of the ledger and written (a claim event, same
    token, between the intent and the submit), as it is without the shortcut."""
    now = [1_000_000.0]

    def slow_clock():
        now[0] += 15.0  # a quarter of the runner's 60 s lease per look at the clock
        return now[0]
    _, calls, history, executions = first_run(tmp_path, "slow", small_corpus,
                                              ledger_options={"clock": slow_clock})
    assert executions == 4 and calls.renew == 3 * 4
    for events in history.values():
        if ("move", S.UNKNOWN, S.SUBMITTED) in [event[:3] for event in events]:
            ops = [event[:3] for event in events]
            intent = ops.index(("move", S.PENDING, S.UNKNOWN))
            assert ops[intent + 1] == ("claim", S.UNKNOWN, S.UNKNOWN)  # the renewal, written


def test_lease_taken_over_at_the_intent_commit_is_caught_before_the_submit(
        tmp_path, small_corpus):
    """Fault: a second process with the same worker name claims the item the moment our
    intent commits (the ledger's ``on_event``, on another connection): the lease is
    legally its. Property: our renewal before the submit is asked of the ledger (a
    listener is installed), fails on the fence, and nothing is submitted for that item:
    the provider executes the three others only."""
    folder = tmp_path / "taken"
    provider = FakeProvider(folder / "provider.db", folder / "jobs")
    ledger = open_ledger(folder / "ledger.sqlite")
    other = open_ledger(folder / "ledger.sqlite")
    taken = []

    def on_event(event):
        if not taken and event.op == "move" and event.to is S.UNKNOWN:
            taken.append(event.key)
            other.claim(event.key, "w1", 60.0)  # "mine": the same worker name
    ledger.on_event = on_event
    runner = Runner(ledger, provider, folder / "out", worker="w1", sleep=lambda s: None,
                    policy=RetryPolicy(base_delay=0.0))
    try:
        runner.run(small_corpus)
    finally:
        runner.close()
        other.close()
        provider.close()
    assert runner.lost_leases == taken and len(taken) == 1
    stats = provider_stats(folder / "provider.db")
    assert stats["executions"] == 3
    with open_ledger(folder / "ledger.sqlite") as reopened:
        assert reopened.get(taken[0]).state is S.UNKNOWN  # intent recorded, never sent
