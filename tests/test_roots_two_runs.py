"""Two runs at once on one SQLite ledger with different ``--out`` (outsider finding).

Real processes, paused at real points: run B is stopped (SIGSTOP) while it holds an
item's lease, run A finishes the rest and waits at its end on the roots lock, which the
test holds; only then does B go on, so B turns the item ``done`` in its own ``--out``
while A still has to account for it.
"""

import fcntl
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from toolkit import documents, roots
from toolkit.ledger import State, open_ledger
from toolkit.provider import provider_stats
from toolkit.errors import ToolkitError


def _waiters_on(path) -> int:
    """How many flock requests on ``path`` are blocked now (``/proc/locks``' ``->`` lines)."""
    inode = os.stat(path).st_ino
    with open("/proc/locks") as locks:
        return sum("->" in line and line.split()[-3].endswith(f":{inode}") for line in locks)


def _until(condition, what, limit=120):
    deadline = time.monotonic() + limit  # a guard against a hang, not a timing assumption
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def _free(path) -> bool:
    """Nobody holds ``path``'s SQLite write lock now."""
    db = sqlite3.connect(path, timeout=0)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        db.close()


def _flock_free(path) -> bool:
    """Nobody holds ``path``'s flock now (a missing file: nobody)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _stopped_holding_a_lease(child, ledger, db, out) -> bool:
    """SIGSTOP ``child``; True (it stays stopped) if it holds an unfinished item's lease
    and neither database's write lock nor its --out witness's lock (a run records there at
    every intent; the other run records there too: ``out`` is the batch's recorded root),
    else SIGCONT and False."""
    os.kill(child.pid, signal.SIGSTOP)
    if _free(ledger) and _free(db) and _flock_free(out / ".witness.json.lock"):
        with open_ledger(ledger) as opened:
            if any(item.lease_owner is not None and item.state is not State.DONE
                   for item in opened.items()):
                return True
    os.kill(child.pid, signal.SIGCONT)
    time.sleep(0.005)
    return False


def _executions(db):
    try:
        return provider_stats(db)["executions"]
    except ToolkitError:
        return 0


@pytest.mark.slow
def test_concurrent_runs_with_different_out_never_claim_done_without_artifact_in_own_out(
        tmp_path, small_corpus):
    """Fault: run B (``--out o2``) holds an item's lease, paused; run A (``--out o1``) on
    the same inputs and ledger finishes the others; B then turns the item done in o2
    while A waits at its end. Property: a run that exits 0 holds every item of its batch
    verified in its own --out (A copies B's item from the recorded root); once both end,
    the recorded ``out`` holds every done item's verified artifact."""
    folder = tmp_path / "in"
    folder.mkdir()
    docs = [doc for doc in small_corpus if "poison" not in doc.name]
    for doc in docs:
        shutil.copyfile(doc, folder / doc.name)
    ledger, db = tmp_path / "b.sqlite", tmp_path / "p.sqlite"

    def start(out):
        return subprocess.Popen(
            [sys.executable, "-m", "toolkit", "run", "--inputs", folder, "--ledger", ledger,
             "--provider-db", db, "--out", tmp_path / out, "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    b = start("o2")
    _until(lambda: _executions(db) >= 1 or b.poll() is not None, "B's first execution")
    # Stop B where it holds a lease but no SQLite write lock (a transaction of B's would
    # block A): stop, look, and let it run on a little until that is so.
    _until(lambda: b.poll() is not None or _stopped_holding_a_lease(b, ledger, db,
                                                                     tmp_path / "o2"),
           "B stopped outside a transaction with an item in flight")
    assert b.poll() is None, "B finished before it could be stopped: the race is not set up"
    try:
        lock = os.open(f"{roots.roots_file(ledger)}.lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(lock, fcntl.LOCK_EX)
        a = start("o1")
        _until(lambda: _waiters_on(f"{roots.roots_file(ledger)}.lock") >= 1 or
               a.poll() is not None, "A waiting at its end")
    finally:
        os.kill(b.pid, signal.SIGCONT)
    _until(lambda: _waiters_on(f"{roots.roots_file(ledger)}.lock") >= 2 or
           b.poll() is not None, "B waiting at its end")
    os.close(lock)  # both go on, in whichever order the lock grants
    results = {"o1": a.communicate(timeout=180), "o2": b.communicate(timeout=180)}
    codes = {"o1": a.returncode, "o2": b.returncode}
    with open_ledger(ledger) as opened:
        done = [item for item in opened.items() if item.state is State.DONE]
    assert len(done) == len(docs)

    def holds(out):
        return all(documents.verify(tmp_path / out / item.artifact_path, item.artifact_size,
                                    item.artifact_sha256) for item in done)
    for out, code in codes.items():
        assert code in (0, 1), results[out]
        if code == 0:
            assert holds(out), f"run --out {out} exited 0 without every artifact"
        else:
            assert "run again" in results[out][1] or "not at rest" in results[out][1]
    assert holds(roots.recorded(ledger)["out"].name), "the recorded out lacks an artifact"
    assert any(code == 0 for code in codes.values())


def _stop_where(child, want, files, flocks, ledger) -> bool:
    """SIGSTOP ``child``; True (it stays stopped) if it holds neither a write lock of
    ``files`` (SQLite) nor a lock of ``flocks`` and ``want(items by source)`` holds of the
    ledger now, else SIGCONT and False."""
    os.kill(child.pid, signal.SIGSTOP)
    if all(map(_free, files)) and all(map(_flock_free, flocks)):
        with open_ledger(ledger) as opened:
            if want({item.source: item for item in opened.items()}):
                return True
    os.kill(child.pid, signal.SIGCONT)
    time.sleep(0.005)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("o2", ["recorded", "unrecorded"])
def test_item_done_by_other_run_after_this_run_let_it_go_is_copied_into_own_out(tmp_path, o2):
    """Fault (outsider o36, finding 2): run A (``--out o1``, the recorded root) meets item X
    leased by run B (``--out o2``) and goes on; B turns X done in o2 and ends before A's
    chunk ends, so A's end reads X done though A never placed it (A exited 0 with X missing
    in o1, the recorded root lacking it). B names o2 the root at its end, or cannot (a
    directory in o2 where an artifact of A's goes: B exits 1). Property: a run that exits
    0 holds every done item verified in its own --out: A copies X verified from o2 (the
    recorded root, or a folder its witness names) and exits 0; once both end, the recorded
    root holds every done artifact; every document executed once."""
    from toolkit.documents import make_corpus

    docs = make_corpus(tmp_path / "corpus", docs=32, poison=0, seed=7)
    prior, x, v, rest = docs[0], docs[1], docs[2], docs[3:]
    ours, theirs = tmp_path / "in", tmp_path / "in-b"
    for folder, names in ((ours, {x: "a-x.pdf", **{doc: doc.name for doc in rest}}),
                          (theirs, {x: "a-x.pdf"}), (tmp_path / "in-0", {prior: "prior.pdf"})):
        folder.mkdir()
        for doc, name in names.items():
            shutil.copyfile(doc, folder / name)
    ledger, db, outs = tmp_path / "b.sqlite", tmp_path / "p.sqlite", (tmp_path / "o1",
                                                                      tmp_path / "o2")

    def start(inputs, out, *options):
        return subprocess.Popen(
            [sys.executable, "-m", "toolkit", "run", "--inputs", inputs, "--ledger", ledger,
             "--provider-db", db, "--out", out, "--no-progress", *options],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    first = start(tmp_path / "in-0", outs[0])  # the batch's first run: o1 is the root
    assert first.wait(timeout=180) == 0, first.communicate()
    if o2 == "unrecorded":  # B cannot copy prior's artifact into o2: it keeps o1 the root
        with open_ledger(ledger) as opened:
            (outs[1] / opened.items()[0].artifact_path).mkdir(parents=True)
    files, flocks = (ledger, db), [o / ".witness.json.lock" for o in outs]
    leased = lambda item: item is not None and item.state is not State.DONE and \
        item.lease_owner is not None  # noqa: E731
    # The premise: B stopped while it holds X's lease and no lock. Executed at its submit,
    # X went from intent to done in one stretch of B's work (~0.35 s on a loaded machine),
    # free of locks only between its transactions, fsyncs and witness records, and looks
    # spaced out by a loaded machine could all miss those moments (CI: B finished first).
    # Its job runs at the provider on its sixth poll instead (``run-polls=6``): between
    # polls B sleeps its backoff holding X's lease and no lock, the fifth time 0.8-1.6 s
    # (RetryPolicy), longer than the looks below are apart short of a stall of this process.
    b = start(theirs, outs[1], "--contract", "idempotent,run-polls=6")
    _until(lambda: b.poll() is not None or _stop_where(
        b, lambda by: leased(by.get("a-x.pdf")), files, flocks, ledger), "B holding X")
    assert b.poll() is None, "B finished before it could be stopped: the race is not set up"
    a = start(ours, outs[0])

    def passed_x(by):  # A went on past X (leased by B), and its chunk has not ended
        mine = [by.get(doc.name) for doc in rest]
        return leased(by.get("a-x.pdf")) and any(
            item is not None and (item.lease_owner or item.state is not State.PENDING)
            for item in mine) and any(item is not None and item.state is State.PENDING
                                      and item.lease_owner is None for item in mine)
    _until(lambda: a.poll() is not None or _stop_where(a, passed_x, files, flocks, ledger),
           "A past X with its chunk under way")
    assert a.poll() is None, "A finished before it could be stopped: the race is not set up"
    os.kill(b.pid, signal.SIGCONT)  # B turns X done in o2 and ends while A is stopped
    results = {"o2": b.communicate(timeout=180)}
    root_after_b = roots.recorded(ledger)["out"]
    os.kill(a.pid, signal.SIGCONT)
    results["o1"] = a.communicate(timeout=180)
    codes = {"o1": a.returncode, "o2": b.returncode}
    with open_ledger(ledger) as opened:
        done = [item for item in opened.items() if item.state is State.DONE]
    assert len(done) == len(rest) + 2

    def holds(out):
        return all(documents.verify(out / item.artifact_path, item.artifact_size,
                                    item.artifact_sha256) for item in done)
    for out, code in codes.items():
        assert code in (0, 1), results[out]
        if code == 0:
            assert holds(tmp_path / out), f"run --out {out} exited 0 without every artifact"
    assert codes["o1"] == 0, results["o1"]  # X verified in o2: copied, not "run again"
    assert holds(roots.recorded(ledger)["out"]), "the recorded out lacks an artifact"
    assert _executions(db) == len(done)  # copies only: nothing executed twice
    # B filled o2 from the recorded root before naming it so (when nothing was in the way)
    assert (root_after_b == outs[1]) is (o2 == "recorded"), results["o2"]
