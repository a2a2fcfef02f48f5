"""N worker processes on one shared ledger, each with its own connection (``run --workers N``).

``run_workers`` starts N processes with "spawn" (nothing is inherited: no
connection, lock, thread or open SQLite handle); each opens the ledger and the
provider itself and runs its strategy over the same inputs. They meet only in
the ledger: leases decide who advances an item, fencing tokens fence late writes.
A pipeline of your own (``module:Class``) may take no leases: each of its
workers gets a disjoint share of the inputs instead (by content digest).

With a PostgreSQL ledger the safe strategy is ``QueueRunner``, which takes the
next free item with ``FOR UPDATE SKIP LOCKED``; on SQLite the workers walk the
batch in order and leases sort them out; JSONL has one writer, so one worker.

Around the workers, the parent does what must happen once:

    before   refuse if an earlier run failed closed (for a URL: the health table);
             create the tables; take back the leases of dead owners (N workers
             racing for the same orphan would trip over each other's claims)
    after    a worker that stopped taking work (fail closed) has its reason
             recorded as the ledger's health (for a URL: in the database)
"""

import contextlib
import dataclasses
import multiprocessing
import os
from pathlib import Path

from toolkit.documents import ocr_routed, page_count
from toolkit.errors import LedgerError, ToolkitError
from toolkit.identity import content_digest, task_key
from toolkit.ledger import State, lease_held, open_ledger
from toolkit.ledger import postgres_health as pg_health
from toolkit.ledger.postgres import postgres_url
from toolkit.ledger.sqlite_damage import DamagedLedgerError
from toolkit.runner import RetryPolicy, Runner, default_worker, keying
from toolkit.runner.inputindex import InputIndex, order
from toolkit.runner.inputs import Odd, read_input
from toolkit.runner.naive import RewriteState
from toolkit.runner.ops import health_marker, pages_at_end, require_healthy
from toolkit.runner.reclaim import recover_abandoned
from toolkit.runner.pipeline import odd_key, routed_options
from toolkit.runner.registry import STRATEGIES, resolve_strategy
from toolkit.runner.workers_stop import (PoolStop, ask, terminal_signals_ignored_by_children,
                                         watching)


class QueueRunner(Runner):
    """The safe runner taking work from a shared PostgreSQL ledger.

    ``Runner.run`` walks the batch's keys in order. Here the walk's first step
    drains the queue instead: claim the next item nobody holds and nobody is
    changing at this instant (``claim_next``), advance it as ``Runner.process``
    does, repeat. The rest of the walk then meets each remaining key once, as
    usual: done items are re-verified, items held by live workers are skipped.
    Each key is advanced at most once per run by this worker.
    """

    def enqueue(self, inputs):
        keys = super().enqueue(inputs)
        self._todo, self._picked = set(keys), {}
        return keys

    def process(self, key):
        # A stop asked (``stop_asked``) before the next claim: no lease of ours held here.
        while self._stop_if_asked() is None and (picked := self.ledger.claim_next(
                sorted(self._todo), self.worker, self.lease_ttl)) is not None:
            taken, token = picked
            self._todo.discard(taken)
            self._picked[taken] = token
            super().process(taken)
            if self._picked.pop(taken, None) is not None:  # it came to rest before our claim
                self.ledger.release(taken, token, self.worker)  # was used: give the lease back
        if key not in self._todo:
            return self.ledger.get(key)
        self._todo.discard(key)
        return super().process(key)

    def _claim(self, key):
        token = self._picked.pop(key, None)
        return super()._claim(key) if token is None else token


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What one worker process needs; picklable (spawn sends it to the child)."""

    ledger: str
    provider_db: str | None
    provider_url: str | None
    read_timeout: float
    contract: object
    inputs: tuple[str, ...]
    out_dir: str
    strategy: str
    options: dict
    policy: RetryPolicy
    lease_ttl: float
    hook: object
    page_by_page_from: int | None = None
    verify: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class WorkersResult:
    """How a multi-process batch ended.

    ``counts``: the batch's items per state, read after every worker exited
    (None when the ledger could not be read then); ``workers``: one report per
    process (``worker``, ``exitcode``, ``halted``, ``error``, ``health_kept``: a halt
    that leaves the ledger's health as it is); ``health_recorded``: whether a halt was
    recorded as the ledger's health (None: no halt that marks it).
    """

    counts: dict[str, int] | None
    unsettled: int | None
    workers: tuple[dict, ...]
    health_recorded: bool | None
    held: tuple = ()  # of the unsettled, the items another live run holds (``lease_held``)
    damage: str | None = None  # the ledger's pages did not read after the workers (its line)

    @property
    def halted(self) -> list[str]:
        return [report["halted"] for report in self.workers if report["halted"]]

    @property
    def damaged(self) -> bool:
        """A worker halted on the ledger's damage, or its pages did not read after them
        (exit 2: the way out is salvage)."""
        return self.damage is not None or any(report.get("damaged") for report in self.workers)

    @property
    def stopped(self) -> list[str]:
        """The workers that stopped on a signal (``run_workers``'s ``stop``)."""
        return [report["worker"] for report in self.workers if report.get("stopped")]

    @property
    def errors(self) -> list[str]:
        return [report["error"] for report in self.workers if report["error"]]

    @property
    def refused(self) -> list[str]:
        """Inputs refused for their options (``other_options``), one line each, once."""
        return list(dict.fromkeys(line for report in self.workers
                                  for line in report.get("refused", ())))


def check_workers(ledger_url, workers: int, strategy, page_by_page_from=None):
    """The strategy class, once the pool's arguments are known to fit (``run`` asks before
    it creates anything).

    Raises:
        ToolkitError: one line: fewer than one worker, a strategy that cannot share a
            ledger or send pages, a JSONL ledger (one writer) for more than one worker.
    """
    if workers < 1:
        raise ToolkitError("--workers must be at least 1")
    cls = resolve_strategy(strategy)  # a name or module:Class, resolved again in each worker
    if cls is RewriteState:
        raise ToolkitError(f"strategy {strategy!r} cannot run as workers on a shared ledger")
    if page_by_page_from is not None and not getattr(cls, "sends_pages", False):
        raise ToolkitError(f"strategy {strategy!r} does not send long documents page by page")
    if postgres_url(ledger_url) is None and Path(ledger_url).suffix.lower() == ".jsonl" \
            and workers > 1:
        raise ToolkitError("a JSONL ledger has one writer: use SQLite or PostgreSQL for "
                           "--workers > 1")
    return cls


def run_workers(ledger_url, provider_db, inputs, out_dir, workers: int, contract=None, *,
                provider_url=None, read_timeout: float = 30.0, strategy: str = "safe",
                options=None, policy: RetryPolicy = RetryPolicy(), lease_ttl: float = 60.0,
                hook=None, start_method: str = "spawn",
                page_by_page_from: int | None = None, verify: bool = False,
                stop=None) -> WorkersResult:
    """Run the batch ``inputs`` with ``workers`` processes on the ledger at ``ledger_url``.

    The provider is the fake one at ``provider_db`` (its jobs beside it, as
    ``provider_at`` does) or the service at ``provider_url``. ``hook`` (picklable)
    is each worker's runner hook; ``verify`` hashes every done artifact (``--verify``).
    ``start_method``: ``spawn`` or ``forkserver`` (a forked worker would inherit the stop's
    write end: ``workers_stop.PoolStop``).
    ``stop`` (the CLI's ``signals.Stop``: ``asked``, ``attach(to)``): a stop asked goes to
    every worker (an Event), and each stops at the end of its step under way
    (``workers_stop``); asked before a worker starts, it is not started.
    Rerun after any crash, as with one worker.

    Raises:
        ToolkitError: bad arguments, a ledger that failed closed and was not
            cleared, or a ledger that cannot be opened.
    """
    if (provider_db is None) == (provider_url is None):
        raise ToolkitError("give exactly one of provider_db and provider_url")
    cls = check_workers(ledger_url, workers, strategy, page_by_page_from)
    url = postgres_url(ledger_url)
    location = url or str(ledger_url)
    (pg_health.require_healthy if url else require_healthy)(location)
    with open_ledger(location) as ledger:  # tables once, before N processes would race to
        recover_abandoned(ledger, default_worker())
    spec = _Spec(location, provider_db and str(provider_db), provider_url, read_timeout,
                 contract, tuple(str(path) for path in inputs), str(out_dir), strategy,
                 dict(options or {}), policy, lease_ttl, hook, page_by_page_from, verify)
    shards = None if cls in STRATEGIES.values() else _shards(inputs, workers)
    reports = _run_processes(spec, workers, multiprocessing.get_context(start_method), shards,
                             stop)
    # the halts that mark the ledger's health (a damaged witness file's does not)
    halted = [report["halted"] for report in reports
              if report["halted"] and not report.get("health_kept")]
    recorded = None
    if halted and url:  # a worker's Runner marks a file ledger itself; a URL is marked here
        recorded = pg_health.mark_unhealthy(url, halted[0])
    elif halted:
        recorded = health_marker(location).exists()
    counts, unsettled, held, damage = _batch_counts(location, inputs, spec.options,
                                                    page_by_page_from)
    return WorkersResult(counts, unsettled, tuple(reports), recorded, held, damage)


def _shards(inputs, workers) -> list[tuple[str, ...]]:
    """Disjoint shares of the inputs, by content digest (a key lands in exactly one share).

    A pipeline of yours may take no leases; the pool then never gives two workers
    the same item, so it needs none.
    """
    shards = [[] for _ in range(workers)]
    for path in inputs:
        try:
            digest = content_digest(read_input(path))  # never blocks on a FIFO
        except Odd:
            digest = content_digest(os.fsencode(Path(path).name))  # its item is keyed by name
        shards[int(digest[:8], 16) % workers].append(str(path))
    return [tuple(shard) for shard in shards]


def _run_processes(spec, workers, context, shards=None, stop=None) -> list[dict]:
    pipes, processes = [], []
    asked = PoolStop(context)  # set once, seen by every worker, any time (a pipe)
    if stop is not None:
        stop.attach(lambda name: asked.set())  # from a signal handler: one flag, no lock
    try:
        for n in range(workers):
            if asked.is_set():
                break  # asked before this one started: it never starts
            reader, writer = context.Pipe(duplex=False)
            mine = spec if shards is None else dataclasses.replace(spec, inputs=shards[n])
            process = context.Process(target=_work, args=(mine, writer, asked.worker_end),
                                      name=f"toolkit-worker-{n + 1}")
            with terminal_signals_ignored_by_children():  # a signal now: taken after it
                process.start()
                processes.append(process)
            writer.close()  # the child holds its own end
            pipes.append(reader)
        reports = [_report(reader, process) for reader, process in zip(pipes, processes)]
        asked.close()
        return reports
    except BaseException:  # the run stopped at once (a second signal): its workers too,
        for process in processes:  # even one still starting (no PDEATHSIG set yet)
            with contextlib.suppress(OSError, ValueError):
                process.kill()
        raise


def _report(reader, process) -> dict:
    """A worker's report, once it ended; EOF when it died before it could report."""
    report = None
    with contextlib.suppress(EOFError):
        report = reader.recv()
    process.join()
    if report is None:
        report = {"worker": process.name, "halted": None,
                  "error": f"worker process died (exit code {process.exitcode})"}
    return {**report, "exitcode": process.exitcode}


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """A worker ends when the run that started it ends, however it ends (``kill -9`` of the
    run alone left its workers sending, billed, with nobody to see it): the kernel sends it
    SIGKILL when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``), exactly what a kill -9
    of the whole group does, which every step survives. A parent already gone before the
    prctl took effect: the worker exits at once, before any work."""
    import ctypes
    import signal
    import sys

    parent = multiprocessing.parent_process()
    if not sys.platform.startswith("linux") or parent is None:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent.pid:
        os._exit(1)


def _stops_at_a_step_end(runner) -> bool:
    """Does ``runner`` stop at its step's end when asked (``Runner.stop_asked``)?"""
    return type(runner).process in (Runner.process, QueueRunner.process)


def _work(spec: _Spec, conn, asked=None) -> None:
    """One worker process: its own ledger connection and provider, one run of the batch;
    ``asked`` (``PoolStop.worker_end``): the pool's stop (``workers_stop.watching``)."""
    _die_with_parent()
    box = watching(asked, _stops_at_a_step_end) if asked is not None else {"asked": False}
    report = {"worker": default_worker(), "halted": None, "error": None, "stopped": None}
    runner = provider = None
    try:
        provider = _provider(spec)
        ledger = open_ledger(spec.ledger)
        cls = resolve_strategy(spec.strategy)
        if cls is Runner and hasattr(ledger, "claim_next"):
            cls = QueueRunner
        runner = cls(ledger, provider, spec.out_dir, options=spec.options, policy=spec.policy,
                     lease_ttl=spec.lease_ttl, hook=spec.hook, worker=report["worker"],
                     page_by_page_from=spec.page_by_page_from,
                     **({"verify": True} if spec.verify else {}))
        box["runner"] = runner
        if box["asked"]:
            ask(box)  # asked before the runner was made: it stops before its first chunk
        runner.run([Path(path) for path in spec.inputs])
        report["halted"] = runner.halted
        report["damaged"] = runner.halted_damaged
        report["health_kept"] = runner.halted is not None and runner.health_recorded is None
        report["refused"] = list(runner.refused_options.values())
    except LedgerError as exc:
        # A ledger lost for good stops the run, even while it counts after halting.
        report["halted"] = str(exc)
        report["damaged"] = isinstance(exc, DamagedLedgerError)
    except ToolkitError as exc:  # not the ledger: this worker failed, the others go on
        report["error"] = f"{type(exc).__name__}: {exc}"
    except KeyboardInterrupt as stop:  # StopAsked at a step's end, or at once: asked
        report["stopped"] = str(stop) or "the run's stop"
    except BaseException as exc:  # a bug or a crash: reported, then the traceback goes to stderr
        report["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        for each in (runner, provider):
            if each is not None:
                try:
                    each.close()
                except ToolkitError:
                    pass
        with contextlib.suppress(OSError):  # the run already gone (a second signal): its
            conn.send(report)                # worker is killed with it, nobody to tell
        conn.close()


def _provider(spec: _Spec):
    if spec.provider_url is not None:
        from toolkit.provider.client import HttpProvider

        return HttpProvider(spec.provider_url, read_timeout=spec.read_timeout)
    from toolkit.provider import Contract, provider_at

    return provider_at(spec.provider_db, spec.contract or Contract())


def _input_key(path, options, page_by_page_from):
    try:
        data = read_input(path)  # never blocks on a FIFO; an odd entry has its own key
    except Odd:
        return odd_key(Path(path).name, options)
    options = ocr_routed(data, options)  # scans: the OCR route is identity
    if page_by_page_from is not None:
        options = routed_options(options, page_count(path), page_by_page_from)
    return task_key(content_digest(data), options)


def _batch_keys(ledger, location, inputs, options, page_by_page_from) -> set:
    """The batch's keys: an input the ledger already keyed into an item at rest by that key
    (read only if the workers' input index cannot vouch for it: ``keying``), any other in
    full (MuPDF routes it)."""
    paths = sorted((Path(path) for path in inputs), key=order)
    vouched = [None] * len(paths)
    if page_by_page_from is None:
        keyers = keying.keyers(options)
        index = InputIndex(location, keyers[0].fingerprint, record=False)
        try:
            vouched = keying.vouched(ledger, paths, keyers, index)
        finally:
            index.discard()
    return {item.key if item is not None else _input_key(path, options, page_by_page_from)
            for path, item in zip(paths, vouched)}


def _batch_counts(location, inputs, options, page_by_page_from=None):
    counts = {state.value: 0 for state in State}
    unsettled, held = 0, []  # this run's workers have exited: a live lease is another run's
    try:
        pages_at_end(location)  # damaged by hand under the workers: never a word of rest
        with open_ledger(location) as ledger:
            keys = _batch_keys(ledger, location, inputs, options, page_by_page_from)
            for item in ledger.get_many(keys).values():  # the batch's, not the whole ledger
                counts[item.state.value] += 1
                unsettled += not item.resting
                if not item.resting and lease_held(item, ledger.clock()):
                    held.append(item)
    except DamagedLedgerError as exc:
        return None, None, (), str(exc)
    except ToolkitError:  # in use and read as damaged, unreadable: counts unknown (exit 1)
        return None, None, (), None
    return counts, unsettled, tuple(held), None
