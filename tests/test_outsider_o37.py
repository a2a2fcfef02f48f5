"""Outsider o37 (README only): what the views of a damaged ledger advise must paste."""

import subprocess
import sys

import pytest


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "toolkit", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("command", ["ledger", "review"])
def test_damaged_jsonl_view_advises_a_salvage_beside_the_ledger_that_pastes_from_any_folder(
        tmp_path, command):
    """Fault: a JSONL ledger with a corrupt interior line, read by ``ledger`` or ``review``
    (a private view) from the ledger's folder with a relative path, under a folder named
    with a space, a quote and a $. Property: exit 2, and the printed salvage command, run
    by bash from /, writes the new ledger beside the original. Before: it named the view's
    private folder, already removed ("no folder ... to hold it")."""
    folder = tmp_path / "we ird 'q $x"
    folder.mkdir()
    assert _cli("fixtures", "in", "--docs", "3", "--seed", "1", cwd=folder).returncode == 0
    ran = _cli("run", "--inputs", "in", "--ledger", "l.jsonl", "--provider-db", "p.sqlite",
               "--out", "out", cwd=folder)
    assert ran.returncode == 0, ran.stderr
    lines = (folder / "l.jsonl").read_text().splitlines(keepends=True)
    lines[4] = "garbage{\n"
    (folder / "l.jsonl").write_text("".join(lines))
    before = (folder / "l.jsonl").read_bytes()
    said = _cli(*(["ledger", "l.jsonl"] if command == "ledger" else
                  ["review", "--ledger", "l.jsonl"]), cwd=folder)
    assert said.returncode == 2 and "--salvage" in said.stderr
    salvage = said.stderr.strip().rsplit("then ", 1)[1]
    pasted = subprocess.run(["bash", "-c", salvage], cwd="/", capture_output=True, text=True,
                            timeout=300)
    assert pasted.returncode == 0, (salvage, pasted.stderr)
    assert (folder / "l.salvaged.jsonl").is_file()
    assert (folder / "l.jsonl").read_bytes() == before


def test_review_decide_commands_name_the_ledger_absolute_and_paste_from_any_folder(tmp_path):
    """Fault: ``review --ledger l.sqlite`` (relative) in the ledger's folder, the printed
    ``resolve`` line pasted into bash from /. Property: it names the ledger absolute and
    works there (a dry run: nothing written). Before: the relative path named no ledger
    from / ("no ledger at ...", exit 2)."""
    from toolkit.ledger import State, open_ledger

    folder = tmp_path / "we ird 'q $x"
    folder.mkdir()
    key = "ab" + "0" * 62
    with open_ledger(folder / "l.sqlite") as ledger:
        ledger.add(key)
        ledger.move(key, State.PENDING, State.UNKNOWN)
        ledger.move(key, State.UNKNOWN, State.NEEDS_REVIEW, reason="why")
    said = _cli("review", "--ledger", "l.sqlite", cwd=folder)
    assert said.returncode == 0, said.stderr
    (release,) = [line.strip() for line in said.stdout.splitlines()
                  if "resolve" in line and "--release" in line]
    pasted = subprocess.run(["bash", "-c", release + " --dry-run"], cwd="/",
                            capture_output=True, text=True, timeout=300)
    assert pasted.returncode == 0, (release, pasted.stderr)
    assert key[:12] in pasted.stdout + pasted.stderr
