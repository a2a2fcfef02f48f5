"""Running a drill: the batch for real under its fault plan, then the checker's verdict.

The catalogue itself (``Drill``, ``CATALOGUE``, ``DRILLS``) is data in
``toolkit.drills.catalogue``, re-exported here.

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
from toolkit.drills.captions import NAIVE_WAYS, twin_summary  # noqa: F401 - re-exported
from toolkit.drills.catalogue import CATALOGUE, DRILLS, STRICT, Drill  # noqa: F401 - re-exported
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
