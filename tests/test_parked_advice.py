"""A run and a salvage that leave items parked in ``needs_review`` say how a person decides
them (outsider o42 F8: the run ended exit 0, "needs_review=136", and no next step)."""

import os
import signal

from conftest import run_cli
from test_held_by_live_run import stopped_after_first_intent
from toolkit.documents import make_corpus
from toolkit.ledger import State, open_ledger


def _args(tmp_path):
    return ["run", "--inputs", tmp_path / "in", "--ledger", tmp_path / "L.sqlite",
            "--provider-db", tmp_path / "p.db", "--out", tmp_path / "out",
            "--contract", "non-idempotent", "--no-progress"]


def test_a_run_ending_with_a_parked_item_names_review_and_resolve_for_it(tmp_path):
    """Fault: run A killed (real SIGKILL) right after its first intent, before it sends;
    keys are not idempotent, so the rerun cannot tell a lost send from none and parks that
    item. Must hold: the rerun ends at rest (exit 0) and says one item waits for a person,
    naming ``review --ledger`` with the ledger's path and ``resolve ... --release``."""
    make_corpus(tmp_path / "in", docs=2, poison=0, seed=1)
    with stopped_after_first_intent(_args(tmp_path)) as a:
        os.kill(a.pid, signal.SIGKILL)
    rerun = run_cli(*_args(tmp_path))
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        parked = [item for item in ledger.items() if item.state is State.NEEDS_REVIEW]
    assert len(parked) == 1 and rerun.returncode == 0, rerun.stderr
    assert "1 item(s) in needs_review wait for a person" in rerun.stderr
    assert f"python -m toolkit review --ledger {tmp_path / 'L.sqlite'}" in rerun.stderr
    assert f"python -m toolkit resolve --ledger {tmp_path / 'L.sqlite'} --key KEY --release" \
        in rerun.stderr and "--resend" in rerun.stderr
