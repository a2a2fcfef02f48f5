"""Every backend and a plain dict model take the same random operations and must agree.

PostgreSQL runs as its own machine (a server round trip costs more than a file write)
when TOOLKIT_TEST_PG names a server; agreeing with the model, it agrees with the others.
"""

import contextlib
import shutil
import subprocess
import sys
import tempfile

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from toolkit.checker import History, check
from toolkit.errors import ToolkitError
from toolkit.ledger import TRANSITIONS, State, apply_event, open_ledger

from conftest import pg_schema, require_pg

KEYS = st.sampled_from(["a", "b", "c"])
ARTIFACT = {"artifact_path": "a.pdf", "artifact_size": 1, "artifact_sha256": "0" * 64}
OWNERS = st.sampled_from(["me", "live", "dead", "remote"])


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid  # exited and reaped


# The process each kind of owner claims as: (pid, host); None is this process / this host.
OWNER_PROCESS = {"me": (None, None), "live": (1, None), "dead": (_dead_pid(), None),
                 "remote": (4242, "another-host/0000")}
WORKERS = st.sampled_from(["w1", "w2"])
STATES = st.sampled_from(list(State))


class ManualClock:
    now = 1000.0

    def __call__(self):
        return self.now


class Model:
    """The ledger's rules written out plainly, independent of the implementation."""

    def __init__(self):
        self.items: dict[str, dict] = {}

    def add(self, key):
        if key in self.items:
            return False
        self.items[key] = {"state": State.PENDING, "attempt": 0, "token": 0, "failure": None,
                           "owner": None, "expires": None, "kind": None, "artifact": False}
        return True

    def move(self, key, frm, to, token, failure, artifact):
        item = self.items.get(key)
        if to not in TRANSITIONS[frm]:
            return "IllegalTransitionError"
        if (to is State.FAILED) != (failure is not None):
            return "IllegalTransitionError"  # a failure class goes with failed, and only there
        if item is None or item["state"] is not frm:
            return "StateConflictError"
        if token != item["token"]:
            return "StaleTokenError"
        if frm is State.FAILED and item["failure"] != "transient" and to is not State.CANCELLED:
            return "IllegalTransitionError"  # a permanent failure only closes (resolve --cancel)
        if frm is State.PENDING and to is State.FAILED and failure != "permanent":
            return "IllegalTransitionError"  # only poison fails before any submit
        if to is State.DONE and not (artifact or item["artifact"]):
            return "IllegalTransitionError"  # done carries its artifact
        item["artifact"] = item["artifact"] or (artifact and to is State.DONE)
        if to is State.UNKNOWN and frm in (State.PENDING, State.FAILED):
            item["attempt"] += 1
        if frm is State.FAILED:
            item["failure"] = None
        if to is State.FAILED:
            item["failure"] = failure
        item["state"] = to
        return None

    def claim(self, key, worker, ttl, now, kind):
        """``kind`` of the claiming process: me (this process), live (another live process
        on this host), dead (a process of this host that is gone), remote (another host)."""
        item = self.items.get(key)
        if item is None:
            return "StateConflictError"
        held = item["owner"] is not None and item["owner"] != worker
        orphaned = item["kind"] == "dead"  # its owner is gone: taken at once
        expired = item["expires"] is not None and item["expires"] <= now
        if held and not orphaned and not (expired and item["kind"] != "live"):
            return "LeaseHeldError"  # a live process of this host is never robbed
        item.update(owner=worker, expires=now + ttl, token=item["token"] + 1, kind=kind)
        return item["token"]

    def release(self, key, token):
        item = self.items.get(key)
        if item is None:
            return "StateConflictError"
        if token != item["token"]:
            return "StaleTokenError"
        item.update(owner=None, expires=None, kind=None)
        return None


def outcome(call):
    try:
        return call()
    except (ToolkitError, ValueError) as exc:
        return type(exc).__name__


class LedgerAgreement(RuleBasedStateMachine):
    backends = ("sqlite", "jsonl")

    @initialize()
    def open_all(self):
        self.dir = tempfile.mkdtemp()
        self.clock = ManualClock()
        self.schemas = contextlib.ExitStack()
        self.ledgers = [open_ledger(self._location(backend), clock=self.clock)
                        for backend in self.backends]
        self.model = Model()

    def _location(self, backend):
        if backend == "postgres":
            require_pg()
            return self.schemas.enter_context(pg_schema())  # a fresh schema per example
        return f"{self.dir}/l.{backend}"

    def teardown(self):
        for ledger in getattr(self, "ledgers", []):
            ledger.close()
        if hasattr(self, "schemas"):
            self.schemas.close()
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)

    def _agree(self, expected, call):
        """``expected``: an error name, or the value add/claim return (None: any success)."""
        for ledger in self.ledgers:
            got = outcome(lambda: call(ledger))
            if isinstance(expected, str) or expected is not None:
                assert got == expected, (type(ledger).__name__, got, expected)
            else:
                assert not isinstance(got, str), (type(ledger).__name__, got)

    @rule(key=KEYS)
    def add(self, key):
        self._agree(self.model.add(key), lambda ledger: ledger.add(key))

    @rule(key=KEYS, to=STATES, use_current=st.booleans(), frm=STATES, stale=st.booleans(),
          failure=st.sampled_from([None, "transient", "permanent"]), artifact=st.booleans())
    def move(self, key, to, use_current, frm, stale, failure, artifact):
        item = self.model.items.get(key)
        if use_current and item is not None:
            frm = item["state"]
        token = (item["token"] if item else 0) - (1 if stale else 0)
        fields = {"failure": failure} if failure else {}
        fields.update(ARTIFACT if artifact else {})
        expected = self.model.move(key, frm, to, token, failure, artifact)
        self._agree(expected, lambda ledger: ledger.move(key, frm, to, token=token, **fields))

    @rule(key=KEYS, worker=WORKERS, ttl=st.sampled_from([1.0, 5.0]), kind=OWNERS)
    def claim(self, key, worker, ttl, kind):
        expected = self.model.claim(key, f"{worker}-{kind}", ttl, self.clock.now, kind)
        pid, host = OWNER_PROCESS[kind]
        self._agree(expected, lambda ledger: ledger.claim(key, f"{worker}-{kind}", ttl, pid=pid,
                                                          host=host))

    @rule(key=KEYS, stale=st.booleans())
    def release(self, key, stale):
        item = self.model.items.get(key)
        token = (item["token"] if item else 0) - (1 if stale else 0)
        self._agree(self.model.release(key, token), lambda ledger: ledger.release(key, token))

    @rule(seconds=st.sampled_from([0.5, 2.0, 6.0]))
    def advance(self, seconds):
        self.clock.now += seconds

    @invariant()
    def backends_and_model_agree(self):
        if not hasattr(self, "ledgers"):
            return
        for ledger in self.ledgers:
            items = {item.key: item for item in ledger.items()}
            assert set(items) == set(self.model.items)
            for key, expected in self.model.items.items():
                item = items[key]
                assert (item.state, item.attempt, item.token, item.failure, item.lease_owner,
                        item.lease_expires) == (expected["state"], expected["attempt"],
                                                expected["token"], expected["failure"],
                                                expected["owner"], expected["expires"])

    @invariant()
    def the_checker_finds_no_illegal_transition_in_what_the_ledger_wrote(self):
        for ledger in getattr(self, "ledgers", []):
            verdict = check(History(events=tuple(ledger.events()), items={}, calls=(),
                                    executions=(), artifacts={}, inputs={}))
            assert "illegal_transition" not in verdict.anomalies, verdict.to_json()

    @invariant()
    def items_are_the_fold_of_their_events(self):
        for ledger in getattr(self, "ledgers", []):
            folded = {}
            for event in ledger.events():
                folded[event.key] = apply_event(folded.get(event.key), event)
            assert sorted(folded.values(), key=lambda item: item.key) == ledger.items()


class PostgresAgreement(LedgerAgreement):
    backends = ("postgres",)


LedgerAgreement.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                             deadline=None)
test_sqlite_jsonl_and_model_agree_after_every_random_operation = LedgerAgreement.TestCase
PostgresAgreement.TestCase.settings = settings(max_examples=25, stateful_step_count=40,
                                               deadline=None)
test_postgres_and_model_agree_after_every_random_operation = PostgresAgreement.TestCase
