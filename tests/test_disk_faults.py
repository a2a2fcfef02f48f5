"""Real disk faults against a real ``python -m toolkit run`` process.

Nothing here replaces a method: the faults are ENOSPC / EIO returned by the
kernel's syscall layer (``strace --inject``, counted per syscall on one file),
by libfiu's POSIX preload switched on from outside at a chosen moment
(``fiu-ctrl``), or the file-size limit of the process (``RLIMIT_FSIZE``).
Every faulted run must halt with exit 1 and one line on stderr, leave health
not-ready until cleared, keep everything it recorded, and a later run must
finish the batch with no double execution and every ``done`` verified.
"""

import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolkit import documents
from toolkit.checker import check
from toolkit.drills.history import collect_history
from toolkit.ledger import open_ledger
from toolkit.provider import parse_contract, provider_at
from toolkit.roots import artifact_file

pytestmark = pytest.mark.slow
CONTRACT = "non-idempotent"  # no dedupe: a blind resubmit would be a second execution
DOCS = 10


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    documents.make_corpus(folder, docs=DOCS, poison=0, seed=3)
    return folder


def toolkit(cwd, *args, prefix=(), preexec_fn=None):
    return subprocess.run([*prefix, sys.executable, "-m", "toolkit", *args], cwd=cwd,
                          capture_output=True, text=True, preexec_fn=preexec_fn, timeout=300)


def run_args(tmp, corpus, ledger, contract=CONTRACT):
    """Paths relative to the run's folder, except the outputs (the checker reads them here)."""
    return ("run", "--inputs", str(corpus), "--ledger", ledger, "--provider-db", "p.sqlite",
            "--out", str(tmp / "out"), "--no-progress", "--contract", contract)


def recorded(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open_ledger(path) as ledger:
        return [event.to_json() for event in ledger.events()]


def assert_halted_cleanly(result):
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines  # one line: the reason
    assert lines[0].startswith(("halted, no new work taken: ", "error: ")), lines


def assert_recovers(tmp, corpus, ledger_name, before, contract=CONTRACT):
    """Health not-ready until cleared; then one run brings the batch to rest, honestly."""
    ledger = tmp / ledger_name
    assert toolkit(tmp, "health", "--ledger", ledger_name).returncode == 1
    cleared = toolkit(tmp, "health", "--ledger", ledger_name, "--clear")
    assert cleared.returncode == 0, cleared.stderr
    final = toolkit(tmp, *run_args(tmp, corpus, ledger_name, contract))
    assert final.returncode == 0, final.stderr
    after = recorded(ledger)
    assert after[:len(before)] == before  # nothing recorded before the fault was lost
    with provider_at(tmp / "p.sqlite") as provider:
        stats = provider.stats()
        history = collect_history(ledger, provider, sorted(corpus.glob("*.pdf")),
                                  parse_contract(contract))
    # 0 double executions: no task executed successfully twice (a provider-side failure
    # of the faulted disk is a failed execution, which a later attempt may follow)
    assert all(task["succeeded"] <= 1 for task in stats["per_task"].values())
    verdict = check(history)
    assert verdict.valid is True, verdict.to_json()
    done = [item for item in history.items.values() if item.state.value == "done"]
    assert all(documents.verify(artifact_file(tmp / ledger_name, i.artifact_path), i.artifact_size,
                                i.artifact_sha256) for i in done)
    assert all(item.resting for item in history.items.values())
    leftovers = [p for p in tmp.rglob("*") if p.name.endswith((".tmp", ".part", ".upgrade"))
                 or ".probe-" in p.name]
    assert leftovers == []  # no stray temp files: marker, artifacts, probes
    return history


def strace_prefix(tmp, target: str, syscall: str, nth: int):
    files = [f"-P{tmp / target}"] + ([f"-P{tmp / target}-wal", f"-P{tmp / target}-journal"]
                                     if target.endswith(".sqlite") else [])
    return ("strace", "-f", "-qq", "--seccomp-bpf", "-o", "/dev/null", *files,
            "-e", f"trace={syscall}",
            "-e", f"inject={syscall}:error=ENOSPC:when={nth}+")


# (ledger file, faulted file, syscall, from the N-th call on). A clean 10-document run makes
# about 280 pwrite64 / 18 fdatasync on the SQLite ledger (one per intent: the other
# transitions defer theirs), 60 write / 60 fsync on the JSONL one, and 340 pwrite64 /
# 45 fdatasync on the provider's database.
SWEEP = [
    ("l.sqlite", "l.sqlite", "pwrite64", 1), ("l.sqlite", "l.sqlite", "pwrite64", 90),
    ("l.sqlite", "l.sqlite", "pwrite64", 200), ("l.sqlite", "l.sqlite", "fdatasync", 10),
    ("l.jsonl", "l.jsonl", "write", 1), ("l.jsonl", "l.jsonl", "write", 25),
    ("l.jsonl", "l.jsonl", "fsync", 50),
    ("l.sqlite", "p.sqlite", "pwrite64", 1), ("l.sqlite", "p.sqlite", "pwrite64", 150),
    ("l.jsonl", "p.sqlite", "fdatasync", 30),
]


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (Debian strace)")
@pytest.mark.parametrize("ledger_name,target,syscall,nth", SWEEP,
                         ids=[f"{t}-{s}-{n}" for _, t, s, n in SWEEP])
def test_enospc_from_the_nth_write_halts_cleanly_and_a_later_run_finishes_without_double_execution(
        tmp_path, corpus, ledger_name, target, syscall, nth):
    """strace makes the kernel answer ENOSPC to one file's writes (or syncs) from the N-th
    on, during a real run: it halts with exit 1 and one line (never a traceback, never
    'cannot rollback'), health is not-ready until cleared, nothing recorded is lost, and
    the next run finishes with 0 double executions and every done verified."""
    prefix = strace_prefix(tmp_path, target, syscall, nth)
    first = toolkit(tmp_path, *run_args(tmp_path, corpus, ledger_name), prefix=prefix)
    assert_halted_cleanly(first)
    assert_recovers(tmp_path, corpus, ledger_name, recorded(tmp_path / ledger_name))


def _fsize(limit):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.parametrize("ledger_name,limit", [("l.sqlite", 300_000), ("l.jsonl", 12_000)])
def test_file_size_limit_halts_cleanly_and_a_later_run_finishes_without_double_execution(
        tmp_path, corpus, ledger_name, limit):
    """RLIMIT_FSIZE makes every write past ``limit`` bytes fail (EFBIG; SQLite says "disk
    I/O error"), whichever file reaches it first: every storage error halts the run,
    and a run without the limit finishes honestly."""
    first = toolkit(tmp_path, *run_args(tmp_path, corpus, ledger_name), preexec_fn=_fsize(limit))
    assert_halted_cleanly(first)
    assert_recovers(tmp_path, corpus, ledger_name, recorded(tmp_path / ledger_name))


def _done_count(ledger: Path) -> int:
    if ledger.suffix == ".sqlite":
        try:
            with sqlite3.connect(f"file:{ledger}?mode=ro", uri=True) as db:
                return db.execute("SELECT count(*) FROM items WHERE state='done'").fetchone()[0]
        except sqlite3.Error:
            return 0
    try:
        lines = ledger.read_bytes().splitlines()
    except OSError:
        return 0
    return sum(b'"op": "move"' in line and b'"to": "done"' in line for line in lines)


@pytest.mark.skipif(shutil.which("fiu-run") is None, reason="needs libfiu (Debian fiu-utils)")
@pytest.mark.parametrize("ledger_name,point", [("l.sqlite", "posix/io/sync/fdatasync"),
                                               ("l.jsonl", "posix/io/sync/fsync")])
def test_libfiu_sync_failure_switched_on_mid_batch_halts_cleanly_and_recovers(
        tmp_path, corpus, ledger_name, point):
    """libfiu's preload fails every fsync/fdatasync from the moment ``fiu-ctrl`` enables
    it, once three documents are done (the provider polls slowly, so the batch is still
    running): the run halts with exit 1 and one line, and a later run finishes honestly."""
    contract = "non-idempotent,run-polls=2"
    command = ["fiu-run", "-x", "-f", str(tmp_path / "fiu"), sys.executable, "-m", "toolkit",
               *run_args(tmp_path, corpus, ledger_name, contract)]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        while _done_count(tmp_path / ledger_name) < 3 and proc.poll() is None:
            time.sleep(0.01)
        assert proc.poll() is None, "the batch ended before the fault could be switched on"
        enabled = subprocess.run(["fiu-ctrl", "-f", str(tmp_path / "fiu"), "-c",
                                  f"enable name={point}", str(proc.pid)],
                                 capture_output=True, text=True, timeout=30)
        assert enabled.returncode == 0, enabled.stderr
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    result = subprocess.CompletedProcess(command, proc.returncode, out, err)
    assert_halted_cleanly(result)
    before = recorded(tmp_path / ledger_name)
    assert sum(1 for e in before if e["to"] == "done" and e["op"] == "move") >= 3
    assert_recovers(tmp_path, corpus, ledger_name, before, contract)

