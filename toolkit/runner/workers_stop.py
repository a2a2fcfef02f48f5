"""``run --workers N`` stopped by a signal: the run (the parent) decides, the workers obey.

The first SIGTERM, SIGHUP or Ctrl-C to the run sets one Event shared with its workers
(``workers._run_processes``); each worker's watcher thread then asks its runner to stop at
the end of the step under way, as a one-process run stops (every lease released, nothing
left ``unknown`` that a step had not yet sent). A worker still starting (Python, its
imports) is never sent a signal that would kill it: it reads the Event once its runner is
made. A second signal ends the run at once, and its workers with it (as ``kill -9``).
"""

import contextlib
import signal

from toolkit.liveness import STOP_SIGNALS


@contextlib.contextmanager
def terminal_signals_ignored_by_children():
    """Start a worker with SIGINT and SIGHUP ignored (a disposition ``exec`` keeps, from its
    first instant): a terminal sends them to the whole group, and the run (the parent)
    decides -- the first asks every worker to stop at its step's end (``watching``), a
    second ends the run and the workers with it (``workers._die_with_parent``). The parent
    holds them meanwhile: one that comes is taken once its own handler is back. Main
    thread only (a library's pool started from another thread keeps its dispositions)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    previous = {}
    try:
        for signum in (signal.SIGINT, signal.SIGHUP):
            if signal.getsignal(signum) is not None:
                previous[signum] = signal.signal(signum, signal.SIG_IGN)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def watching(asked, honours) -> dict:
    """A worker's side of the pool's stop: once ``asked`` (an Event the parent sets on a
    signal) is set, the runner in ``box["runner"]`` is asked to stop at the end of its step
    under way (``Runner.stop_asked``), or at once when its ``process`` is not the safe
    runner's (``honours(runner)`` false: ``KeyboardInterrupt`` in the main thread); asked
    before the runner is made, ``workers._work`` asks it when it is (``box["asked"]``). A
    thread waits on the Event: no signal reaches a worker still starting (Python, its
    imports), where it would kill it."""
    import threading

    box = {"runner": None, "asked": False, "lock": threading.Lock(), "honours": honours}

    def watch():
        asked.wait()
        box["asked"] = True
        if box["runner"] is not None:
            ask(box)

    threading.Thread(target=watch, name="toolkit-stop-watch", daemon=True).start()
    return box


def ask(box) -> None:
    """Ask ``box["runner"]`` to stop, once (the watcher and ``_work`` may both get here)."""
    import _thread

    with box["lock"]:
        if box.get("done"):
            return
        box["done"] = True
    runner = box["runner"]
    if not box["honours"](runner):
        _thread.interrupt_main()  # a pipeline that cannot stop at a step's end: at once
    else:
        runner.stop_asked = "the run's stop"
