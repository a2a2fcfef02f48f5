"""Two runs at once on one ledger: the one that ends first while the other still holds an
item (outsider o37, finding B).

It exits 1 (its batch is not complete), but it said "run the same command again" as if
the item were abandoned; it is held by a live run that will settle it. Real processes:
run A stops itself (SIGSTOP) right after its first intent, holding that item's lease.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time

from conftest import run_cli
from toolkit.documents import make_corpus
from toolkit.ledger import State, open_ledger

# The real CLI, stopped by itself (SIGSTOP) the instant its first intent is durable.
STOP_AFTER_FIRST_INTENT = """
import os, signal, sys
from toolkit.runner import witness_progress
recording = witness_progress.Progress.__call__
def call(self, point, key, **context):
    recording(self, point, key, **context)
    if point == "after_intent" and not call.stopped:
        call.stopped = True
        os.kill(os.getpid(), signal.SIGSTOP)
call.stopped = False
witness_progress.Progress.__call__ = call
from toolkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _args(tmp_path):
    return ["run", "--inputs", tmp_path / "in", "--ledger", tmp_path / "L.sqlite",
            "--provider-db", tmp_path / "p.db", "--out", tmp_path / "out",
            "--contract", "idempotent", "--no-progress"]


def _stopped(pid) -> bool:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0] == "T"


@contextlib.contextmanager
def stopped_after_first_intent(args):
    """Run A, the real CLI with ``args``, stopped by itself right after its first intent
    (it holds that item's lease and the ledger open): yields its ``Popen``. On leaving,
    A is let go (SIGCONT) and waited for; its stderr is ``a.stderr_text``."""
    a = subprocess.Popen([sys.executable, "-c", STOP_AFTER_FIRST_INTENT, *map(str, args)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60  # a guard against a hang, not a timing
        while not _stopped(a.pid):
            assert a.poll() is None and time.monotonic() < deadline, a.communicate()
            time.sleep(0.01)
        yield a
    finally:
        os.kill(a.pid, signal.SIGCONT)
        _, a.stderr_text = a.communicate(timeout=120)


def test_run_ending_while_a_live_run_holds_an_item_names_that_run_not_run_again(tmp_path):
    """Fault: run A is stopped (real SIGSTOP) holding the lease of one item of three; run
    B, on the same ledger, does the other two and ends. Must hold: B exits 1 (its batch is
    not complete) and says the item is held by a live run naming A's pid, to wait for it
    (or check with ``ledger``/``audit``), not "run the same command again"; A, let go,
    settles the item: all three done. Before: B said "1 item(s) not at rest: run the same
    command again"."""
    make_corpus(tmp_path / "in", docs=3, poison=0, seed=1)
    with stopped_after_first_intent(_args(tmp_path)) as a:
        b = run_cli(*_args(tmp_path))
    assert b.returncode == 1, b.stderr
    assert "Traceback" not in b.stderr
    assert "run the same command again" not in b.stderr, b.stderr
    assert f"1 item(s) not at rest are held by a live run (pid {a.pid})" in b.stderr, b.stderr
    assert "wait for it to end" in b.stderr
    assert a.returncode == 0, a.stderr_text
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        assert [item.state for item in ledger.items()] == [State.DONE] * 3
