"""An SQLite ledger whose bytes are damaged (cut short by an interrupted copy or
``truncate``, a page zeroed, a JSON file under a ``.sqlite`` name) against a full TMPDIR.

The damage is the ledger's: ``run``, ``ledger``, ``health`` and ``ledger --salvage`` say so
in one line, exit 2, naming ``sqlite3 L .recover`` (for an SQLite file) and the salvage from
nothing that works (move it aside, ``ledger L --salvage NEW --out OUT``, run NEW); never
"TMPDIR failed … free space there" with the disk empty, never exit 1 ("run again": a rerun
reads the same bytes). A TMPDIR really full while the private copy is written stays the
storage's: exit 1 naming TMPDIR, no verdict on the ledger. All faults are real files and a
real tmpfs (outsider o33 Q6).
"""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import fill_disk, tmpfs_mount

PAGE = 4096


def _toolkit(*args, cwd, env=None):
    done = subprocess.run([sys.executable, "-m", "toolkit", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=300)
    return done.returncode, done.stderr


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """A finished batch: its ledger ``H.sqlite`` (several pages), inputs, outputs, provider."""
    from toolkit.documents import make_corpus

    folder = tmp_path_factory.mktemp("batch")
    make_corpus(folder / "in", docs=6, poison=0, seed=3)
    status, err = _toolkit("run", "--inputs", "in", "--ledger", "H.sqlite", "--provider-db",
                           "p.db", "--out", "A", "--no-progress", cwd=folder)
    assert status == 0, err
    assert os.path.getsize(folder / "H.sqlite") >= 4 * PAGE
    return folder


def _damaged_copy(batch, name, damage):
    """``H.sqlite`` copied to ``name`` (with its roots file) and damaged by ``damage(path)``."""
    path = batch / name
    for suffix in ("", ".roots.json"):
        shutil.copyfile(batch / f"H.sqlite{suffix}", f"{path}{suffix}")
    damage(path)
    return path


def _cut(size):
    return lambda path: os.truncate(path, size)


def _zero(page):
    def damage(path):
        with open(path, "r+b") as handle:
            handle.seek(page * PAGE)
            handle.write(b"\0" * PAGE)
    return damage


COMMANDS = {
    "ledger": lambda name: ["ledger", name],
    "health": lambda name: ["health", "--ledger", name],
    "salvage": lambda name: ["ledger", name, "--salvage", "S.sqlite", "--out", "A"],
    "run": lambda name: ["run", "--inputs", "in", "--ledger", name, "--provider-db", "p.db",
                         "--out", "A", "--no-progress"],
}


def _assert_damage_words(status, err, name, recover=True):
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{name}' is damaged" in err, err
    assert "TMPDIR" not in err and "free space" not in err and "run again" not in err, err
    assert f"mv " in err and "--salvage" in err and "--out" in err, err
    assert (".recover" in err) is recover, err


@pytest.mark.parametrize("size", [PAGE, 3 * PAGE, 3 * PAGE + 1000])
def test_ledger_cut_short_is_damage_exit_2_naming_salvage_not_tmpdir(batch, size):
    """A ledger cut short (a copy interrupted, ``truncate -s``) at several sizes, page
    aligned or not: every command says it is damaged, exit 2, one line, with the way out;
    no health marker is left (``run`` must not fail closed as for a failing disk), and the
    salvage writes no NEW."""
    name = f"cut{size}.sqlite"
    _damaged_copy(batch, name, _cut(size))
    for what, args in COMMANDS.items():
        status, err = _toolkit(*args(name), cwd=batch)
        _assert_damage_words(status, err, name)
    assert not (batch / f"{name}.health").exists()
    assert not (batch / "S.sqlite").exists()


@pytest.mark.parametrize("page", [0, 1])
def test_ledger_page_zeroed_is_damage_exit_2_naming_salvage_not_tmpdir(batch, page):
    """The header page or the first table page zeroed in place: damage, as a cut is
    (``.recover`` named only while the file still starts as an SQLite file)."""
    name = f"zero{page}.sqlite"
    _damaged_copy(batch, name, _zero(page))
    for what, args in COMMANDS.items():
        status, err = _toolkit(*args(name), cwd=batch)
        _assert_damage_words(status, err, name, recover=page != 0)


def test_json_file_named_sqlite_is_damage_exit_2_without_recover(batch):
    """A JSON file under the ledger's ``.sqlite`` name is no SQLite file: damaged, exit 2,
    the salvage named, ``.recover`` not (it reads SQLite files only)."""
    name = "json.sqlite"
    _damaged_copy(batch, name, lambda path: path.write_text('{"format": 1, "items": []}\n'))
    for what, args in COMMANDS.items():
        status, err = _toolkit(*args(name), cwd=batch)
        _assert_damage_words(status, err, name, recover=False)


def test_damaged_ledger_advice_followed_salvages_from_nothing_and_runs(batch):
    """The words are what works: moved aside, salvaged from nothing with the named --out (the
    witness says all was lost), the new ledger runs the batch to rest."""
    name = "advice.sqlite"
    _damaged_copy(batch, name, _cut(3 * PAGE))
    status, err = _toolkit(*COMMANDS["ledger"](name), cwd=batch)
    salvage = err.split("(`python -m toolkit ")[1].split("`")[0].split()
    new = salvage[salvage.index("--salvage") + 1]
    os.rename(batch / name, batch / f"{name}.damaged")
    status, err = _toolkit(*salvage, cwd=batch)
    assert status == 0, err
    status, err = _toolkit("run", "--inputs", "in", "--ledger", new, "--provider-db", "p.db",
                           "--out", "A", "--no-progress", cwd=batch)
    assert status == 0, err


def test_full_tmpdir_on_a_healthy_or_damaged_ledger_is_tmpdir_exit_1(batch, tmp_path):
    """The contrast: TMPDIR a real tmpfs too full for the private copy's write. A healthy
    ledger and a damaged one alike are exit 1 naming TMPDIR (the copy failed before any byte
    was judged: no verdict on the ledger), never 'damaged'."""
    name = "cutfull.sqlite"
    _damaged_copy(batch, name, _cut(3 * PAGE))
    with tmpfs_mount(tmp_path / "scratch", "size=16k") as scratch:
        fill_disk(scratch, room=PAGE)
        env = {**os.environ, "TMPDIR": str(scratch)}
        for ledger in ("H.sqlite", name):
            for what in ("ledger", "health", "salvage"):
                status, err = _toolkit(*COMMANDS[what](ledger), cwd=batch, env=env)
                assert status == 1, err
                assert f"TMPDIR {str(scratch)!r}" in err and "damaged" not in err, err
                assert err.count("\n") == 1, err


@pytest.mark.parametrize("table", ["items", "events"])
def test_table_page_zeroed_run_and_health_name_damage_before_any_work(batch, table):
    """The items or events table's root page zeroed: an open reads only the schema, so on
    main ``run`` halted mid-batch on it (exit 1, a health marker: "fix the cause, clear
    health", in a loop) or crashed in the witness's read of the events. Now ``run``,
    ``health``, ``health --clear`` and ``ledger`` read every page first: damaged, exit 2,
    one line with the salvage, no marker left, nothing sent."""
    import sqlite3

    db = sqlite3.connect(batch / "H.sqlite")
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name=?", (table,)).fetchone()[0]
    db.close()
    name = f"{table}.sqlite"
    _damaged_copy(batch, name, _zero(root - 1))
    for args in (COMMANDS["run"](name), COMMANDS["health"](name), COMMANDS["ledger"](name),
                 ["health", "--ledger", name, "--clear"]):
        status, err = _toolkit(*args, cwd=batch)
        _assert_damage_words(status, err, name)
    assert not (batch / f"{name}.health").exists()


def _strace_eio(syscalls, *args, cwd):
    """``python -m toolkit args`` with the kernel answering EIO to ``syscalls`` on the
    ledger ``H.sqlite`` only (strace ``-P``: the loader's and the copy's reads go on)."""
    inject = [word for call in syscalls for word in ("-e", f"inject={call}:error=EIO")]
    command = ["strace", "-f", "-qq", "-o", "/dev/null", "-P", str(cwd / "H.sqlite"),
               "-e", f"trace={','.join(syscalls)}", *inject,
               sys.executable, "-m", "toolkit", *args]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stderr or done.stdout  # health's "not ready: …" is stdout


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_eio_on_the_private_copy_write_is_tmpdir_and_on_its_read_the_ledgers(batch):
    """EIO from the copy's one ``sendfile`` (strace injects it) while the ledger's bytes read
    alone: TMPDIR failed a write, exit 1, naming TMPDIR, no verdict on the ledger. EIO to the
    ledger's read too: the ledger's storage, exit 1, 'cannot read' naming the ledger, never
    TMPDIR and never 'damaged'."""
    for what in ("ledger", "health"):
        status, err = _strace_eio(["sendfile"], *COMMANDS[what]("H.sqlite"), cwd=batch)
        assert status == 1 and err.count("\n") == 1, err
        assert "TMPDIR" in err and "Input/output error" in err and "damaged" not in err, err
        status, err = _strace_eio(["sendfile", "pread64"], *COMMANDS[what]("H.sqlite"),
                                  cwd=batch)
        assert status == 1 and err.count("\n") == 1, err
        assert "cannot read" in err and "H.sqlite" in err and "Input/output error" in err, err
        assert "TMPDIR" not in err and "damaged" not in err, err
