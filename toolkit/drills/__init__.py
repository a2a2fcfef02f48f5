"""The drill catalogue: corpus + strategy + contract + fault plan + what must hold.

``run_drill(drill)`` runs the batch for real (PyMuPDF work, SQLite or JSONL
ledger, the fake provider's own database) in a temporary folder: the first
run with the fault plan, then clean reruns as a restarted process would do
them, each opening the ledger fresh. It collects the whole history and asks
the checker. Every fault is drilled with the safe strategy (must be valid)
and with the naive strategy it breaks (must be invalid, with the expected
anomaly); a drill the naive design passed would be a broken drill.
"""

import contextlib
import dataclasses
import tempfile
import threading
import time
from pathlib import Path

from toolkit import documents
from toolkit.checker import History, Verdict, check
from toolkit.checker.findings import headline
from toolkit.drills.actors import _barrier_hook, _cancel_one_in_flight, _chain, _start_slow_owner
from toolkit.drills.captions import NAIVE_WAYS, twin_summary
from toolkit.drills.conclusive import (RACE, missing_faults, not_applicable, service_shots,
                                      settled_between_runs)
from toolkit.drills.history import _items, collect_history
from toolkit.drills.service import http_provider, settle
from toolkit.drills.shots import _Fired, _watched, _watched_later
from toolkit.faults import Crash, Injector, fill_disk, tear_jsonl_writes
from toolkit.ledger import State
from toolkit.provider import FakeProvider, parse_contract
from toolkit.runner import RetryPolicy
from toolkit.runner.ops import clear_health, health_marker
from toolkit.runner.registry import open_strategy, resolve_strategy, strategy_label

STRICT = "non-idempotent"


@dataclasses.dataclass(frozen=True, slots=True)
class Drill:
    name: str
    summary: str
    strategy: str = "safe"
    contract: str = STRICT
    faults: tuple[str, ...] = ()
    persistent: bool = False  # the fault stays for the reruns too (an outage, not a blip)
    ledger: str = "sqlite"
    docs: int = 4
    poison: int = 0
    long_docs: int = 0  # documents of 6 pages, processed page by page
    page_by_page_from: int | None = None  # documents with this many pages go page by page
    service_faults: tuple[str, ...] = ()  # over real HTTP: faults the provider service does
    http: bool = False  # the provider as a service process on loopback, not in-process
    workers: int = 1
    runs: int = 2
    disk_full_after: int = 6  # ledger writes that succeed before the disk is "full"
    options: tuple = ({},)  # the request options of run n: options[n % len(options)]
    slow_owner: bool = False  # another live process holds the first item's lease, slowly
    cancel_after_first_run: bool = False  # the operator cancels one in-flight item
    scans: int = 0  # scanned documents and mixed (text + scan + blank) ones, each: OCR route
    expect_valid: bool = True
    expect: tuple[str, ...] = ()  # anomaly kinds the checker must find
    expect_parked: int | None = None  # items left in needs_review, when that is the measure
    note: str = ""  # said in the row: why a naive design is harmless here


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """One moment of a drill, for steppers: after an event (or at the end of a run)."""

    run: int
    label: str
    event: object
    items: tuple
    jobs: tuple
    submit_calls: int
    executions: int


@dataclasses.dataclass(frozen=True)
class DrillResult:
    drill: Drill
    history: History
    verdict: object
    steps: tuple[Step, ...]
    by_state: dict
    submit_calls: int
    executions: int
    fired: tuple
    missing: tuple = ()  # required faults that never fired: the verdict proves nothing
    not_applicable: str | None = None  # why the drill was not run with this strategy
    run_starts: tuple = ()  # wall-clock start of each run: places witnesses by run
    shots: tuple = ()  # every fault and actor as it happened, placed among the steps

    @property
    def passed(self) -> bool:
        """The fault fired and the verdict is the one the drill expects, with every expected anomaly."""
        if self.not_applicable or self.missing:
            return False
        parked = self.by_state.get("needs_review", 0)
        found = {*self.verdict.anomalies, *self.verdict.costly}
        return (self.verdict.valid is self.drill.expect_valid
                and set(self.drill.expect) <= found
                and set(self.verdict.costly) <= set(self.drill.expect)
                and self.drill.expect_parked in (None, parked))

    @property
    def status(self) -> str:
        """``n/a``, ``inconclusive`` (its fault never fired), ``as expected`` or ``UNEXPECTED``."""
        if self.not_applicable:
            return "n/a"
        if self.missing and not self._finding_without_fault:
            return "inconclusive"
        return "as expected" if self.passed else "UNEXPECTED"

    @property
    def _finding_without_fault(self) -> bool:
        # An anomaly where none was expected stands whether or not the fault fired.
        return self.drill.expect_valid and self.verdict.valid is False

    @property
    def failing(self) -> bool:
        """A row that makes ``drill`` exit 1: unexpected, or a fault that never fired."""
        return self.status in ("UNEXPECTED", "inconclusive")

    @property
    def reason(self) -> str:
        if self.not_applicable:
            return self.not_applicable
        if self.missing:
            return f"the fault never fired: {', '.join(self.missing)}" + (
                " (the anomalies stand without it)" if self._finding_without_fault else "")
        return self.drill.note

    @property
    def outcome(self) -> str:
        return " ".join(f"{state}={n}" for state, n in self.by_state.items() if n)

    def row(self) -> dict:
        return {"drill": self.drill.name, "strategy": strategy_label(self.drill.strategy),
                "contract": self.drill.contract, "submit_calls": self.submit_calls,
                "executions": self.executions, "outcome": self.outcome,
                "valid": self.verdict.valid, "expected_valid": self.drill.expect_valid,
                "anomalies": sorted(self.verdict.anomalies), "passed": self.passed,
                "costly": sorted(self.verdict.costly), "headline": headline(self.verdict),
                "status": self.status, "reason": self.reason}


def _pair(name, summary, naive, expect, **common):
    """The safe drill and its naive twin on the same input, contract and fault."""
    safe = Drill(name, summary, **common)
    twin = dataclasses.replace(safe, name=f"{name}/{naive}", strategy=naive, expect_valid=False,
                               summary=twin_summary(summary, naive), expect=expect,
                               **_naive_overrides(naive, common))
    return [safe, twin]


def _naive_overrides(naive, common):
    # Some faults act where only the naive design has a seam (its state file,
    # its in-place download); the twin takes the variant that lands there.
    if naive == "rewrite-state" and "torn_jsonl_write" in common.get("faults", ()):
        return {"faults": ("crash_during_state_write",), "ledger": "sqlite"}
    if naive == "output-exists" and common.get("faults"):
        return {"faults": ("crash_mid_download",)}
    return {}


def _matrix():
    drills = []
    for contract in ("idempotent", "non-idempotent", "idempotent,lag=2", "non-idempotent,lag=2",
                     "idempotent,retention=3600", "non-idempotent,retention=3600"):
        for strategy in ("safe", "blind-retry"):
            # A blind retry is harmless only where the provider dedupes a key it surely keeps.
            dedupes = contract.startswith("idempotent")
            harmless = dedupes and "retention" not in contract
            expect = () if strategy == "safe" or harmless else \
                ("blind_resubmit",) if dedupes else ("blind_resubmit", "double_execution")
            name = f"contract[{contract}]" + ("" if strategy == "safe" else f"/{strategy}")
            note = "harmless here: the provider dedupes a key it keeps forever" \
                if strategy != "safe" and harmless else ""
            summary = twin_summary("a lost reply, then a crash after the next intent", strategy)
            drills.append(Drill(name, summary + (f" ({note})" if note else ""),
                                strategy=strategy, contract=contract,
                                faults=("lost_reply", "crash_after_second_intent"),
                                expect_valid=not expect, expect=expect, note=note))
    return drills


CATALOGUE = [
    # The two-ledger article: run 1 ends unknown (reply lost, lookup down), run 2
    # recovers by lookup, run 3 reuses the verified artifact; exactly one submit.
    *_pair("lost-reply", "the provider commits, the reply is lost: recover by lookup, never resubmit",
           "blind-retry", ("double_execution",), faults=("lost_reply", "lookup_unavailable"),
           runs=3),
    Drill("crash-after-intent", "intent committed, nothing sent: parked for review, never resubmitted "
          "blindly", faults=("crash_after_intent",)),
    Drill("crash-after-intent/idempotent", "the same crash where the contract makes a resubmit safe",
          contract="idempotent", faults=("crash_after_intent",)),
    *_pair("crash-after-submit", "the job is accepted, the process dies before the reply",
           "blind-retry", ("double_execution",), faults=("crash_after_submit",)),
    *_pair("crash-before-commit", "the reply is in hand, the process dies before committing it",
           "batch-commit", ("double_execution", "unrecorded_execution"),
           faults=("crash_before_commit",), docs=6),
    *_pair("torn-write", "the process dies halfway through writing its state",
           "rewrite-state", ("double_execution",), faults=("torn_jsonl_write",), ledger="jsonl"),
    *_pair("concurrent-workers", "two workers race for the same items", "no-lease",
           ("double_execution",), workers=2, runs=1),
    *_pair("lookup-unavailable", "the reply is lost and the status API is down for the whole batch",
           "blind-retry", ("double_execution",), faults=("lost_reply", "lookup_unavailable"),
           persistent=True),
    *_pair("lookup-lag", "the reply is lost and a new job is invisible to the first two lookups",
           "blind-retry", ("double_execution",), contract="non-idempotent,lag=2",
           faults=("lost_reply",)),
    *_pair("half-download", "the artifact download stops halfway", "output-exists",
           ("fake_done",), contract="idempotent", faults=("half_download",)),
    *_pair("poison-storm", "poison files in a storm of transient errors", "rewrite-state",
           ("poison_submitted",), contract="idempotent,transient=0.6", docs=6, poison=2, runs=3),
    *_pair("disk-full", "the ledger cannot record the reply: stop taking work, reconcile later",
           "blind-retry", ("double_execution",), faults=("disk_full",)),
    # The job-registry rules (owner recovery, conflicts, cancellation, health, identity).
    # A slow live owner keeps its lease (safe: it renews before each call). In the naive
    # design every worker steals expired leases and never checks its own: the thief
    # finds an intent with no job yet and parks it, the owner submits anyway (a side
    # effect by a lease loser) and its job succeeds: paid for, not delivered.
    Drill("owner-recovery", "a live but slow process holds a lease past its expiry",
          slow_owner=True, runs=1, expect_parked=0),
    Drill("owner-recovery/steal-expired", "a live but slow process holds a lease past its "
          "expiry; " + NAIVE_WAYS["steal-expired"] + " (the owner's job is paid, then parked)",
          strategy="steal-expired", slow_owner=True, runs=1, expect_parked=1,
          expect_valid=False, expect=("execution_by_lease_loser", "parked_after_success")),
    # The fake provider runs a job only when it is polled, so the abandoned first job
    # never bills here; the checker still proves the second key was sent blind.
    *_pair("active-conflict", "the reply is lost while the job still runs: attach, never re-create",
           "timeout-as-failed", ("blind_resubmit",), contract="idempotent,conflict,run-polls=2",
           faults=("lost_reply",)),
    Drill("cancel", "the operator cancels one running item; no later run retries it (the other "
          "three stay submitted: their jobs need 50 polls to run, more than two runs make)",
          contract="non-idempotent,run-polls=50", cancel_after_first_run=True),
    *_pair("health-fail-closed", "the disk fills up before an intent: stop taking work",
           "ignore-write-errors", ("unrecorded_execution", "double_execution"),
           faults=("disk_full",), disk_full_after=5),
    *_pair("identity-change", "the same files again with another target language",
           "output-exists", ("fake_done",), contract="idempotent",
           options=({"target": "de"}, {"target": "fr"})),
    # A long document dies after its second page; pages are billed one by one.
    *_pair("partial-resume", "a 6-page document: the process dies after page 2 is checkpointed",
           "restart-long-docs", ("double_execution",), faults=("crash_after_checkpoint",),
           docs=2, long_docs=2, page_by_page_from=5),
    # Over real HTTP, the faults done by the provider service itself.
    *_pair("http-lost-reply", "over HTTP: the socket times out while the job runs on",
           "blind-retry", ("double_execution",), http=True, service_faults=("slow_submit",),
           docs=3),
    # No naive twin: any HTTP client that checks Content-Length refuses a cut body, so a
    # half file under the final name needs a crash mid-write (half-download/output-exists).
    Drill("http-cut-download", "over HTTP: the artifact response stops halfway; fetched again",
          contract="idempotent", http=True, service_faults=("cut_fetch",), docs=3),
    # Scans go the OCR route (Tesseract, for real): a lost reply, then the process dies
    # inside an OCR job; the provider re-runs the abandoned job, the client looks it up.
    *_pair("scan-batch", "text, scanned and mixed documents: a lost reply, then a crash mid-OCR",
           "blind-retry", ("double_execution",), faults=("lost_reply", "crash_mid_ocr"),
           docs=2, scans=1),
    *_matrix(),
]
DRILLS = {drill.name: drill for drill in CATALOGUE}


def run_drill(drill: Drill, workdir=None, seed: int = 0, strategy=None) -> DrillResult:
    """Run one drill in ``workdir`` (a fresh temporary folder if None).

    ``strategy`` (a name, ``module:Name`` or a ``Pipeline`` class) replaces the
    drill's own: your pipeline under the drill's fault, judged the same way.
    """
    if strategy is not None:
        cls = resolve_strategy(strategy)  # a bad reference fails before any work
        drill = dataclasses.replace(drill, strategy=strategy)
        if reason := not_applicable(drill, cls):
            return DrillResult(drill, History((), {}, None, None, {}, {}), Verdict(None, {}), (), {}, 0, 0, (),
                               not_applicable=reason)
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="drill-") as tmp:
            return run_drill(drill, tmp, seed)
    work = Path(workdir)
    inputs = documents.make_corpus(work / "in", docs=drill.docs, poison=drill.poison, seed=seed,
                                   long_docs=drill.long_docs, scans=drill.scans, mixed=drill.scans)
    contract = dataclasses.replace(parse_contract(drill.contract), seed=seed)
    with contextlib.ExitStack() as stack:
        if drill.http:
            provider = stack.enter_context(http_provider(work, contract, drill.service_faults))
        else:
            provider = stack.enter_context(FakeProvider(work / "provider.db",
                                                        work / "provider-jobs", contract))
        steps = []
        fired = _Fired(steps, provider)
        ocr = _ocr_phase_faults(drill, provider, inputs, _watched_later(steps, provider, fired))
        return _run(drill, work, inputs, contract, provider, steps, fired, ocr.fired)


def _ocr_phase_faults(drill, provider, inputs, watch):
    """Faults fired by the in-process provider itself (``crash_mid_ocr``), once per drill:
    at its ``executed`` phase of a job whose document goes the OCR route."""
    from toolkit.identity import file_task_key

    injector = Injector(tuple(name for name in drill.faults if name == "crash_mid_ocr"))
    if not injector.plan or drill.http:
        return injector
    ocr_keys = set()
    for path in inputs:
        routed = documents.ocr_routed(path, {})
        if "route" in routed:
            ocr_keys.update(file_task_key(path, {**option, **routed}) for option in drill.options)

    hook = watch(injector)

    def on_phase(phase, job_id):
        job = next(job for job in provider.jobs() if job.job_id == job_id)
        if job.task_key in ocr_keys:
            hook(f"ocr_{phase}", job_id)
    provider.on_phase = on_phase
    return injector


def _run(drill, work, inputs, contract, provider, steps, fired, provider_fired=()) -> DrillResult:
    """``provider_fired``: faults the in-process provider fires itself (filled as it runs)."""
    suffix = ".json" if drill.strategy == "rewrite-state" else f".{drill.ledger}"
    ledger_path = work / f"ledger{suffix}"
    starts = []
    for run in range(drill.runs):
        starts.append(time.time())
        faults = drill.faults if run == 0 or drill.persistent else ()
        if run and health_marker(ledger_path).exists():
            clear_health(ledger_path)  # the operator freed the disk and cleared the marker
        _one_run(drill, run, faults, ledger_path, provider, work, inputs, steps, fired)
    if drill.http:
        settle(provider)  # a job abandoned by a blind retry still runs: wait for its bill
        fired.extend(service_shots(provider))
    fired.extend((0, *shot) for shot in provider_fired)  # their shots were taken as they fired
    history = collect_history(ledger_path, provider, inputs, contract, drill.options,
                              drill.page_by_page_from)
    stats = provider.stats()
    counts = {state.value: 0 for state in State}
    for item in history.items.values():
        counts[State(item.state).value] += 1
    verdict = check(history)
    missing, reason = missing_faults(drill, fired), settled_between_runs(drill, fired, verdict)
    return DrillResult(drill, history, verdict, tuple(steps), counts,
                       stats["submit_calls"], stats["executions"], tuple(fired),
                       () if reason else missing, not_applicable=reason,
                       run_starts=tuple(starts),
                       shots=tuple(sorted(fired.shots, key=lambda shot: shot.after)))


def _policy(drill, run) -> RetryPolicy:
    if drill.http:  # real jobs take real time: poll and look up with real backoff
        return RetryPolicy(lookups=40, polls=200, base_delay=0.02, max_delay=0.1, seed=run)
    return RetryPolicy(base_delay=0.0, seed=run)


def _one_run(drill, run, faults, ledger_path, provider, work, inputs, steps, fired):
    options = drill.options[run % len(drill.options)]
    injectors = [Injector(faults) for _ in range(drill.workers)]
    race = _barrier_hook(drill.workers, lambda key: fired.append((run, RACE, key))) \
        if drill.workers > 1 else None
    slow = _start_slow_owner(ledger_path, provider, work, inputs[:1], options,
                             drill.strategy) \
        if drill.slow_owner and run == 0 else None
    runners = []
    for n, injector in enumerate(injectors):
        watched = _watched(injector, run, steps, provider, fired.shots)
        hook = _chain(*(h for h in (race, watched, slow and slow.release) if h))
        runner = open_strategy(drill.strategy, ledger_path, provider, work / "out",
                               options=options, lease_ttl=0.3 if slow else 60.0,
                               policy=_policy(drill, run), hook=hook, worker=f"worker-{n + 1}",
                               sleep=time.sleep if drill.http else lambda seconds: None,
                               **({"page_by_page_from": drill.page_by_page_from}
                                  if drill.page_by_page_from is not None else {}))
        if "torn_jsonl_write" in faults:
            tear_jsonl_writes(runner.ledger, nth=len(inputs) + 3,
                              on_fire=lambda: fired.append((run, "torn_jsonl_write", None)))
        if "disk_full" in faults:
            fill_disk(runner.ledger, after=drill.disk_full_after,
                      on_fire=lambda: fired.append((run, "disk_full", None)))
        if hasattr(runner.ledger, "on_event"):
            runner.ledger.on_event = _recorder(run, runner.ledger, provider, steps)
        runners.append(runner)

    errors = []
    ours = isinstance(drill.strategy, str) and ":" not in drill.strategy

    def work_on(runner):
        try:
            runner.run(inputs)
        except Crash:
            pass  # the process is gone; the next run starts from what is on disk
        except Exception as exc:  # noqa: BLE001 - handed on below
            if ours:
                errors.append(exc)  # our own strategies must not break: fail the drill
            else:  # a user's pipeline that raises dies like a crashed process
                fired.append((run, "pipeline_error", f"{type(exc).__name__}: {exc}"))

    threads = [threading.Thread(target=work_on, args=(runner,)) for runner in runners]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for runner in runners:
        runner.close()
    if errors:
        raise errors[0]  # a drill that breaks unexpectedly is a failed drill, not a verdict
    if slow is not None:
        slow.stolen.set()  # a recoverer that never took its item must not keep it waiting
        slow.join(timeout=30)
        fired.append((run, "slow_owner", f"exit {slow.exitcode}"))
    if drill.cancel_after_first_run and run == 0:
        _cancel_one_in_flight(ledger_path, provider, fired)
    for injector in injectors:
        fired.extend((run, *shot) for shot in injector.fired)
    steps.append(_snapshot(run, f"end of run {run + 1}", None, _items(ledger_path), provider))


def _recorder(run, ledger, provider, steps):
    lock = threading.Lock()

    def record(event):
        with lock:
            label = f"{event.op} {event.key[:8]} {event.frm or '-'} -> {event.to}"
            steps.append(_snapshot(run, label, event, tuple(ledger.items()), provider))
    return record


def _snapshot(run, label, event, items, provider):
    stats = provider.stats()
    return Step(run, label, event, tuple(items), tuple(provider.jobs()), stats["submit_calls"],
                stats["executions"])


# The catalogue runners (one after another, or in parallel processes) live beside each
# other; imported last because they call run_drill.
from toolkit.drills.parallel import chosen_drills, run_catalogue  # noqa: E402
