"""A JSONL ledger's one writer keeps it when its ``<ledger>.lock`` file is deleted (o40 HIGH 2).

The lock file can be unlinked under its holder: the next opener made a new one, took it and
wrote too (the file cut under the first run, documents sent twice). Every writer now also
locks the ledger file itself (``storage.open_exclusive``), and a compaction locks the new
file before it takes the name; salvage and ``health --clear`` take both locks as a writer
does. Each test deletes the lock file under a real, live writer.
"""

import os
import subprocess
import sys
import time

import pytest

from toolkit.documents import make_corpus
from toolkit.provider import provider_stats

DOCS = 200

HOLD = """
import sys
from toolkit.ledger import open_ledger
with open_ledger(sys.argv[1]) as ledger:  # the one writer, as a running batch is
    if sys.argv[2:] == ["compact"]:
        ledger.compact()  # a new file renamed over the name: the writer must keep its lock
    print("holding", flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


def _toolkit(*args):
    return [sys.executable, "-m", "toolkit", *args]


def _run_args(tmp_path):
    return ["run", "--inputs", str(tmp_path / "in"), "--ledger", str(tmp_path / "l.jsonl"),
            "--provider-db", str(tmp_path / "p.db"), "--out", str(tmp_path / "out"),
            "--no-progress", "--contract", "non-idempotent"]


def _event_lines(path) -> int:
    try:
        return path.read_bytes().count(b'"seq"')
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_second_run_after_a_live_runs_lock_file_is_deleted_is_refused_each_doc_executes_once(tmp_path):
    """What breaks: a first `run` (a real process) is writing a JSONL ledger; its
    ``l.jsonl.lock`` is deleted; a second `run` with the same arguments starts. Must hold:
    the second exits 1 with one line naming the first's pid (as when the lock file is
    there), writes nothing; the first finishes undisturbed (exit 0, all done); the provider
    executed every document exactly once. Main: the second took a new lock file and
    wrote too, the file was cut under the first, documents were sent twice."""
    make_corpus(tmp_path / "in", docs=DOCS, poison=0, seed=5)
    ledger = tmp_path / "l.jsonl"
    first = subprocess.Popen(_toolkit(*_run_args(tmp_path)), cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _event_lines(ledger) < DOCS + 10:  # its adds, and some intents sent
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first run wrote no intent"
            time.sleep(0.02)
        os.unlink(f"{ledger}.lock")
        second = subprocess.run(_toolkit(*_run_args(tmp_path)), cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        # Still running: not halted by a second writer (main: "... is N bytes where this
        # run's appends end at M"), nor finished before the second started.
        assert first.poll() is None, first.communicate()
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert second.returncode == 1 and second.stderr.count("\n") == 1, second.stderr
    assert f"busy: open in another writer (live process {first.pid})" in second.stderr
    assert first.returncode == 0 and f"done={DOCS}" in out, (out, err)
    stats = provider_stats(tmp_path / "p.db")
    assert stats["executions"] == DOCS == len(stats["per_task"])
    assert all(task["executions"] == 1 for task in stats["per_task"].values())


def _holder(ledger, *extra):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(ledger), *extra],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "holding\n"
    return holder


def _release(holder):
    holder.stdin.close()
    assert holder.wait(timeout=60) == 0


@pytest.mark.parametrize("extra", [(), ("compact",)], ids=["as_opened", "after_compaction"])
def test_a_writer_whose_lock_file_was_deleted_still_refuses_a_second_writer(tmp_path, extra):
    """What breaks: a live writer holds a JSONL ledger (as opened, or after a compaction
    renamed a new file over its name); ``l.jsonl.lock`` is deleted; another process opens
    the ledger to write. Must hold: LedgerBusyError naming the holder's pid, the file
    byte-identical; once the holder exits the same open succeeds."""
    from toolkit.errors import LedgerBusyError
    from toolkit.ledger import open_ledger

    ledger = tmp_path / "l.jsonl"
    with open_ledger(ledger) as seed:
        seed.add("doc-1", source="doc-1.pdf")
    holder = _holder(ledger, *extra)
    try:
        os.unlink(f"{ledger}.lock")
        before = ledger.read_bytes()
        with pytest.raises(LedgerBusyError, match=f"live process {holder.pid}"):
            open_ledger(ledger)
        assert ledger.read_bytes() == before
    finally:
        _release(holder)
    with open_ledger(ledger) as again:
        assert [item.key for item in again.items()] == ["doc-1"]


@pytest.mark.parametrize("command", [["ledger", "{l}", "--salvage", "{new}"],
                                     ["health", "--ledger", "{l}", "--clear"]],
                         ids=["salvage", "health_clear"])
def test_salvage_and_health_clear_refuse_a_live_writer_whose_lock_file_was_deleted(
        tmp_path, command):
    """What breaks: `ledger --salvage` or `health --clear` meets a JSONL ledger whose live
    writer's lock file was deleted. Must hold: exit 1 naming the writer's pid ("busy" for
    salvage, "in use by" for --clear, as with the lock file there); no salvaged copy made
    of an unfinished history."""
    from toolkit.ledger import open_ledger

    ledger, new = tmp_path / "l.jsonl", tmp_path / "new.jsonl"
    with open_ledger(ledger) as seed:
        seed.add("doc-1", source="doc-1.pdf")
    holder = _holder(ledger)
    try:
        os.unlink(f"{ledger}.lock")
        args = [part.format(l=ledger, new=new) for part in command]
        done = subprocess.run(_toolkit(*args), cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
    finally:
        _release(holder)
    said = done.stdout + done.stderr
    assert done.returncode == 1 and f"live process {holder.pid}" in said, said
    assert "Traceback" not in said and not new.exists()
