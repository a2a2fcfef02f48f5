"""A drilled program's processes never outlive the drill: daemonized children, SIGTERM.

Real processes only: a script that daemonizes with ``setsid`` and ``nohup``,
and a real SIGTERM sent to a real ``drill --command`` process.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from toolkit.blackbox import SCENARIOS, run_scenario

ROOT = Path(__file__).resolve().parents[1]
CAREFUL = f"{sys.executable} {ROOT / 'examples/blackbox/careful_batch.py'}"

pytestmark = pytest.mark.slow


def _with_marker(marker: str):
    return [p for p in psutil.process_iter(["cmdline"])
            if marker in " ".join(p.info["cmdline"] or [])]


def _dead(pid: int) -> bool:
    """Gone, or a zombie: killed and waiting for its reaper (the drill's orphans are
    reparented to PID 1, which in some sandboxes reaps late; a zombie runs nothing)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _all_dead(pids: list, polls: int = 100) -> list:
    """The pids still alive after a bounded wait (no timing asserted)."""
    for _ in range(polls):
        alive = [pid for pid in pids if not _dead(pid)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def test_daemonized_children_of_the_program_are_killed_after_every_run(inputs, tmp_path):
    """Fault: the program leaves background children (``setsid sleep &`` leaves its process
    group, ``nohup sleep &`` stays in it) and exits. Property: after the drill no process
    the program started is alive (the drill is their subreaper and kills them per run)."""
    marker = f"{os.getpid() % 9000 + 1000}.{len(str(tmp_path))}"
    script = tmp_path / "daemon.sh"
    script.write_text("#!/bin/bash\n"
                      f"setsid sleep 7{marker} </dev/null >/dev/null 2>&1 &\n"
                      f"nohup sleep 8{marker} </dev/null >/dev/null 2>&1 &\n"
                      f"exec {CAREFUL}\n")
    result = run_scenario(f"bash {script}", inputs, SCENARIOS["clean"], "idempotent")
    assert result.status == "valid" and len(result.runs) >= 2
    strays = _with_marker(f"sleep 7{marker}") + _with_marker(f"sleep 8{marker}")
    for stray in strays:  # do not leave them behind even when the test fails
        stray.kill()
    assert strays == []


def test_sigterm_to_the_drill_stops_the_service_the_program_and_removes_its_folder(inputs,
                                                                                  tmp_path):
    """Fault: CI's timeout sends SIGTERM to ``drill --command`` while the program runs.
    Property: the drill exits 130 with one line; the program, its group and the
    provider service are gone, and the drill's temp folder is removed."""
    pid_file, temp = tmp_path / "program.pid", tmp_path / "tmp"
    temp.mkdir()
    command = f"echo $$ > {pid_file}; exec sleep 600"
    drill = subprocess.Popen([sys.executable, "-m", "toolkit", "drill", "clean", "--command",
                              command, "--inputs", str(inputs)], cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**os.environ, "TMPDIR": str(temp)})
    for _ in range(600):  # the program has started (bounded wait, no timing asserted)
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.1)
    program = int(pid_file.read_text())
    family = psutil.Process(drill.pid).children(recursive=True)
    assert any("serve-provider" in " ".join(p.cmdline()) for p in family)
    drill.send_signal(signal.SIGTERM)
    out, err = drill.communicate(timeout=60)
    assert drill.returncode == 130, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    alive = _all_dead([p.pid for p in family] + [program])
    for pid in alive:  # do not leave them behind even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert alive == []
    assert list(temp.iterdir()) == []


_SIGTERM_INSIDE_POPEN = """
import os, signal, subprocess, sys, time
from pathlib import Path
from toolkit import blackbox
from toolkit.blackbox.procs import guarded

pid_file, real_popen = Path(sys.argv[1]), subprocess.Popen

def popen_then_sigterm(*args, **kwargs):
    real_popen(*args, **kwargs)  # the program runs; the handle is never returned
    for _ in range(600):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)  # guarded() turns it into KeyboardInterrupt here
    time.sleep(5)
    raise SystemExit("SIGTERM was not delivered")

subprocess.Popen = popen_then_sigterm
with guarded():
    try:
        blackbox.run_command(f"echo $$ > {pid_file}; exec sleep 600", ".", None, sys.argv[2])
    except KeyboardInterrupt:
        sys.exit(130)
"""


def test_sigterm_landing_inside_popen_still_kills_the_program(tmp_path):
    """Fault: a real SIGTERM reaches the drill after it forked the program but before
    ``Popen`` returned the handle (a loaded machine deschedules the drill right there).
    Property: the drill is interrupted and the program, which it holds no handle to,
    is killed anyway (it is the drill's child: ``kill_strays`` finds it)."""
    pid_file = tmp_path / "program.pid"
    done = subprocess.run([sys.executable, "-c", _SIGTERM_INSIDE_POPEN, str(pid_file),
                           str(tmp_path / "run.log")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    program = int(pid_file.read_text())
    alive = _all_dead([program])
    for pid in alive:  # do not leave it behind even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert alive == []


def test_a_program_that_does_nothing_loses_every_input_and_fails_the_clean_drill(inputs):
    """Fault: none (clean) or 503s; the program is ``true``: it exits 0 without sending
    anything. Property: every healthy input is ``never_processed`` (lost work, unsafe), not
    parked, and ``drill --command true`` exits 1."""
    for name in ("clean", "503-storm"):
        result = run_scenario("true", inputs, SCENARIOS[name])
        assert result.status == "INVALID" and result.executions == 0
        assert {f.kind for f in result.findings} == {"never_processed"}
    cli = subprocess.run([sys.executable, "-m", "toolkit", "drill", "clean", "--command", "true",
                          "--inputs", str(inputs)], capture_output=True, text=True, cwd=ROOT)
    assert cli.returncode == 1, cli.stdout + cli.stderr


def test_never_resting_under_lookups_down_passes_only_when_the_program_says_it_is_not_done(
        inputs, tmp_path):
    """Fault: a lost reply and every lookup 503 (resting is impossible for a careful
    program). Property: a program that never rests yet exits 0 every run (it says "done")
    is ``never rests``; only a non-zero exit (it says "run again") makes it legitimate."""
    script = tmp_path / "resubmits_quietly.sh"  # sends the input every run, always exit 0
    script.write_text(f"{CAREFUL} || true\n")
    quiet = run_scenario(f"bash {script}", inputs, SCENARIOS["lookup-unavailable"])
    assert not quiet.rested and quiet.status == "never rests", quiet.row()
    honest = run_scenario(CAREFUL, inputs, SCENARIOS["lookup-unavailable"])
    assert not honest.rested and honest.status == "valid", honest.row()


def test_every_blackbox_finding_carries_its_remedy_and_the_documents_witness_calls(
        inputs, tmp_path):
    """Fault: the program delivers, then tears its output to a half file and rests (a
    download written in place, cut). Property: the fake-done finding names a remedy from the
    one remedy table and lists the provider's records for that document (its execution and
    its fetch), in the JSON row too."""
    from toolkit.checker.findings import REMEDY

    script = tmp_path / "tears_output.sh"
    script.write_text("if [ ! -e torn ]; then\n"
                      f"  {CAREFUL} || exit 1\n"
                      '  for f in "$TOOLKIT_OUT"/*; do head -c 100 "$f" > t && mv t "$f"; done\n'
                      "  touch torn\n"
                      "fi\n")
    result = run_scenario(f"bash {script}", inputs, SCENARIOS["clean"])
    assert result.findings and all(f.remedy == REMEDY[f.kind] for f in result.findings)
    fake = [f for f in result.findings if f.kind == "fake_done"]
    assert fake and all(f.witnesses for f in fake), result.row()
    whats = " ".join(w["what"] for w in fake[0].witnesses)
    assert "execution succeeded" in whats and "fetch" in whats, whats
    row = result.row()["findings"][0]
    assert row["remedy"] == REMEDY[row["kind"]] and row["witnesses"]


def test_a_hanging_program_is_cut_once_at_the_run_timeout_as_never_finishes(inputs):
    """Fault: the program hangs (``sleep``). Property: its run is cut at ``--run-timeout``,
    it is not rerun (one cut per scenario, not one per rerun), and the scenario fails with
    the finding ``never_finishes``; the CLI exits 1."""
    result = run_scenario("sleep 600", inputs, SCENARIOS["clean"], run_timeout=1.0)
    assert [run.exit_code for run in result.runs] == [None]
    assert "never_finishes" in {f.kind for f in result.findings}
    assert result.status == "INVALID"
    cli = subprocess.run([sys.executable, "-m", "toolkit", "drill", "clean", "--command",
                          "sleep 600", "--inputs", str(inputs), "--run-timeout", "1", "--json"],
                         capture_output=True, text=True, cwd=ROOT)
    assert cli.returncode == 1, cli.stderr
    assert "never_finishes" in cli.stdout


def test_a_failing_runs_last_lines_are_shown_and_kept_in_the_json_report(inputs):
    """Fault: the program fails every run with a message on stderr. Property: the text report
    prints its last lines, and each run's last lines are in the JSON row."""
    command = "echo 'cannot reach the bucket' >&2; exit 3"
    text = subprocess.run([sys.executable, "-m", "toolkit", "drill", "clean", "--command",
                           command, "--inputs", str(inputs)], capture_output=True, text=True,
                          cwd=ROOT)
    assert text.returncode == 1 and "cannot reach the bucket" in text.stdout
    data = subprocess.run([sys.executable, "-m", "toolkit", "drill", "clean", "--command",
                           command, "--inputs", str(inputs), "--json"], capture_output=True,
                          text=True, cwd=ROOT)
    (row,) = __import__("json").loads(data.stdout)
    assert all(run["last_lines"] == "cannot reach the bucket" for run in row["run_output"])


def test_an_inputs_folder_with_no_readable_pdf_is_a_one_line_error(tmp_path):
    """Fault: the inputs folder holds only a file named .pdf that is not a PDF. Property:
    one line on stderr and exit 2, not a ``valid`` row with nothing executed."""
    (tmp_path / "a.pdf").write_text("hello\n")
    cli = subprocess.run([sys.executable, "-m", "toolkit", "drill", "clean", "--command", "true",
                          "--inputs", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert cli.returncode == 2 and cli.stderr.count("\n") == 1 and "readable PDF" in cli.stderr


def test_explore_command_says_when_max_points_cut_it_short(inputs, tmp_path):
    """Fault: none; ``--max-points 1`` on a program with several durable writes. Property:
    the report says how many points were recorded and how many explored."""
    command = "for i in 1 2 3; do echo $i > f$i; done"
    cli = subprocess.run([sys.executable, "-m", "toolkit", "explore", "--command", command,
                          "--inputs", str(inputs), "--max-points", "1", "--json"],
                         capture_output=True, text=True, cwd=ROOT)
    total = __import__("json").loads(cli.stdout)["total"]
    assert total["points"] == 1 and total["points_recorded"] > 1, total
