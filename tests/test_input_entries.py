"""Input folders as users keep them: odd entries, odd names, odd ledger paths.

Every run here is a real ``python -m toolkit`` process with a timeout: an entry
that blocks (a FIFO) must fail the test, not hang it.
"""

import os
import shutil

import pytest
from conftest import run_cli

from toolkit.ledger import State, open_ledger



def _batch_args(tmp_path):
    return ["--inputs", tmp_path / "in", "--ledger", tmp_path / "l.sqlite",
            "--provider-db", tmp_path / "p.sqlite", "--out", tmp_path / "out", "--no-progress"]


@pytest.mark.slow
def test_odd_input_entries_are_quarantined_one_by_one_and_upper_case_pdfs_are_run(
        tmp_path, small_corpus):
    """Fault: the inputs folder holds ``SCAN.PDF``, a PDF without a suffix, a FIFO named
    ``x.pdf``, a dangling symlink, a symlink loop and a directory named ``d.pdf``.
    Property: the run never blocks; both PDFs are done; each odd entry is its own
    ``failed(permanent)`` item naming why; the batch exits 0 (at rest)."""
    folder = tmp_path / "in"
    folder.mkdir()
    healthy = [path for path in small_corpus if path.name.startswith("doc-")]
    shutil.copyfile(healthy[0], folder / "SCAN.PDF")
    shutil.copyfile(healthy[1], folder / "no-suffix")
    (folder / "notes.txt").write_text("not a PDF, not named as one: not an input\n")
    os.mkfifo(folder / "x.pdf")
    os.symlink(tmp_path / "nowhere.pdf", folder / "dangling.pdf")
    os.symlink(folder / "loop.pdf", folder / "loop.pdf")
    (folder / "d.pdf").mkdir()
    done = run_cli("run", *_batch_args(tmp_path))
    assert done.returncode == 0, done.stderr
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        items = {item.source: item for item in ledger.items()}
    assert {items["SCAN.PDF"].state, items["no-suffix"].state} == {State.DONE}
    why = {name: items[name].reason for name in ("x.pdf", "dangling.pdf", "loop.pdf", "d.pdf")}
    assert all(items[name].state is State.FAILED for name in why)
    assert "FIFO" in why["x.pdf"] and "dangling" in why["dangling.pdf"]
    assert "loop" in why["loop.pdf"] and "directory" in why["d.pdf"]
    assert "notes.txt" not in items and len(items) == 6


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_ledger_path_that_is_not_a_regular_file_is_refused_in_one_line(
        tmp_path, small_corpus, kind):
    """Fault: ``--ledger`` is a FIFO, a symlink to ``/dev/zero`` or a directory. Property:
    refused at once with one line and exit 2 (never read without end); nothing created."""
    shutil.copytree(small_corpus[0].parent, tmp_path / "in")
    ledger = tmp_path / "l.jsonl"
    {"fifo": os.mkfifo, "directory": os.mkdir,
     "dev-zero": lambda path: os.symlink("/dev/zero", path)}[kind](ledger)
    before = sorted(os.listdir(tmp_path))
    args = _batch_args(tmp_path)
    args[args.index(tmp_path / "l.sqlite")] = ledger
    refused = run_cli("run", *args)
    assert refused.returncode == 2 and "not a regular file" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == before


def test_provider_db_that_is_a_pdf_creates_no_jobs_folder(tmp_path, small_corpus):
    """Fault: ``--provider-db`` names a PDF (a slip of the argument order). Property:
    exit 2 with one line; no ``<stem>-jobs`` folder (or anything else) is created."""
    from toolkit.cli import main

    shutil.copytree(small_corpus[0].parent, tmp_path / "in")
    shutil.copyfile(small_corpus[0], tmp_path / "file.pdf")
    before = sorted(os.listdir(tmp_path))
    args = _batch_args(tmp_path)
    args[args.index(tmp_path / "p.sqlite")] = tmp_path / "file.pdf"
    assert main(["run", *map(str, args)]) == 2
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
@pytest.mark.parametrize("command", [["health", "--ledger"], ["health", "--clear", "--ledger"],
                                     ["provider-stats", "--provider-db"]],
                         ids=["health", "health-clear", "provider-stats"])
def test_health_and_provider_stats_on_a_path_that_is_not_a_file_refuse_in_one_line(
        tmp_path, kind, command):
    """Fault: the ledger or provider database named is a FIFO, a symlink to ``/dev/zero``
    or a directory. Property: never ``ready``, never blocked on the FIFO: one line, exit
    2, and nothing created beside it."""
    for name in ("l.sqlite", "l.jsonl"):
        {"fifo": os.mkfifo, "directory": os.mkdir,
         "dev-zero": lambda path: os.symlink("/dev/zero", path)}[kind](tmp_path / name)
    before = sorted(os.listdir(tmp_path))
    for name in ("l.sqlite", "l.jsonl"):
        refused = run_cli(*command, tmp_path / name)
        assert refused.returncode == 2, (name, refused.stdout, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1 and "ready" not in refused.stdout
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.slow
def test_health_clear_on_a_missing_ledger_refuses_and_creates_nothing(tmp_path):
    """Fault: ``health --clear`` with a typo in the ledger's name. Property: exit 2, one
    line; no ledger (nor anything else) is created."""
    refused = run_cli("health", "--ledger", tmp_path / "typo.sqlite", "--clear")
    assert refused.returncode == 2 and "no ledger" in refused.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["ledger-hard-link", "symlink-into-out"])
def test_input_entry_that_is_our_own_file_by_another_name_is_refused(
        tmp_path, small_corpus, entry):
    """Fault: after a first run, ``in/led.pdf`` is a hard link to the ledger, or a symlink
    to an artifact in ``--out``. Property: the rerun refuses in one line (exit 2): the
    ledger is never sent as a document, an output never becomes new work; the ledger's
    items are unchanged."""
    folder = tmp_path / "in"
    folder.mkdir()
    healthy = [path for path in small_corpus if path.name.startswith("doc-")]
    shutil.copyfile(healthy[0], folder / "a.pdf")
    assert run_cli("run", *_batch_args(tmp_path)).returncode == 0
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        before = ledger.items()
    if entry == "ledger-hard-link":
        os.link(tmp_path / "l.sqlite", folder / "led.pdf")
    else:
        os.symlink(tmp_path / "out" / before[0].artifact_path, folder / "again.pdf")
    refused = run_cli("run", *_batch_args(tmp_path))
    assert refused.returncode == 2, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    if entry == "ledger-hard-link":  # a ledger with two names is refused by open_ledger too
        (folder / "led.pdf").unlink()
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        assert ledger.items() == before


def test_open_regular_refuses_every_odd_entry_without_blocking_or_leaking_a_descriptor(
        tmp_path):
    """Fault: the one opener of inputs and of the input index (``inputs.open_regular``) is
    given a FIFO without a writer, a directory, a dangling symlink and a symlink loop.
    Property: each is refused as ``Odd`` naming what it is, none blocks (``O_NONBLOCK``),
    and no descriptor stays open; a regular file opens with the fstat of what was opened."""
    from toolkit.runner.inputs import Odd, open_regular

    os.mkfifo(tmp_path / "fifo.pdf")
    (tmp_path / "dir.pdf").mkdir()
    os.symlink(tmp_path / "gone", tmp_path / "dangling.pdf")
    os.symlink(tmp_path / "loop.pdf", tmp_path / "loop.pdf")
    (tmp_path / "doc.pdf").write_bytes(b"%PDF-1.4\n")
    before = len(os.listdir("/proc/self/fd"))
    reasons = {}
    for name in ("fifo.pdf", "dir.pdf", "dangling.pdf", "loop.pdf"):
        with pytest.raises(Odd) as refused:
            open_regular(tmp_path / name)
        reasons[name] = refused.value.reason
    assert len(os.listdir("/proc/self/fd")) == before
    assert reasons["fifo.pdf"] == "a FIFO" and reasons["dangling.pdf"] == "a dangling symlink"
    assert reasons["loop.pdf"] == "a symlink loop"
    assert reasons["dir.pdf"] in ("a directory", "Is a directory")
    fd, info = open_regular(tmp_path / "doc.pdf")
    try:
        assert info.st_size == 9 and os.fstat(fd).st_ino == info.st_ino
    finally:
        os.close(fd)
