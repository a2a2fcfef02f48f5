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
  batch folder, copied. The runner's private input copies live in the system's
  temp folder, per run, and no rerun reads another run's: nothing to carry.
* the provider's state: the fake provider keeps all of it in its database and
  jobs folder, inside the batch folder, copied at the same instant as the
  ledger. Its in-memory state (locks, the set of executing jobs) dies with a
  kill and a recovery process starts without it in both modes. A job it
  recorded as executing names the recording child (pid, start ticks); every
  recovery starts after that child exited, as a killed executor is gone.

What differs, and is guarded or refused:

* inodes: a copy has new ones (sizes, bytes and ``mtime_ns`` are kept). A
  resume that compares inodes sees a change and verifies by SHA-256 instead
  of trusting the stat: the same verdict, a slower path.
* time: a recovery starts seconds after the recording instead of at once, so a
  contract whose keys expire (``retention=``) is refused.
* another thread could write while the copy is taken: a step reached with a
  thread alive other than a lease heartbeat that cannot write yet raises (and
  ends the recording) instead of copying.
* absolute paths: a copy is recovered in another folder than the one it was
  recorded in; if any copy names the recording's folder, the exploration
  falls back to the real mode (``position_dependent``).
* the first rerun cannot be killed (``pairs``) nor the ledger cut to its last
  fsync (``power_loss``): those stay in the real mode, the default.

``tests/test_explore_snapshot.py`` proves that both modes give the same row
(verdict, anomalies, executions, submits, outcome) at every point of a batch.
"""

import errno
import fcntl
import os
import shutil
import threading
import time
from pathlib import Path

FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int), a reflink where the file system has them


def clone(src, dst) -> None:
    """Copy one file: a reflink if the file system can (btrfs, XFS), bytes otherwise; keep stat."""
    with open(src, "rb") as source, open(dst, "wb") as target:
        try:
            fcntl.ioctl(target.fileno(), FICLONE, source.fileno())
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY,
                                 errno.EBADF):
                raise
            shutil.copyfileobj(source, target, 1 << 20)
    shutil.copystat(src, dst)  # mtime_ns too: a resume comparing stats sees the same times


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True, copy_function=clone)


def folder(snapshots: Path, n: int, torn: bool) -> Path:
    return Path(snapshots) / f"{n}-{'tear' if torn else 'kill'}"


class Recorder:
    """Called by the recording child's ``Tracer`` at each step: copy the batch folder.

    The only other threads a run may have are the runner's lease heartbeats
    (``lease-...``), and a heartbeat writes nothing until half its lease is
    spent (``quiet`` seconds after the run starts): a step reached later, or
    with any other thread alive, could be copied while something writes, so it
    raises instead.
    """

    def __init__(self, root: Path, snapshots: Path, quiet: float):
        self.root, self.snapshots = Path(root), Path(snapshots)
        self.deadline = time.monotonic() + quiet

    def __call__(self, n: int, path=None) -> None:
        others = [t.name for t in threading.enumerate()
                  if t is not threading.current_thread() and not t.name.startswith("lease-")]
        if others or time.monotonic() > self.deadline:
            raise RuntimeError(f"step {n}: threads {others} alive or a lease heartbeat may write "
                               "now: this run cannot be copied consistently")
        copy_tree(self.root, folder(self.snapshots, n, False))
        if path is not None:  # the tear+kill twin: the download cut to half its bytes
            torn = folder(self.snapshots, n, True)
            copy_tree(self.root, torn)
            relative = Path(os.path.abspath(path)).relative_to(os.path.abspath(self.root))
            copy = torn / relative
            os.truncate(copy, copy.stat().st_size // 2)


def position_dependent(snapshots: Path, recorded_at: Path) -> str | None:
    """Does any copy name the folder it was recorded in? (None: no copy does.)

    A copy is recovered in another folder than the recording's (points run side
    by side). Relative paths resolve alike there; an absolute path written into
    the batch's files (a naive ledger that records where it downloaded) would
    name the recording's folder, gone by then, where a killed run's rerun finds
    its own: the verdicts could differ, so the exploration falls back to the
    real mode. Every byte of every copy is searched (SQLite and JSONL store
    text as UTF-8).
    """
    needle = os.fsencode(os.path.abspath(recorded_at))
    for path in sorted(Path(snapshots).rglob("*")):
        if path.is_file() and needle in path.read_bytes():
            return f"{path.relative_to(snapshots)} names the folder it was recorded in"
    return None


def refusal(plan) -> str | None:
    """Why ``plan`` cannot be explored from snapshots (None: it can)."""
    if plan.power_loss:
        return "snapshot mode cannot cut the ledger to its last fsync: drop --power-loss"
    if plan.pairs:
        return "snapshot mode does not kill the rerun: drop --pairs"
    if plan.contract_object().key_retention is not None:
        return "snapshot mode delays recovery: a contract whose keys expire needs the real mode"
    return None
