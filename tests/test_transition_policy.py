"""One transition policy (ledger/transitions.py) for the ledger, the checker and the forensics;
operator paths that decide on the item as it is after their claim."""

import itertools
import subprocess
import sys

import pytest

from toolkit.checker import History, check
from toolkit.errors import IllegalTransitionError, ToolkitError
from toolkit.ledger import PERMANENT, TRANSIENT, TRANSITIONS, State, open_ledger
from toolkit.ledger.transitions import ARTIFACT_FIELDS, DONE_WITHOUT_ARTIFACT, describe, why_illegal
from toolkit.provider import FakeProvider
from toolkit.runner.reclaim import cancel, recover_abandoned

S = State
A = {"artifact_path": "/x.pdf", "artifact_size": 1, "artifact_sha256": "0" * 64}


@pytest.fixture(params=["sqlite", "jsonl"])
def ledger(request, tmp_path, clock):
    with open_ledger(tmp_path / f"l.{request.param}", clock=clock) as opened:
        yield opened


def test_pending_to_failed_transient_is_refused_only_poison_goes_there(ledger):
    """A pending item has never been sent: a 'transient' failure there is a lie the old
    table accepted. Only failed(permanent) (poison found before any submit) is an edge."""
    ledger.add("k")
    with pytest.raises(IllegalTransitionError, match="only as permanent"):
        ledger.move("k", S.PENDING, S.FAILED, failure=TRANSIENT, reason="HTTP 503")
    assert ledger.get("k").state is S.PENDING and len(ledger.events()) == 1
    ledger.move("k", S.PENDING, S.FAILED, failure=PERMANENT, reason="poison")


def test_move_into_done_without_artifact_fields_is_refused(ledger):
    """Rule 5: done means a verified artifact. unknown -> done with no artifact fields was
    accepted by the old ledger; now it is refused and nothing is written."""
    ledger.add("k")
    ledger.move("k", S.PENDING, S.UNKNOWN)
    with pytest.raises(IllegalTransitionError, match="artifact"):
        ledger.move("k", S.UNKNOWN, S.DONE, job_id="j")
    assert ledger.get("k").state is S.UNKNOWN
    ledger.move("k", S.UNKNOWN, S.DONE, job_id="j", **A)
    ledger.move("k", S.DONE, S.DONE)  # a re-fetch keeps the artifact fields it had


@pytest.mark.parametrize("missing", ARTIFACT_FIELDS)
def test_done_lacking_any_one_artifact_field_is_refused_by_the_policy(missing):
    """``why_illegal`` asks the three artifact fields one by one (no loop: the audit
    replays a quarter-million dones a million lines); dropping one of the three questions
    would let a done with that field absent or None pass the checker and the replay. Asked
    with members and with the strings a file holds."""
    for after in ({name: value for name, value in A.items() if name != missing},
                  {**A, missing: None}):
        assert why_illegal(S.SUBMITTED, S.DONE, None, after) == DONE_WITHOUT_ARTIFACT
        assert why_illegal("submitted", "done", None, after) == DONE_WITHOUT_ARTIFACT
    assert why_illegal("submitted", "done", None, A) is None


def _history(events):
    return History(events=tuple(events), items={}, calls=(), executions=(), artifacts={},
                   inputs={})


def test_checker_flags_exactly_the_moves_the_ledger_refuses(tmp_path, clock):
    """For every (from, to) pair, with and without artifact fields and both failure
    kinds: the checker's illegal_transition fires on a history iff Ledger.move refused
    that move (the history is written past the policy, by the ledger's own commit)."""
    cases = itertools.product(S, S, (TRANSIENT, PERMANENT), (False, True))
    for n, (frm, to, failure, artifact) in enumerate(cases):
        with open_ledger(tmp_path / f"l{n}.jsonl", clock=clock, durable=False) as ledger:
            key = "k"
            ledger.add(key)
            path = {S.PENDING: [], S.UNKNOWN: [S.UNKNOWN], S.SUBMITTED: [S.UNKNOWN, S.SUBMITTED],
                    S.PARTIAL: [S.UNKNOWN, S.SUBMITTED, S.PARTIAL],
                    S.DONE: [S.UNKNOWN, S.DONE], S.FAILED: [S.UNKNOWN, S.FAILED],
                    S.NEEDS_REVIEW: [S.UNKNOWN, S.NEEDS_REVIEW],
                    S.CANCELLED: [S.CANCELLED]}[frm]
            for step in path:
                fields = {"failure": failure} if step is S.FAILED else {}
                fields.update(A if step is S.DONE else {})
                ledger.move(key, ledger.get(key).state, step, **fields)
            fields = {"failure": failure} if to is S.FAILED else {}
            fields.update(A if artifact else {})
            try:
                ledger.move(key, frm, to, **fields)
                refused = False
            except IllegalTransitionError:
                refused = True
                with ledger._commit() as commit:  # write it anyway: the checker must see it
                    item = ledger._load(key)
                    commit(item, "move", key, frm, to, item.attempt, None, 0, fields)
            verdict = check(_history(ledger.events()))
        flagged = "illegal_transition" in verdict.anomalies
        assert flagged == refused, (frm, to, failure, artifact)
    assert S.CANCELLED in TRANSITIONS[S.FAILED] and "pending -> " in " ".join(describe().split())


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # exited and reaped: no process has this (pid, start time)


def test_second_recoverer_between_listing_and_claim_is_not_a_state_conflict(tmp_path):
    """Two restarted workers recover the same dead owner's submitted item: the second
    one's listing is stale by the time it claims (the first already moved it to unknown
    and released). It re-reads after its claim, changes nothing, releases its lease."""
    path = tmp_path / "l.sqlite"
    with open_ledger(path) as setup:
        setup.add("k")
        token = setup.claim("k", "dead", ttl=60, pid=_dead_pid())
        setup.move("k", S.PENDING, S.UNKNOWN, token=token)
        setup.move("k", S.UNKNOWN, S.SUBMITTED, token=token, job_id="j")
    late, early = open_ledger(path), open_ledger(path)
    claim = late.claim

    def claim_after_the_other_recoverer(key, worker, ttl, **options):
        assert recover_abandoned(early, "early") == ["k"]  # runs between listing and claim
        return claim(key, worker, ttl, **options)

    late.claim = claim_after_the_other_recoverer
    try:
        recovered = recover_abandoned(late, "late")  # old code: StateConflictError
        item = late.get("k")
    finally:
        late.close()
        early.close()
    assert recovered == ["k"]
    assert item.state is S.UNKNOWN and item.lease_owner is None


def test_cancel_of_failed_transient_makes_it_cancelled_and_no_later_run_executes_it(tmp_path):
    """A failed(transient) item would be retried by the next run; the old cancel said
    'nothing to cancel'. Now it becomes cancelled (resting), and failed(permanent) is
    still refused with one line."""
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        provider = FakeProvider(tmp_path / "p.db", tmp_path / "jobs")
        for key in ("transient", "poison"):
            ledger.add(key)
        ledger.move("transient", S.PENDING, S.UNKNOWN)
        ledger.move("transient", S.UNKNOWN, S.FAILED, failure=TRANSIENT, reason="HTTP 503")
        ledger.move("poison", S.PENDING, S.FAILED, failure=PERMANENT, reason="encrypted")
        assert cancel(ledger, provider, "transient") is S.CANCELLED
        item = ledger.get("transient")
        assert item.state is S.CANCELLED and item.resting and item.lease_owner is None
        with pytest.raises(ToolkitError, match="failed\\(permanent\\): nothing to cancel"):
            cancel(ledger, provider, "poison")
        assert ledger.get("poison").lease_owner is None  # the lease went back in finally
        provider.close()
