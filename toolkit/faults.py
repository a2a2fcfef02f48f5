"""Named faults, injected for real at the named points of one item's path.

An ``Injector`` is the runner's hook: at each point it fires the faults of
its plan that match. Crashes raise ``Crash``, a ``BaseException`` that no
handler of the runner catches, so nothing after the crash point runs; the
drill then drops every in-memory object and opens the ledger fresh, which is
what a new process would do. Faults of the storage itself (a torn JSONL
write, a full disk) wrap the ledger object instead.
"""

import dataclasses
import itertools
import os

from toolkit.errors import LedgerError, TransientError


class Crash(BaseException):
    """The process dies here. Not an ``Exception``: no ``except Exception`` stops it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Fault:
    """Fire ``action`` at ``point`` on its ``nth`` arrival there, ``times`` times in a row."""

    name: str
    point: str
    action: str
    nth: int = 1
    times: int = 1
    summary: str = ""


FAULTS = {fault.name: fault for fault in (
    Fault("lost_reply", "after_submit", "timeout",
          summary="the provider commits the job, the client's read times out"),
    Fault("crash_after_intent", "after_intent", "crash",
          summary="the process dies after the intent is committed, before the submit"),
    Fault("crash_after_second_intent", "after_intent", "crash", nth=2,
          summary="the process dies after committing the second item's intent"),
    Fault("crash_after_submit", "after_submit", "crash",
          summary="the provider commits the job, the process dies before reading the reply"),
    Fault("crash_before_commit", "before_commit", "crash",
          summary="the process dies with the reply in hand, before committing it"),
    Fault("half_download", "during_fetch", "truncate",
          summary="the artifact download stops halfway"),
    Fault("crash_mid_download", "during_fetch", "truncate_crash",
          summary="the process dies halfway through writing the artifact"),
    Fault("lookup_unavailable", "during_lookup", "unavailable", times=10**9,
          summary="every lookup fails: the provider's status API is down"),
    Fault("crash_during_state_write", "during_state_write", "crash", nth=3,
          summary="the process dies while rewriting its state file"),
    Fault("crash_at_second_commit", "before_commit", "crash", nth=2,
          summary="the process dies before committing its second reply"),
    Fault("crash_after_checkpoint", "after_checkpoint", "crash", nth=2,
          summary="the process dies after checkpointing page 2 of a long document"),
    Fault("crash_mid_ocr", "ocr_executed", "crash",
          summary="the process dies in an OCR job: Tesseract has run, the provider has not "
                  "committed the result (fired by the in-process provider, not the runner)"),
)}

# Points reached by the in-process provider's ``on_phase`` (drills wire them), not the runner.
PROVIDER_POINTS = ("ocr_executed",)

# Faults that replace a ledger primitive rather than act at a hook point.
LEDGER_FAULTS = ("torn_jsonl_write", "disk_full")


class Injector:
    """A runner hook that fires the named faults; ``fired`` records what happened."""

    def __init__(self, names=(), *, key=None):
        unknown = [name for name in names if name not in FAULTS and name not in LEDGER_FAULTS]
        if unknown:
            raise ValueError(f"unknown fault(s) {unknown}; known: {sorted(FAULTS) + list(LEDGER_FAULTS)}")
        self.plan = [FAULTS[name] for name in names if name in FAULTS]
        self.key = key  # only this item, if given
        self.arrivals: dict[str, int] = {}
        self.fired: list[tuple[str, str | None]] = []

    def __call__(self, point, key, **context):
        if self.key is not None and key != self.key:
            return
        arrival = self.arrivals[point] = self.arrivals.get(point, 0) + 1
        for fault in self.plan:
            if fault.point == point and fault.nth <= arrival < fault.nth + fault.times:
                self.fired.append((fault.name, key))
                ACTIONS[fault.action](context)


def _timeout(context):
    raise TimeoutError("read timed out (injected lost reply)")


def _crash(context):
    raise Crash()


def _truncate(context):
    path = context["path"]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _truncate_crash(context):
    _truncate(context)
    raise Crash()


def _unavailable(context):
    raise TransientError("lookup unavailable (injected)")


ACTIONS = {"timeout": _timeout, "crash": _crash, "truncate": _truncate,
           "truncate_crash": _truncate_crash, "unavailable": _unavailable}


def tear_jsonl_writes(ledger, nth: int = 1, on_fire=None):
    """The ``nth`` append of a JSONL ledger writes half its line, then the process dies.

    ``on_fire()`` is called when it happens (a drill whose fault never fired proves nothing).
    """
    counter = itertools.count(1)
    append = ledger._append

    def torn_append(line: bytes):
        if next(counter) != nth:
            return append(line)
        os.write(ledger._fd, line[: len(line) // 2])  # really on disk, without its newline
        if on_fire is not None:
            on_fire()
        # The process is dead from here on: the harness's close of this ledger is no close
        # of the dead writer, so it must not judge the file its death left (a halted
        # ledger's close checks nothing: ``JsonlLedger.close``).
        ledger._halted = True
        raise Crash()

    ledger._append = torn_append
    return ledger


def fill_disk(ledger, after: int = 1, on_fire=None):
    """Every ledger write after the first ``after`` ones fails, as on a full disk."""
    counter = itertools.count(1)
    write = ledger._write

    def failing_write(old, new, event):
        if next(counter) > after:
            if on_fire is not None:
                on_fire()
            raise LedgerError("cannot record: No space left on device (injected)")
        return write(old, new, event)

    ledger._write = failing_write
    return ledger
