"""Outsider o40, LOW 4: ``run --inputs B`` on a ledger another live run (``--inputs A``)
is using listed A's queued and in-flight items as "no longer among the inputs (changed or
removed)" and printed a ``cancel`` command for each: pasted, they take a live run's work
away. While a live run holds a lease on the ledger, no cancel is advised; the items are
named as that run's (its pid), to wait for.

Real processes: run A stops itself (SIGSTOP) right after its first intent, holding that
item's lease, its other items queued (pending); run B runs another folder on that ledger.
"""

from conftest import run_cli
from test_held_by_live_run import stopped_after_first_intent
from toolkit.documents import make_corpus
from toolkit.ledger import State, open_ledger


def _args(tmp_path, inputs):
    return ["run", "--inputs", tmp_path / inputs, "--ledger", tmp_path / "L.sqlite",
            "--provider-db", tmp_path / "p.db", "--out", tmp_path / "out",
            "--contract", "idempotent", "--no-progress"]


def test_run_of_other_inputs_beside_a_live_run_advises_no_cancel_of_its_queued_items(
        tmp_path):
    """Fault: run A (4 documents) stopped (real SIGSTOP) holding one lease, 3 items queued;
    run B, with another --inputs (1 document) on the same ledger, ends. Must hold: B exits
    1, prints no ``cancel`` command, names A's pid as the live run holding them, says to
    wait for it; A, let go, settles all its items (5 done, none cancelled). Before: B
    listed A's 4 items as "changed or removed" with a cancel command for each."""
    make_corpus(tmp_path / "a", docs=4, poison=0, seed=1)
    make_corpus(tmp_path / "b", docs=1, poison=0, seed=2)
    with stopped_after_first_intent(_args(tmp_path, "a")) as a:
        b = run_cli(*_args(tmp_path, "b"))
    assert b.returncode == 1, b.stderr
    assert "Traceback" not in b.stderr
    assert "toolkit cancel" not in b.stderr, b.stderr
    assert "4 item(s) not at rest are not among these inputs" in b.stderr, b.stderr
    assert f"a live run on this ledger (pid {a.pid}) holds 1 of them" in b.stderr, b.stderr
    assert "wait for it to end" in b.stderr
    assert a.returncode == 0, a.stderr_text
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        assert [item.state for item in ledger.items()] == [State.DONE] * 5
