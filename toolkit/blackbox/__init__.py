"""Drill an unmodified program, in any language, against the provider service.

For each scenario the toolkit makes a fresh work folder with a copy of the
inputs, starts ``serve-provider`` on a free loopback port with the
scenario's contract and service faults, and runs the command through the
shell in that folder with ``TOOLKIT_PROVIDER_URL``, ``TOOLKIT_INPUTS`` and
``TOOLKIT_OUT`` set. It reruns the command until it rests (exit 0, then a
further run that makes no provider call), at most ``MAX_RUNS`` times: a
program that never rests is a finding. The oracle (``oracle.judge``) reads
the provider's own records and the outputs; the program needs no change.
"""

import dataclasses
import os
import shutil
import subprocess
import time
from pathlib import Path

from toolkit.errors import ToolkitError
from toolkit.provider.wire import ServiceFaults

MAX_RUNS = 4
RUN_TIMEOUT = 60.0  # default seconds one run may take before its group is killed (--run-timeout)
DROP = ServiceFaults(drop_submits=1)


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    contract: str = ""  # contract parts added to the drill's base contract
    faults: ServiceFaults = ServiceFaults()
    may_not_rest: bool = False  # nothing can resolve it: unresolved, exiting non-zero, is correct


SCENARIOS = {s.name: s for s in (
    Scenario("clean", "no fault: every healthy input delivered, nothing executed twice"),
    Scenario("lost-reply", "the submit is accepted and runs on; the connection drops with no "
             "reply", faults=DROP),
    Scenario("cut-download", "the first artifact download stops halfway (full Content-Length)",
             faults=ServiceFaults(cut_fetches=1)),
    # The first submit is always refused: a seeded rate alone may refuse none of a small
    # batch's submits, and a storm that never blew proves nothing (``fault_fired``).
    Scenario("503-storm", "the first submit and then half the submits are refused with 503 "
             "(nothing accepted)", contract="transient=0.5",
             faults=ServiceFaults(refuse_submits=1)),
    Scenario("lookup-lag", "a lost reply, and a new job is invisible to its first two lookups",
             contract="lag=2", faults=DROP),
    Scenario("lookup-unavailable", "a lost reply, and every lookup answers 503",
             contract="unavailable", faults=DROP, may_not_rest=True),
    Scenario("active-conflict", "a lost reply while the job still runs; its key again is a 409",
             contract="conflict,run-polls=2", faults=DROP),
)}


@dataclasses.dataclass(frozen=True)
class RunRecord:
    run: int
    exit_code: int | None  # None: cut (its group killed) after the run timeout
    provider_calls: int
    stderr_tail: str


@dataclasses.dataclass(frozen=True)
class BlackboxResult:
    scenario: Scenario
    contract: str
    runs: tuple[RunRecord, ...]
    rested: bool
    executions: int
    findings: tuple
    faults_fired: dict

    @property
    def fault_fired(self) -> bool:
        wanted = {k for k, v in dataclasses.asdict(self.scenario.faults).items()
                  if isinstance(v, int) and v and k != "slow_seconds"}
        return all(self.faults_fired.get(k) for k in wanted)

    @property
    def status(self) -> str:
        unsafe = [f for f in self.findings if f.kind != "unresolved"]
        if unsafe:
            return "INVALID"
        if not self.fault_fired:
            return "inconclusive"
        if not self.rested and not self._may_stay_unresolved:
            return "never rests"
        return "valid"

    @property
    def _may_stay_unresolved(self) -> bool:
        """Not resting is legitimate only where the fault makes resting impossible (lookups
        down for good: a lost reply can never be resolved) *and* the program says it is not
        done: its last run exited non-zero (a run cut at the timeout says nothing)."""
        said = bool(self.runs) and self.runs[-1].exit_code not in (0, None)
        return self.scenario.may_not_rest and said

    def row(self) -> dict:
        return {"scenario": self.scenario.name, "contract": self.contract,
                "runs": len(self.runs), "rested": self.rested, "executions": self.executions,
                "exit_codes": [r.exit_code for r in self.runs], "status": self.status,
                "run_output": [{"run": r.run, "exit_code": r.exit_code,
                                "provider_calls": r.provider_calls, "last_lines": r.stderr_tail}
                               for r in self.runs],
                "findings": [dataclasses.asdict(f) for f in self.findings],
                "faults_fired": self.faults_fired}


def _spec(base: str, extra: str) -> str:
    return ",".join(part for part in (base, extra) if part)


def run_scenario(command: str, inputs_dir, scenario: Scenario, contract: str = "non-idempotent",
                 workdir=None, run_timeout: float = RUN_TIMEOUT) -> BlackboxResult:
    """Run ``command`` to rest under ``scenario`` and judge it.

    Raises:
        ToolkitError: the inputs folder has no PDF, or the service does not start.
    """
    from toolkit.blackbox.oracle import judge
    from toolkit.provider import parse_contract
    from toolkit.provider.client import HttpProvider, ServiceProcess

    sources = input_pdfs(inputs_dir)
    spec = _spec(contract, scenario.contract)
    parse_contract(spec)  # a bad contract is one line, before any work
    if workdir is None:
        from toolkit.blackbox.procs import guarded, owned_scratch

        with guarded(), owned_scratch("blackbox", suffix=f"-{scenario.name}") as tmp:
            return run_scenario(command, inputs_dir, scenario, contract, tmp, run_timeout)
    work = Path(workdir)
    inputs, out, folder = prepare(work, sources)
    runs, starts = [], []
    with drill_records() as records, ServiceProcess(
            records / "provider.db", records / "provider-jobs", spec,
            faults=scenario.faults) as service:
        provider = HttpProvider(service.url)
        try:
            rested = rerun_to_rest(command, folder, environment(service.url, inputs, out),
                                   provider, work, runs, starts, timeout=run_timeout)
            fired = provider.faults_fired()
            executions = len(provider.executions())
        finally:
            provider.close()
        findings = judge(inputs, out, records / "provider.db", starts, rested)
    findings += cut_runs(runs, run_timeout)
    return BlackboxResult(scenario, spec, tuple(runs), rested, executions, tuple(findings), fired)


def drill_records():
    """A private folder for the service's database and job files, removed after the
    service is dead (``procs.owned_scratch``): never beside the program's work folder,
    where a program's ``rm -f ../*`` or a cleanup of its parent would reach the very
    records that judge it."""
    from toolkit.blackbox.procs import owned_scratch

    return owned_scratch("drill-records")


def input_pdfs(inputs_dir) -> list[Path]:
    """The ``*.pdf`` files of the inputs folder, at least one of them a readable PDF.

    Raises:
        ToolkitError: one line: no ``*.pdf`` file, or none passes preflight (nothing to drill).
    """
    from toolkit import documents

    sources = sorted(Path(inputs_dir).glob("*.pdf")) if Path(inputs_dir).is_dir() else []
    if not sources:
        raise ToolkitError(f"no PDF files in {str(inputs_dir)!r}")
    if not any(documents.preflight(path).ok for path in sources):
        raise ToolkitError(f"no input in {str(inputs_dir)!r} is a readable PDF (all "
                           f"{len(sources)} fail preflight): nothing to drill")
    return sources


def cut_runs(runs, timeout: float) -> list:
    """One ``never_finishes`` finding if a run was cut at the timeout (reruns stop there)."""
    from toolkit.blackbox.oracle import Finding

    cut = [record.run for record in runs if record.exit_code is None]
    if not cut:
        return []
    return [Finding("never_finishes", None, f"run {cut[0]} did not finish within {timeout:g} s "
                    "(--run-timeout); its process group was killed and it was not rerun")]


def prepare(work: Path, sources) -> tuple[Path, Path, Path]:
    """A fresh work folder: a copy of the inputs, an empty output folder, the program's folder."""
    inputs, out, folder = work / "inputs", work / "out", work / "work"
    for path in (inputs, out, folder):
        path.mkdir(parents=True, exist_ok=True)
    for source in sources:
        shutil.copy2(source, inputs / source.name)
    return inputs, out, folder


def environment(url, inputs, out) -> dict:
    return {**os.environ, "TOOLKIT_PROVIDER_URL": url, "TOOLKIT_INPUTS": str(inputs),
            "TOOLKIT_OUT": str(out)}


def rerun_to_rest(command, folder, env, provider, work, runs, starts, first=1,
                  timeout: float = RUN_TIMEOUT) -> bool:
    """Run ``command`` until it rests: exit 0, then a run with exit 0 and no provider call.

    ``runs`` and ``starts`` are extended (runs before ``first`` were done by the caller).
    Returns whether it rested within ``MAX_RUNS`` runs in all. A run cut at ``timeout``
    ends the reruns: a program that hangs once will hang again, and each rerun costs the
    whole timeout.
    """
    rested = False
    for run in range(first, MAX_RUNS + 1):
        before = len(provider.calls())
        starts.append(time.time())
        code, tail = run_command(command, folder, env, work / f"run-{run}.log", timeout)
        made = len(provider.calls()) - before
        runs.append(RunRecord(run, code, made, tail))
        if code is None:
            break
        if code == 0 and made == 0 and len(runs) > 1 and runs[-2].exit_code == 0:
            rested = True
            break
    _settle(provider)
    return rested


def run_command(command: str, cwd, env, log_path,
                timeout: float = RUN_TIMEOUT) -> tuple[int | None, str]:
    """Run ``command`` through the shell in its own process group; kill the group on timeout."""
    import psutil

    from toolkit.blackbox.procs import kill_group, kill_strays

    # What runs before the program (the provider service) is spared; everything the
    # program started is killed once it exits, is cut, or the drill is interrupted.
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    code, proc = None, None
    with open(log_path, "wb") as log:
        # Popen is inside the try: a SIGTERM that lands after the fork but before Popen
        # returns leaves no handle, yet kill_strays still finds the program as our child.
        try:
            proc = subprocess.Popen(command, shell=True, cwd=cwd, env=env,
                                    stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            if proc is not None:
                kill_group(proc.pid)  # the whole group: `cmd &` and nohup children stay in it
            kill_strays(keep=before)  # setsid children left the group; we are their reaper
            if proc is not None:
                proc.wait()
    lines = Path(log_path).read_text(errors="replace").strip().splitlines()
    return code, " | ".join(lines[-2:])


def _settle(provider, seconds: float = 3.0) -> None:
    """Let any job still running at the service finish: an abandoned job bills too."""
    from toolkit.provider import ACTIVE

    deadline = time.monotonic() + seconds
    while any(job.status in ACTIVE for job in provider.jobs()) and time.monotonic() < deadline:
        time.sleep(0.05)


def run_all(command: str, inputs_dir, contract: str = "non-idempotent", names=None,
            progress=None, run_timeout: float = RUN_TIMEOUT) -> list[BlackboxResult]:
    """Every scenario (or the named ones), in order."""
    chosen = list(SCENARIOS) if names is None else names
    unknown = [name for name in chosen if name not in SCENARIOS]
    if unknown:
        raise ToolkitError(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    results = []
    for name in chosen:
        results.append(run_scenario(command, inputs_dir, SCENARIOS[name], contract,
                                    run_timeout=run_timeout))
        if progress is not None:
            progress(results[-1])
    return results
