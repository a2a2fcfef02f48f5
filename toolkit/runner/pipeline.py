"""The protocol of a pipeline under test, and the plumbing every strategy shares.

``Pipeline`` owns what is not a matter of strategy: keying and preflight
(``Intake``, in ``intake``), health and owner recovery, the loop over items,
progress, the observer snapshot. ``Runner`` (the safe strategy), the naive strategies and a user's
own pipeline differ only in ``process(key)``.
"""

import contextlib
import dataclasses
import os
import random
import socket
import sys
import time
from pathlib import Path

from toolkit import liveness, roots
from toolkit.errors import LedgerError
from toolkit.identity import canonical_json
from toolkit.ledger import Item, State, lease_held
from toolkit.ledger.records import Light
from toolkit.ledger.sqlite_damage import DamagedLedgerError
from toolkit.provider import Contract
from toolkit.runner import artifacts, outroot
from toolkit.runner.inputindex import InputIndex, order, remove_orphans
# Intake (enqueue, keying, snapshots, quarantine) is its own module; its names are
# importable from here as before.
from toolkit.runner.intake import (PAGE_BY_PAGE, InOrder, Intake, odd_key,  # noqa: F401
                                   routed_options, sweep_snapshots)
from toolkit.runner.ops import mark_unhealthy, require_healthy
from toolkit.runner.reclaim import recover_abandoned
from toolkit.runner.witness_damaged import WitnessDamagedError

HOOK_POINTS = ("before_intent", "after_intent", "after_submit", "before_commit",
               "during_fetch", "during_lookup", "after_checkpoint")
_AT_REST = (Item, Light)  # what process() may return that says whether it rests
_VALUE = {state: state.value for state in State}  # a dict look-up: ``.value`` is Python code
CHUNK = 256  # inputs a run keys, looks up and processes together: all it holds of a batch


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Per-item, per-run budgets and the backoff between tries.

    A budget spent leaves the item where it is (``failed(transient)``,
    ``unknown``, ``submitted``) for a later run: the batch rests, it never spins.
    """

    submits: int = 4
    lookups: int = 4
    polls: int = 20
    fetches: int = 3
    base_delay: float = 0.05
    max_delay: float = 2.0
    seed: int = 0

    def delay(self, tries: int, rng: random.Random) -> float:
        """Exponential backoff with seeded jitter: half to all of ``base * 2**tries``."""
        return min(self.max_delay, self.base_delay * 2 ** tries) * (0.5 + rng.random() / 2)


@dataclasses.dataclass
class _Budget:
    submits: int = 0
    lookups: int = 0
    polls: int = 0
    fetches: int = 0

    def reset(self):
        """A new request (the next page of a long document) starts with fresh budgets."""
        self.submits = self.lookups = self.polls = self.fetches = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """What an observer may see of a running batch (read-only)."""

    counts: dict
    current: str | None
    stage: str | None
    elapsed: float
    lost_replies: int
    reused: int


def no_hook(point, key, **context) -> None:
    """The hook of a pipeline given none: nothing runs at the hook points."""


def default_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def resubmit_is_safe(contract: Contract) -> bool:
    """A key the provider cannot find may be sent again only if it would dedupe.

    That needs idempotent keys and a key that is surely still retained; with
    a finite retention we cannot prove that, so we do not resubmit.
    """
    return contract.idempotent_keys and contract.key_retention is None


class Pipeline(Intake):
    """A pipeline under test: the protocol every strategy follows, ours and yours.

    The toolkit keys and enqueues the inputs (``enqueue``: content + options,
    preflight, poison quarantined), checks health, recovers dead owners and
    calls ``process(key)`` once per item; a subclass decides what happens to
    an item. It uses ``self.ledger`` and ``self.provider`` and calls
    ``self.hook(point, key, **context)`` at the named ``HOOK_POINTS`` so that
    faults can be injected there; ``self._paths[key]`` is the input file.
    Construct it as ``Cls(ledger, provider, out_dir, **options)``; drills and
    the crash exploration run any such class (``--strategy module:Name``).
    With ``page_by_page_from=n``, documents of n pages or more are keyed with
    the page-by-page routing and ``self._pages[key]`` holds their page count.
    """

    name = "pipeline"
    sends_pages = False  # True: routes long documents page by page (the safe ``Runner``)

    def __init__(self, ledger, provider, out_dir, *, options=None, policy=RetryPolicy(),
                 worker=None, hook=None, sleep=time.sleep, lease_ttl=60.0, progress=False,
                 page_by_page_from: int | None = None, verify: bool = False):
        self.ledger, self.provider = ledger, provider
        self.out_dir = Path(out_dir)
        self._out_text = os.fspath(self.out_dir)  # joined with each artifact's path at reuse
        self._out_slash = os.path.join(self._out_text, "")  # the prefix of a relative one
        self.options = dict(options or {})
        canonical_json(self.options)  # fail early on options that cannot be keyed
        self.contract: Contract = provider.contract
        self.policy = policy
        self.worker = worker or default_worker()
        self.hook = hook or no_hook
        self.sleep, self.lease_ttl, self.progress = sleep, lease_ttl, progress
        self._rng = random.Random(policy.seed)
        if page_by_page_from is not None and (page_by_page_from < 1 or not self.sends_pages):
            raise ValueError(f"page_by_page_from={page_by_page_from}: needs a strategy that "
                             "sends pages (the safe Runner) and a value >= 1")
        self.page_by_page_from = page_by_page_from
        self.verify_all = verify  # --verify: hash every done artifact, whatever its stat says
        # Of the chunk in hand only (run() streams the batch, CHUNK inputs at a time):
        self._paths: dict[str, Path] = {}
        self._pages: dict[str, int] = {}  # page count of each document routed page by page
        self._known: dict[str, Item] = {}  # items read by enqueue, for process's first look
        self._ahead: list | None = None  # the chunk's slice of the run's ordered pass, if any
        self._seen: dict[str, Path] = {}  # every key of this run -> its first input
        self._index: InputIndex | None = None  # the inputs' stat index, during run()
        self._routes = None  # digest -> key, per option set an input can have (``keying``)
        self._snapshots = None  # tempfile.TemporaryDirectory of this run's input snapshots
        self.other_roots: list[Path] = []  # the recorded outputs root, when --out is another
        self._current = self._stage = None
        self._in_hand = self._fenced = None  # the safe runner's last committed move (Runner)
        self._started = time.monotonic()
        self.lost_replies = self.reused = 0
        self.halted: str | None = None  # why the batch stopped taking work, if it did
        self.halted_damaged = False  # that halt is the ledger's damage (exit 2: salvage it)
        self.health_recorded: bool | None = None  # whether that halt reached the health marker
        self.unsettled = 0
        self.held: list[Item] = []  # of the unsettled, those another live run holds
        self.local_errors: list[str] = []  # writes under --out that failed (the run goes on)
        self.aliases: list[tuple[str, str]] = []  # (name, the name it is one item with)
        self.strays: list[Item] = []  # not at rest, content no longer among the inputs
        self.refused_options: dict[str, str] = {}  # other item's key -> line (other_options)
        self.other_routing: dict[str, str] = {}  # key -> its content's other key (other_options)
        self._unplaced: set[str] = set()  # done items whose copy into --out failed this run
        self.recovered: list[str] = []  # keys taken over from dead owners at start
        self.lost_leases: list[str] = []  # keys another owner took over while we worked on them
        self.quarantined: set[str] = set()  # poison found by preflight: never processed

    def close(self):
        self._drop_snapshots()
        self.ledger.close()

    # -- observer ----------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return Snapshot(self.ledger.counts(), self._current, self._stage,
                        time.monotonic() - self._started, self.lost_replies, self.reused)

    # -- the batch ---------------------------------------------------------------
    def halt(self, exc) -> None:
        """Stop taking work for ``exc`` (a ledger's or the disk's error), recorded as the
        ledger's health, unless the damage refuses the next run by itself: a damaged
        witness or ledger (the marker would only add a ``health --clear`` to the way out)."""
        self.halted = str(exc) if isinstance(exc, LedgerError) else f"storage: {exc}"
        self.halted_damaged = isinstance(exc, DamagedLedgerError)
        if not isinstance(exc, (WitnessDamagedError, DamagedLedgerError)):
            self.health_recorded = mark_unhealthy(self.ledger.path, self.halted)

    def run(self, inputs) -> dict[str, int]:
        """Enqueue ``inputs`` and process each item; return counts per state of this batch.

        The batch streams: ``CHUNK`` inputs at a time are keyed, looked up in the ledger
        in one read, processed, counted and let go (their snapshots deleted), so what a
        run holds grows with the chunk, not the batch (only the keys it met, for aliases
        and strays). Items not at rest when counted are read again at the end.

        Raises:
            ToolkitError: an earlier run failed closed and nobody cleared the ledger's health.
        """
        require_healthy(self.ledger.path)
        self.halted, bar, chunk = None, None, []
        self._seen = {}
        counts = {state.value: 0 for state in State}
        restless: set[str] = set()  # keys of this batch not at rest when their chunk ended,
        # or done there by another run after this one let them go (read again at the end)
        # The temps that runs killed midway (SIGKILL) left beside the ledger: its input
        # index's and its roots' (a live run's stay).
        remove_orphans(getattr(self.ledger, "path", None))
        liveness.remove_dead_temps(roots.roots_file(getattr(self.ledger, "path", None)))
        if self.page_by_page_from is None:  # page-by-page keying reads every input anyway
            self._index = InputIndex(getattr(self.ledger, "path", None),
                                     self._keyers()[0].fingerprint, trust=not self.verify_all)
        try:
            self.recovered = recover_abandoned(self.ledger, self.worker)
            paths = [p if isinstance(p, Path) else Path(p) for p in inputs]
            paths.sort(key=order)
            self._record_roots(paths)
            if self.progress:
                from tqdm.auto import tqdm

                bar = tqdm(total=len(paths), file=sys.stderr, unit="doc", leave=False)
            # Before any chunk: the ordered pass reads the ledger once for the whole batch
            # (its state when the run starts, as each chunk's look-up would read it then).
            ahead = self._vouched_ahead(paths)
            for start in range(0, len(paths), CHUNK):
                if ahead is not None:  # handed to this chunk, and let go of by the run
                    self._ahead = ahead[start:start + CHUNK]
                    ahead[start:start + CHUNK] = [None] * len(self._ahead)
                chunk = self.enqueue(InOrder(paths[start:start + CHUNK]))
                ended = self._process_chunk(chunk)
                if bar is not None:
                    bar.update(min(CHUNK, len(paths) - start))
                self._tally(chunk, counts, restless, ended)
                chunk = self._let_go()
        except (LedgerError, OSError) as exc:
            # Fail closed: whatever we cannot record (the ledger, the provider's database,
            # an artifact on a full disk), we must not act upon.
            self.halt(exc)
            with contextlib.suppress(LedgerError, OSError):  # what the halted chunk holds
                self._tally(chunk, counts, restless)
            self._let_go()
        finally:  # what it vouched for and read is recorded only by a run that went through
            index, self._index = self._index, None
            if index is not None and (self.halted or sys.exc_info()[0] is not None):
                index.discard()  # stopped midway: the recorded index stays as it was
            elif index is not None:
                index.commit()
        if bar is not None:
            bar.close()
        self._current = self._stage = None
        self._drop_snapshots()
        self.unsettled = 0  # items a later run must pick up again
        self.held = []  # of those, the ones another live run holds (a lease: ``lease_held``)
        # Counted first, then settled: one another run turns done after this read is not
        # called done here (it is not at rest: "run again"); one counted done is still
        # done when ``settle`` checks it in --out (counted after, it could be neither).
        clock = getattr(self.ledger, "clock", time.time)  # a wrapped ledger may not say
        with contextlib.suppress(LedgerError, OSError) if self.halted else contextlib.nullcontext():
            for item in self.ledger.get_many(restless).values():
                counts[item.state.value] += 1
                self.unsettled += not item.resting
                if not item.resting and item.lease_owner != self.worker and \
                        lease_held(item, clock()):
                    self.held.append(item)  # another live run's: it settles them, not a rerun
        if not self.halted:  # another run may have done some of ours, into its --out
            self.local_errors += outroot.settle(self.ledger, self.out_dir,
                                                restless.union(self.lost_leases),
                                                self.verify_all, replace=not self.local_errors)
        if not self.halted:
            self.strays = self._strays()
        return counts

    def _process_chunk(self, keys, ended=None) -> dict:
        """``process`` each of ``keys`` not in ``ended`` (a strategy's items settled in a pass
        of its own), except poison, which never is; return where each ended, by key."""
        ended = {} if ended is None else ended
        if len(ended) == len(keys):  # all settled already (``ended`` holds keys of ``keys``)
            return ended
        known, quarantined, process = self._known, self.quarantined, self.process
        for key in keys:
            if key not in ended:
                ended[key] = known.get(key) if key in quarantined else process(key)
        return ended

    def _tally(self, keys, counts, restless, ended=None) -> None:
        """Count the chunk's items at rest; keep the others' keys to count at the end.

        An item ``process`` returned at rest is counted as returned (rest is final for
        automation); any other is read again (one query for the chunk)."""
        again = list(keys) if not ended else [] if len(ended) == len(keys) else \
            [key for key in keys if key not in ended]  # ``ended`` holds keys of ``keys``
        done, at_rest, dones = State.DONE, _AT_REST, 0
        for key, item in (ended or {}).items():
            if not isinstance(item, at_rest):  # an Item, or a scan's row; else read it again
                again.append(key)
            elif item.state is done:  # most of a rerun: no Enum hash (Python code) per item
                dones += 1
            elif item.resting:
                counts[_VALUE[item.state]] += 1
            else:
                again.append(key)
        counts[_VALUE[done]] += dones
        for key, item in self.ledger.get_many(again).items() if again else ():
            if item.resting and item.state is not done:
                counts[_VALUE[item.state]] += 1
            else:  # not at rest, or done since process let it go (by another run, maybe
                restless.add(key)  # into its --out): counted at the end, after ``settle``

    def _let_go(self) -> list:
        """Forget the chunk in hand: its paths, items, page counts and input snapshots."""
        self._ahead = None
        self._paths.clear()
        self._pages.clear()
        self._known.clear()
        self.other_routing.clear()
        self._drop_snapshots()
        return []

    def _strays(self) -> list[Item]:
        """Items of the ledger not at rest whose content is no longer among the inputs (a
        file changed, or left the folder, after they were recorded). This run cannot move
        them (it has not their bytes) and will not guess: they are reported, and the run
        is not "at rest" (exit 1) until the input is back or an operator cancels them."""
        return [item for item in self.ledger.unsettled()
                if item.key not in self._seen and item.key not in self.refused_options]

    def _record_roots(self, inputs) -> None:
        """Paths in the ledger are relative to the roots; record them once, beside it."""
        where = getattr(self.ledger, "path", None)
        recorded = roots.recorded(where).get("out")
        if recorded is not None and recorded.resolve() != self.out_dir.resolve():
            self.other_roots = [recorded]
        if roots.recorded(where):
            return  # recorded once: only a run's end replaces ``out`` (``outroot.settle``)
        folders = {os.path.dirname(path) for path in inputs}  # no Path per input
        with roots.locked(where):  # two first runs at once: one writes, the other sees it
            roots.record(where, out=self.out_dir,
                         inputs=Path(folders.pop()) if len(folders) == 1 else None)

    def process(self, key: str):
        """Advance one item until it rests for this run."""
        raise NotImplementedError
