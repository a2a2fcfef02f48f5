"""Outsider o40, LOW 1: the commands a message tells a person to run must paste into bash
and work from any folder, whatever the path's name (``toolkit/advice.py``).

A ledger named ``-bad.sqlite`` (or a file in a folder with a space) got the advice ``mv
-bad.sqlite -bad.sqlite.damaged`` (``mv: invalid option``) and ``python -m toolkit ledger
-bad.sqlite --salvage ...`` (an argparse error), each relative to the folder the failing
command ran in. Every file an advice names is now absolute: it starts with ``/``, never
with ``-``, and names the same file from any folder.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

from toolkit.ledger import State, open_ledger

S = State
ENV = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path(__file__).resolve().parents[1]))}


def _toolkit(*args, cwd):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=120)


def _pasted(command: str, cwd):
    """``command`` as a person pastes it into bash, in ``cwd`` (another folder)."""
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=120)


def test_damaged_sqlite_named_dash_advice_mv_and_salvage_paste_from_another_folder(tmp_path):
    """Fault: a non-database file ``-bad.sqlite`` in a folder with a space, read by
    ``ledger -- -bad.sqlite`` run in that folder. Property: the advised ``mv``, pasted into
    bash in another folder, moves that very file; the advised salvage, pasted there (its
    OUT filled in), reaches the toolkit as a salvage of that ledger, not an argparse error."""
    folder = tmp_path / "a b"
    folder.mkdir()
    (folder / "-bad.sqlite").write_bytes(b"not a database, " * 64)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    done = _toolkit("ledger", "--", "-bad.sqlite", cwd=folder)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    mv, salvage = re.findall(r"`([^`]*)`", done.stderr)
    assert mv.startswith("mv ") and salvage.startswith("python -m toolkit ledger "), done.stderr

    moved = _pasted(mv, elsewhere)
    assert moved.returncode == 0, (mv, moved.stderr)
    assert (folder / "-bad.sqlite.damaged").is_file() and not (folder / "-bad.sqlite").exists()

    (tmp_path / "out").mkdir()
    tried = _pasted(salvage.replace(" OUT", f" {tmp_path / 'out'}"), elsewhere)
    assert "usage:" not in tried.stderr and "Traceback" not in tried.stderr, tried.stderr
    assert f"no ledger at {str(folder / '-bad.sqlite')!r}" in tried.stderr, tried.stderr


def test_jsonl_line_1_edited_named_dash_audit_and_salvage_advice_paste_from_another_folder(
        tmp_path):
    """Fault: a JSONL ledger ``-l.jsonl`` whose line 1 was edited to version 0, read by
    ``ledger -- -l.jsonl`` in its folder. Property: after line 1 is set back as the message
    says, the advised audit and salvage, pasted into bash in another folder, audit that
    ledger and write the salvaged ledger beside it (exit 0 each)."""
    path = tmp_path / "-l.jsonl"
    with open_ledger(path) as ledger:
        for key in ("a", "b"):
            ledger.add(key)
            ledger.move(key, S.PENDING, S.UNKNOWN)
    (tmp_path / "-l.jsonl.lock").unlink()
    whole = path.read_bytes()
    path.write_bytes(whole.replace(b'"version": 1}', b'"version": 0}', 1))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    refused = _toolkit("ledger", "--", "-l.jsonl", cwd=tmp_path)
    assert refused.returncode == 2 and "line 1 was edited" in refused.stderr, refused.stderr
    audit, salvage = re.findall(r"python -m toolkit (?:audit|ledger) .*?(?=, then |$)",
                                refused.stderr.strip())
    path.write_bytes(whole)  # line 1 set back, as the message says
    audited = _pasted(audit, elsewhere)
    assert audited.returncode == 0, (audit, audited.stderr)
    salvaged = _pasted(salvage, elsewhere)
    assert salvaged.returncode == 0, (salvage, salvaged.stderr)
    assert (tmp_path / "-l.salvaged.jsonl").is_file()
