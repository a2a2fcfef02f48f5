"""Outsider o38's findings on routing (``--page-by-page-from``), each with real processes.

F1: a plain run and a page-by-page run of one document on one ledger at once. The runs
are real ``python -m toolkit run`` processes; one stops itself (SIGSTOP, by the kernel)
right after its check of the other routing (``other_options.refused``), before it records
anything; the test runs the other to its end, then lets the stopped one go on (SIGCONT).
The oracle is the fake provider's execution log.
"""

import signal
import subprocess
import sys
import time

import pytest

from conftest import BLOCKED_LIMIT, run_cli
from toolkit.documents import make_corpus
from toolkit.ledger import State, open_ledger
from toolkit.provider.records import provider_records

pytestmark = pytest.mark.slow

# A real run, which stops itself by SIGSTOP once its intake has checked an input against
# the other routing, before it adds the input's item (the check-then-create window).
STOPS_AFTER_ITS_CHECK = """
import os, signal, sys
from toolkit.runner import other_options
checked = other_options.refused
def refused(*args, **kwargs):
    answer = checked(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGSTOP)
    return answer
other_options.refused = refused
from toolkit.cli import main
sys.argv = ["toolkit", *sys.argv[1:]]
sys.exit(main())
"""


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def _until(condition, what):
    deadline = time.monotonic() + BLOCKED_LIMIT  # a guard against a hang, not a timing
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def _args(tmp_path, paged: bool) -> list[str]:
    return ["run", "--inputs", str(tmp_path / "in"), "--ledger", str(tmp_path / "L.sqlite"),
            "--provider-db", str(tmp_path / "p.sqlite"), "--out", str(tmp_path / "out"),
            "--no-progress", *(["--page-by-page-from", "3"] if paged else [])]


@pytest.mark.parametrize("stopped_paged", [False, True], ids=["plain-stopped", "paged-stopped"])
def test_plain_and_page_by_page_runs_meeting_after_their_checks_execute_the_document_once(
        tmp_path, stopped_paged):
    """Fault (o38 F1): two runs on one ledger, one with ``--page-by-page-from 3``, both find
    no item of the long document under the other routing, then both record theirs. The one
    stopped after its check goes on only once the other has sent the document and ended.
    Property: the provider executes the document under one routing only (on main: whole
    and page by page, billed twice); the later run records its intent as not sent
    (``failed(transient)``, "not sent") and exits 2 with the refusal's line."""
    make_corpus(tmp_path / "in", docs=0, poison=0, seed=9, long_docs=1, long_pages=4)
    stopped = subprocess.Popen([sys.executable, "-c", STOPS_AFTER_ITS_CHECK,
                                *_args(tmp_path, stopped_paged)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _until(lambda: _stopped(stopped.pid) or stopped.poll() is not None,
               "the run stopped after its check")
        assert stopped.poll() is None, stopped.communicate()
        other = run_cli(*_args(tmp_path, not stopped_paged))
        assert other.returncode == 0, other.stderr
    finally:
        stopped.send_signal(signal.SIGCONT)
    out, err = stopped.communicate(timeout=BLOCKED_LIMIT)
    executed = {row["task_key"].split("#")[0]
                for row in provider_records(tmp_path / "p.sqlite")["executions"]}
    assert len(executed) == 1, f"the document executed under both routings: {err}"
    assert stopped.returncode == 2, err
    assert "its content is recorded" in err and "not sent" in err, err
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        later = [item for item in ledger.items() if item.key not in executed]
    assert len(later) == 1 and later[0].state is State.FAILED, later
    assert later[0].reason.startswith("not sent"), later[0].reason


def test_page_by_page_from_above_the_page_count_of_a_paged_document_is_refused_saying_so(
        tmp_path):
    """Fault (o38 F4): 5-page documents recorded page by page (``--page-by-page-from 3``),
    then a rerun with ``--page-by-page-from 7``, above their page count. Property: refused
    (exit 2, nothing sent) with a line that names the flag as given and says it is above
    the page count, never "no --page-by-page-from"."""
    make_corpus(tmp_path / "in", docs=0, poison=0, seed=9, long_docs=1, long_pages=5)
    args = _args(tmp_path, paged=True)
    assert run_cli(*args).returncode == 0
    executions = len(provider_records(tmp_path / "p.sqlite")["executions"])
    args[args.index("--page-by-page-from") + 1] = "7"
    refused = run_cli(*args)
    assert refused.returncode == 2, refused.stderr
    assert "no --page-by-page-from" not in refused.stderr, refused.stderr
    assert "would send it whole (--page-by-page-from 7 is above its page count)" in \
        refused.stderr, refused.stderr
    assert len(provider_records(tmp_path / "p.sqlite")["executions"]) == executions


def test_index_line_of_a_changed_input_holding_another_items_key_is_damage_and_read(
        tmp_path):
    """Fault (o38 F2): after a batch, ``d3`` is edited, and its line of ``<ledger>.inputs``
    is changed to its new stat and digest but ``d1``'s key (a hand edit, or a bit flip that
    lands on another item's key), its checksum left as it was. Property: the line is damage:
    ``d3`` is read and keyed by its bytes, executed as a new item (never called "the same
    content as d1"), the run exits 0 with every input's item done."""
    import hashlib
    import os

    from toolkit.runner import inputindex

    docs = make_corpus(tmp_path / "in", docs=3, poison=0, seed=4)
    args = _args(tmp_path, paged=False)
    assert run_cli(*args).returncode == 0
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        keys = {item.source: item.key for item in ledger.items()}
    d1, d3 = docs[0], docs[2]
    index = inputindex.index_file(tmp_path / "L.sqlite")
    text = index.read_text()
    old_line = next(line for line in text.splitlines() if line.endswith(f"/{d3.name}"))
    old_digest = hashlib.sha256(d3.read_bytes()).hexdigest()
    old_stamp = " ".join(map(str, inputindex.stamp(os.stat(d3))))
    d3.write_bytes(docs[1].read_bytes().replace(b"%%EOF", b"% edited\n%%EOF"))
    new_digest = hashlib.sha256(d3.read_bytes()).hexdigest()
    new_stamp = " ".join(map(str, inputindex.stamp(os.stat(d3))))
    assert old_stamp in old_line and old_digest in old_line and keys[d3.name] in old_line
    damaged = old_line.replace(old_stamp, new_stamp).replace(old_digest, new_digest) \
        .replace(keys[d3.name], keys[d1.name])
    index.write_text(text.replace(old_line, damaged))
    executions = len(provider_records(tmp_path / "p.sqlite")["executions"])
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    assert "same content" not in rerun.stderr + rerun.stdout, rerun.stderr + rerun.stdout
    assert len(provider_records(tmp_path / "p.sqlite")["executions"]) == executions + 1
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        assert sum(item.state is State.DONE for item in ledger.items()) == 4


def test_page_by_page_run_leaves_the_input_index_as_it_was_and_the_readme_says_so(tmp_path):
    """Fault (o38 F3): the README said every run records ``<ledger>.inputs``; a run with
    ``--page-by-page-from`` records none (its routing needs each page count: a read).
    Property: a page-by-page run leaves the index a plain run wrote byte for byte as it
    was, and the README's paragraph on the index says that such a run neither reads nor
    writes it (the README tells the truth)."""
    import re
    from pathlib import Path

    import toolkit
    from toolkit.runner import inputindex

    paged, plain = tmp_path / "paged", tmp_path / "plain"
    for batch in (paged, plain):
        make_corpus(batch / "in", docs=2, poison=0, seed=4, long_docs=1, long_pages=4)
    assert run_cli(*_args(paged, paged=True)).returncode == 0
    assert not inputindex.index_file(paged / "L.sqlite").exists(), "an index was written"
    index = inputindex.index_file(plain / "L.sqlite")
    assert run_cli(*_args(plain, paged=False)).returncode == 0
    recorded = index.read_bytes()
    assert run_cli(*_args(plain, paged=True)).returncode == 2  # refused: recorded whole
    assert index.read_bytes() == recorded
    readme = (Path(toolkit.__file__).resolve().parents[1] / "README.md").read_text()
    said = " ".join(readme.split())
    assert re.search(r"each run without `--page-by-page-from` records, in `<ledger>\.inputs`",
                     said)
    assert "A run with `--page-by-page-from` neither reads nor writes the index" in said


def test_first_intents_are_each_items_first_move_to_unknown_in_commit_order(ledger):
    """Fault: none (o38 F1's primitive, every backend). Property: ``first_intents`` gives
    each key's first event entering ``unknown`` (a retry's later intent does not move it),
    only for keys that have one, and two items' first intents compare in the order they
    were committed."""
    for key in ("a" * 64, "b" * 64, "c" * 64):
        ledger.add(key, source=key[0])
    ledger.move("a" * 64, State.PENDING, State.UNKNOWN)
    ledger.move("b" * 64, State.PENDING, State.UNKNOWN)
    ledger.move("a" * 64, State.UNKNOWN, State.FAILED, failure="transient", reason="no")
    ledger.move("a" * 64, State.FAILED, State.UNKNOWN)  # a retry: a later intent of a
    seqs = {event.key: event.seq for event in reversed(ledger.events())
            if event.to is State.UNKNOWN}
    firsts = ledger.first_intents(["a" * 64, "b" * 64, "c" * 64])
    assert set(firsts) == {"a" * 64, "b" * 64}
    assert firsts["a" * 64] < firsts["b" * 64] == seqs["b" * 64]
    assert firsts["a" * 64] == seqs["a" * 64]  # reversed: the first event wins the dict


# A first intent written but not committed: the child prints its backend pid, then waits for
# a line on stdin before it commits (its transaction open, its seq drawn).
INTENT_HELD_OPEN = """
import sys
from toolkit.ledger import State, open_ledger
ledger = open_ledger(sys.argv[1])
write = ledger._write
def write_then_wait(old, new, parts):
    written = write(old, new, parts)
    print(ledger._conn.info.backend_pid, flush=True)
    sys.stdin.readline()
    return written
ledger._write = write_then_wait
ledger.move("a" * 64, State.PENDING, State.UNKNOWN)
"""


def test_postgres_first_intent_committed_after_an_open_one_gets_the_later_seq(pg_url):
    """Fault (o38 F1 on PostgreSQL): an IDENTITY seq is drawn at INSERT, not at COMMIT. A
    first intent (item a) is written and held uncommitted by a real process; another
    process records item b's first intent meanwhile. Property: b's waits until a's commits
    (an advisory lock held to COMMIT, seen waiting in ``pg_locks``), so ``first_intents``
    orders them as they were committed (on main b commits first with the later seq: a
    reader between the two commits sees b alone, then a "first")."""
    import threading

    import psycopg

    with open_ledger(pg_url) as ledger:
        ledger.add("a" * 64)
        ledger.add("b" * 64)
        child = subprocess.Popen([sys.executable, "-c", INTENT_HELD_OPEN, pg_url],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline(), child.stderr.read()
            other = threading.Thread(target=ledger.move, args=("b" * 64, State.PENDING,
                                                               State.UNKNOWN))
            other.start()
            with psycopg.connect(pg_url, autocommit=True) as admin:
                _until(lambda: not other.is_alive() or admin.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ).fetchone()[0], "b's intent done or waiting")
            assert other.is_alive(), "b's first intent committed while a's was still open"
        finally:
            child.stdin.write("\n")
            child.stdin.close()
            assert child.wait(timeout=BLOCKED_LIMIT) == 0, child.stderr.read()
        other.join(timeout=BLOCKED_LIMIT)
        firsts = ledger.first_intents(["a" * 64, "b" * 64])
        assert firsts["a" * 64] < firsts["b" * 64]
