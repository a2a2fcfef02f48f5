"""The rest of the second outsider round on the o25 fixes (o26 P5, P6).

* P5: with TMPDIR full (or this process's file-size limit below the ledger's size),
  ``health``, ``ledger`` and ``review`` said the ledger was not ready or bad input (exit 2):
  a full scratch space is the storage's, exit 1, one line naming TMPDIR. A JSONL ledger is
  now read in place (no copy), so it needs no room in TMPDIR at all.
* P6: ``health --clear`` said "ready" while a live writer held the JSONL lock; ``ledger
  --salvage NEW`` wrote NEW inside the batch's recorded inputs folder; a ``stale_input``
  detail said "a later run took it up" of an item that was there before the change.

Every fault is real: a tmpfs filled to ENOSPC, RLIMIT_FSIZE, a second process holding the
lock, real runs and real files.
"""

import hashlib
import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import fill_disk, tmpfs_mount
from toolkit import roots
from toolkit.documents import make_corpus
from toolkit.ledger import State, open_ledger
from toolkit.runner.ops import health_marker, mark_unhealthy

VIEWS = (("health", "--ledger"), ("ledger",), ("review", "--ledger"))


def tk(cwd, *args, env=None, preexec_fn=None):
    return subprocess.run([sys.executable, "-m", "toolkit", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, preexec_fn=preexec_fn)


def listing(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else "dir" for p in sorted(folder.rglob("*"))}


def ledger_of(path: Path, items: int = 40) -> Path:
    """A real ledger of ``items`` items (a claim, a move and a release each), closed."""
    with open_ledger(path) as ledger:
        for n in range(items):
            key = f"key-{n:04d}-" + "x" * 40
            ledger.add(key, source=f"document-{n:04d}.pdf")
            token = ledger.claim(key, "w", 60.0)
            ledger.move(key, State.PENDING, State.UNKNOWN, token=token, worker="w")
            ledger.release(key, token, "w")
    Path(f"{path}.lock").unlink(missing_ok=True)  # as copied from elsewhere: nothing beside
    return path


def view(cwd, command, ledger, **options):
    return tk(cwd, *command, ledger, **options)


# -- P5: a full TMPDIR is the storage's, named; a JSONL ledger needs none of it ---------------

@pytest.fixture
def full_tmpdir(tmp_path):
    """A real tmpfs of 64 KiB, filled but for 8 KiB (less than any ledger here), as TMPDIR."""
    with tmpfs_mount(tmp_path / "scratch", "size=64k") as scratch:
        fill_disk(scratch, room=8192)
        yield scratch


@pytest.mark.parametrize("room", ["none", "the copy alone"])
def test_full_tmpdir_sqlite_views_exit_1_with_one_line_naming_tmpdir(tmp_path, room):
    """Fault: TMPDIR (a real tmpfs) is full; the views read an SQLite ledger from a private
    copy made there. With 8 KiB left the copy fails (ENOSPC); with room for the copy alone
    SQLite cannot make the copy's -shm ("disk I/O error"). Property: ``health``, ``ledger``
    and ``review`` each exit 1 with one line on stderr naming TMPDIR's folder and saying it
    is full (before: health said the ledger was "not ready" on stdout, ledger and review
    exited 2 as for bad input, or named the ledger's own I/O); nothing beside the ledger
    changes."""
    work = tmp_path / "work"
    work.mkdir()
    size = ledger_of(work / "l.sqlite").stat().st_size
    assert size > 8192
    before = listing(work)
    with tmpfs_mount(tmp_path / "scratch", "size=256k") as scratch:
        fill_disk(scratch, room=8192 if room == "none" else size + 4096)
        results = [(command, view(work, command, "l.sqlite", env={"TMPDIR": str(scratch)}))
                   for command in VIEWS]
    for command, result in results:
        assert result.returncode == 1, (command, result)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, (command, result)
        assert f"TMPDIR {str(scratch)!r} is full" in lines[0], (command, lines)
        assert result.stdout == "", (command, result)
    assert listing(work) == before


def test_full_tmpdir_jsonl_views_read_the_ledger_in_place_and_answer(tmp_path, full_tmpdir):
    """Fault: TMPDIR is full (a real tmpfs). Property: a JSONL ledger is read in place, not
    copied there: ``health`` is ready (exit 0), ``ledger`` lists its 40 items, ``review``
    answers (exit 0); nothing is made beside the ledger (no lock) and nothing is left in
    TMPDIR. Before: the copy failed, health was not ready and ledger/review exited 2."""
    work = tmp_path / "work"
    work.mkdir()
    assert ledger_of(work / "l.jsonl").stat().st_size > 8192
    before, scratch = listing(work), sorted(os.listdir(full_tmpdir))
    results = {command[0]: view(work, command, "l.jsonl", env={"TMPDIR": str(full_tmpdir)})
               for command in VIEWS}
    assert all(r.returncode == 0 for r in results.values()), results
    assert results["health"].stdout.strip() == "ready"
    assert "unknown=40" in results["ledger"].stdout
    assert results["review"].stdout.startswith("needs_review (0)")
    assert listing(work) == before and sorted(os.listdir(full_tmpdir)) == scratch


def test_file_size_limit_below_the_ledger_sqlite_views_exit_1_jsonl_views_answer(tmp_path):
    """Fault: RLIMIT_FSIZE (real, 16 KiB) below the ledger's size: a private copy of it is
    refused (EFBIG). Property: on an SQLite ledger each view exits 1 with one line naming
    TMPDIR and the file-size limit (before: health "not ready", ledger and review exit 2);
    a JSONL ledger of the same items is never copied: each view answers, exit 0."""
    for name in ("l.sqlite", "l.jsonl"):
        ledger_of(tmp_path / name, items=200)
        assert (tmp_path / name).stat().st_size > 16384

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))

    before = listing(tmp_path)
    for command in VIEWS:
        refused = view(tmp_path, command, "l.sqlite", preexec_fn=limit)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 1 and len(lines) == 1, (command, refused)
        assert "TMPDIR" in lines[0] and "file-size limit" in lines[0], (command, lines)
        answered = view(tmp_path, command, "l.jsonl", preexec_fn=limit)
        assert answered.returncode == 0, (command, answered)
    assert listing(tmp_path) == before


# -- P6 (a): --clear while a live writer holds the JSONL lock --------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from toolkit.ledger import open_ledger
    with open_ledger(sys.argv[1]) as ledger:  # the one writer: it holds <ledger>.lock
        print("holding", flush=True)
        sys.stdin.read()  # until the test closes our stdin
""")


def test_writer_holding_the_jsonl_lock_clear_is_not_ready_names_its_pid_keeps_the_marker(
        tmp_path):
    """Fault: a batch failed closed (the health marker is there) and another live process
    (a real second process) holds the JSONL ledger's writer lock. Property: ``health
    --clear`` says not ready, in use by that process's pid, exit 1, and the marker stays
    (before: "ready", exit 0, the marker removed under a live writer); once the writer
    has exited, --clear says ready and removes it."""
    ledger = ledger_of(tmp_path / "l.jsonl", items=3)
    assert mark_unhealthy(ledger, "disk full while recording")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(ledger)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "holding"
        busy = tk(tmp_path, "health", "--ledger", "l.jsonl", "--clear")
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert busy.returncode == 1, busy
    assert busy.stdout.startswith("not ready: in use by live process "), busy
    assert f"live process {holder.pid}:" in busy.stdout
    assert health_marker(ledger).exists()
    cleared = tk(tmp_path, "health", "--ledger", "l.jsonl", "--clear")
    assert cleared.returncode == 0 and cleared.stdout.strip() == "ready", cleared
    assert not health_marker(ledger).exists()


# -- P6 (b): --salvage into a folder of the batch ---------------------------------------------

def _damaged_batch(tmp_path) -> Path:
    """A JSONL ledger with a corrupt interior line whose recorded roots are in/ and out/."""
    for folder in ("in", "out"):
        (tmp_path / folder).mkdir()
    ledger = ledger_of(tmp_path / "l.jsonl", items=3)
    roots.record(ledger, out=tmp_path / "out", inputs=tmp_path / "in")
    lines = ledger.read_bytes().split(b"\n")
    lines[3] = b"{garbage"
    ledger.write_bytes(b"\n".join(lines))
    return ledger


@pytest.mark.parametrize("target", ["in/salvaged.jsonl", "out/salvaged.jsonl",
                                    "in/../in/salvaged.jsonl", "alias/salvaged.jsonl"])
def test_salvage_into_a_recorded_folder_of_the_batch_is_refused_and_writes_nothing(
        tmp_path, target):
    """Fault: ``ledger L --salvage NEW`` with NEW inside the inputs (or outputs) root
    recorded beside L, by its name, a ``..`` spelling or a symlinked folder. Property: one
    line naming the folder, exit 2, nothing written anywhere (as ``audit --csv`` refuses
    a file there; before: the new ledger was written among the inputs); outside the
    batch's folders the salvage goes on."""
    _damaged_batch(tmp_path)
    (tmp_path / "alias").symlink_to("in")
    before = listing(tmp_path)
    refused = tk(tmp_path, "ledger", "l.jsonl", "--salvage", target)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused
    assert "recorded beside the ledger" in lines[0] and "refusing" in lines[0], lines
    assert listing(tmp_path) == before
    salvaged = tk(tmp_path, "ledger", "l.jsonl", "--salvage", "salvaged.jsonl")
    assert salvaged.returncode == 0, salvaged
    assert (tmp_path / "salvaged.jsonl").is_file()


# -- P6 (c): stale_input of an item whose new content was an item before the change ----------

def test_input_overwritten_by_another_inputs_content_says_no_later_run_took_it_up(tmp_path):
    """Fault: after a real run to done, an input is overwritten with another input's bytes:
    its new content was an item before the change, no later run took anything up.
    Property: ``stale_input``'s detail names that item and does not claim "a later run took
    it up" (before: it did, which is false here); the done item keeps its artifact's plan."""
    make_corpus(tmp_path / "in", docs=2, poison=0, seed=26)
    ran = tk(tmp_path, "run", "--inputs", "in", "--ledger", "l.sqlite", "--provider-db",
             "p.sqlite", "--out", "out", "--no-progress")
    assert ran.returncode == 0, ran.stderr
    first, second = sorted((tmp_path / "in").iterdir())
    first.write_bytes(second.read_bytes())
    audited = tk(tmp_path, "audit", "l.sqlite", "--inputs", "in", "--json")
    assert audited.returncode == 0, audited.stderr
    document = json.loads(audited.stdout)
    stale = [a for a in document["anomalies"] if a["kind"] == "stale_input"]
    assert len(stale) == 1, document["anomalies"]
    other = next(row for row in document["per_item"] if row["source"] == second.name)
    assert f"its new content is item {other['key']}" in stale[0]["detail"]
    assert "later run took it up" not in stale[0]["detail"], stale
    assert "before the change" in stale[0]["detail"]


# -- twin: one wording of a damaged JSONL ledger ----------------------------------------------

def test_corrupt_line_view_refusal_words_the_damage_as_the_ledger_does(tmp_path, capsys):
    """Fault: an interior line of a JSONL ledger is corrupt. Property: ``ledger`` and
    ``review`` refuse it (exit 2) in the ledger's own words, the damage clause of
    ``JsonlLedger.corruption`` (which ``run`` and ``health`` give) naming the user's path,
    never a second wording of the same damage (before: "line 4 is damaged or unusable")."""
    from toolkit.cli import main
    from toolkit.ledger.jsonl import JsonlLedger

    ledger = _damaged_batch(tmp_path)
    view_ = JsonlLedger(ledger, view=True)
    try:
        damage = view_.corruption().split(";")[0]
    finally:
        view_.close()
    assert damage.startswith(f"JSONL ledger {str(ledger)!r} has corrupt lines 4 ")
    for argv in (["ledger", str(ledger)], ["review", "--ledger", str(ledger)]):
        capsys.readouterr()
        assert main(argv) == 2
        error = capsys.readouterr().err.strip()
        assert len(error.splitlines()) == 1 and error.startswith(f"error: {damage}; refusing "
                                                                 "to list its items"), error


def test_full_tmpdir_audit_of_a_dead_writers_wal_exits_1_naming_tmpdir(tmp_path):
    """Fault: TMPDIR (a real tmpfs) is full, and an SQLite ledger has a dead writer's -wal
    (a writer killed with its connection open: the audit must read it from a private copy,
    as even ``mode=ro`` would rebuild -shm beside it). Property: ``audit`` exits 1 with one
    line naming TMPDIR as full, as the views do (before: exit 2, as for bad input); nothing
    beside the ledger changes."""
    work = tmp_path / "work"
    work.mkdir()
    writer = subprocess.run([sys.executable, "-c", (
        "import os, sys; from toolkit.ledger import open_ledger\n"
        "ledger = open_ledger(sys.argv[1])\n"
        "for n in range(40): ledger.add(f'key-{n:04d}-' + 'x' * 40, source=f'd{n}.pdf')\n"
        "os.kill(os.getpid(), 9)"), str(work / "l.sqlite")], capture_output=True, text=True)
    assert writer.returncode == -9, writer
    Path(f"{work / 'l.sqlite'}.lock").unlink(missing_ok=True)
    assert (work / "l.sqlite-wal").stat().st_size > 8192  # the copy needs more than is left
    before = listing(work)
    with tmpfs_mount(tmp_path / "scratch", "size=256k") as scratch:
        fill_disk(scratch, room=8192)
        result = tk(work, "audit", "l.sqlite", env={"TMPDIR": str(scratch)})
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"TMPDIR {str(scratch)!r} is full" in lines[0], result
    assert listing(work) == before
