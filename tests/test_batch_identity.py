"""Outsider o36 findings 1 and 6: one batch, whatever the working directory and the flags.

1: a rerun from another folder with a relative ``--ledger`` named a new, empty ledger and
a non-idempotent provider executed every document again; ``run`` now keeps a per-user
registry of the ledgers that ran an inputs folder (``runner/batches.py``) and refuses to
create another one for it. 6: a rerun that forgot (or added) ``--page-by-page-from``
keyed a document it had paid for under other options and executed it again; such an
input is now refused, nothing sent (``runner/other_options.py``). Every run is a real
``python -m toolkit`` process; kills are real SIGKILLs.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import sigkill_at_executions

from toolkit.documents import make_corpus
from toolkit.ledger import open_ledger
from toolkit.provider import provider_stats
from toolkit.runner import batches

TOOLKIT = [sys.executable, "-m", "toolkit"]


def toolkit(*args, cwd=None):
    return subprocess.run([*TOOLKIT, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=180)


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    """Six healthy documents and one poison file (seed 5)."""
    folder = tmp_path_factory.mktemp("docs")
    make_corpus(folder, docs=6, poison=1, seed=5)
    return folder


@pytest.fixture(scope="module")
def long_doc(tmp_path_factory):
    """One long document of 8 pages (sent page by page from 5)."""
    folder = tmp_path_factory.mktemp("long")
    make_corpus(folder, docs=0, poison=0, long_docs=1, long_pages=8, seed=5)
    return folder


def executions(provider_db) -> int:
    return provider_stats(provider_db)["executions"]


def twice_or_more(provider_db) -> int:
    """Tasks (documents, pages) the provider executed successfully twice or more."""
    return sum(task["succeeded"] >= 2 for task in provider_stats(provider_db)["per_task"].values())


@pytest.mark.slow
def test_rerun_from_another_directory_with_relative_ledger_is_refused_not_executed_again(
        tmp_path, docs):
    """Fault (o36 1): a non-idempotent batch with a relative ``--ledger`` and ``--out`` is
    killed -9 midway in one folder and rerun from another. Property: the rerun exits 2
    with one line naming the first ledger's real path, shell-quoted (a folder name with a
    quote, a space and a ``$``), creates nothing in its folder and sends nothing; rerun
    with that ``--ledger`` it finishes the batch with no document executed twice."""
    inputs = tmp_path / "big in"
    shutil.copytree(docs, inputs)
    first, second = tmp_path / "it's $HOME" / "cwd3", tmp_path / "cwd4"
    first.mkdir(parents=True)
    second.mkdir()
    provider = tmp_path / "prov.sqlite"
    args = ["run", "--inputs", inputs, "--ledger", "batch.jsonl", "--provider-db", provider,
            "--out", "out", "--contract", "non-idempotent", "--no-progress"]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(first)  # the killed run's working directory (the helper starts it here)
        assert sigkill_at_executions([*TOOLKIT, *map(str, args)], provider, [3]) == 1
    sent = executions(provider)
    assert 3 <= sent < 6

    refused = toolkit(*args, cwd=second)
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    ledger = os.path.realpath(first / "batch.jsonl")
    assert len(lines) == 1 and f"--ledger {shlex.quote(ledger)}" in lines[0], lines
    assert "--new-batch" in lines[0] and "Traceback" not in refused.stderr
    assert shlex.split(lines[0].split("--ledger ", 1)[1].split(", or ")[0]) == [ledger]
    assert list(second.iterdir()) == [] and executions(provider) == sent

    args[4] = ledger  # the way on the line names: that ledger, from here
    finished = toolkit(*args, cwd=second)
    assert finished.returncode == 0, finished.stderr
    assert twice_or_more(provider) == 0  # the first run's work was not executed again


def test_new_batch_flag_starts_another_ledger_on_inputs_another_ledger_has_run(tmp_path, docs):
    """Fault: a second ledger for the same inputs, wanted this time. Property: without
    ``--new-batch`` it is refused and no file of the folder changes (the SQLite ledger
    read without a ``-wal`` or ``-shm`` made beside it); ``--new-batch`` lets it start
    (exit 0, its own items), and the registry then names both."""
    common = ["--inputs", docs, "--provider-db", tmp_path / "p.sqlite", "--no-progress"]
    assert toolkit("run", *common, "--ledger", tmp_path / "a.sqlite",
                   "--out", tmp_path / "outA").returncode == 0
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir() if path.is_file()}
    again = toolkit("run", *common, "--ledger", tmp_path / "b.sqlite", "--out", tmp_path / "outB")
    assert again.returncode == 2 and "--new-batch" in again.stderr
    # the refusal read a.sqlite and left every file as it was: no b.sqlite, no -wal or -shm
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir() if path.is_file()} \
        == before
    deliberate = toolkit("run", *common, "--ledger", tmp_path / "b.sqlite",
                         "--out", tmp_path / "outB", "--new-batch", "--json")
    assert deliberate.returncode == 0, deliberate.stderr
    assert json.loads(deliberate.stdout)["items"] == 7
    entry = json.loads(batches.entry_file(docs).read_text())
    assert entry["ledgers"] == sorted(os.path.realpath(tmp_path / name)
                                      for name in ("a.sqlite", "b.sqlite"))


def test_damaged_batch_registry_is_warned_about_rewritten_and_never_fatal(tmp_path, docs):
    """Fault: the registry file of the inputs folder holds garbage (a disk error, an editor).
    Property: the run warns in one line naming it, finishes (exit 0) and rewrites it, so a
    later new ledger for those inputs is refused again."""
    registry = batches.entry_file(docs)
    registry.parent.mkdir(parents=True)
    registry.write_bytes(b"\x00garbage{")
    common = ["--inputs", docs, "--provider-db", tmp_path / "p.sqlite", "--no-progress"]
    result = toolkit("run", *common, "--ledger", tmp_path / "a.jsonl", "--out", tmp_path / "o")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "damaged" in warnings[0] and str(registry) in warnings[0]
    assert json.loads(registry.read_text())["ledgers"] == [os.path.realpath(tmp_path / "a.jsonl")]
    other = toolkit("run", *common, "--ledger", tmp_path / "b.jsonl", "--out", tmp_path / "o2")
    assert other.returncode == 2 and "a.jsonl" in other.stderr


def test_ledger_moved_or_emptied_is_not_held_against_a_new_ledger(tmp_path, docs):
    """Fault: the registry names a ledger that was moved away, or one that holds no item.
    Property: neither blocks a new ledger for the inputs (held before the registry: a
    guard against a registry that refuses too much)."""
    common = ["--inputs", docs, "--provider-db", tmp_path / "p.sqlite", "--no-progress"]
    assert toolkit("run", *common, "--ledger", tmp_path / "a.sqlite",
                   "--out", tmp_path / "o").returncode == 0
    (tmp_path / "moved").mkdir()
    for name in os.listdir(tmp_path):
        if name.startswith("a.sqlite"):
            os.rename(tmp_path / name, tmp_path / "moved" / name)
    open_ledger(tmp_path / "empty.jsonl").close()  # its header line alone: no item
    registry = batches.entry_file(docs)
    registry.write_text(json.dumps({"ledgers": [str(tmp_path / "empty.jsonl"),
                                                *json.loads(registry.read_text())["ledgers"]]}))
    fresh = toolkit("run", *common, "--ledger", tmp_path / "b.sqlite", "--out", tmp_path / "o2")
    assert fresh.returncode == 0, fresh.stderr


@pytest.mark.slow
def test_rerun_without_page_by_page_flag_refuses_the_paged_document_and_sends_nothing(
        tmp_path, long_doc):
    """Fault (o36 6): a page-by-page run is killed -9 after 3 pages, and rerun without
    ``--page-by-page-from``. Property: that rerun exits 2 with one line naming the flag,
    sends nothing and does not say the input is gone; the rerun with the flag resumes:
    8 pages executed in all, one item, one output."""
    args = ["run", "--inputs", long_doc, "--ledger", tmp_path / "l.jsonl", "--provider-db",
            tmp_path / "p.sqlite", "--out", tmp_path / "out", "--no-progress"]
    paged = [*args, "--page-by-page-from", "5"]
    assert sigkill_at_executions([*TOOLKIT, *map(str, paged)], tmp_path / "p.sqlite", [3]) == 1
    sent = executions(tmp_path / "p.sqlite")
    assert 3 <= sent < 8

    forgot = toolkit(*args)
    assert forgot.returncode == 2, forgot.stderr
    lines = forgot.stderr.strip().splitlines()
    assert len(lines) == 1 and "--page-by-page-from" in lines[0] and "not sent" in lines[0]
    assert "no longer among the inputs" not in forgot.stderr
    assert executions(tmp_path / "p.sqlite") == sent

    resumed = toolkit(*paged, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["by_state"]["done"] == 1
    assert executions(tmp_path / "p.sqlite") == 8 and twice_or_more(tmp_path / "p.sqlite") == 0
    assert len(list((tmp_path / "out").glob("*.pdf"))) == 1  # one output for one document


def test_rerun_adding_page_by_page_flag_refuses_a_document_done_whole(tmp_path, long_doc):
    """Fault: a document done whole is rerun with ``--page-by-page-from 5``. Property: exit 2,
    one line saying it is recorded whole, no page sent (without the fix: 8 more executions)."""
    args = ["run", "--inputs", long_doc, "--ledger", tmp_path / "l.sqlite", "--provider-db",
            tmp_path / "p.sqlite", "--out", tmp_path / "out", "--no-progress"]
    assert toolkit(*args).returncode == 0
    assert executions(tmp_path / "p.sqlite") == 1
    added = toolkit(*args, "--page-by-page-from", "5")
    assert added.returncode == 2, added.stderr
    assert "recorded whole" in added.stderr and executions(tmp_path / "p.sqlite") == 1


def test_workers_rerun_adding_page_by_page_flag_refuses_the_done_document_and_says_so(
        tmp_path, long_doc):
    """Fault: as above with ``--workers 2`` (each worker keys its share). Property: the
    refusal reaches the parent: exit 2, its line, ``refused`` in the summary, no page sent."""
    args = ["run", "--inputs", long_doc, "--ledger", tmp_path / "l.sqlite", "--provider-db",
            tmp_path / "p.sqlite", "--out", tmp_path / "out", "--no-progress", "--workers", "2"]
    assert toolkit(*args).returncode == 0
    added = toolkit(*args, "--page-by-page-from", "5", "--json")
    assert added.returncode == 2, added.stderr
    assert json.loads(added.stdout)["refused"] == 1
    assert "refused: long-000.pdf" in added.stderr and executions(tmp_path / "p.sqlite") == 1


# The real CLI, stopped (SIGSTOP, by itself) as the witness is about to judge its just
# created ledger: after the batch registry was consulted for it, before it holds an item
# (on main, also before the registry recorded it). The seam ``run`` calls in both.
STOPPED_AT_WITNESS_CHECK = """
import os, signal, sys
from toolkit.runner import witness
judge = witness.check
def stopped_first(out, ledger):
    os.kill(os.getpid(), signal.SIGSTOP)
    return judge(out, ledger)
witness.check = stopped_first
from toolkit.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _state(pid) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def test_two_first_runs_at_once_with_two_new_ledgers_refuse_the_second_check_then_create_race(
        tmp_path, docs):
    """Fault: two first runs of one inputs folder at once, each with its own new ledger:
    run A has passed the registry's check and created its ledger, and is held there
    (SIGSTOP, a real process) before it records anything; run B starts then. Property: B
    is refused (exit 2, the one line naming A's ledger, --new-batch), creates no ledger
    and sends nothing; A, let go, finishes (exit 0); ``--new-batch`` still lets B start.
    Before: both checks passed (check, then create, then record) and B ran a second batch."""
    common = ["--inputs", docs, "--provider-db", tmp_path / "p.sqlite", "--no-progress"]
    first = subprocess.Popen([sys.executable, "-c", STOPPED_AT_WITNESS_CHECK, "run", *map(
        str, [*common, "--ledger", tmp_path / "a.sqlite", "--out", tmp_path / "outA"])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _state(first.pid) != "T" and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _state(first.pid) == "T", "run A never reached the witness's check"
        second = toolkit("run", *common, "--ledger", tmp_path / "b.sqlite",
                         "--out", tmp_path / "outB")
    finally:
        os.kill(first.pid, signal.SIGCONT)
    _, err = first.communicate(timeout=180)
    assert first.returncode == 0, err
    assert second.returncode == 2, second.stderr
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "--new-batch" in lines[0], lines
    assert f"--ledger {shlex.quote(os.path.realpath(tmp_path / 'a.sqlite'))}" in lines[0]
    assert not (tmp_path / "b.sqlite").exists() and executions(tmp_path / "p.sqlite") == 6
    deliberate = toolkit("run", *common, "--ledger", tmp_path / "b.sqlite",
                         "--out", tmp_path / "outB", "--new-batch")
    assert deliberate.returncode == 0, deliberate.stderr
