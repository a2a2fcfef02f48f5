"""``run``'s signals: SIGTERM, SIGHUP and Ctrl-C stop a one-process run at a step's end."""

import contextlib
import os


@contextlib.contextmanager
def stopping_on_signals(runner):
    """While a one-process run runs (main thread only): SIGTERM (``kill``, systemd, ``docker
    stop``, a CI timeout), SIGHUP (a closed terminal) and SIGINT (Ctrl-C) ask the safe
    runner to stop at the end of its step under way (``Runner.stop_asked``): that step's
    move committed, the lease released, ``StopAsked`` before the next item; the witness
    then records the end and ``run`` exits 1 ("run again"). A second signal, or the first
    to a strategy whose ``process`` is not the safe runner's, stops at once
    (``KeyboardInterrupt``, exit 130: as ``kill -9``, safe by design: the rerun looks up
    what was in flight). A signal ignored when the run started (``nohup``, a background
    ``run &`` of a shell without job control: SIGINT) stays ignored.

    The stop waits for the step under way: its provider calls (each bounded by
    ``--read-timeout`` with a service; a lookup or fetch step retries within its budget) and
    backoff sleeps (each at most ``RetryPolicy.max_delay``). A second signal does not wait.
    """
    import signal
    import threading

    from toolkit.runner import Runner

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    honours = type(runner).process is Runner.process

    def ask(signum, frame):
        name = signal.Signals(signum).name
        if not honours or runner.stop_asked is not None:
            raise KeyboardInterrupt(name)
        runner.stop_asked = name
        with contextlib.suppress(OSError):  # raw: a handler may interrupt a print to stderr
            os.write(2, f"{name}: stopping at the end of the current step (again: at once)\n"
                     .encode())

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        if signal.getsignal(signum) not in (signal.SIG_IGN, None):  # None: not Python's to set
            previous[signum] = signal.signal(signum, ask)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
