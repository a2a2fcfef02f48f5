"""``run``'s signals: SIGTERM, SIGHUP and Ctrl-C stop a run at a step's end, from its start.

Order, from the process's first instant: ``python -m toolkit`` holds these signals
(the first thing ``toolkit/__main__.py`` does, the package imported) while the
command line is imported and parsed; ``run`` installs its handlers, then lets them in
(``stopping_on_signals``), so a signal sent while Python was still importing is one stop
asked before the batch starts, not a death by the signal's default; any other command lets
them in as soon as it is known (``release_early``), to its own handling or the default.
What is left is the interpreter's own start, before the package is imported: a signal
then ends the process as it ends any program (SIGTERM: 143), nothing opened yet.
"""

import contextlib
import os
import signal

from toolkit.liveness import STOP_SIGNALS as STOPS


def release_early() -> None:
    """Let the stop signals in (one held meanwhile is delivered now). A no-op when nothing
    held them (``main`` called as a library, the console script)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)


class Stop:
    """The stop a signal asked of a run, and whom it goes to (``attach``).

    ``asked``: the first signal's name (None: none yet). Before anything is attached a
    stop is only noted; attached, it goes on at once, and a stop noted before is passed
    on at attach time."""

    def __init__(self):
        self.asked: str | None = None
        self._to = None

    def attach(self, to) -> None:
        """From now on, a stop goes to ``to(name)``; one asked already, at once."""
        self._to = to
        if self.asked is not None:
            to(self.asked)

    def ask(self, name: str) -> None:
        if self.asked is not None:
            raise KeyboardInterrupt(name)  # the second signal: at once, as kill -9
        self.asked = name
        if self._to is not None:
            self._to(name)
        with contextlib.suppress(OSError):  # raw: a handler may interrupt a print to stderr
            os.write(2, f"{name}: stopping at the end of the current step (again: at once)\n"
                     .encode())


def to_runner(runner):
    """What a stop does to a one-process run: ask the safe runner to stop at the end of
    its step under way (``Runner.stop_asked``); a strategy whose ``process`` is not the
    safe runner's cannot, and stops at once (``KeyboardInterrupt``, exit 130)."""
    from toolkit.runner import Runner

    honours = type(runner).process is Runner.process

    def stop(name):
        if not honours:
            raise KeyboardInterrupt(name)
        runner.stop_asked = name
    return stop


@contextlib.contextmanager
def stopping_on_signals():
    """While ``run`` runs (main thread only), from its first step to its exit status:
    SIGTERM (``kill``, systemd, ``docker stop``, a CI timeout), SIGHUP (a closed terminal)
    and SIGINT (Ctrl-C) ask for a stop (the ``Stop`` yielded): before the batch starts, it
    is noted and the run stops before its first chunk; once a runner is attached
    (``to_runner``) or a pool of workers (``run --workers``: each is sent SIGTERM), at the
    end of the step under way: that step's move committed, the lease released, then
    ``StopAsked``; the witness records the end and ``run`` exits 1 ("run again"). A second
    signal stops at once (``KeyboardInterrupt``, exit 130: as ``kill -9``, safe by design:
    the rerun looks up what was in flight; a pool's workers die with their parent). A
    signal ignored when the run started (``nohup``, a background ``run &`` of a shell
    without job control: SIGINT) stays ignored.

    The stop waits for the step under way: its provider calls (each bounded by
    ``--read-timeout`` with a service; a lookup or fetch step retries within its budget) and
    backoff sleeps (each at most ``RetryPolicy.max_delay``). A second signal does not wait.
    """
    import threading

    stop = Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def ask(signum, frame):
        stop.ask(signal.Signals(signum).name)

    previous = {}
    held = set(signal.pthread_sigmask(signal.SIG_BLOCK, ())) & set(STOPS)  # by __main__
    try:
        for signum in STOPS:
            if signal.getsignal(signum) not in (signal.SIG_IGN, None):  # None: not Python's
                previous[signum] = signal.signal(signum, ask)
        release_early()  # handlers first: a signal held since the start is asked now
        yield stop
    finally:
        # The program's exit status is decided: held again first (as ``__main__`` held
        # them), then the handlers given back, so that a late second signal neither
        # meets a restored default (death, 143) nor changes that status.
        if held:
            signal.pthread_sigmask(signal.SIG_BLOCK, held)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
