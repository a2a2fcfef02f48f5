"""`python -m toolkit run` killed for real with SIGKILL, then run again to completion."""

import json
import sys

import pytest

from conftest import run_until_rest, sigkill_at_executions
from toolkit.provider import provider_stats


@pytest.mark.parametrize("contract", ["idempotent", "non-idempotent"])
def test_sigkill_at_several_moments_then_rerun_finishes_without_double_execution(
        tmp_path, corpus, contract):
    db = tmp_path / "provider.db"
    command = [sys.executable, "-m", "toolkit", "run", "--inputs", str(corpus[0].parent),
               "--ledger", str(tmp_path / "ledger.sqlite"), "--provider-db", str(db),
               "--out", str(tmp_path / "out"), "--contract", contract, "--json"]
    kills = sigkill_at_executions(command, db, (1, 8, 15))
    assert kills >= 2  # the batch really was interrupted
    # a resting batch needs at most a few reruns (none with transient errors)
    final = run_until_rest(command)
    assert final.returncode == 0, final.stderr
    by_state = json.loads(final.stdout)["by_state"]
    stats = provider_stats(db)
    assert all(row["succeeded"] <= 1 for row in stats["per_task"].values())
    if contract == "idempotent":
        assert (by_state["done"], by_state["failed"]) == (27, 3)
    else:
        # No blind resubmit: every task was sent at most once; what cannot be
        # proven is parked for review, never re-executed.
        assert all(row["submit_calls"] == 1 for row in stats["per_task"].values())
        assert by_state["done"] + by_state["needs_review"] == 27 and by_state["failed"] == 3
