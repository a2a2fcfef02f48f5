"""The panels' logic, without widgets: a frozen state and a pure step function each.

- comparer: one fault scenario, several strategies, run them side by side;
- contract explorer: the provider's promise as knobs, the same fault under it;
- audit explorer: an audit's findings, filtered by kind.

``*_step(state, action) -> state``; the drill-running steps take ``run``
(default ``drills.run_drill``) so tests can count or replace the runs.
"""

import dataclasses
import threading

from toolkit.drills import CATALOGUE, DRILLS, run_drill, twin_summary
from toolkit.provider import parse_contract
from toolkit.runner.registry import STRATEGIES
from toolkit.widgets.tables import Table

SCENARIOS = tuple(d.name for d in CATALOGUE if "/" not in d.name and "[" not in d.name)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One drill of a panel: its result (None if it raised), and what went wrong."""

    drill: object
    result: object = None
    errors: tuple[str, ...] = ()


def run_quietly(drill, run=run_drill) -> Outcome:
    """Run ``drill``; an exception, or a worker thread's, becomes data, not a traceback."""
    caught = []
    previous = threading.excepthook
    threading.excepthook = lambda args: caught.append(args.exc_value)
    try:
        result = run(drill)
    except Exception as exc:  # a panel shows it; the notebook must go on
        return Outcome(drill, None, (f"{type(exc).__name__}: {exc}",))
    finally:
        threading.excepthook = previous
    return Outcome(drill, result, tuple(f"a worker died: {type(e).__name__}: {e}" for e in caught))


def twin(scenario: str) -> str | None:
    """The naive strategy the catalogue pairs with ``scenario``, if any."""
    for name, drill in DRILLS.items():
        if name.startswith(scenario + "/") and drill.strategy != "safe":
            return drill.strategy
    return None


def scenario_drill(scenario: str, strategy: str):
    """The catalogued drill for this pair, or the scenario's drill run with ``strategy``."""
    catalogued = DRILLS.get(f"{scenario}/{strategy}")
    if strategy == DRILLS[scenario].strategy:
        return DRILLS[scenario]
    if catalogued is not None and catalogued.strategy == strategy:
        return catalogued  # the twin may move the fault to where the naive design has a seam
    base = DRILLS[scenario]
    return dataclasses.replace(base, name=f"{scenario}/{strategy}", strategy=strategy,
                               summary=twin_summary(base.summary, strategy))


# -- comparer ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Comparison:
    scenario: str
    strategies: tuple[str, ...]
    outcomes: tuple[Outcome, ...] = ()


def comparison(scenario: str = "lost-reply", strategies=None) -> Comparison:
    """A fresh comparer state; strategies default to safe and the scenario's naive twin."""
    state = compare_step(Comparison(scenario, ()), ("scenario", scenario))
    return state if strategies is None else compare_step(state, ("strategies", tuple(strategies)))


def compare_step(state: Comparison, action, run=run_drill) -> Comparison:
    """``("scenario", name)``, ``("strategies", names)`` or ``("run",)``.

    Changing the scenario or the strategies drops the results shown.

    Raises:
        ValueError: an unknown scenario, strategy or action.
    """
    verb, *args = action
    if verb == "scenario":
        if args[0] not in SCENARIOS:
            raise ValueError(f"unknown scenario {args[0]!r}; one of {SCENARIOS}")
        return Comparison(args[0], tuple(s for s in STRATEGIES if s in ("safe", twin(args[0]))))
    if verb == "strategies":
        unknown = set(args[0]) - set(STRATEGIES)
        if unknown:
            raise ValueError(f"unknown strategies {sorted(unknown)}; one of {list(STRATEGIES)}")
        return Comparison(state.scenario, tuple(s for s in STRATEGIES if s in args[0]))
    if verb == "run":
        return dataclasses.replace(state, outcomes=tuple(
            run_quietly(scenario_drill(state.scenario, s), run) for s in state.strategies))
    raise ValueError(f"unknown comparer action {action!r}")


def outcome_table(outcomes) -> Table:
    """Per drill run by a panel: strategy, counts, outcome, verdict, findings or errors."""
    from toolkit.widgets.results import doubles, verdict

    rows = []
    for o in outcomes:
        r = o.result
        rows.append({"drill": o.drill.name, "strategy": o.drill.strategy,
                     "contract": o.drill.contract,
                     "submits": "-" if r is None else r.submit_calls,
                     "execs": "-" if r is None else r.executions,
                     "doubles": "-" if r is None else doubles(r.history.executions or ()),
                     "outcome": "-" if r is None else r.outcome,
                     "verdict": "error" if r is None else verdict(r),
                     "findings": "; ".join(o.errors) if o.errors else
                     ", ".join(sorted(r.verdict.anomalies)) or "-"})
    return Table(rows, marked=[i for i, o in enumerate(outcomes)
                               if o.result is None or o.result.verdict.valid is False])


# -- contract explorer -------------------------------------------------------------
LOOKUP_CHOICES = ("consistent", "lagging", "unavailable")
CONTRACT_DRILL = "contract[idempotent]"  # a lost reply, then a crash after the next intent


@dataclasses.dataclass(frozen=True)
class ContractChoice:
    idempotent: bool = True
    lookup: str = "consistent"
    expiring: bool = False  # keys are forgotten after an hour of provider time
    strategies: tuple[str, ...] = ("safe", "blind-retry")
    outcomes: tuple[Outcome, ...] = ()

    @property
    def spec(self) -> str:
        parts = ["idempotent" if self.idempotent else "non-idempotent"]
        parts += ["lag=2"] if self.lookup == "lagging" else ["unavailable"] \
            if self.lookup == "unavailable" else []
        return ",".join(parts + (["retention=3600"] if self.expiring else []))


def promise(spec: str) -> str:
    """What a contract promises, in words (the runner decides from this, never from hope)."""
    c = parse_contract(spec)
    keys = ("a repeated submit with the same key returns the same job (no second execution)"
            if c.idempotent_keys else "no promise: a repeated submit is a new job, billed again")
    lookup = {"consistent": "a lookup sees every job at once",
              "lagging": f"a new job is invisible to its first {c.lag} lookups",
              "unavailable": "the status API is down: no lookup answers"}[c.lookup]
    kept = "keys are kept forever" if c.key_retention is None else \
        f"keys are forgotten {c.key_retention:g} s after creation"
    return f"{spec}: {keys}; {lookup}; {kept}."


def _with_strategies(state, names):
    """``state`` with the chosen strategies (in catalogue order) and no stale outcomes."""
    if set(names) - set(STRATEGIES):
        raise ValueError(f"unknown strategies in {names}; one of {list(STRATEGIES)}")
    return dataclasses.replace(state, outcomes=(),
                               strategies=tuple(s for s in STRATEGIES if s in names))


def contract_step(state: ContractChoice, action, run=run_drill) -> ContractChoice:
    """``("idempotent", bool)``, ``("lookup", name)``, ``("expiring", bool)``,
    ``("strategies", names)`` or ``("run",)``; any change drops the results shown.

    Raises:
        ValueError: an unknown lookup, strategy or action.
    """
    verb, *args = action
    if verb in ("idempotent", "expiring"):
        return dataclasses.replace(state, outcomes=(), **{verb: bool(args[0])})
    if verb == "lookup":
        if args[0] not in LOOKUP_CHOICES:
            raise ValueError(f"unknown lookup {args[0]!r}; one of {LOOKUP_CHOICES}")
        return dataclasses.replace(state, lookup=args[0], outcomes=())
    if verb == "strategies":
        return _with_strategies(state, args[0])
    if verb == "run":
        base = DRILLS[CONTRACT_DRILL]
        drills = [dataclasses.replace(base, contract=state.spec, strategy=s,
                                      name=f"contract[{state.spec}]" + ("" if s == "safe" else
                                                                        f"/{s}"))
                  for s in state.strategies]
        return dataclasses.replace(state, outcomes=tuple(run_quietly(d, run) for d in drills))
    raise ValueError(f"unknown contract explorer action {action!r}")


# -- retries and poison: the 30-document experiment ----------------------------------
RETRY_DRILL = "poison-storm"  # seeded transient errors on submit, poison among the inputs


def retry_drill(rate: float, strategy: str = "safe", docs: int = 27, poison: int = 3):
    """The poison-storm drill on ``docs`` healthy and ``poison`` poison files, with a
    provider that fails ``rate`` of submits transiently (seeded: the same every run)."""
    rate = round(float(rate), 2)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"transient rate must be within [0, 1), got {rate}")
    name = f"retries[{docs}+{poison} poison, transient={rate:g}]"
    return dataclasses.replace(
        DRILLS[RETRY_DRILL], name=name if strategy == "safe" else f"{name}/{strategy}",
        summary=f"{docs} documents and {poison} poison files; {rate:.0%} of submits fail "
                "transiently", strategy=strategy, docs=docs, poison=poison,
        contract="idempotent" + (f",transient={rate:g}" if rate else ""))


@dataclasses.dataclass(frozen=True)
class RetryChoice:
    rate: float = 0.3
    strategies: tuple[str, ...] = ("safe", "rewrite-state")
    outcomes: tuple[Outcome, ...] = ()


def retry_step(state: RetryChoice, action, run=run_drill) -> RetryChoice:
    """``("rate", float)``, ``("strategies", names)`` or ``("run",)``; a change drops results.

    Raises:
        ValueError: a rate outside [0, 1), an unknown strategy or action.
    """
    verb, *args = action
    if verb == "rate":
        retry_drill(args[0])  # validates
        return dataclasses.replace(state, rate=round(float(args[0]), 2), outcomes=())
    if verb == "strategies":
        return _with_strategies(state, args[0])
    if verb == "run":
        return dataclasses.replace(state, outcomes=tuple(
            run_quietly(retry_drill(state.rate, s), run) for s in state.strategies))
    raise ValueError(f"unknown retry experiment action {action!r}")


# -- audit explorer ----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AuditView:
    summary: dict  # Report.to_json()
    items: tuple  # (key, state, action, why) per item
    kind: str | None = None  # None: every finding

    @property
    def kinds(self) -> dict:
        counts = {}
        for anomaly in self.summary["anomalies"]:
            counts[anomaly["kind"]] = counts.get(anomaly["kind"], 0) + 1
        return counts


def audit_view(report) -> AuditView:
    """The explorer's state for a ``forensics.Report``, every finding shown."""
    frame = report.items
    items = tuple(zip(*(map(str, frame[c]) for c in ("key", "state", "action", "why")))) \
        if len(frame) else ()
    return AuditView(report.to_json(), items)


def audit_step(state: AuditView, action) -> AuditView:
    """``("kind", name or None)``.

    Raises:
        ValueError: a kind the audit did not find, or an unknown action.
    """
    verb, *args = action
    if verb != "kind":
        raise ValueError(f"unknown audit explorer action {action!r}")
    if args[0] is not None and args[0] not in state.kinds:
        raise ValueError(f"the audit found no {args[0]!r}; found {sorted(state.kinds)}")
    return dataclasses.replace(state, kind=args[0])


def findings_table(state: AuditView) -> Table:
    rows = [a for a in state.summary["anomalies"] if state.kind in (None, a["kind"])]
    return Table(rows, ["kind", "key", "detail"],
                 title=f"findings: {state.kind or 'all kinds'} ({len(rows)})")


def todo_table(state: AuditView) -> Table:
    """Items whose next action is not ``skip`` (only those the filter's findings name)."""
    keys = {a["key"] for a in state.summary["anomalies"] if state.kind in (None, a["kind"])}
    rows = [dict(zip(("key", "state", "next", "why"), item)) for item in state.items
            if item[2] != "skip" and (state.kind is None or item[0] in keys)]
    return Table(rows, ["key", "state", "next", "why"], title=f"items needing action ({len(rows)})")
