"""Explore's work folder: where it is, and its removal on any exit, with nothing still writing.

Where. ``/dev/shm`` (RAM: an fsync costs nothing there, ``pool.scratch``) unless
TMPDIR is set: a user who sets it expects scratch space there (room, quotas, a
machine whose /dev/shm is small), so an explicit TMPDIR wins.

Removal. Explore forks supervisors, and each supervisor forks the runs of its
points (the real mode's killed replay and reruns, the snapshot mode's recording
child, which copies the batch folder at every step). Interrupted, explore kills its
supervisors (``pool``), but a supervisor killed by SIGKILL runs no cleanup: its own
child went on writing into the folder explore was removing, and ``rmtree`` left
the new entries behind (``points/<k>-kill-None/...``, ``snapshots/<n>-kill``), or
failed with "Directory not empty". So the folder is removed only once every
process explore forked is gone:

* a *lifeline* pipe is made with the folder, before any fork: every descendant
  inherits its write end (``fork`` keeps all descriptors), and only explore closes
  its own. Its read end reaches EOF exactly when no descendant is left (a zombie
  holds no descriptor), whoever their parent now is;
* until then, every process that holds the pipe (``/proc/<pid>/fd``) is killed
  with SIGKILL, again and again (one may fork as it is killed);
* then the folder is removed (with the runs' input snapshots, ``toolkit-inputs-*``:
  explore's runs make them in its ``tmp`` folder), and those that dead runs left in
  the system's temporary folder swept.

Signals. The folder and the pipe are made with SIGINT and SIGTERM held (a signal
between making and registering left the folder, as ``liveness.owned_folder`` says),
and held again during the removal: a second Ctrl-C then waits for the removal to
end instead of cutting it short, and explore exits as interrupted after it. A
signal that came just before the mask still raises inside the removal (Python runs
handlers late): its steps are idempotent and run again (``_remove``).

One explore at a time per process: another one running in a thread of the same
process would fork children holding this lifeline too, and they would be killed.
"""

import contextlib
import os
import select
import shutil
import signal
import tempfile

from toolkit import liveness, pool

KIND = "explore"
_HELD = {signal.SIGINT, signal.SIGTERM}


def root() -> str:
    """The folder explore's work folder is made in: TMPDIR if set, else /dev/shm if
    writable, else the system's temporary folder."""
    if os.environ.get("TMPDIR"):
        return tempfile.gettempdir()
    return pool.scratch() or tempfile.gettempdir()


@contextlib.contextmanager
def workdir():
    """A fresh owner-named folder in ``root()``, removed on the way out with every process
    forked inside the block gone first (see the module's docstring)."""
    where = root()
    liveness.sweep_dead(where, KIND)  # a SIGKILLed explore's folder: its owner is dead
    path, lifeline = None, [None, None]  # [read end, write end]: None once closed
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        path = tempfile.mkdtemp(prefix=liveness.owned_prefix(KIND), dir=where)
        lifeline[:] = os.pipe()
        # A signal held so far runs its handler (it raises) just after this call: inside
        # the ``try``, with the folder and the pipe made and known to ``_remove``.
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        yield path
    finally:
        _remove(path, lifeline, held)


def _remove(path: str, lifeline: list, held) -> None:
    """Kill what holds the lifeline, then remove ``path``, signals held
    (``liveness.cleanup_held``); re-raise an interruption after."""
    def steps():
        _bury(lifeline)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
        liveness.sweep_dead(tempfile.gettempdir(), "toolkit-inputs")

    liveness.cleanup_held(steps, _HELD, held)


def _bury(lifeline: list, rounds: int = 2000) -> None:
    """Close our write end; kill the holders of the lifeline until its read end is at EOF.

    An end is marked closed before ``os.close`` (a handler runs after a call, never inside
    it): run again, this never closes a descriptor number twice."""
    if lifeline[1] is not None:
        fd, lifeline[1] = lifeline[1], None
        os.close(fd)
    if lifeline[0] is None:  # never made (or done)
        return
    inode = f"pipe:[{os.fstat(lifeline[0]).st_ino}]"
    for attempt in range(rounds):  # bounded: never hang an exit on a process we cannot kill
        if _at_eof(lifeline[0], 0.01 if attempt else 0):
            break
        for pid in _holders(inode):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    fd, lifeline[0] = lifeline[0], None
    os.close(fd)


def _at_eof(fd: int, timeout: float) -> bool:
    """Nothing is ever written to the lifeline: readable means EOF."""
    readable, _, _ = select.select([fd], [], [], timeout)
    return bool(readable) and os.read(fd, 1) == b""


def _holders(inode: str) -> list[int]:
    """The other processes holding the pipe ``inode`` (``pipe:[N]``), from /proc."""
    me, found = os.getpid(), []
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc (not Linux): wait for them to end
        return found
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:  # gone, or not ours to read (then not ours to kill either)
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") == inode:
                    found.append(int(name))
                    break
            except OSError:
                continue
    return found
