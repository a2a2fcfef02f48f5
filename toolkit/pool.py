"""One process pool: forked children, each writing its result to a pipe, at most ``jobs`` at once.

Used by crash exploration (``explore.child``: one child per crash point) and by
the drill catalogue (``drills.parallel``: one child per drill). Forking (not
spawning) keeps the children warm: the parent has imported everything once.

A child runs ``task(fd)`` with the write end of its pipe and ends with
``os._exit`` (no atexit handler, no inherited stdio buffer flushed twice): what
it has to say, it writes to ``fd`` itself, and the parent reads the pipe until
EOF (the child exited or was killed) before it reaps the child. So a child
killed by SIGKILL gives its bytes so far and its wait status, never a hang.
"""

import contextlib
import gc
import os
import selectors
import signal
import sys

FAILED = 70  # the exit status of a child whose task raised (EX_SOFTWARE)


def default_jobs() -> int:
    """One child per CPU this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def scratch() -> str | None:
    """A RAM-backed folder for children's throwaway batches, if there is one (None: the
    system's default temporary folder).

    A SIGKILL leaves the same files on tmpfs as on a disk (the page cache
    outlives the process), and an fsync there costs nothing: the protocol runs
    the same, without waiting on the medium. Power loss is simulated
    (``explore.powerloss``), never left to the medium.
    """
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _terminate(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def interruptible():
    """While the block runs (main thread only): SIGINT raises KeyboardInterrupt and SIGTERM
    SystemExit, so that ``finally`` blocks run (``run`` kills its children, temporary
    folders are removed) and the CLI exits 130 (or 143).

    SIGINT inherited ignored stays ignored (POSIX: a shell without job control starts
    ``cmd &`` so, that a terminal's Ctrl-C spares its background jobs): a handler set here
    made such an explore ignore an early ``kill -INT`` (during its start) and honour a later
    one. SIGTERM stops it either way. The children fork with these handlers (or the ignore);
    they end at once when interrupted (``run``).
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _terminate)}
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def start(task) -> tuple[int, int]:
    """Fork; the child runs ``task(write_fd)`` and exits with what it returns (None: 0).

    Returns (pid, read end of its pipe). A task that raises exits with
    ``FAILED`` (it should have written its error to the pipe first).
    """
    sys.stdout.flush()  # else the child's copy of a pending buffer would be written twice
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    # The child inherits every object of this process in the permanent generation: no
    # collection of its own traverses them (Python's advice for fork without exec, see
    # ``gc.freeze``). Else a child that happens to run a full collection writes the
    # header of each inherited object, copying thousands of shared pages: measured
    # here, ~2,000 page faults and ~30 ms of CPU per crash point. The parent thaws at
    # once: only the child keeps them frozen.
    gc.freeze()
    # SIGINT and SIGTERM held across the fork: a signal to the group landing in the child's
    # after-fork hooks (threading's, random's reseed) raised there, and Python printed it
    # as "Exception ignored ... Traceback". Held, it lands inside the ``try`` below.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    pid = os.fork()
    if pid != 0:
        gc.unfreeze()
    if pid == 0:  # the child
        code = FAILED
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            os.close(read_fd)
            code = task(write_fd) or 0
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a held signal raises after this
    except BaseException:  # the caller never learns the pid: the child must not outlive us
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_fd)
        raise
    return pid, read_fd


def wait(pid: int, read_fd: int) -> tuple[bytes, int]:
    """Read the child's pipe to EOF, reap it; return (its bytes, its wait status)."""
    try:
        with open(read_fd, "rb") as pipe:
            data = pipe.read()
    except BaseException:  # interrupted: the child must not outlive us (nor our temp folder)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    _, status = os.waitpid(pid, 0)
    return data, status


def run(tasks, jobs: int, done=None, order=None) -> list[tuple[bytes, int]]:
    """Run each ``task(fd)`` in a forked child, up to ``jobs`` at once; return (bytes, status)
    per task, in the order of ``tasks``.

    ``order``: the indices in the order to start them (default: as given), e.g.
    the longest first. ``done(index, result)`` is called as each child is
    reaped; if it returns true, no further task starts (those running finish).
    If this process is interrupted (an exception here or in ``done``), the
    children still running are killed and reaped before it propagates.
    """
    results = [None] * len(tasks)
    pending = list(range(len(tasks)) if order is None else order)
    assert sorted(pending) == list(range(len(tasks))), "order must name every task once"
    pending.reverse()  # popped from the end
    running = {}  # read fd -> (index, pid, chunks)
    try:
        with selectors.DefaultSelector() as selector:
            while pending or running:
                while pending and len(running) < max(1, jobs):
                    index = pending.pop()
                    pid, read_fd = start(tasks[index])
                    running[read_fd] = (index, pid, [])
                    selector.register(read_fd, selectors.EVENT_READ)
                for key, _ in selector.select():
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        running[key.fd][2].append(chunk)
                        continue
                    selector.unregister(key.fd)  # EOF: the child is gone (or closing)
                    os.close(key.fd)
                    index, pid, chunks = running.pop(key.fd)
                    _, status = os.waitpid(pid, 0)
                    results[index] = (b"".join(chunks), status)
                    if done is not None and done(index, results[index]):
                        pending = []
    finally:
        for read_fd, (_, pid, _) in running.items():  # only after an exception
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_fd)
    return results
