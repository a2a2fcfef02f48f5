"""The drilled program's processes never outlive its run, nor the drill.

A program may daemonize (``setsid cmd &``, ``nohup cmd &``): such a child
leaves the program's process group and, once its parent exits, would be
re-parented to init and keep running after the drill. So the drill makes
itself the *child subreaper* (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``):
orphans of its descendants are re-parented to the drill, where
``psutil.Process().children(recursive=True)`` still finds them, and after
each run every descendant that is not one of ``keep`` (the toolkit's own
provider service) is killed with SIGKILL.

SIGTERM and SIGHUP (what CI sends on a timeout, a closed terminal) are turned into
``KeyboardInterrupt`` while a drill runs, so the same ``finally`` blocks that handle
Ctrl-C run; the CLI then prints one line and exits 130. The folders are
``owned_scratch``: removed only after every process started inside them (the
service, the program and what it left) is dead, so nothing writes into a folder being
removed. Named by their owner (``liveness.owned_prefix``), the folders of a drill
killed by SIGKILL are removed by the next drill (``sweep_dead_drills``), after it has
killed what still runs in them. The service dies with a killed drill by itself (its
stdin pipe, ``ServiceProcess``); the program's processes cannot be reached until then.
"""

import contextlib
import ctypes
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

from toolkit import liveness

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


_TURNED = (signal.SIGTERM, signal.SIGHUP)  # into KeyboardInterrupt, as SIGINT already is
_HELD = {signal.SIGINT, *_TURNED}


@contextlib.contextmanager
def guarded():
    """While the block runs: subreaper on, SIGTERM and SIGHUP handled like SIGINT (main
    thread only). A signal ignored when the drill started (``nohup``) stays ignored."""
    become_subreaper()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise_interrupt) for signum in _TURNED
                if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _descendants() -> set[int]:
    import psutil

    return {child.pid for child in psutil.Process().children(recursive=True)}


@contextlib.contextmanager
def owned_scratch(kind: str, suffix: str = ""):
    """A private folder ``$TMPDIR/<kind>-<pid>-<start ticks>-*<suffix>`` (mode 700),
    removed on the way out only after every process started inside the block is dead.
    ``kind`` is one of ``SCRATCH_KINDS`` (the next drill sweeps those of a killed one).

    Order on the way out, interrupted or not: the stop signals are held (a second Ctrl-C
    waits for the removal instead of cutting it short, and raises after it); every
    descendant born in the block is SIGKILLed and reaped (the service if its own stop did
    not run, what the program left); then the folder is removed. Made with the signals
    held too: a signal between ``mkdtemp`` and the ``try`` would leave it behind."""
    sweep_dead_drills()
    before = _descendants()
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    path = None
    try:
        path = tempfile.mkdtemp(prefix=liveness.owned_prefix(kind), suffix=suffix)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a held signal raises here, in the try
        yield Path(path)
    finally:
        _remove(path, before, held)


def _remove(path, before: set, held) -> None:
    """Kill what the block started, then remove ``path``, signals held
    (``liveness.cleanup_held``); re-raise an interruption after."""
    def steps():
        kill_strays(keep=before)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)

    liveness.cleanup_held(steps, _HELD, held)


SCRATCH_KINDS = ("blackbox", "drill-records")  # owned_scratch's kinds (drill, explore --command)


def sweep_dead_drills() -> list[str]:
    """Remove the folders of drills that died (SIGKILL ran no cleanup); return them.

    First the processes of ours that provably belong to such a drill are killed
    (``_started_in``). A live drill's folders are never touched (``liveness``)."""
    dead = [path for kind in SCRATCH_KINDS
            for path in liveness.dead_folders(tempfile.gettempdir(), kind)]
    for path in dead:
        for _ in range(20):  # bounded: one may fork as it is killed
            started = _started_in(path)
            if not started:
                break
            for pid in started:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            _reap(started)
        shutil.rmtree(path, ignore_errors=True)
    return dead


def _started_in(path: str) -> list[int]:
    """Our user's live processes that a drill started in ``path``, by the marks the drill
    gave them: the program and whatever it started, daemons included, carry
    ``TOOLKIT_INPUTS`` and ``TOOLKIT_OUT`` as the drill set them (``_program_of``); a
    provider service that outlived it is the toolkit's ``serve-provider`` with its ``--db``
    there (``_service_of``). A process that merely names the folder (a user's ``less`` on a
    file in it, a shell standing there, one given either variable alone or other values
    by hand) is not one of them, nor one that cleared its environment (it lives on)."""
    import psutil

    prefixes = tuple(os.fsencode(os.path.join(p, "")) for p in (path, os.path.realpath(path)))
    found, me, uid = [], os.getpid(), os.getuid()
    for proc in psutil.process_iter(["uids"]):
        if proc.pid == me or proc.info["uids"] is None or proc.info["uids"].real != uid:
            continue
        environ, argv = (_proc_strings(proc.pid, part) for part in ("environ", "cmdline"))
        if _program_of(environ, prefixes) or _service_of(argv, prefixes):
            found.append(proc.pid)
    return found


def _program_of(environ: list, prefixes: tuple) -> bool:
    """The environment the drill gives its program (``blackbox.environment``): the work
    folder's ``inputs`` and ``out``, one folder inside the dead one, exactly."""
    values = dict(entry.partition(b"=")[::2] for entry in environ)
    inputs, out = values.get(b"TOOLKIT_INPUTS", b""), values.get(b"TOOLKIT_OUT", b"")
    return inputs.startswith(prefixes) and inputs.endswith(b"/inputs") and \
        out == inputs[:-len(b"inputs")] + b"out"


def _service_of(argv: list, prefixes: tuple) -> bool:
    """The drill's service: ``python -m toolkit serve-provider --db <in the dead folder>``."""
    try:
        at = argv.index(b"serve-provider")
        db = argv[argv.index(b"--db", at) + 1]
    except (ValueError, IndexError):
        return False
    return argv[at - 2:at] == [b"-m", b"toolkit"] and db.startswith(prefixes)


def _proc_strings(pid: int, part: str) -> list[bytes]:
    """``/proc/<pid>/<part>``'s NUL-separated strings; none if it is gone or not ours."""
    try:
        with open(f"/proc/{pid}/{part}", "rb") as handle:
            return handle.read().split(b"\0")
    except OSError:
        return []


def _reap(pids) -> None:
    """Wait (bounded) until the killed ``pids`` are gone or zombies of another parent."""
    import psutil

    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            procs.append(psutil.Process(pid))
    psutil.wait_procs(procs, timeout=2)
