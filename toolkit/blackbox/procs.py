"""The drilled program's processes never outlive its run, nor the drill.

A program may daemonize (``setsid cmd &``, ``nohup cmd &``): such a child
leaves the program's process group and, once its parent exits, would be
re-parented to init and keep running after the drill. So the drill makes
itself the *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``):
orphans of its descendants are re-parented to the drill, where
``psutil.Process().children(recursive=True)`` still finds them, and after
each run every descendant that is not one of ``keep`` (the toolkit's own
provider service) is killed with SIGKILL.

SIGTERM (what CI sends on a timeout) is turned into ``KeyboardInterrupt``
while a drill runs, so the same ``finally`` blocks that handle Ctrl-C stop
the service, kill the program's group and remove the temp folders; the CLI
then prints one line and exits 130.
"""

import contextlib
import ctypes
import os
import signal
import sys
import threading

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux); False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def kill_group(pgid: int) -> None:
    """SIGKILL a whole process group; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_strays(keep=()) -> int:
    """SIGKILL every descendant of this process except the ``keep`` pids and theirs.

    Returns how many were killed. Zombies among them are reaped here too.
    """
    import psutil

    me = psutil.Process()
    spared = set()
    for pid in keep:
        with contextlib.suppress(psutil.Error):
            spared.add(pid)
            spared.update(child.pid for child in psutil.Process(pid).children(recursive=True))
    strays = [child for child in me.children(recursive=True) if child.pid not in spared]
    for child in strays:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(strays, timeout=5)
    return len(strays)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def guarded():
    """While the block runs: subreaper on, SIGTERM handled like SIGINT (main thread only)."""
    become_subreaper()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
