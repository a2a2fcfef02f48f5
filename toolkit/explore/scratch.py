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
* then the folder is removed, and the runs' input snapshots (``toolkit-inputs-*``,
  their owners now dead) swept.

Signals. The folder and the pipe are made with SIGINT and SIGTERM held (a signal
between making and registering left the folder, as ``liveness.owned_folder`` says),
and held again during the removal: a second Ctrl-C then waits for the removal to
end instead of cutting it short; it is delivered after, and explore exits as
interrupted.
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
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        path = tempfile.mkdtemp(prefix=liveness.owned_prefix(KIND), dir=where)
        read_end, write_end = os.pipe()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    try:  # a signal held above lands here at the earliest: inside the ``try``
        yield path
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
        try:
            _bury(read_end, write_end)
            shutil.rmtree(path, ignore_errors=True)
            liveness.sweep_dead(tempfile.gettempdir(), "toolkit-inputs")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _bury(read_end: int, write_end: int, rounds: int = 2000) -> None:
    """Close our write end; kill the holders of the lifeline until its read end is at EOF."""
    os.close(write_end)
    inode = f"pipe:[{os.fstat(read_end).st_ino}]"
    try:
        for _ in range(rounds):  # bounded: never hang an exit on a process we cannot kill
            if _at_eof(read_end, 0 if _ == 0 else 0.01):
                return
            for pid in _holders(inode):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    finally:
        os.close(read_end)


def _at_eof(fd: int, timeout: float) -> bool:
    """Nothing is ever written to the lifeline: readable means EOF."""
    readable, _, _ = select.select([fd], [], [], timeout)
    return bool(readable) and os.read(fd, 1) == b""


def _holders(inode: str) -> list[int]:
    """The other processes holding the pipe ``inode`` (``pipe:[N]``), from /proc."""
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
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
