"""``explore --command``: a real SIGKILL of the whole process group after each durable syscall.

strace records a clean run's durable syscalls (fsync, renames, O_TRUNC opens, writes to
work files, connects and sends to the provider); each crash point is then reached in a
fresh run, stopped there by an injected SIGSTOP and killed with SIGKILL from the tracer,
and the program is rerun until it rests and judged from the provider's log and outputs.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.blackbox.crash import durable_points, explore_command
from toolkit.documents import make_corpus

ROOT = Path(__file__).resolve().parents[1]
NAIVE = f"{sys.executable} {ROOT / 'examples/blackbox/naive_batch.py'}"
CAREFUL = f"{sys.executable} {ROOT / 'examples/blackbox/careful_batch.py'}"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")]


@pytest.fixture(scope="module")
def one_doc(tmp_path_factory):
    folder = tmp_path_factory.mktemp("one")
    make_corpus(folder, docs=1, poison=0, seed=9)
    return folder


def test_trace_lines_become_crash_points_only_for_work_files_and_the_provider():
    """Parsing: a write to a work file, an O_TRUNC open, a rename and a send to the provider
    port are points; a write to a pipe, an open without O_TRUNC and another port are not."""
    work = "/w"
    log = "\n".join([
        '7 openat(AT_FDCWD</w/work>, "p.json", O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0666) = 3</w/work/p.json>',
        '7 write(3</w/work/p.json>, "{}", 2) = 2',
        '7 write(1<pipe:[1]>, "hi", 2) = 2',
        '7 openat(AT_FDCWD</w/work>, "in.pdf", O_RDONLY) = 4</w/work/in.pdf>',
        '7 rename("p.tmp", "p.json") = 0',
        '7 connect(5<TCP:[0]>, {sa_family=AF_INET, sin_port=htons(4000), sin_addr=inet_addr("127.0.0.1")}, 16) = 0',
        '7 sendto(5<TCP:[127.0.0.1:5->127.0.0.1:4000]>, "POST", 4, 0, NULL, 0) = 4',
        '7 sendto(6<TCP:[127.0.0.1:5->127.0.0.1:9]>, "x", 1, 0, NULL, 0) = 1',
    ])
    points = durable_points(log, work, 4000)
    assert [(p.syscall, p.count, p.target) for p in points] == [
        ("openat", 1, "work/p.json"), ("write", 1, "work/p.json"), ("rename", 1, "work/p.tmp"),
        ("connect", 1, "provider"), ("sendto", 1, "provider")]


def test_naive_batch_killed_after_its_submit_torn_output_and_torn_progress_file(one_doc):
    """Killed right after the request body went out (sendto #2), the naive batch resends with
    a fresh id: double execution. Killed after opening its output with O_TRUNC: an empty
    file that the rerun takes as done (fake done). Killed after truncating progress.json: it
    never rests again (the JSON no longer parses)."""
    opens = []

    def chosen(p):  # the submit's body, the output's open, the first progress rewrite
        if p.syscall == "openat" and ("out/" in p.target or not opens):
            opens.append(p)
            return True
        return (p.syscall, p.count) == ("sendto", 2)

    rows = {r.point.label.split(" ", 2)[2]: r for r in
            explore_command(NAIVE, one_doc, select=chosen)[1:]}
    assert all(r.outcome == "killed" for r in rows.values())
    sent = next(r for label, r in rows.items() if label.startswith("sendto#2"))
    assert {f.kind for f in sent.result.findings} == {"double_execution"}
    out = next(r for label, r in rows.items() if "out/" in label)
    assert "fake_done" in {f.kind for f in out.result.findings}
    torn = [r for label, r in rows.items() if "progress.json" in label]
    assert torn and all(r.result.status == "never rests" for r in torn)


def test_careful_twin_is_valid_at_every_durable_syscall_through_the_cli(one_doc):
    """Every crash point of the careful batch (intent fsync and rename, connects and sends,
    temp download, verify, rename): rerun to rest, nothing executed twice, nothing fake, the
    document delivered. The command exits 0 and prints one JSON document."""
    result = subprocess.run([sys.executable, "-m", "toolkit", "explore", "--command", CAREFUL,
                             "--inputs", str(one_doc), "--json"], capture_output=True,
                            text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    document = json.loads(result.stdout)
    total = document["total"]
    assert total["points"] >= 15 and total["valid"] == total["points"]
    assert all(row["outcome"] == "killed" for row in document["rows"][1:])
    assert {row["syscall"] for row in document["rows"][1:]} >= {"fsync", "rename", "sendto",
                                                                "openat", "write", "connect"}


def test_background_child_left_by_the_program_does_not_hold_the_recorded_run_to_its_timeout(
        one_doc, monkeypatch):
    """Outsider o43 F5. Fault: the program leaves a background child behind (``sleep``
    longer than a run may take) and exits 0. Must hold: the recording ends when the
    program's main process does, with its code (``strace -f`` alone waits for every
    tracee: the run was cut at its timeout, ``timeout``, no exit code), and the child is
    killed, as the drill kills it after each run."""
    import toolkit.blackbox

    monkeypatch.setattr(toolkit.blackbox, "RUN_TIMEOUT", 20.0)  # < the sleep
    (clean,) = explore_command(f"{CAREFUL}; (sleep 31.7 &)", one_doc, max_points=0)
    assert clean.outcome == "finished" and clean.result.runs[0].exit_code == 0
    assert clean.result.status == "valid" and clean.result.executions == 1
    left = subprocess.run(["pgrep", "-f", "^sleep 31.7$"], capture_output=True, text=True)
    assert left.stdout == ""
