"""An operator's way out of a parked item (outsider o36 findings 4, 5, 8, 12).

5: an intent the provider has no job for, where keys are not idempotent, is parked; a
release only parks it again. ``resolve --resend`` (that reason only) lets the next run look
it up once more and, not found, send it once. 4: a long document's lost checkpoints are
rebuilt from its pages' jobs (fetched, never executed again). 8: ``resolve --key`` takes a
unique prefix. 12: a failed(permanent) item is listed by ``review`` and closed by
``resolve --cancel``; the truncated reason names the end-of-file marker in words.
"""

import dataclasses
import json
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import Crash, crash_once_at, run_cli
from toolkit.checker import check, explain
from toolkit.documents import make_corpus
from toolkit.drills import collect_history
from toolkit.ledger import State, open_ledger
from toolkit.provider import FakeProvider, parse_contract, provider_stats
from toolkit.runner import RetryPolicy, Runner
from toolkit.runner.review import resolve

S = State
# The reason a run parks an intent the provider has no job for (runner.review.NO_JOB_NO_RESEND),
# spelled out: the test runs against the code before it had a name.
NO_JOB_NO_RESEND = "intent recorded, provider has no job, contract forbids a resubmit"
CONTRACT = "non-idempotent"

# The real CLI, killed (SIGKILL, by itself) the instant its first intent is durable and
# before that request is sent: the o36 finding 5 kill, at its exact instant.
KILL_AFTER_FIRST_INTENT = """
import os, signal, sys
from toolkit.runner import witness_progress
recording = witness_progress.Progress.__call__
def call(self, point, key, **context):
    recording(self, point, key, **context)
    if point == "after_intent":
        os.kill(os.getpid(), signal.SIGKILL)
witness_progress.Progress.__call__ = call
from toolkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _run_args(tmp_path, *extra):
    return ["run", "--inputs", tmp_path / "in", "--ledger", tmp_path / "L.sqlite",
            "--provider-db", tmp_path / "p.db", "--out", tmp_path / "out",
            "--contract", CONTRACT, "--no-progress", *extra]


def _items(path):
    with open_ledger(path) as ledger:
        return {item.key: item for item in ledger.items()}, len(ledger.events())


def _verdict(tmp_path, contract=CONTRACT, page_by_page_from=None):
    contract = dataclasses.replace(parse_contract(contract), seed=0)
    db = tmp_path / "p.db"
    inputs = sorted((tmp_path / "in").iterdir())
    with FakeProvider(db, db.with_name(db.stem + "-jobs"), contract) as provider:
        verdict = check(collect_history(tmp_path / "L.sqlite", provider, inputs, contract,
                                        page_by_page_from=page_by_page_from,
                                        out=tmp_path / "out"))
    return verdict, [explain(a) for found in verdict.anomalies.values() for a in found]


def test_kill_between_intent_and_send_parked_then_resend_decision_sends_it_once(tmp_path):
    """Fault: a real SIGKILL of a real ``run`` right after its first intent, before that
    request is sent, under a non-idempotent contract: the rerun parks it (no job, no
    resubmit). Property: ``resolve --key <12-char prefix> --resend --note`` records the
    person's decision (worker and note in the event); the next run sends it once and ends
    every document done, each executed once; a further run sends nothing; the checker
    finds nothing (no blind resubmit, no double execution, no submit after done). Before:
    no such decision, and a release was parked again by every run."""
    make_corpus(tmp_path / "in", docs=3, poison=0, seed=7)
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_FIRST_INTENT,
                             *map(str, _run_args(tmp_path))], capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert provider_stats(tmp_path / "p.db")["submit_calls"] == 0  # killed before the send
    assert run_cli(*_run_args(tmp_path)).returncode in (0, 1)
    items, _ = _items(tmp_path / "L.sqlite")
    parked = [item for item in items.values() if item.state is S.NEEDS_REVIEW]
    assert [item.reason for item in parked] == [NO_JOB_NO_RESEND]
    key = parked[0].key

    decided = run_cli("resolve", "--ledger", tmp_path / "L.sqlite", "--key", key[:12],
                      "--resend", "--note", "checked at the provider: never executed")
    assert decided.returncode == 0, decided.stderr
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        last = [e for e in ledger.events() if e.key == key and e.op == "move"][-1]
    assert (last.frm, last.to, last.worker) == (S.NEEDS_REVIEW, S.UNKNOWN, "operator")
    assert last.detail["note"] == "checked at the provider: never executed"

    rerun = run_cli(*_run_args(tmp_path, "--json"))
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["by_state"]["done"] == 3
    again = run_cli(*_run_args(tmp_path))
    assert again.returncode == 0, again.stderr
    stats = provider_stats(tmp_path / "p.db")
    assert stats["executions"] == stats["submit_calls"] == 3
    assert all(row["executions"] == 1 for row in stats["per_task"].values())
    verdict, said = _verdict(tmp_path)
    assert verdict.valid is True, said + list(verdict.notes)


class LostRequests(FakeProvider):
    """A provider whose requests are lost on the way while ``lose`` is set: no job is made,
    the client hears nothing (a timeout)."""

    lose, sent = False, 0

    def submit(self, *args, **kwargs):
        if self.lose:
            LostRequests.sent += 1
            raise TimeoutError("request lost on the way")
        return super().submit(*args, **kwargs)


def test_resend_decision_is_spent_by_one_send_a_lost_request_is_parked_not_sent_again(
        tmp_path):
    """Fault: the one send a person allowed is lost on the way (no job, no reply), so the
    next lookups find nothing again. Property: the item is parked again for the same
    reason, after exactly one send; the decision never authorizes a second one. Before:
    there was no resend decision at all."""
    corpus = make_corpus(tmp_path / "in", docs=2, poison=0, seed=8)
    contract = dataclasses.replace(parse_contract(CONTRACT), seed=0)
    provider = LostRequests(tmp_path / "p.db", tmp_path / "jobs", contract)

    def runner(hook=None):
        return Runner(open_ledger(tmp_path / "L.sqlite"), provider, tmp_path / "out",
                      policy=RetryPolicy(base_delay=0.0), hook=hook, sleep=lambda s: None)

    def run_once(run):
        try:
            return run.run(corpus)
        finally:
            run.close()
    crash = crash_once_at("after_intent")
    with pytest.raises(Crash):
        run_once(runner(crash))
    run_once(runner())
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        assert ledger.get(crash.keys[0]).reason == NO_JOB_NO_RESEND
        resolve(ledger, crash.keys[0][:12], "resend", "checked: never executed")
    provider.lose = True
    run_once(runner())
    run_once(runner())
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        item = ledger.get(crash.keys[0])
    assert (item.state, item.reason) == (S.NEEDS_REVIEW, NO_JOB_NO_RESEND)
    assert LostRequests.sent == 1
    provider.close()


def test_resend_of_an_item_parked_for_another_reason_is_one_line_and_writes_nothing(
        tmp_path):
    """Fault: ``--resend`` on an item parked for another reason (here: a release's lookup
    that got no answer would not park; a salvage's parking). Property: exit 2, one line
    naming both reasons, the ledger unchanged. Before: argparse knew no --resend."""
    path = tmp_path / "L.sqlite"
    with open_ledger(path) as ledger:
        ledger.add("k" * 64)
        ledger.move("k" * 64, S.PENDING, S.UNKNOWN)
        ledger.move("k" * 64, S.UNKNOWN, S.NEEDS_REVIEW, reason="salvaged: lines lost")
    _, events = _items(path)
    refused = run_cli("resolve", "--ledger", path, "--key", "kkkk", "--resend", "--note", "x")
    assert refused.returncode == 2
    assert "--resend decides only an item parked as" in refused.stderr
    assert "salvaged: lines lost" in refused.stderr and "Traceback" not in refused.stderr
    items, after = _items(path)
    assert after == events and items["k" * 64].state is S.NEEDS_REVIEW


def test_lost_checkpoints_of_a_long_document_are_fetched_again_not_parked_not_reexecuted(
        tmp_path):
    """Fault: a real SIGKILL mid long document (some pages checkpointed), then ``rm -rf
    out/.checkpoints``. Property: the rerun rebuilds the checkpoint from the finished pages'
    jobs (fetched, never executed again) and finishes the document: done, every page
    executed once, the checker finds nothing. Before: parked "checkpoint damaged before
    page N", and a release parked it again."""
    # 30 pages: the kill lands after page 4 with room to spare on a loaded machine (the
    # poll below opens the provider's database each time; 12 pages were all done once)
    PAGES = 30
    make_corpus(tmp_path / "in", docs=0, poison=0, seed=3, long_docs=1, long_pages=PAGES)
    args = _run_args(tmp_path, "--page-by-page-from", "5")
    child = subprocess.Popen([sys.executable, "-m", "toolkit", *map(str, args)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while child.poll() is None:
            try:
                if provider_stats(tmp_path / "p.db")["succeeded"] >= 4:
                    break
            except Exception:  # not created yet
                pass
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait(timeout=120)
    items, _ = _items(tmp_path / "L.sqlite")
    (item,) = items.values()
    assert item.state is not S.DONE and item.pages_done and item.pages_done < PAGES
    shutil.rmtree(tmp_path / "out" / ".checkpoints")
    rerun = run_cli(*args, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["by_state"]["done"] == 1
    stats = provider_stats(tmp_path / "p.db")
    assert stats["executions"] == PAGES
    assert all(row["executions"] == 1 for row in stats["per_task"].values())
    verdict, said = _verdict(tmp_path, page_by_page_from=5)
    assert verdict.valid is True, said + list(verdict.notes)


def test_resolve_key_takes_a_unique_prefix_and_an_ambiguous_one_lists_the_matches(tmp_path):
    """Fault: ``resolve --key`` given the 12 characters ``ledger`` prints, and a prefix of
    two keys. Property: the prefix names its item (dry run: nothing written); the
    ambiguous one is one line naming both, exit 2, nothing written. Before: "no item"."""
    path = tmp_path / "L.sqlite"
    keys = ["ab" + "0" * 62, "ab" + "1" * 62]
    with open_ledger(path) as ledger:
        for key in keys:
            ledger.add(key)
            ledger.move(key, S.PENDING, S.UNKNOWN)
            ledger.move(key, S.UNKNOWN, S.NEEDS_REVIEW, reason="why")
    _, events = _items(path)
    named = run_cli("resolve", "--ledger", path, "--key", keys[1][:12], "--cancel",
                    "--note", "x", "--dry-run")
    assert named.returncode == 0, named.stderr
    assert f"{keys[1]}: would go needs_review -> cancelled" in named.stdout
    both = run_cli("resolve", "--ledger", path, "--key", "ab", "--cancel", "--note", "x")
    assert both.returncode == 2 and len(both.stderr.strip().splitlines()) == 1
    assert keys[0] in both.stderr and keys[1] in both.stderr
    assert _items(path)[1] == events


def test_failed_permanent_item_is_listed_by_review_and_closed_by_resolve_cancel(tmp_path):
    """Fault: a truncated PDF among the inputs (failed(permanent): audit plans review).
    Property: ``review`` lists it under failed(permanent) with the command that closes it;
    ``resolve --key PREFIX --release`` is refused (one line, exit 2), ``--cancel`` records
    failed -> cancelled, after which audit plans nothing for it; its reason names the
    end-of-file marker in words. Before: review listed 0, resolve said "is failed, not
    needs_review", and the table refused failed(permanent) -> cancelled."""
    make_corpus(tmp_path / "in", docs=1, poison=0, seed=2)
    whole = (tmp_path / "in" / "doc-000.pdf").read_bytes()
    (tmp_path / "in" / "cut.pdf").write_bytes(whole[:len(whole) * 2 // 3])
    assert run_cli(*_run_args(tmp_path)).returncode in (0, 1)
    items, _ = _items(tmp_path / "L.sqlite")
    (poison,) = [item for item in items.values() if item.state is S.FAILED]
    assert poison.reason.startswith("poison: truncated: no end-of-file marker (the line %%EOF)")
    listed = run_cli("review", "--ledger", tmp_path / "L.sqlite", "--json")
    assert [i["key"] for i in json.loads(listed.stdout)["failed_permanent"]] == [poison.key]
    text = run_cli("review", "--ledger", tmp_path / "L.sqlite").stdout
    assert "failed(permanent) (1)" in text and "--cancel" in text
    released = run_cli("resolve", "--ledger", tmp_path / "L.sqlite", "--key", poison.key[:12],
                       "--release", "--note", "x")
    assert released.returncode == 2 and "--cancel closes it" in released.stderr
    cancelled = run_cli("resolve", "--ledger", tmp_path / "L.sqlite", "--key", poison.key[:12],
                        "--cancel", "--note", "poison: the input is broken")
    assert cancelled.returncode == 0, cancelled.stderr
    assert "failed(permanent) -> cancelled" in cancelled.stderr
    assert _items(tmp_path / "L.sqlite")[0][poison.key].state is S.CANCELLED
    audit = run_cli("audit", tmp_path / "L.sqlite", "--json")
    plans = {row["key"]: row["action"] for row in json.loads(audit.stdout)["per_item"]}
    assert plans[poison.key] == "skip"
