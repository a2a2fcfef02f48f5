"""Is the process that recorded itself as an owner still that process? (rank 1)

One helper for the ledger's leases and the fake provider's executors. An owner is
recorded as (host, boot id, pid, start time in clock ticks since boot):

* the start time comes from ``/proc/<pid>/stat`` (field 22), an integer the kernel
  fixes at fork. ``psutil.Process.create_time()`` instead adds the boot time, read
  afresh from the wall clock, so a clock step makes a live owner look dead; ticks
  are compared exactly, never with a tolerance.
* the boot id (``/proc/sys/kernel/random/boot_id``) tells a reboot: after one, every
  recorded process of this host is gone, even if a new one has the same pid and ticks.
* another host's process table is not ours to read: liveness is then unknown (None).

The host is recorded as ``hostname/boot_id``; a plain ``hostname`` (recorded before
boot ids were) is taken as this boot.
"""

import contextlib
import functools
import glob
import os
import signal
import socket

HOSTNAME = socket.gethostname()
# The signals that ask a process to stop: SIGTERM (``kill``, systemd, ``docker stop``),
# SIGHUP (a closed terminal), SIGINT (Ctrl-C). ``python -m toolkit`` holds them while it
# imports (``__main__``); ``run`` and its workers take them (cli/signals.py, runner/workers.py).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@functools.cache
def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:  # no /proc (not Linux): one boot as far as we can tell
        return "unknown-boot"


def host_id() -> str:
    """What an owner records as its host: this machine, in this boot."""
    return f"{HOSTNAME}/{boot_id()}"


def start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot; None if gone or a zombie."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as handle:
            stat = handle.read()
    except (OSError, ValueError):
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split at the last ")"
    fields = stat[stat.rfind(b")") + 2:].split()
    if not fields or fields[0] == b"Z":
        return None
    return int(fields[19])  # field 22 of the line; the 20th after "(comm)"


_OWN: dict[int, int | None] = {}  # this process's start ticks, keyed by pid (a fork re-reads)


def my_start() -> int | None:
    pid = os.getpid()
    if pid not in _OWN:
        _OWN.clear()
        _OWN[pid] = start_ticks(pid)
    return _OWN[pid]


def alive(host: str | None, pid: int | None, started) -> bool | None:
    """Is the owner recorded as (``host``, ``pid``, ``started``) still running?

    True or False for an owner on this machine; None for another machine's (only a
    lease's expiry can tell). ``host`` None: recorded on this machine. ``started``
    None: recorded without a start time (pid alone decides).
    """
    if host is not None:
        name, _, boot = host.partition("/")
        if name != HOSTNAME:
            return None
        if boot and boot != boot_id():
            return False  # this machine rebooted since: that process is gone
    if pid is None:
        return False
    ticks = my_start() if pid == os.getpid() else start_ticks(pid)
    return ticks is not None and (started is None or ticks == started)


# Private scratch folders named by their owner: ``<kind>-<pid>-<start ticks>-<random>``.
# A process killed by SIGKILL runs no cleanup; the next process of the same kind removes
# the folders whose owner is dead (``alive`` decides, as for leases), never a live one's.
# Names without an owner (made before this rule) are left alone: whose they are is unknown.

def owned_prefix(kind: str) -> str:
    """The ``tempfile`` prefix of a scratch folder owned by this process."""
    return f"{kind}-{os.getpid()}-{my_start() or 0}-"


def owned_folder(kind: str, dir=None):
    """A ``tempfile.TemporaryDirectory`` named by this process (``owned_prefix``), made
    with SIGINT and SIGTERM held in this thread. Its constructor makes the folder, then
    registers the removal: a Ctrl-C landing between the two (a caller that polls for the
    folder and interrupts at once hits just that) left it behind, found by a test 1 run
    in 12. Held, the interrupt lands after, on an object that removes the folder on the
    way out (its ``with`` or its finalizer)."""
    import tempfile

    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        return tempfile.TemporaryDirectory(prefix=owned_prefix(kind), dir=dir)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def sweep_dead(folder, kind: str) -> list[str]:
    """Remove ``folder``'s ``<kind>-<pid>-<ticks>-*`` folders whose owner is gone; return
    their paths. Errors (another sweeper got there first, no permission) are skipped."""
    import shutil

    removed = dead_folders(folder, kind)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def dead_folders(folder, kind: str) -> list[str]:
    """``folder``'s ``<kind>-<pid>-<ticks>-*`` folders whose owner is gone (``alive``)."""
    found = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return found
    start = f"{kind}-"
    for entry in entries:
        if not entry.name.startswith(start):
            continue
        pid, _, rest = entry.name[len(start):].partition("-")
        ticks, dash, _ = rest.partition("-")
        if not (dash and pid.isdigit() and ticks.isdigit()):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
        except OSError:
            continue
        if alive(None, int(pid), int(ticks) or None) is False:
            found.append(entry.path)
    return found


# Private temp files named the same way, beside the file they replace (written whole: temp,
# fsync, rename): ``<target>.<pid>-<start ticks>.<random>.tmp``. A writer killed between
# the temp's creation and the rename leaves it; the next process that writes ``target``
# removes the ones whose owner is gone (``alive``), never a live writer's.

def owned_temp_prefix(target) -> str:
    """The ``tempfile`` prefix of a temp file beside ``target``, owned by this process."""
    return f"{os.path.basename(target)}.{os.getpid()}-{my_start()}."


def remove_dead_temps(target) -> None:
    """Delete the temp files (``owned_temp_prefix``) beside ``target`` whose owner is gone;
    a live one's stays, a name not of this form is left alone, errors are skipped."""
    if target is None:
        return
    base = os.fspath(target)
    for temp in glob.glob(f"{glob.escape(base)}.*-*.*.tmp"):
        pid, _, start = temp[len(base) + 1:].partition(".")[0].partition("-")
        try:
            owner_alive = alive(None, int(pid), None if start == "None" else int(start))
        except ValueError:
            continue  # not one of ours
        if not owner_alive:
            with contextlib.suppress(OSError):
                os.unlink(temp)


def cleanup_held(steps, signals, restore) -> None:
    """Run ``steps()`` (idempotent: kill, then remove) with ``signals`` blocked, then set the
    mask back to ``restore``; an interruption is re-raised after, never half-way through.

    The mask stops new signals, but one that arrived just before it still runs its
    handler (it raises) at the next bytecode that checks, inside ``steps``: they run
    again, at most once more per signal."""
    interrupted = None
    for _ in range(4):
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, signals)
            steps()
            break
        except BaseException as exc:
            interrupted = interrupted or exc
    signal.pthread_sigmask(signal.SIG_SETMASK, restore)
    if interrupted is not None:
        raise interrupted
