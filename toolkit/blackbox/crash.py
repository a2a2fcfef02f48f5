"""A real SIGKILL at every durable syscall of an unmodified program (``explore --command``).

1. **Record.** A clean run under ``strace -f -yy`` lists, per process in spawn
   order, its fsync, fdatasync, rename/renameat/renameat2, unlink/unlinkat,
   ``openat`` with ``O_TRUNC`` and write/pwrite64/ftruncate on files in the
   work folder, and its connects and sends to the provider. A crash point is
   (process, syscall, n): the n-th call of that syscall by that process,
   counted over all its calls of it, as strace's ``when=n`` counts.
2. **Crash.** For each point a fresh run is traced with
   ``-e inject=SYSCALL:signal=SIGSTOP:when=n``: strace stops the caller right
   after that call (it counts per process and would kill only the caller, so
   it stops it instead). The tracer sees "stopped by SIGSTOP" in strace's log
   and SIGKILLs the whole process group at once: the program, its children
   and strace itself. With several processes, the first to make its n-th call
   stops: the point is exact for one process, the first such moment otherwise.
3. **Rest and judge.** The program is rerun (untraced) until it rests, then
   judged by the black-box oracle: the provider's execution log and the outputs.
"""

import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from toolkit.errors import ToolkitError

SYSCALLS = ("fsync", "fdatasync", "rename", "renameat", "renameat2", "unlink", "unlinkat",
            "openat", "write", "pwrite64", "ftruncate", "connect", "sendto", "sendmsg")
_LINE = re.compile(r"^(\d+)\s+(\w+)\((.*)$")
_FD = re.compile(r"^(?:\d+|AT_FDCWD)<(TCP:\[[^\]]*\]|[^>]*)>")
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_PORT = re.compile(r"htons\((\d+)\)")


@dataclasses.dataclass(frozen=True)
class CrashPoint:
    process: int  # 1-based, in order of first appearance in the trace (spawn order)
    syscall: str
    count: int  # the n-th call of ``syscall`` by that process (strace's when=n)
    target: str  # the file (relative to the work folder) or "provider"

    @property
    def label(self) -> str:
        return f"process {self.process} {self.syscall}#{self.count} {self.target}"


def need_strace() -> str:
    """The path of strace, or a one-line ToolkitError."""
    path = shutil.which("strace")
    if path is None:
        raise ToolkitError("explore --command needs strace (Debian package 'strace')")
    return path


def _target(syscall: str, args: str, work: str, port: int) -> str | None:
    """What a traced call makes durable, relative to the work folder; None if nothing."""
    fd = _FD.match(args)
    decorated = fd.group(1) if fd else ""
    if syscall in ("connect",):
        ports = _PORT.findall(args)
        return "provider" if ports and int(ports[0]) == port else None
    if decorated.startswith("TCP:"):
        return "provider" if decorated.endswith(f":{port}]") and syscall in (
            "write", "sendto", "sendmsg") else None
    if syscall in ("write", "pwrite64", "ftruncate", "fsync", "fdatasync"):
        return os.path.relpath(decorated, work) if decorated.startswith(work + "/") else None
    if syscall == "openat" and "O_TRUNC" not in args:
        return None
    base = decorated or os.path.join(work, "work")  # no dirfd: relative to the program's folder
    for raw in _STRING.findall(args):
        path = os.path.normpath(os.path.join(base, raw))
        if path.startswith(work + "/"):
            return os.path.relpath(path, work)
    return None


def durable_points(log_text: str, work: str, port: int) -> list[CrashPoint]:
    """Crash points of a recorded trace, per process in order of first appearance."""
    order, counts, points = {}, {}, []
    for line in log_text.splitlines():
        match = _LINE.match(line)
        if not match or "resumed>" in line:
            continue
        pid, syscall, args = match.groups()
        if syscall not in SYSCALLS:
            continue
        process = order.setdefault(pid, len(order) + 1)
        n = counts[(pid, syscall)] = counts.get((pid, syscall), 0) + 1
        target = _target(syscall, args, work, port)
        if target is not None:
            points.append(CrashPoint(process, syscall, n, target))
    # strace counts when=n in every process: a (syscall, n) shared by several processes
    # stops the first to reach it, so it is one point, named after the first process.
    seen, unique = set(), []
    for point in points:
        if (point.syscall, point.count) not in seen:
            seen.add((point.syscall, point.count))
            unique.append(point)
    return unique


def traced(strace: str, log: Path, command: str, trace=SYSCALLS, inject=None) -> list[str]:
    # -q, not -qq: the log names each process's exit ("PID +++ exited with N +++"), so the
    # run ends when its main process does (``run_until_stop``), not when its last child does.
    argv = [strace, "-f", "-q", "-yy", "-s", "64", "-o", str(log),
            "-e", f"trace={','.join(trace)}"]
    if inject is not None:
        argv += ["-e", f"inject={inject.syscall}:signal=SIGSTOP:when={inject.count}"]
    return [*argv, "--", "/bin/sh", "-c", command]


def run_until_stop(argv, cwd, env, log: Path, timeout: float) -> str:
    """Run the traced command in its own process group; SIGKILL the group when it stops.

    Returns (outcome, exit code): ``killed`` (stopped at the point and killed),
    ``finished`` (it never reached the point: its main process exited, with that code;
    what it left running in the background is killed then, as the drill kills it after
    each run, since ``strace -f`` would wait for it) or ``timeout`` (killed after
    ``timeout`` seconds); the code is None unless finished.
    """
    import psutil

    from toolkit.blackbox.procs import kill_group, kill_strays

    before = {child.pid for child in psutil.Process().children(recursive=True)}
    deadline, outcome, proc, main, code = time.monotonic() + timeout, "finished", None, None, None
    try:  # Popen inside: a SIGTERM landing before it returns still reaches kill_strays
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        while proc.poll() is None:
            if main is None:  # strace's child once it has exec'd the shell (strace forks a
                with contextlib.suppress(psutil.Error):  # short-lived probe of its own first)
                    tracer = psutil.Process(proc.pid)
                    main = next((child for child in tracer.children()
                                 if child.name() != tracer.name()), None)
            text = log.read_text(errors="replace") if log.exists() else ""
            if "--- stopped by SIGSTOP ---" in text:
                outcome = "killed"
                break
            ended = main is not None and re.search(
                rf"^{main.pid}\s+\+\+\+ (?:exited with (\d+)|killed by (SIG\w+)).* \+\+\+$",
                text, re.M)
            if ended:  # the shell's code, as strace would pass it on (-N: killed by signal N)
                code = int(ended.group(1)) if ended.group(1) else \
                    -int(getattr(signal, ended.group(2), 0))
                break
            if time.monotonic() > deadline:
                outcome = "timeout"
                break
            time.sleep(0.005)
    finally:
        if proc is not None:
            kill_group(proc.pid)  # program, children and strace at once
        kill_strays(keep=before)  # and whatever left the group (setsid): we are its reaper
        if proc is not None:
            returned = proc.wait()
            code = returned if code is None and outcome == "finished" else code
    return outcome, (code if outcome == "finished" else None)


def stopped_at(log_text: str, work: str, port: int) -> str | None:
    """What the call that strace stopped made durable, read back from its log (the truth)."""
    lines = log_text.splitlines()
    for i, line in enumerate(lines):
        if line.endswith("--- stopped by SIGSTOP ---"):
            pid = line.split()[0]
            for before in reversed(lines[:i]):
                match = _LINE.match(before)
                if match and match.group(1) == pid and match.group(2) in SYSCALLS:
                    target = _target(match.group(2), match.group(3), work, port)
                    return target or f"{match.group(2)} elsewhere (not durable)"
    return None


@dataclasses.dataclass(frozen=True)
class PointResult:
    point: CrashPoint | None  # None: the clean recording run
    outcome: str
    result: object  # blackbox.BlackboxResult-like: status, findings, runs, rested
    hit: str | None = None  # what the stopped call really touched (another process may be first)

    def row(self) -> dict:
        point = self.point
        return {"point": point.label if point else "(clean run)",
                "process": point and point.process, "syscall": point and point.syscall,
                "count": point and point.count, "target": point and point.target,
                "outcome": self.outcome, "hit": self.hit, **{k: v for k, v in self.result.row().items()
                                           if k in ("status", "runs", "rested", "exit_codes",
                                                    "executions", "findings")}}


def explore_command(command: str, inputs_dir, contract: str = "idempotent",
                    max_points: int | None = None, progress=None,
                    select=None, counts=None) -> list[PointResult]:
    """Record the durable syscalls of a clean run, then crash a fresh run at each one.

    ``select(point) -> bool`` keeps only some points (after the recording);
    ``counts`` (a dict), if given, receives ``recorded`` and ``selected`` point totals,
    so a caller can say when ``max_points`` cut the exploration short.
    """
    from toolkit.blackbox.procs import guarded

    with guarded():
        return _explore(command, inputs_dir, contract, max_points, progress, select,
                        {} if counts is None else counts)


def _explore(command, inputs_dir, contract, max_points, progress, select, counts):
    strace = need_strace()
    from toolkit.blackbox import input_pdfs

    from toolkit.blackbox.procs import owned_scratch

    sources = input_pdfs(inputs_dir)
    # Named by this process, as the drill's (``owned_scratch``): after a kill -9 the next
    # drill or explore kills what the program left running there and removes it.
    with owned_scratch("blackbox", suffix="-explore") as tmp:
        clean, points = _one(strace, command, sources, contract, Path(tmp) / "record", None)
    results = [clean]
    if progress is not None:
        progress(clean)
    chosen = [point for point in points if select is None or select(point)]
    counts.update(recorded=len(points), selected=len(chosen))
    for point in chosen[:max_points]:
        with owned_scratch("blackbox", suffix="-explore") as tmp:
            results.append(_one(strace, command, sources, contract, Path(tmp) / "p", point)[0])
        if progress is not None:
            progress(results[-1])
    return results


def _one(strace, command, sources, contract, work, point):
    """One run (recording, or crashed at ``point``), rerun to rest, judged."""
    from toolkit.blackbox import (RUN_TIMEOUT, SCENARIOS, BlackboxResult, RunRecord,
                                  drill_records, environment, prepare, rerun_to_rest)
    from toolkit.blackbox.oracle import judge
    from toolkit.provider.client import HttpProvider, ServiceProcess

    inputs, out, folder = prepare(work, sources)
    runs, starts, found = [], [], []
    with drill_records() as records, ServiceProcess(
            records / "provider.db", records / "provider-jobs", contract) as service:
        env = environment(service.url, inputs, out)
        provider = HttpProvider(service.url)
        try:
            log = work / "trace.log"
            argv = traced(strace, log, command, (point.syscall,) if point else SYSCALLS, point)
            starts.append(time.time())
            outcome, code = run_until_stop(argv, folder, env, log, RUN_TIMEOUT)
            runs.append(RunRecord(1, code, len(provider.calls()), outcome))
            port = int(service.url.rpartition(":")[2])
            if point is None:
                found = durable_points(log.read_text(errors="replace"), str(work), port)
            hit = stopped_at(log.read_text(errors="replace"), str(work), port) if point else None
            rested = rerun_to_rest(command, folder, env, provider, work, runs, starts, first=2)
            executions = len(provider.executions())
        finally:
            provider.close()
        findings = judge(inputs, out, records / "provider.db", starts, rested)
    result = BlackboxResult(SCENARIOS["clean"], contract, tuple(runs), rested, executions,
                            tuple(findings), {})
    return PointResult(point, outcome, result, hit), found
