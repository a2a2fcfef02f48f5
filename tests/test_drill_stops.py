"""``drill --command`` stopped by a real SIGTERM, SIGINT or SIGKILL leaves nothing behind.

Real processes and real signals, each sent at a moment the test observes (never after a
sleep): while the command line is still imported (the stop signals held, read from
``/proc/<pid>/status``) and while the service starts (frozen there by a real SIGSTOP);
a SIGKILL while the program runs with a ``setsid`` daemon and a plain background child.
(A stop while the program runs: ``test_blackbox_procs``.)
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
CAREFUL = f"{sys.executable} {ROOT / 'examples/blackbox/careful_batch.py'}"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, subreaper")]


def _until(found, polls: int = 6000, pause: float = 0.005):
    """``found()``'s first truthy value (bounded wait; no timing asserted)."""
    for _ in range(polls):
        value = found()
        if value:
            return value
        time.sleep(pause)
    raise AssertionError(f"never happened: {found.__doc__}")


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _still_alive(pids) -> list:
    """The pids alive after a bounded wait; those are killed here (never left behind)."""
    try:
        _until(lambda: all(_dead(pid) for pid in pids), polls=200, pause=0.05)
        return []
    except AssertionError:
        alive = [pid for pid in pids if not _dead(pid)]
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
        return alive


def _program(tmp_path) -> str:
    """The outsider's program: a ``setsid`` daemon, a background child, then the batch;
    each writes its pid to ``pids`` (one line each)."""
    script = tmp_path / "program.sh"
    script.write_text("#!/bin/bash\n"
                      f"(setsid bash -c 'echo $$ >> {tmp_path}/pids; exec sleep 600' &)\n"
                      f"bash -c 'echo $$ >> {tmp_path}/pids; exec sleep 600' &\n"
                      f"echo $$ >> {tmp_path}/pids\n"
                      f"exec {CAREFUL}\n")
    script.chmod(0o755)
    return str(script)


def _drill(tmp_path, inputs, command, name="all") -> subprocess.Popen:
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "toolkit", "drill", name, "--command", command,
                             "--inputs", str(inputs)], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TMPDIR": str(temp)})


def _service_of(drill_pid: int):
    """The drill's ``serve-provider`` child, once it exists."""
    for child in psutil.Process(drill_pid).children():
        try:
            if "serve-provider" in child.cmdline():
                return child
        except psutil.Error:
            continue
    return None


def _holds_stop_signals(pid: int) -> bool:
    """The process blocks SIGINT and SIGTERM (``/proc/<pid>/status``, SigBlk)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            mask = int(line.split()[1], 16)
            return all(mask >> (s - 1) & 1 for s in (signal.SIGINT, signal.SIGTERM))
    return False


def _pids(tmp_path) -> list[int]:
    path = tmp_path / "pids"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _assert_stopped_clean(drill, tmp_path, family):
    out, err = drill.communicate(timeout=120)
    alive = _still_alive(family + _pids(tmp_path))
    assert drill.returncode == 130, err
    assert err.strip() == "interrupted", err  # one line, never a traceback
    assert alive == []
    assert sorted(os.listdir(tmp_path / "tmp")) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_while_the_command_line_imports_is_one_line_exit_130(
        signum, inputs, tmp_path):
    """Fault: SIGTERM or Ctrl-C reaches ``drill --command`` while ``python -m toolkit``
    still imports its command line (the signals held by ``__main__``). Property: exit 130
    with the one line ``interrupted``: not a KeyboardInterrupt traceback from letting the
    signals in, not a death by SIGTERM's default (143)."""
    drill = _drill(tmp_path, inputs, "true")
    _until(lambda: _holds_stop_signals(drill.pid))
    drill.send_signal(signum)
    _assert_stopped_clean(drill, tmp_path, [])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_while_the_service_starts_kills_it_before_the_folders_go(
        signum, inputs, tmp_path):
    """Fault: SIGTERM or Ctrl-C reaches the drill while its provider service starts (the
    service frozen by a real SIGSTOP before it reports its URL). Property: exit 130, one
    line; the service is dead (it ran on before: its stop was never reached) and no
    ``drill-records-*`` or ``blackbox-*`` folder stays in TMPDIR."""
    drill = _drill(tmp_path, inputs, _program(tmp_path))
    service = _until(lambda: _service_of(drill.pid))
    service.send_signal(signal.SIGSTOP)
    drill.send_signal(signum)
    _assert_stopped_clean(drill, tmp_path, [service.pid])


def test_sigkill_of_the_drill_takes_its_service_and_the_next_drill_sweeps_only_what_it_started(
        inputs, tmp_path):
    """Fault: ``kill -9`` of the drill while the program runs (no handler, no cleanup).
    Property: the provider service dies with the drill (its stdin pipe reaches EOF); the
    program's processes, which nothing can reach then, and the dead drill's folders are
    removed by the next drill, which kills what still works inside them first; a
    bystander of ours that merely names the dead folder (a user's viewer on a file in it,
    standing in it, given ``TOOLKIT_INPUTS`` there by hand: outsider o43 F2) lives on: the
    sweep kills by the drill's marks (both variables it sets), never by a name."""
    drill = _drill(tmp_path, inputs, _program(tmp_path))
    _until(lambda: len(_pids(tmp_path)) == 3)
    service = _service_of(drill.pid)
    drill.kill()
    drill.communicate(timeout=60)
    service_alive = _still_alive([service.pid])
    [dead] = [path for path in (tmp_path / "tmp").iterdir() if path.name.startswith("blackbox-")]
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    bystanders = [  # (o43 F2, o44 F1) a name, one mark, marks of other values, a lookalike
        subprocess.Popen([*sleep, str(dead / "inputs")], cwd=dead,
                         env={**os.environ, "TOOLKIT_INPUTS": str(dead / "inputs")}),
        subprocess.Popen(sleep, env={**os.environ, "TOOLKIT_INPUTS": str(dead / "work"),
                                     "TOOLKIT_OUT": str(dead / "work")}),
        subprocess.Popen([*sleep, "serve-provider", "--db", str(dead / "x.db")])]
    try:
        later = _drill(tmp_path, inputs, "true", "clean")
        later.communicate(timeout=300)
        bystander_alive = [process.poll() is None for process in bystanders]
    finally:
        for process in bystanders:
            process.kill()
            process.wait()
    left = sorted(os.listdir(tmp_path / "tmp"))
    program_alive = _still_alive(_pids(tmp_path))
    assert service_alive == []
    assert left == []
    assert program_alive == []
    assert bystander_alive == [True, True, True]


def test_sigkill_of_explore_command_leaves_what_the_next_drill_sweeps(inputs, tmp_path):
    """Fault (outsider o43 F1): ``kill -9`` of ``explore --command`` while its recorded
    run's program runs, with a ``setsid`` daemon and a background child. Must hold: its
    work folder is named by its owner as the drill's are, so the next drill kills the
    program's processes (they carry the marks) and removes the folder. Before: the folder
    was ``explore-<random>``, whose owner nobody could tell: it stayed, and so did the
    program's processes, 8 of 8."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    explore = subprocess.Popen([sys.executable, "-m", "toolkit", "explore", "--command",
                                _program(tmp_path), "--inputs", str(inputs), "--max-points",
                                "1"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(temp)})
    _until(lambda: len(_pids(tmp_path)) == 3)
    explore.kill()
    explore.wait(timeout=60)
    later = _drill(tmp_path, inputs, "true", "clean")
    later.communicate(timeout=300)
    left = sorted(os.listdir(temp))
    program_alive = _still_alive(_pids(tmp_path))
    assert left == []
    assert program_alive == []
