"""Inside a forked child: one run of the batch, counting its durable steps, dying at step k.

A *durable step* is a moment after which something is on disk that was not
before: a ledger commit (``on_event``), a provider call that returned (the
provider's call log and job table changed), the provider accepting or
finishing a job (``on_phase``), the client renaming an artifact into its
output folder, a naive state file truncated for its rewrite, and (power-loss
mode) a ledger line written but not yet fsynced. The ``Tracer`` numbers them
1, 2, 3, ... in the order the run reaches them; the batch is deterministic
(seeded, no sleeping), so step k of one run is step k of the next.

At step ``kill_at`` the child sends the parent a ``kill`` message and then
``os.kill(os.getpid(), SIGKILL)``: a real SIGKILL, no handler, no ``finally``,
no flush. ``tear+kill`` first cuts the file just downloaded to half its bytes,
as a kill in the middle of a multi-chunk copy would leave it.

Messages are JSON lines on a pipe (one ``os.write`` each, below PIPE_BUF, so
a kill never leaves half a message): ``step``, ``kill``, ``ack`` (a ledger
commit that returned), ``sync`` (the ledger file's size at an fsync),
``end``, ``error``. The parent reads them after the child is gone.
"""

import dataclasses
import json
import os
import signal
import traceback
from pathlib import Path

from toolkit import pool
from toolkit.identity import PAGE_MARK

KILL, TEAR = "kill", "tear+kill"
# The real calls, taken at import (before any fork): a process that runs the batch twice
# (``run_here``, then a fork of itself) wraps them afresh each time, never a wrapper again.
_REPLACE, _FSYNC, _FDATASYNC = os.replace, os.fsync, os.fdatasync


@dataclasses.dataclass(frozen=True, slots=True)
class Paths:
    """Where one crash point's batch lives (the inputs are shared and read-only)."""

    root: Path
    ledger: Path

    @property
    def provider_db(self) -> Path:
        return self.root / "provider.db"

    @property
    def provider_out(self) -> Path:
        return self.root / "provider-jobs"

    @property
    def out(self) -> Path:
        return self.root / "out"


def send(fd: int, **message) -> None:
    data = (json.dumps(message, sort_keys=True) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


class Tracer:
    """Numbers the durable steps of one run; really dies at step ``kill_at``."""

    def __init__(self, fd: int, names: dict, *, kill_at=None, how=KILL, record=False,
                 acks=False, snapshot=None):
        self.fd, self.names = fd, names
        self.kill_at, self.how, self.record, self.acks = kill_at, how, record, acks
        self.snapshot = snapshot  # snapshot mode: copies the batch folder at each step
        self.n = 0
        self.ledger = None  # the ledger whose ``on_event`` this is

    def name(self, key) -> str:
        document, mark, page = str(key).partition(PAGE_MARK)  # a page: "doc-003#p2"
        return (self.names.get(document) or document[:8]) + mark + page

    def step(self, kind: str, label: str, path=None) -> None:
        self.n += 1
        if self.record:
            send(self.fd, t="step", n=self.n, kind=kind, label=label, tearable=path is not None)
        if self.snapshot is not None:  # here, where a real kill at step n would strike
            try:
                self.snapshot(self.n, path)
            except BaseException as exc:  # stop the recording: no caller may take it for a fault
                send(self.fd, t="error", error=f"snapshot at step {self.n}: {exc}",
                     traceback=traceback.format_exc()[-3000:])
                os._exit(70)
        if self.n == self.kill_at:
            if self.how == TEAR and path is not None:
                _tear(Path(path))
            send(self.fd, t="kill", n=self.n, kind=kind, label=label, how=self.how)
            os.kill(os.getpid(), signal.SIGKILL)

    def on_event(self, event) -> None:
        """The ledger's ``on_event``: the commit returned; acknowledge it, then count it."""
        frm = f"{event.frm.value}->" if event.frm and event.frm != event.to else ""
        if self.acks:  # a deferred commit (Ledger "DEFERRED SYNC") is durable only later
            deferred = not getattr(self.ledger, "event_synced", True)
            send(self.fd, t="ack", seq=event.seq, op=event.op, key=event.key, to=event.to.value,
                 deferred=deferred)
        self.step("ledger", f"commit {event.op} {self.name(event.key)} {frm}{event.to.value}")

    def on_phase(self, phase: str, job_id: str) -> None:
        """The fake provider's ``on_phase``: a job accepted (claimed) or executed (not committed)."""
        what = {"claimed": "accepted, not executed yet",
                "executed": "executed, result not committed"}.get(phase, phase)
        self.step("provider", f"provider {job_id} {what}")

    def hook(self, point, key, **context) -> None:
        """The runner's hook: only the naive state-file rewrite is a step of its own."""
        if point == "during_state_write":
            self.step("state", "state file truncated, rewrite in progress")


def _tear(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)  # what a kill mid-copy leaves behind


class TracedProvider:
    """The provider seen by the runner: each call that returns (or raises) is a step."""

    def __init__(self, provider, tracer: Tracer):
        self._provider, self._tracer = provider, tracer

    def __getattr__(self, name):
        return getattr(self._provider, name)

    def _call(self, what: str, method, *args, path=None):
        try:
            job = method(*args)
        except BaseException as exc:
            self._tracer.step("provider", f"{what} raised {type(exc).__name__}")
            raise
        status = "not found" if job is None else f"{job.job_id} {job.status.value}"
        self._tracer.step("provider" if path is None else "artifact",
                          f"{what} returned {status}" + (
                              f", artifact written to {Path(path).name}" if path else ""),
                          path)
        return job

    def _task(self, idem_key: str) -> str:
        task, _, attempt = idem_key.rpartition(":")
        return f"{self._tracer.name(task)}#{attempt}"

    def submit(self, idem_key, document_path, options, task_key=None):
        return self._call(f"submit {self._task(idem_key)}", self._provider.submit, idem_key,
                          document_path, options, task_key)

    def lookup(self, idem_key):
        return self._call(f"lookup {self._task(idem_key)}", self._provider.lookup, idem_key)

    def poll(self, job_id):
        return self._call(f"poll {job_id}", self._provider.poll, job_id)

    def fetch(self, job_id, dest_path):
        return self._call(f"fetch {job_id}", self._provider.fetch, job_id, dest_path,
                          path=dest_path)

    def cancel(self, job_id):
        return self._call(f"cancel {job_id}", self._provider.cancel, job_id)


def _watch_renames(tracer: Tracer, out_dir: Path) -> None:
    """A rename into the client's output (or checkpoint) folder is a step (this process only:
    we are a fork)."""
    real_replace = _REPLACE

    def replace(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        dst = Path(dst)
        if dst.parent == out_dir:
            tracer.step("artifact", f"artifact renamed into place: {dst.name}")
        elif dst.parent == out_dir / ".checkpoints":  # <task key>.<pages>.pdf
            key, _, pages = dst.stem.rpartition(".")
            tracer.step("artifact", f"checkpoint of {tracer.name(key)} renamed into place: "
                                    f"{int(pages)} page(s)")
    os.replace = replace


def _watch_fsyncs(tracer: Tracer, ledger_path: Path) -> None:
    """Power-loss mode: a ledger line written but not yet fsynced is a step; report synced sizes.

    The synced file is the JSONL file, or SQLite's WAL (``powerloss.synced_file``),
    which the ledger fsyncs with ``os.fsync``/``os.fdatasync`` itself."""
    from toolkit.explore.powerloss import synced_file

    ledger_path = synced_file(ledger_path)

    def is_ledger(fd) -> bool:
        try:
            mine, theirs = os.fstat(fd), os.stat(ledger_path)
        except OSError:
            return False
        return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)

    def watched(real):
        def sync(fd):
            if not is_ledger(fd):
                return real(fd)
            tracer.step("ledger", "ledger line written, fsync pending")
            real(fd)
            send(tracer.fd, t="sync", size=os.fstat(fd).st_size)
        return sync
    # The pristine calls, never an earlier wrapper: one process may run several batches.
    os.fsync, os.fdatasync = watched(_FSYNC), watched(_FDATASYNC)
    size = ledger_path.stat().st_size if ledger_path.exists() else 0
    send(tracer.fd, t="sync", size=size)  # what earlier runs left is taken as durable


def run_batch(fd: int, plan, paths: Paths, inputs, names, *, run: int, kill_at=None, how=KILL,
              record=False, snapshots=None) -> dict:
    """One run of the batch in this (forked) process; returns how it ended.

    With ``snapshots`` (a folder), the batch folder is copied there at every
    explored step (``snapshot.Recorder``); ``position`` in the result says if a
    copy names the folder it was recorded in.
    """
    from toolkit.ledger import open_ledger
    from toolkit.provider import FakeProvider
    from toolkit.runner import RetryPolicy
    from toolkit.runner.registry import open_strategy, resolve_strategy

    power_loss = plan.power_loss and run == 0
    tracer = Tracer(fd, names, kill_at=kill_at, how=how, record=record, acks=power_loss)
    _watch_renames(tracer, paths.out)
    if power_loss:
        _watch_fsyncs(tracer, paths.ledger)
    provider = FakeProvider(paths.provider_db, paths.provider_out, plan.contract_object(),
                            on_phase=tracer.on_phase)
    options = {"policy": RetryPolicy(base_delay=0.0, seed=run), "hook": tracer.hook,
               "sleep": lambda seconds: None}
    if plan.page_by_page_from is not None:
        options["page_by_page_from"] = plan.page_by_page_from
    traced = TracedProvider(provider, tracer)
    if plan.strategy == "rewrite-state":
        runner = open_strategy(plan.strategy, paths.ledger, traced, paths.out, **options)
    else:
        ledger = open_ledger(paths.ledger, **plan.ledger_options())
        runner = resolve_strategy(plan.strategy)(ledger, traced, paths.out, **options)
    if snapshots is not None:
        from toolkit.explore.snapshot import Recorder

        tracer.snapshot = Recorder(paths.root, snapshots, getattr(runner, "lease_ttl", 60.0) / 2,
                                   plan.every)
    if hasattr(runner.ledger, "on_event"):
        runner.ledger.on_event = tracer.on_event
        tracer.ledger = runner.ledger
    try:
        counts = runner.run(inputs)
    finally:
        runner.close()
        provider.close()
    return {"steps": tracer.n, "unsettled": runner.unsettled,
            "halted": getattr(runner, "halted", None), "counts": counts,
            "position": getattr(tracer.snapshot, "dependent", None)}


def _task(body, args, kwargs):
    """``body(fd, *args, **kwargs)`` as a ``pool`` task: what it returns arrives as the
    ``end`` message, an exception as an ``error`` message (and exit status 70)."""
    def task(fd: int) -> int:
        try:
            send(fd, t="end", **body(fd, *args, **kwargs))
        except BaseException as exc:  # whatever it is, the parent must hear of it
            try:
                send(fd, t="error", error=f"{type(exc).__name__}: {exc}",
                     traceback=traceback.format_exc()[-3000:])
            except BaseException:
                pass  # the parent sees exit status 70 with no message
            return pool.FAILED
        return 0
    return task


def _messages(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def run_here(body, *args, **kwargs) -> tuple[list[dict], int]:
    """Run ``body`` in this process, as ``fork`` runs it in a child; return (messages, status).

    For a crash point's supervisor, a fork of the exploring parent (see
    ``snapshot`` for what it may keep of the points it ran before). The
    messages go to a file, not a pipe (no reader while it runs): in memory
    (``memfd_create``) where the system has it, else a temporary file.
    """
    if hasattr(os, "memfd_create"):
        sink = open(os.memfd_create("explore-messages"), "w+b")  # close-on-exec
    else:
        import tempfile

        sink = tempfile.TemporaryFile()
    with sink:
        status = 0
        try:
            send(sink.fileno(), t="end", **body(sink.fileno(), *args, **kwargs))
        except Exception as exc:  # the caller must hear of it, as from a child
            status = pool.FAILED << 8  # as os.waitpid reports an exit status of 70
            send(sink.fileno(), t="error", error=f"{type(exc).__name__}: {exc}",
                 traceback=traceback.format_exc()[-3000:])
        sink.seek(0)
        return _messages(sink.read()), status


def fork(body, *args, **kwargs) -> tuple[list[dict], int]:
    """Run ``body`` in a forked child and wait; return its messages and its wait status."""
    data, status = pool.wait(*pool.start(_task(body, args, kwargs)))
    return _messages(data), status


def fork_meanwhile(meanwhile, body, *args, **kwargs) -> tuple[list[dict], int]:
    """``fork``, with ``meanwhile()`` run in this process while the child runs.

    The child's messages wait in its pipe meanwhile (a child with more to say than
    the pipe holds waits for us, then goes on). If ``meanwhile`` raises, the child
    is killed and reaped before the exception propagates.
    """
    pid, read_fd = pool.start(_task(body, args, kwargs))
    try:
        meanwhile()
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_fd)
        raise
    data, status = pool.wait(pid, read_fd)
    return _messages(data), status


def fork_many(calls, jobs: int, done=None) -> list[tuple[list[dict], int]]:
    """Run ``(body, args, kwargs)`` calls in up to ``jobs`` forked children at once (``pool``).

    Results come back in the order of ``calls``; ``done(index, result)`` is
    called as each child finishes.
    """
    results = [None] * len(calls)

    def reaped(index, result):
        results[index] = (_messages(result[0]), result[1])
        if done is not None:
            done(index, results[index])
    pool.run([_task(*call) for call in calls], jobs, reaped)
    return results


def fork_shared(calls, jobs: int, size: int, done=None) -> list[tuple[list[dict], int]]:
    """Like ``fork_many``, but each forked child runs up to ``size`` calls, one after another.

    Calls are dealt round-robin to ``ceil(len(calls) / size)`` children (early and
    late ones mixed: their costs differ). Each call's result is an ``end``
    message and its exception an ``error`` message, both tagged with the call's
    ``index``; a call that raised ends its child (the later ones of that child
    get no message, as from a child that died). Returns ``(messages, status)``
    per call, in the order of ``calls``; ``done(index, result)`` as each child is
    reaped, for each of its calls in order.
    """
    count = -(-len(calls) // max(1, size))
    groups = [list(range(first, len(calls), count)) for first in range(count)]

    def task(indices):
        def run(fd: int) -> int:
            for index in indices:
                body, args, kwargs = calls[index]
                try:
                    send(fd, t="end", index=index, **body(fd, *args, **kwargs))
                except BaseException as exc:  # the parent must hear of it, then we stop
                    try:
                        send(fd, t="error", index=index, error=f"{type(exc).__name__}: {exc}",
                             traceback=traceback.format_exc()[-3000:])
                    except BaseException:
                        pass
                    return pool.FAILED
            return 0
        return run

    results = [None] * len(calls)

    def reaped(group, result):
        messages = _messages(result[0])
        for index in groups[group]:
            results[index] = ([m for m in messages if m.get("index") == index], result[1])
            if done is not None:
                done(index, results[index])
    pool.run([task(indices) for indices in groups], jobs, reaped)
    return results


def killed_by_sigkill(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
