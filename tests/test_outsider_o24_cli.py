"""Outsider o24's CLI findings F1, F3, F6, each reproduced with the real thing: a FIFO made
by ``mkfifo``, a symlink, a character device made by ``mknod``, a JSONL ledger whose key
holds a lone surrogate printed through a real pipe, a ledger path in a folder that does
not exist.
"""

import json
import os
import stat

import pandas as pd
import pytest

from toolkit.cli import main
from toolkit.errors import ToolkitError
from toolkit.forensics.csvout import write_atomic

from conftest import run_cli


def jsonl_ledger(path, key="k1"):
    event = {"attempt": 0, "detail": {"source": "s.pdf"}, "from": None, "key": key,
             "op": "add", "seq": 1, "to": "pending", "token": 0, "ts": 1.0, "worker": None}
    path.write_text('{"format": "resume-toolkit-ledger-jsonl", "version": 1}\n'
                    + json.dumps(event) + "\n")
    return path


def node_identity(path):
    info = os.lstat(path)
    return (info.st_ino, info.st_mode, info.st_rdev, info.st_size)


def make_node(tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "myfifo"
        os.mkfifo(path)
    elif kind == "symlink":
        (tmp_path / "other.txt").write_text("keep\n")
        path = tmp_path / "link.csv"
        path.symlink_to("other.txt")
    else:
        path = tmp_path / "mynull"
        try:  # /dev/null's numbers: as root, --csv /dev/null would have destroyed the node
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod is not permitted here")
    return path


# -- F1: --csv never replaces what is not a regular file --------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "symlink", "device"])
def test_audit_csv_onto_fifo_symlink_or_device_is_refused_and_the_node_is_unchanged(
        tmp_path, capsys, kind):
    """Fault: ``audit --csv PATH`` where PATH is a FIFO, a symlink or a device node (the
    temporary file used to be renamed over it, turning it into a regular file). Property:
    one line, exit 2, and the node at PATH (inode, type, device numbers) and the audited
    ledger are unchanged; no temporary file is left in the folder."""
    ledger = jsonl_ledger(tmp_path / "l.jsonl")
    before_ledger = ledger.read_bytes()
    target = make_node(tmp_path, kind)
    before = node_identity(target)
    listing = sorted(os.listdir(tmp_path))
    assert main(["audit", str(ledger), "--csv", str(target)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not a regular file" in err
    assert node_identity(target) == before
    assert ledger.read_bytes() == before_ledger
    assert sorted(os.listdir(tmp_path)) == listing
    if kind == "symlink":
        assert (tmp_path / "other.txt").read_text() == "keep\n"


@pytest.mark.parametrize("kind", ["fifo", "symlink", "device"])
def test_write_atomic_refuses_a_node_that_is_not_a_regular_file_before_its_temp_file(
        tmp_path, kind):
    """Fault: the CSV writer itself called on a FIFO, a symlink or a device node (any
    caller, not only ``audit``'s checked path). Property: ToolkitError before the temporary
    file exists; the node is unchanged and the folder holds nothing new."""
    target = make_node(tmp_path, kind)
    before = node_identity(target)
    listing = sorted(os.listdir(tmp_path))
    with pytest.raises(ToolkitError, match="not a regular file"):
        write_atomic(pd.DataFrame({"key": ["k1"]}), target)
    assert node_identity(target) == before
    assert sorted(os.listdir(tmp_path)) == listing


def test_write_atomic_still_replaces_a_regular_csv(tmp_path):
    """Property kept: a regular file at PATH (the previous CSV) is replaced whole."""
    target = tmp_path / "a.csv"
    target.write_text("old\n")
    write_atomic(pd.DataFrame({"key": ["k1"]}), target)
    assert target.read_text().splitlines() == ["key", "k1"]


# -- F3: text output of a key holding a lone surrogate ----------------------------------------

@pytest.mark.slow
def test_ledger_text_output_of_a_lone_surrogate_key_is_escaped_not_a_traceback(tmp_path):
    """Fault: a JSONL ledger whose key is ``"k\\ud800"`` (a lone surrogate, valid JSON,
    not encodable as UTF-8) listed by ``ledger PATH`` in text mode, through a real pipe.
    Property: exit 0, the key printed as its escape ``k\\ud800``, no traceback."""
    ledger = jsonl_ledger(tmp_path / "sur.jsonl", key="k\ud800")
    result = run_cli("ledger", ledger)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "k\\ud800" in result.stdout


# -- F6: health on a ledger path whose folder does not exist ----------------------------------

def test_health_on_a_ledger_in_a_missing_folder_is_bad_input_and_creates_nothing(
        tmp_path, capsys):
    """Fault: ``health --ledger nope/l.sqlite`` (a typo in the folder). Property (README):
    a ledger in a folder that does not exist is bad input: one line, exit 2, and no folder
    or file is created; ``--clear`` says the same."""
    ledger = tmp_path / "nope" / "l.sqlite"
    for extra in ([], ["--clear"]):
        assert main(["health", "--ledger", str(ledger), *extra]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "nope" in err
    assert os.listdir(tmp_path) == []


def test_health_on_a_missing_ledger_in_an_existing_folder_stays_not_ready(tmp_path, capsys):
    """Fault: ``health --ledger l.sqlite`` where the folder exists but no ledger was made
    yet. Property (README's health line): not ready, exit 1, and nothing is created."""
    assert main(["health", "--ledger", str(tmp_path / "l.sqlite")]) == 1
    assert "no ledger at this path" in capsys.readouterr().out
    assert os.listdir(tmp_path) == []


def test_audit_csv_new_file_gets_the_umask_mode_and_a_replaced_one_keeps_its_mode(tmp_path):
    """mkstemp's temporary file is 0600: renamed over the target, a new CSV was unreadable
    to the group and others whatever the umask, and a replaced CSV lost its mode."""
    table = pd.DataFrame({"key": ["a"]})
    new, kept = tmp_path / "new.csv", tmp_path / "kept.csv"
    kept.write_text("old\n")
    kept.chmod(0o640)
    umask = os.umask(0o022)
    try:
        write_atomic(table, new)
        write_atomic(table, kept)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o644
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640
