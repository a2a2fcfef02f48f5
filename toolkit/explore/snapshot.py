"""Snapshot mode: record one run, copy its batch folder at every durable step, recover from copies.

The real mode replays the prefix of the batch in a fresh child for every crash
point and kills it at step k. Snapshot mode runs the batch once (the recording
child, uncrashed) and, inside ``Tracer.step`` at each step n, copies the
point's whole batch folder (ledger, provider database and jobs folder, the
client's outputs and temporary files) to ``<snapshots>/<n>-kill`` (and, for a
download, to ``<n>-tear`` with that file cut to half its bytes, as ``tear``
does). A crash point then starts its recoveries from that copy: no replay.

Why the copy is what a SIGKILL at step n leaves behind. The recording child is
single-threaded and stopped inside ``step`` while it copies, exactly where the
real child would send itself SIGKILL, so:

* file contents: a kill keeps everything the process wrote (the page cache
  outlives it) and loses what sat in its user-space buffers; the copy reads the
  same page cache and cannot see those buffers either. Unflushed is unflushed
  for both; power loss is not a kill (``powerloss``) and is refused here.
* SQLite ``-wal`` and ``-shm``: copied byte for byte as the kill leaves them,
  uncommitted frames included; the next opener recovers from them the same way.
* open descriptors and ``fcntl`` locks: a kill closes and releases them; a copy
  has none. The same for both.
* temporary files (a download's ``.tmp`` beside its destination): inside the
  batch folder, copied. The runner's private input copies live in the
  exploration's temporary folder (``<root>/tmp``, not the batch folder), per run,
  and no rerun reads another run's: nothing to carry.
* the provider's state: the fake provider keeps all of it in its database and
  jobs folder, inside the batch folder, copied at the same instant as the
  ledger. Its in-memory state (locks, the set of executing jobs) dies with a
  kill and a recovery process starts without it in both modes. A job it
  recorded as executing names the recording child (pid, start ticks); every
  recovery starts after that child exited, as a killed executor is gone.

What differs, and is guarded or refused:

* extended attributes: not copied (``copy_tree``); nothing in a batch folder
  sets any, and no resume reads them.
* inodes: a copy has new ones (sizes, bytes and ``mtime_ns`` are kept). A
  resume that compares inodes sees a change and verifies by SHA-256 instead
  of trusting the stat: the same verdict, a slower path.
* time: a recovery starts seconds after the recording instead of at once, so a
  contract whose keys expire (``retention=``) is refused. It cannot start
  sooner: the copies name the recording child as lease owner and executor,
  and a recovery must find that process gone, as after a real kill; started
  while the recording still runs, it would find its owner alive (a live worker
  holding the lease), which no real kill leaves: the points start after it.
* another thread could write while the copy is taken: a step reached with a
  thread alive other than a lease heartbeat that cannot write yet raises (and
  ends the recording) instead of copying.
* absolute paths: a copy is recovered in another folder than the one it was
  recorded in; if any copy names the recording's folder, the exploration
  falls back to the real mode (``Recorder``).
* the first rerun cannot be killed (``pairs``) nor the ledger cut to its last
  fsync (``power_loss``): those stay in the real mode, the default.
* the recovering process: in the real mode a fresh fork of a fresh supervisor;
  here the supervisor itself (``run_here``), which may have recovered and
  judged other points before (``SHARED`` points per supervisor, each in its
  own folder, one after another; ``child.fork_shared``). A fork per point and
  its copy-on-write faults were over half of a point's CPU. What a run keeps
  of its process between points: its identity (pid and start ticks: never the
  recording's, which is gone), caches of pure functions (``memo``, compiled
  patterns), nothing of a ledger, a provider or a lease (each run opens and
  closes its own, and joins its heartbeats). A point that raises ends its
  supervisor (the exploration stops, as when a supervisor fails).
  ``tests/test_explore_speed_paths.py`` proves the rows equal those of one
  fresh supervisor per point, for a safe design and a violating one.

``tests/test_explore_snapshot.py`` proves that both modes give the same row
(verdict, anomalies, executions, submits, outcome) at every point of a batch.
"""

import os
import threading
import time
from pathlib import Path


def copy_tree(src: Path, dst: Path, needle: bytes | None = None) -> str | None:
    """Copy the folder ``src`` to ``dst`` (new): bytes, modes, ``mtime_ns`` and ``atime_ns``
    of every file and folder, symlinks as links; return the first file (relative path)
    whose bytes contain ``needle``, if any.

    Each file is read whole (a batch folder holds a few small files) and written
    with one ``os.write``: the bytes are in hand for the ``needle`` search, which
    a reflink would not save (``Recorder``). No ``shutil.copytree``:
    its ``copystat`` lists extended attributes per file, which a batch folder on
    tmpfs does not have, and that was most of the copy's cost.
    """
    return _copy_dir(os.fspath(src), os.fspath(dst), needle, "")


def _copy_dir(src: str, dst: str, needle, prefix: str):
    found = None
    os.mkdir(dst)
    with os.scandir(src) as entries:
        entries = sorted(entries, key=lambda entry: entry.name)  # deterministic ``found``
    for entry in entries:
        target = os.path.join(dst, entry.name)
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir():
            found = _copy_dir(entry.path, target, needle, f"{prefix}{entry.name}/") or found
        elif not entry.is_file():  # a FIFO would block the read: no batch folder has one
            raise OSError(f"{entry.path}: not a regular file, folder or symlink")
        else:
            st, data = _read_whole(entry.path)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fchmod(fd, st.st_mode & 0o7777)
                os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(fd)
            if found is None and needle is not None and needle in data:
                found = f"{prefix}{entry.name}"
    st = os.stat(src)  # the folder's own times last: creating its entries changed them
    os.chmod(dst, st.st_mode & 0o7777)
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    return found


def _read_whole(path: str) -> tuple[os.stat_result, bytes]:
    """The file's stat (taken before the read moves its access time) and all its bytes,
    through its descriptor: ``open()``'s buffered file asked the terminal (``isatty``) and
    the position (``lseek``) of every file, and ``utime`` by name looked the path up again."""
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        chunks = [os.read(fd, st.st_size + 1)]
        while chunks[-1]:  # to the end, whatever the stat said
            chunks.append(os.read(fd, 1 << 16))
        return st, b"".join(chunks)
    finally:
        os.close(fd)


def folder(snapshots: Path, n: int, torn: bool) -> Path:
    return Path(snapshots) / f"{n}-{'tear' if torn else 'kill'}"


class Recorder:
    """Called by the recording child's ``Tracer`` at each step: copy the batch folder.

    The only other threads a run may have are the runner's lease heartbeats
    (``lease-...``), and a heartbeat writes nothing until half its lease is
    spent (``quiet`` seconds after the run starts): a step reached later, or
    with any other thread alive, could be copied while something writes, so it
    raises instead.

    Only the steps explored are copied (``every``: step n when ``(n - 1) %
    every == 0``). Each copy is searched for the recording's folder as it is
    taken: from the first copy that names it, ``dependent`` says which file,
    and no further copy is taken. A copy is recovered in another folder than
    the recording's (points run side by side); relative paths resolve alike
    there, but an absolute path written into the batch's files (a naive
    ledger that records where it downloaded) would name the recording's
    folder, gone by then, where a killed run's rerun finds its own: the
    verdicts could differ, so the exploration falls back to the real mode.
    Every byte of every file is searched (SQLite and JSONL store text as UTF-8).
    """

    def __init__(self, root: Path, snapshots: Path, quiet: float, every: int = 1):
        self.root, self.snapshots = Path(root), Path(snapshots)
        self.deadline = time.monotonic() + quiet
        self.every = every
        self.needle = os.fsencode(os.path.abspath(self.root))
        self.dependent = None  # the first copy that names the recording's folder

    def __call__(self, n: int, path=None) -> None:
        if (n - 1) % self.every or self.dependent is not None:
            return
        others = [t.name for t in threading.enumerate()
                  if t is not threading.current_thread() and not t.name.startswith("lease-")]
        if others or time.monotonic() > self.deadline:
            raise RuntimeError(f"step {n}: threads {others} alive or a lease heartbeat may write "
                               "now: this run cannot be copied consistently")
        self.snapshots.mkdir(parents=True, exist_ok=True)
        copy = folder(self.snapshots, n, False)
        found = copy_tree(self.root, copy, self.needle)
        if path is not None and found is None:  # the tear+kill twin: the download cut in half
            copy = folder(self.snapshots, n, True)
            found = copy_tree(self.root, copy, self.needle)
            torn = copy / Path(os.path.abspath(path)).relative_to(os.path.abspath(self.root))
            os.truncate(torn, torn.stat().st_size // 2)
        if found is not None:
            self.dependent = f"{copy.name}/{found} names the folder it was recorded in"


def refusal(plan) -> str | None:
    """Why ``plan`` cannot be explored from snapshots (None: it can)."""
    if plan.power_loss:
        return "snapshot mode cannot cut the ledger to its last fsync: drop --power-loss"
    if plan.pairs:
        return "snapshot mode does not kill the rerun: drop --pairs"
    if plan.contract_object().key_retention is not None:
        return "snapshot mode delays recovery: a contract whose keys expire needs the real mode"
    return None
