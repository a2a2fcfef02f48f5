"""A salvaged ledger that lost every line of a key whose job was sent at a late attempt
(a storm run of refusals, then one more run): the run looks up the later attempts too,
output or not, and adopts the job (runner/salvaged.py, ``_look_up_later``)."""

import json

import pytest

from conftest import run_cli
from toolkit.documents import make_corpus
from toolkit.ledger.jsonl import JsonlLedger
from toolkit.provider import provider_stats

pytestmark = pytest.mark.slow


def _run_args(tmp_path, ledger, *extra, provider="p.db"):
    return ["run", "--inputs", tmp_path / "in", "--ledger", ledger, "--provider-db",
            tmp_path / provider, "--out", tmp_path / "out", "--contract", "non-idempotent",
            "--no-progress", *extra]


def _late_key_lost(tmp_path):
    """Two documents executed at attempt >= 6 (refusals in a storm run, then a run at
    half the refusals); every line of the first one's key deleted, the ledger salvaged
    (marked: the key is in it no more). Returns (salvaged ledger, that key)."""
    make_corpus(tmp_path / "in", docs=2, poison=0, seed=0)
    ledger = tmp_path / "L.jsonl"
    run_cli(*_run_args(tmp_path, ledger, "--transient-rate", "1.0"))
    assert run_cli(*_run_args(tmp_path, ledger, "--transient-rate", "0.5", "--seed", "6")
                   ).returncode == 0
    with JsonlLedger(ledger, view=True) as view:
        items = sorted(view.items(), key=lambda item: item.source)
    assert all(item.state.value == "done" and item.attempt >= 6 for item in items)
    lost = items[0].key
    kept = [line for line in ledger.read_bytes().split(b"\n")
            if not line or json.loads(line).get("key") != lost]
    ledger.write_bytes(b"\n".join(kept))
    salvaged = run_cli("ledger", ledger, "--salvage", tmp_path / "S.jsonl")
    assert salvaged.returncode == 0, salvaged.stderr
    return tmp_path / "S.jsonl", lost


def test_salvaged_key_lost_at_attempt_6_output_deleted_is_adopted_not_sent_again(tmp_path):
    """Fault: a salvaged ledger lost every line of a key whose only job is at attempt 6,
    and its output under --out was deleted. Property: the run looks up attempts 2, 3, ...
    after "not found" for attempt 1, finds the job, fetches it: nothing executes twice."""
    ledger, lost = _late_key_lost(tmp_path)
    for output in (tmp_path / "out").glob(f"*.{lost[:8]}.pdf"):
        output.unlink()
    executed = provider_stats(tmp_path / "p.db")["executions"]
    rerun = run_cli(*_run_args(tmp_path, ledger))
    assert rerun.returncode == 0, rerun.stderr
    assert provider_stats(tmp_path / "p.db")["executions"] == executed
    assert list((tmp_path / "out").glob(f"*.{lost[:8]}.pdf"))  # fetched again, not run


def test_salvaged_key_with_output_and_no_job_is_parked_naming_the_attempts_checked(tmp_path):
    """Fault: the same lost key, its output still under --out, at a provider that has no
    job of it at any attempt (another provider database). Property: it is parked, and the
    reason names the attempts looked up (1 to 1 + 2 x 4 + 1 misses), not "no job for it"."""
    ledger, lost = _late_key_lost(tmp_path)
    rerun = run_cli(*_run_args(tmp_path, ledger, provider="other.db"))
    assert rerun.returncode == 0, rerun.stderr
    with JsonlLedger(ledger, view=True) as view:
        item = view.get(lost)
    assert item.state.value == "needs_review"
    assert "no job for attempts 1-10 (not found)" in item.reason, item.reason
    assert provider_stats(tmp_path / "other.db")["executions"] == 0
