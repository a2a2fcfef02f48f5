"""Systematic crash exploration: a real SIGKILL at every durable step of a batch.

"A resume path that was never killed does not exist." In the spirit of ALICE
and CrashMonkey, at the level of this protocol:

1. run the batch once, uncrashed, in a child forked by this process that
   reports its ordered list of durable steps (``child.Tracer``: ledger commits,
   provider calls and phases, artifact downloads and renames, naive state-file
   rewrites); it is judged beside the crash points (``point``);
2. for every step k: fork a fresh child that runs the same batch and sends
   itself SIGKILL when it reaches step k (``tear+kill``: a download cut
   halfway, then the kill; power-loss mode: the ledger cut back to its last
   fsync after the kill, see ``powerloss``);
3. rerun the batch in fresh forked processes until it rests (at most
   ``plan.runs`` reruns), as an operator would after a crash;
4. collect the whole history (both ledgers, the call logs, the disk) and
   judge it with ``toolkit.checker.check``: the checker is the oracle.

Snapshot mode (``mode="snapshot"``, see ``snapshot``) records the uncrashed
run once, copying the batch folder at each durable step, and starts each crash
point's reruns from its copy instead of replaying the prefix and killing it;
a few supervisor processes (one per job) take the points one after another.

With ``pairs``, the first rerun is killed too, at each of its own durable
steps (bounded by ``max_pairs``). Children are forked from a parent that has
already imported everything (PyMuPDF, SQLite, psutil), with the parent's
objects frozen in them (``pool.start``), so a crash point costs a few forks and
the batch's own work; ``jobs`` points run side by side.

Verdict of one crash point: ``valid`` (the checker found nothing and every
item rests), ``parked`` (valid, with items left in ``needs_review`` for an
operator), ``violation`` (an anomaly of the checker, a batch that does not
rest after the reruns ``not_at_rest``, or in power-loss mode an acknowledged
transition gone from the ledger ``lost_acknowledged``), ``undecided`` (the
checker could not judge), ``not-reached`` or ``diverged`` (the run ended
before step k, or step k was another step than in the baseline: the batch was
not deterministic, which makes the exploration meaningless there).

Each row also lists ``new``: the anomalies the crash caused, beyond those the
design shows uncrashed (a naive design may violate an invariant on every run).
"""

import collections
import dataclasses
import os
import tempfile
import time
from pathlib import Path

from toolkit import pool
from toolkit.errors import StorageError, ToolkitError
from toolkit.explore.child import (KILL, TEAR, Paths, fork, fork_many, fork_meanwhile,
                                   fork_shared)
from toolkit.explore.judge import VERDICTS, _judge, _rested  # noqa: F401 - _judge: widgets
from toolkit.explore.memo import input_checks, prefile
from toolkit.explore.point import _explore_point, _record
from toolkit.explore.powerloss import LEDGERS
from toolkit.explore import scratch
from toolkit.explore.snapshot import folder, refusal

MODES = ("real", "snapshot")  # real: replay the prefix, SIGKILL at step k; snapshot: copies
SHARED = 16  # snapshot mode: at most this many points run one after another per supervisor


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """What to explore: the batch (strategy, contract, documents, ledger) and how far."""

    strategy: str = "safe"
    contract: str = "non-idempotent"
    docs: int = 10
    long_docs: int = 0  # documents of ``long_pages`` pages, sent page by page
    long_pages: int = 5
    ledger: str = "sqlite"  # a key of powerloss.LEDGERS
    power_loss: bool = False  # after each kill, drop the ledger bytes not yet fsynced
    every: int = 1  # explore every k-th step only (1: all of them)
    pairs: bool = False  # also kill the first rerun, at each of its steps
    max_pairs: int = 200
    runs: int = 3  # reruns allowed for the batch to rest after the crash
    seed: int = 0
    jobs: int = 0  # crash points explored side by side (0: one per CPU)
    mode: str = "real"  # a key of MODES; the real mode is the default

    def validate(self) -> "Plan":
        """Raises ToolkitError naming the first bad field (one line, for the CLI)."""
        from toolkit.runner.registry import resolve_strategy

        resolve_strategy(self.strategy)  # a name or module:Class; one-line ToolkitError
        self.contract_object()
        if self.ledger not in LEDGERS:
            raise ToolkitError(f"unknown ledger {self.ledger!r}; choose from {', '.join(LEDGERS)}")
        if self.power_loss and (not LEDGERS[self.ledger].power_loss
                                or self.strategy == "rewrite-state"):
            raise ToolkitError("power loss is simulated for the ledgers only (not the "
                               "rewrite-state strategy's state file)")
        if self.mode not in MODES:
            raise ToolkitError(f"unknown mode {self.mode!r}; choose from {', '.join(MODES)}")
        if self.mode == "snapshot" and refusal(self):
            raise ToolkitError(refusal(self))
        for name, low in (("docs", 1), ("every", 1), ("max_pairs", 0), ("runs", 1), ("jobs", 0),
                          ("long_docs", 0), ("long_pages", 5)):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < low:
                raise ToolkitError(f"{name} must be an integer >= {low}")
        return self

    def contract_object(self):
        from toolkit.provider import parse_contract

        contract = parse_contract(self.contract)  # ToolkitError on a bad spec
        return contract if "seed=" in self.contract else dataclasses.replace(contract,
                                                                             seed=self.seed)

    @property
    def page_by_page_from(self) -> int | None:
        """Long documents go page by page; the short ones (1-4 pages) stay whole."""
        return self.long_pages if self.long_docs else None

    def ledger_options(self) -> dict:
        return dict(LEDGERS[self.ledger].options)

    def ledger_file(self) -> str:
        return "state.json" if self.strategy == "rewrite-state" else \
            f"ledger{LEDGERS[self.ledger].suffix}"


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    """Kill the first run at step ``k`` (None: not at all), the first rerun at step ``j``."""

    k: int | None
    how: str = KILL
    j: int | None = None


@dataclasses.dataclass
class Exploration:
    """Rows (one per crash point, as JSON-ready dicts), the uncrashed baseline, timing."""

    plan: Plan
    rows: list[dict]
    baseline: dict
    steps: list[dict]  # the durable steps of the uncrashed run, in order
    seconds: float
    mode: str = "real"  # the mode the points ran in (snapshot mode may fall back to real)
    note: str = ""  # why it fell back
    supervisors: int = 0  # processes the points ran in (snapshot mode: a few share them)

    def total(self) -> dict:
        count = collections.Counter(row["verdict"] for row in self.rows)
        # the rate counts only points whose recovery really ran (no row is ever taken from
        # another point's result) and was judged
        recovered = sum(row["verdict"] in ("valid", "parked", "violation", "undecided")
                        and row["runs"] >= 1 for row in self.rows)
        total = {"mode": self.mode, "points": len(self.rows), "violations": count["violation"],
                 "parked": count["parked"], "recovered": recovered,
                 "points_per_s": round(recovered / self.seconds, 2) if self.seconds else 0.0}
        total["caused_by_crash"] = sum(bool(row["new"]) for row in self.rows)
        if self.plan.power_loss:
            total["lost_acknowledged"] = sum(row["lost_acked"] for row in self.rows)
        return total

    def to_json(self) -> dict:
        return {"rows": self.rows, "total": self.total()}

    def violations(self) -> list[dict]:
        return [row for row in self.rows if row["verdict"] == "violation"]


def batch_inputs(plan: Plan, folder: Path):
    """The plan's seeded batch written to ``folder``, and each input's task key mapped to
    the name its steps are labelled with (``doc-000``)."""
    from toolkit.documents import make_corpus, page_count
    from toolkit.identity import file_task_key
    from toolkit.runner.pipeline import routed_options

    inputs = make_corpus(folder, docs=plan.docs, poison=0, seed=plan.seed,
                         long_docs=plan.long_docs, long_pages=plan.long_pages)
    names = {file_task_key(path, routed_options({}, page_count(path),
                                                plan.page_by_page_from)): path.stem
             for path in inputs}
    return inputs, names


def explore(plan: Plan, workdir=None, progress=None) -> Exploration:
    """Kill the batch at every durable step (and pair of steps), rerun it, judge each history.

    ``progress(done, total)`` is called as crash points finish.

    Raises:
        ToolkitError: a bad plan, or an uncrashed run that does not reach rest.
    """
    plan.validate()
    if workdir is None:  # named by its owner: the next explore sweeps it if we are killed
        from toolkit.runner.pipeline import sweep_snapshots

        sweep_snapshots()  # here, once: the forked runs inherit that it was done
        # Handlers first, then the folder: a signal from here on runs ``workdir``'s removal,
        # which waits until every process forked inside is gone (``scratch``).
        with pool.interruptible(), scratch.workdir() as tmp:
            return explore(plan, tmp, progress)
    root = Path(workdir)
    inputs, names = batch_inputs(plan, root / "in")
    _warm(inputs, check=plan.mode != "snapshot")  # else ``input_checks`` checks them all
    jobs = plan.jobs or pool.default_jobs()
    started = time.monotonic()

    snapshots = root / "snapshots" if plan.mode == "snapshot" else None
    memo = None if snapshots is None else (root / "provider-work", input_checks(inputs))
    # The uncrashed run, forked from here (``_record``); it is judged (and, if it did not
    # rest, rerun) by ``_explore_point`` from its messages: beside the points when it rested,
    # else before them, to refuse the exploration. No supervisor of its own waits for it.
    def meanwhile():  # the recording is serial: render the later documents beside it
        if memo is not None:
            prefile(memo[0], inputs, memo[1], plan.page_by_page_from)
    work = root / "points" / "baseline"
    recorded = fork_meanwhile(meanwhile, _record, plan, Paths(work, work / plan.ledger_file()),
                              inputs, names, snapshots=snapshots, memo=memo, temp=root / "tmp")
    body, args, kwargs = _call(plan, root, inputs, names, "baseline", Point(None))
    kwargs.update(ran=recorded, memo=memo)
    errors = [m["error"] for m in recorded[0] if m["t"] == "error"]
    if snapshots is not None and errors:
        raise ToolkitError(f"the recording failed: {errors[0]}")
    steps = [m for m in recorded[0] if m["t"] == "step"]
    baseline = None if _rested(recorded[0]) else _result(*fork(body, *args, **kwargs))
    if baseline is not None and (baseline["row"]["verdict"] == "not-reached"
                                 or "not_at_rest" in baseline["row"]["anomalies"]):
        _refuse_baseline(baseline, root)
    note = next((m["position"] for m in recorded[0] if m["t"] == "end"), None)  # ``Recorder``
    if note:  # the copies cannot be moved: every point replays and dies for real
        import shutil

        shutil.rmtree(snapshots)
        snapshots = memo = None
        kwargs.update(memo=None)

    singles = [Point(s["n"], how) for s in steps if (s["n"] - 1) % plan.every == 0
               for how in (KILL, TEAR) if how == KILL or s["tearable"]]
    done = [0]
    expected = [len(singles)]

    def tick(index, result):
        done[0] += 1
        if progress is not None:
            progress(done[0], expected[0])

    results = _explore_points(plan, root, inputs, names, singles, jobs, tick, record=plan.pairs,
                              snapshots=snapshots, steps=steps, memo=memo,
                              baseline=(body, args, kwargs) if baseline is None else None)
    if baseline is None:
        baseline = results.pop()
    # The label each crash point must die at: the baseline's, and for pairs the first rerun's.
    expect = {(point.k, point.how, None): steps[point.k - 1]["label"] for point in singles}
    if plan.pairs:
        pairs = []
        for point, result in zip(singles, results):
            for s in result["recovery_steps"]:
                pairs.append(Point(point.k, point.how, s["n"]))
                expect[(point.k, point.how, s["n"])] = s["label"]
        if len(pairs) > plan.max_pairs:  # evenly spread over all pairs, deterministic
            pairs = [pairs[i * len(pairs) // plan.max_pairs] for i in range(plan.max_pairs)]
        expected[0] += len(pairs)
        results += _explore_points(plan, root, inputs, names, pairs, jobs, tick)
    seconds = time.monotonic() - started
    rows = [result["row"] for result in results]
    for row in rows:
        # what the crash caused, beyond what the design does uncrashed
        row["new"] = sorted(set(row["anomalies"]) - set(baseline["row"]["anomalies"]))
        died_at = row["step"] if row["recovery_point"] is None else row["recovery_step"]
        if row["verdict"] != "not-reached" and died_at != expect[
                (row["point"], row["how"], row["recovery_point"])]:
            row["verdict"] = "diverged"  # not the step the baseline had: not deterministic
    return Exploration(plan, rows, baseline["row"], steps, seconds,
                       "real" if snapshots is None else "snapshot", note or "",
                       len({result["pid"] for result in results}))


def _warm(inputs, check=True) -> None:
    """Import and load everything once, so that forked children start hot (``check``:
    load PyMuPDF by checking the first input; else the caller checks every input, before
    any fork: snapshot mode's ``input_checks`` did the same check a second time)."""
    import psutil

    import toolkit.checker
    import toolkit.drills
    import toolkit.ledger.jsonl
    import toolkit.ledger.sqlite
    import toolkit.runner.naive  # noqa: F401
    from toolkit import documents

    if check:
        documents.preflight(inputs[0])  # loads PyMuPDF
    psutil.Process(os.getpid()).create_time()


def _call(plan, root, inputs, names, label, point, record_first=False, record=False):
    work = root / "points" / label
    return (_explore_point, (plan, work, inputs, names, point),
            {"record_first": record_first, "record_recovery": record, "temp": root / "tmp"})


def _explore_points(plan, root, inputs, names, points, jobs, tick, record=False, snapshots=None,
                    steps=(), memo=None, baseline=None):
    """Each point's result, in order; and last, if ``baseline`` (a ``_call``), its result."""
    calls = [_call(plan, root, inputs, names, f"{point.k}-{point.how}-{point.j}", point,
                   record=record) for point in points]
    for (_, _, kwargs), point in zip(calls if snapshots else (), points):  # from its copy
        kwargs.update(start=folder(snapshots, point.k, point.how == TEAR),
                      start_step=steps[point.k - 1], memo=memo)
    calls += [baseline] if baseline else []

    def done(index, result):  # the baseline's judgement is no crash point
        if index < len(points):
            tick(index, result)
    if snapshots is None:
        return [_result(*result) for result in fork_many(calls, jobs, done)]
    # A few supervisors (one per job, at most SHARED points each) run the points one after
    # another: a fork per point, its copy-on-write faults and cold caches were over half of
    # a point's CPU. Each point still recovers in its own folder (``_explore_point``).
    size = min(SHARED, -(-len(calls) // max(1, jobs)))
    return [_result(*result) for result in fork_shared(calls, jobs, size, done)]


def _refuse_baseline(baseline: dict, root: Path):
    """The uncrashed batch did not rest: no point can be judged against it. A halt on full
    or failing storage is the scratch folder's (exit 1, naming it), any other is a bug."""
    row, halted = baseline["row"], baseline["halted"]
    if halted:
        raise StorageError(f"the uncrashed batch halted in the exploration's folder {root} "
                           f"(TMPDIR: {tempfile.gettempdir()}): {halted}; free space there or "
                           "point TMPDIR at a larger folder")
    raise ToolkitError(f"the uncrashed batch does not rest ({row['outcome']}, "
                       f"{row['detail'] or 'verdict ' + row['verdict']})")


def _result(messages, status) -> dict:
    end = next((m for m in messages if m["t"] == "end"), None)
    if end is None:
        error = next((m for m in messages if m["t"] == "error"), {"traceback": f"status {status}"})
        raise ToolkitError(f"crash-point supervisor failed: {error['traceback']}")
    return end


__all__ = ["KILL", "LEDGERS", "TEAR", "VERDICTS", "Exploration", "Plan", "Point", "explore"]
