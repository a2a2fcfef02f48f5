"""``run --workers N`` stopped by a signal: the run (the parent) decides, the workers obey.

The first SIGTERM, SIGHUP or Ctrl-C to the run sets the pool's stop (``PoolStop``: the
parent closes the one write end of a pipe whose read end every worker holds); each
worker's watcher thread then asks its runner to stop at the end of the step under way, as
a one-process run stops (every lease released, nothing left ``unknown`` that a step had not
yet sent). A worker still starting (Python, its imports) is never sent a signal that would
kill it: it reads the stop once its runner is made. A second signal ends the run at once,
and its workers with it (as ``kill -9``).
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


class PoolStop:
    """The pool's stop, set once by the parent (from a signal handler), seen by every worker
    any time: a pipe, whose write end only the parent holds and closes to stop (each worker
    holds the read end, ``worker_end``, and reads EOF). Not a ``multiprocessing.Event``: its
    named semaphores are registered with the resource tracker, which, the run killed with
    ``kill -9``, printed "There appear to be 5 leaked semaphore objects" (o40 LOW 3); a
    pipe is the kernel's, gone with its last holder. The parent dead, the workers read EOF
    too: they stop at their step's end, if ``PR_SET_PDEATHSIG`` has not ended them first."""

    def __init__(self, context):
        if context.get_start_method() == "fork":  # a forked worker would hold the write end
            raise ValueError("the pool's stop needs workers started by spawn or forkserver")
        self.worker_end, self._write_end = context.Pipe(duplex=False)
        self._set = False

    def set(self) -> None:  # from a signal handler: one flag, one close (a second: no-op)
        self._set = True
        self._write_end.close()

    def is_set(self) -> bool:
        return self._set

    def close(self) -> None:
        """The pool ended: both ends closed (its workers are gone)."""
        self._write_end.close()
        self.worker_end.close()


def watching(asked, honours) -> dict:
    """A worker's side of the pool's stop: once ``asked`` (``PoolStop.worker_end``) reads
    EOF, the parent having set the stop, the runner in ``box["runner"]`` is asked to stop at the end of its step
    under way (``Runner.stop_asked``), or at once when its ``process`` is not the safe
    runner's (``honours(runner)`` false: ``KeyboardInterrupt`` in the main thread); asked
    before the runner is made, ``workers._work`` asks it when it is (``box["asked"]``). A
    thread waits on the pipe: no signal reaches a worker still starting (Python, its
    imports), where it would kill it."""
    import threading

    box = {"runner": None, "asked": False, "lock": threading.Lock(), "honours": honours}

    def watch():
        with contextlib.suppress(OSError, EOFError):
            asked.poll(None)  # readable: EOF, the parent's end closed (nothing is written)
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
