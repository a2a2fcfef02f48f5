"""The checker: one hand-written history per anomaly, clean ones, and generated ones.

Each fixture in ``fixtures/histories`` tells its story in its first (``note``)
line; each test says the fault and the property that must hold.
"""

import dataclasses
import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.checker import (KINDS, Anomaly, ArtifactOnDisk, Call, Execution, History, check,
                             dump_history, explain, load_history)
from toolkit.errors import ToolkitError
from toolkit.ledger import PERMANENT, TRANSIENT, Event, State, apply_event

S = State
HISTORIES = Path(__file__).resolve().parents[1] / "fixtures" / "histories"
CLEAN = ("clean-safe-run.jsonl", "clean-transient-retry.jsonl")


def history(name: str) -> History:
    return load_history(HISTORIES / name)


def only(verdict, kind: str) -> list[Anomaly]:
    """Assert the verdict is invalid with exactly ``kind``; return its anomalies."""
    assert verdict.valid is False
    assert set(verdict.anomalies) == {kind}, verdict.anomalies
    return verdict.anomalies[kind]


# -- one history per anomaly -----------------------------------------------------------
def test_lost_reply_then_lagging_lookup_and_resubmit_is_double_execution():
    """Non-idempotent provider, lookup lags: 'not found' was a lie, the document ran twice."""
    [anomaly] = only(check(history("double-execution.jsonl")), "double_execution")
    assert anomaly.key == "doc-a"
    assert [x.job_id for x in anomaly.witnesses] == ["j1", "j2"]


def test_run_that_ignores_the_ledger_submitting_a_done_task_is_submit_after_done():
    """A submit at t=20 for a task done at t=8 is flagged even though the provider deduped it."""
    [anomaly] = only(check(history("submit-after-done.jsonl")), "submit_after_done")
    done, call = anomaly.witnesses
    assert anomaly.key == "doc-a" and done.to is S.DONE and call.ts == 20


def test_ledger_that_forgets_done_and_records_a_new_intent_is_submit_after_done():
    """A rewritten state file loses done; the new intent on a done task is the anomaly."""
    [anomaly] = only(check(history("submit-after-done-ledger.jsonl")), "submit_after_done")
    done, intent = anomaly.witnesses
    assert anomaly.key == "doc-a" and (done.seq, intent.seq) == (4, 6)


def test_partial_download_or_deleted_output_marked_done_is_fake_done():
    """A done whose checksum no execution produced, and a done with no file, are not done."""
    anomalies = only(check(history("fake-done.jsonl")), "fake_done")
    assert {a.key: len(a.witnesses) for a in anomalies} == {"doc-a": 2, "doc-b": 2}
    assert "matches no succeeded execution" in anomalies[0].detail
    assert "missing" in anomalies[1].detail


def test_state_file_rewrite_that_drops_an_executed_input_is_lost_item():
    """doc-b executed at the provider, but the client ended with no item for it."""
    [anomaly] = only(check(history("lost-item.jsonl")), "lost_item")
    assert anomaly.key == "doc-b" and len(anomaly.witnesses) == 2  # its submit and execution


def test_submit_before_the_intent_is_committed_is_unrecorded_execution():
    """Batch commit writes the intent at t=6 for a submit at t=3: side effect without intent."""
    [anomaly] = only(check(history("unrecorded-execution.jsonl")), "unrecorded_execution")
    call, execution = anomaly.witnesses
    assert anomaly.key == "doc-a" and call.op == "submit" and execution.job_id == "j1"


def test_unrecorded_execution_is_not_judged_without_a_ledger():
    """A strategy with no event log cannot show intents; only its other invariants count."""
    h = dataclasses.replace(history("unrecorded-execution.jsonl"), events=())
    assert check(h).valid is True


def test_blind_retry_with_finite_key_retention_is_blind_resubmit():
    """The same key resubmitted after a lost reply, no lookup between, retention 60 s."""
    [anomaly] = only(check(history("blind-resubmit.jsonl")), "blind_resubmit")
    first, again = anomaly.witnesses
    assert anomaly.key == "doc-a" and (first.seq, again.seq) == (1, 2)


def test_blind_retry_against_idempotent_keys_retained_forever_is_allowed():
    """With idempotent keys and no retention limit the provider dedupes: not an anomaly."""
    h = dataclasses.replace(history("blind-resubmit.jsonl"), key_retention=None)
    assert check(h).valid is True
    h = dataclasses.replace(h, idempotent_keys=False)
    only(check(h), "blind_resubmit")


def test_new_key_while_the_first_submit_outcome_is_unknown_is_blind_under_any_contract():
    """A fresh attempt key cannot be deduped against the old one, whatever the contract."""
    h = history("blind-resubmit.jsonl")
    again = dataclasses.replace(h.calls[1], idem_key="doc-a:2", outcome="created", job_id="j2")
    h = dataclasses.replace(h, calls=(h.calls[0], again, h.calls[2]), key_retention=None)
    [anomaly] = only(check(h), "blind_resubmit")
    assert [c.idem_key for c in anomaly.witnesses] == ["doc-a:1", "doc-a:2"]


def test_resubmit_after_a_transient_refusal_is_not_blind():
    """'Provider busy' is a definite answer: nothing was accepted, so the same key may go again."""
    h = history("blind-resubmit.jsonl")
    refused = dataclasses.replace(h.calls[0], outcome="transient", job_id=None)
    h = dataclasses.replace(h, calls=(refused, *h.calls[1:]))
    assert check(h).valid is True


def test_submit_with_the_token_of_an_expired_lease_is_execution_by_lease_loser():
    """w1 submits after w2 claimed token 2: the provider executes for a lease loser.
    (The old stale_token_write rule re-checked the ledger's own fence, which no history a
    real ledger writes can break: it is deleted. A real run: test_lease_loser_run.)"""
    [anomaly] = only(check(history("execution-by-lease-loser.jsonl")), "execution_by_lease_loser")
    claim, call = anomaly.witnesses
    assert anomaly.key == "doc-a" and (claim.token, call.token, call.worker) == (2, 1, "w1")


def test_poison_sent_to_the_provider_is_poison_submitted():
    """Without preflight the truncated file reaches the provider (which rejects it)."""
    [anomaly] = only(check(history("poison-submitted.jsonl")), "poison_submitted")
    assert anomaly.key == "doc-p" and len(anomaly.witnesses) == 1


def test_auto_resume_of_an_in_flight_item_to_pending_is_illegal_transition():
    """submitted -> pending is not an edge: it would re-run work whose fate is known."""
    [anomaly] = only(check(history("illegal-transition.jsonl")), "illegal_transition")
    assert anomaly.key == "doc-a" and anomaly.witnesses[0].seq == 4


def test_submit_after_an_operator_releases_a_parked_done_item_is_allowed():
    """done -> needs_review -> (operator) unknown -> lookup not found -> resubmit is legitimate."""
    h = history("submit-after-done.jsonl")
    ts = 9
    park = Event(5, ts, "move", "doc-a", S.DONE, S.NEEDS_REVIEW, 1, "w1", 0, {})
    release = Event(6, ts + 1, "move", "doc-a", S.NEEDS_REVIEW, S.UNKNOWN, 1, "operator", 0, {})
    lookup = Call(3, ts + 2, "lookup", "doc-a:1", "doc-a", None, "not_found")
    resubmit = dataclasses.replace(h.calls[-1], seq=4, ts=ts + 3)
    redone = dataclasses.replace(h.events[-1], seq=7, ts=ts + 4, frm=S.UNKNOWN)
    h = dataclasses.replace(h, events=(*h.events, park, release, redone),
                            calls=(*h.calls[:-1], lookup, resubmit))
    assert check(h).valid is True


# -- clean and undecided ---------------------------------------------------------------
@pytest.mark.parametrize("name", CLEAN)
def test_safe_runner_histories_with_lost_replies_and_retries_are_valid(name):
    """Lost replies, transient refusals, parked and unknown items: none is an anomaly."""
    verdict = check(history(name))
    assert (verdict.valid, verdict.anomalies, verdict.notes) == (True, {}, ())


def test_missing_provider_records_leave_the_verdict_undecided():
    """Without the provider's side nothing proves single execution: valid is None, not True."""
    verdict = check(history("undecided-no-provider-records.jsonl"))
    assert verdict.valid is None and verdict.anomalies == {}
    assert verdict.possibly_executed == ("doc-a", "doc-b")  # both ever entered unknown
    for name in CLEAN:
        h = dataclasses.replace(history(name), calls=None, executions=None)
        assert check(h).valid is None


def test_anomaly_found_without_provider_records_still_makes_the_verdict_invalid():
    """Undecided is only for the absence of evidence; a proven anomaly is decisive."""
    h = dataclasses.replace(history("illegal-transition.jsonl"), calls=None, executions=None)
    only(check(h), "illegal_transition")


def test_explain_gives_one_sentence_naming_the_key_for_every_kind():
    anomalies = [a for path in sorted(HISTORIES.glob("*.jsonl"))
                 for kind_list in check(load_history(path)).anomalies.values() for a in kind_list]
    assert {a.kind for a in anomalies} == set(KINDS)
    for anomaly in anomalies:
        sentence = explain(anomaly)
        assert anomaly.key in sentence and sentence.endswith(".") and sentence.count(". ") == 0
        assert "\n" not in sentence and sentence[0].isupper()


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.jsonl")), ids=lambda p: p.stem)
def test_dump_then_load_keeps_every_fixture_history_and_its_verdict(path, tmp_path):
    h = load_history(path)
    dump_history(h, tmp_path / "h.jsonl")
    again = load_history(tmp_path / "h.jsonl")
    assert again == h
    assert check(again).to_json() == check(h).to_json()


def test_malformed_history_line_is_a_toolkit_error_naming_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"kind": "contract"}\n{"kind": "event", "seq": 1}\n')
    with pytest.raises(ToolkitError, match=r"bad\.jsonl:2"):
        load_history(path)


# -- generated histories ------------------------------------------------------------------
class Recorder:
    """Both ledgers of a simulated batch, written only through legal steps."""

    def __init__(self):
        self.clock = itertools.count(1)
        self.events, self.calls, self.executions = [], [], []
        self.items, self.artifacts, self.jobs = {}, {}, itertools.count(1)

    def event(self, op, key, to, *, attempt=None, token=None, **detail):
        item = self.items.get(key)
        attempt = (item.attempt if item else 0) if attempt is None else attempt
        token = (item.token if item else 0) if token is None else token
        event = Event(len(self.events) + 1, next(self.clock), op, key, item and item.state, to,
                      attempt, "w", token, detail)
        self.items[key] = apply_event(item, event)
        self.events.append(event)

    def move(self, key, to, **detail):
        item = self.items[key]
        new_attempt = to is S.UNKNOWN and item.state in (S.PENDING, S.FAILED)
        self.event("move", key, to, attempt=item.attempt + new_attempt, **detail)

    def call(self, op, key, job, outcome):
        idem = f"{key}:{self.items[key].attempt}"
        self.calls.append(Call(len(self.calls) + 1, next(self.clock), op, idem, key, job, outcome))

    def execute(self, key, job, status):
        sha = f"sha-{job}" if status == "succeeded" else None
        self.executions.append(Execution(len(self.executions) + 1, next(self.clock), job,
                                         f"{key}:{self.items[key].attempt}", key, status,
                                         sha and 100, sha))


def life(rec: Recorder, key: str, poison: bool, draw):
    """One item's legal path, one step per ``yield`` so items interleave."""
    rec.event("add", key, S.PENDING, source=f"{key}.pdf")
    yield
    rec.event("claim", key, S.PENDING, token=1, lease_owner="w")
    if poison:
        rec.move(key, S.FAILED, failure=PERMANENT, reason="poison")
        return
    rec.move(key, S.UNKNOWN, note="intent")
    yield
    while True:
        if draw(st.booleans()) and draw(st.booleans()):  # refused: nothing accepted
            rec.call("submit", key, None, "transient")
            rec.move(key, S.FAILED, failure=TRANSIENT)
            yield
            if draw(st.booleans()):
                return  # budget spent: rests failed(transient)
            rec.move(key, S.UNKNOWN, failure=None)
            continue
        job, status = f"j{next(rec.jobs)}", draw(st.sampled_from(["succeeded", "failed"]))
        rec.call("submit", key, job, "created")
        rec.execute(key, job, status)
        yield
        if draw(st.booleans()):  # the reply was lost: look it up
            if draw(st.booleans()):
                rec.call("lookup", key, None, "unavailable")
                return  # rests unknown
            rec.call("lookup", key, job, "found")
        rec.move(key, S.SUBMITTED, job_id=job)
        rec.call("poll", key, job, status)
        yield
        if status == "failed":
            failure = draw(st.sampled_from([TRANSIENT, PERMANENT]))
            rec.move(key, S.FAILED, failure=failure)
            if failure == PERMANENT or draw(st.booleans()):
                return
            rec.move(key, S.UNKNOWN, failure=None)
            continue
        break
    fields = {"job_id": job, "artifact_path": f"out/{key}", "artifact_size": 100,
              "artifact_sha256": f"sha-{job}"}
    rec.call("fetch", key, job, "ok")
    rec.move(key, S.DONE, **fields)
    yield
    if draw(st.booleans()):  # damaged later, parked, released by an operator, re-fetched
        rec.move(key, S.NEEDS_REVIEW, reason="damaged")
        yield
        rec.move(key, S.UNKNOWN, note="released")
        rec.call("lookup", key, job, "found")
        rec.move(key, S.SUBMITTED, job_id=job)
        rec.call("fetch", key, job, "ok")
        rec.move(key, S.DONE, **fields)


def simulate(data) -> History:
    rec = Recorder()
    keys = [f"doc-{i}" for i in range(data.draw(st.integers(1, 4), label="items"))]
    poison = {key: data.draw(st.booleans()) and data.draw(st.booleans()) for key in keys}
    lives = {key: life(rec, key, poison[key], data.draw) for key in keys}
    while lives:
        key = data.draw(st.sampled_from(sorted(lives)))
        if next(lives[key], StopIteration) is StopIteration:
            del lives[key]
    for key, item in rec.items.items():
        if item.state is S.DONE:
            rec.artifacts[key] = ArtifactOnDisk(item.artifact_path, True, item.artifact_size,
                                                item.artifact_sha256)
    idempotent, retention = data.draw(st.booleans()), data.draw(st.sampled_from([None, 60.0]))
    return History(tuple(rec.events), dict(rec.items), tuple(rec.calls),
                   tuple(rec.executions), rec.artifacts,
                   {key: {"source": f"{key}.pdf", "poison": poison[key]} for key in keys},
                   idempotent_keys=idempotent, key_retention=retention)


FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FASTER = settings(FAST, max_examples=50)


@FAST
@given(st.data())
def test_any_legal_history_with_matching_provider_records_is_valid(data):
    """Folding only legal transitions, each submit after its intent: never an anomaly."""
    verdict = check(simulate(data))
    assert verdict.valid is True, verdict.anomalies


@FASTER
@given(st.data())
def test_duplicating_one_succeeded_execution_always_yields_double_execution(data):
    h = simulate(data)
    succeeded = [x for x in h.executions if x.status == "succeeded"]
    if not succeeded:
        return
    x = data.draw(st.sampled_from(succeeded))
    twin = dataclasses.replace(x, seq=len(h.executions) + 1, ts=x.ts + 0.5, job_id=x.job_id + "b")
    verdict = check(dataclasses.replace(h, executions=(*h.executions, twin)))
    assert verdict.valid is False
    assert [a.key for a in verdict.anomalies["double_execution"]] == [x.task_key]


STATES = st.sampled_from(list(State))
ODD_EVENTS = st.builds(Event, st.integers(0, 9), st.floats(allow_nan=True), st.sampled_from(
    ["add", "move", "claim", "release", "?"]), st.sampled_from(["a", "b"]), st.none() | STATES,
    STATES, st.integers(-1, 3), st.none() | st.text(max_size=2), st.integers(-1, 3),
    st.dictionaries(st.sampled_from(["job_id", "failure", "artifact_sha256", "x"]),
                    st.none() | st.text(max_size=2), max_size=2))
ODD_CALLS = st.builds(Call, st.integers(0, 9), st.floats(0, 9), st.sampled_from(
    ["submit", "lookup", "poll", "?"]), st.none() | st.sampled_from(["a:1", "b:2", "x"]),
    st.none() | st.sampled_from(["a", "b"]), st.none() | st.sampled_from(["j1", "j2"]),
    st.sampled_from(["created", "transient", "found", "not_found", "?"]))
ODD_EXECUTIONS = st.builds(Execution, st.integers(0, 9), st.floats(0, 9), st.sampled_from(
    ["j1", "j2"]), st.sampled_from(["a:1", "b:1"]), st.sampled_from(["a", "b"]),
    st.sampled_from(["succeeded", "failed"]), st.none() | st.integers(0, 9),
    st.none() | st.sampled_from(["s1", "s2"]))


@FASTER
@given(st.lists(ODD_EVENTS, max_size=8), st.none() | st.lists(ODD_CALLS, max_size=6),
       st.none() | st.lists(ODD_EXECUTIONS, max_size=4), st.booleans())
def test_check_never_raises_on_an_arbitrary_history(events, calls, executions, idempotent):
    """Duplicate seqs, moves before add, NaN times: a verdict and sentences, never an exception."""
    items = {}
    for e in events:
        if e.op == "add" or e.key in items:
            items[e.key] = apply_event(items.get(e.key), e)
    h = History(tuple(events), items, calls and tuple(calls), executions and tuple(executions),
                {"a": ArtifactOnDisk("out/a", False, None, None)},
                {"a": {"source": "a.pdf", "poison": True}, "c": {}}, idempotent, None)
    verdict = check(h)
    assert verdict.valid in (True, False, None)
    assert not [note for note in verdict.notes if "could not judge" in note]  # no rule crashed
    for anomalies in verdict.anomalies.values():
        assert all(explain(a).endswith(".") for a in anomalies)
