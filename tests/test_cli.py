"""The command line: --help everywhere, one-line errors, JSON alone on stdout."""

import json
import subprocess
import sys

import pytest

from toolkit.cli import COMMANDS
from toolkit.ledger import State, open_ledger


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "toolkit", *map(str, args)],
                          capture_output=True, text=True)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_subcommand_has_help(name):
    result = run_cli(name, "--help")
    assert result.returncode == 0 and "usage:" in result.stdout


def test_top_level_help_lists_every_subcommand():
    result = run_cli("--help")
    assert result.returncode == 0
    assert all(name in result.stdout for name in COMMANDS)


def test_missing_ledger_is_a_one_line_error_not_a_traceback(tmp_path):
    result = run_cli("ledger", tmp_path / "nope.sqlite")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_unknown_suffix_is_a_one_line_error(tmp_path):
    path = tmp_path / "state.txt"
    path.write_text("x")
    result = run_cli("ledger", path)
    assert result.returncode == 2 and result.stderr.startswith("error: unknown ledger type")


def test_ledger_json_is_the_only_thing_on_stdout(tmp_path):
    path = tmp_path / "l.jsonl"
    with open_ledger(path) as ledger:
        ledger.add("k1", source="a.pdf")
        ledger.add("k2", source="b.pdf")
        ledger.move("k2", State.PENDING, State.FAILED, failure="permanent", reason="truncated")
    result = run_cli("ledger", path, "--json")
    assert result.returncode == 0
    document = json.loads(result.stdout)
    assert document["items"] == 2
    assert document["by_state"]["pending"] == 1 and document["by_state"]["failed"] == 1
    assert [(i["key"], i["state"], i["attempt"], i["reason"]) for i in document["per_item"]] == \
        [("k1", "pending", 0, None), ("k2", "failed", 0, "truncated")]


def test_audit_json_has_exactly_the_documented_keys_and_modifies_nothing():
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "ledgers" / "state.jsonl"
    before = (fixture.read_bytes(), fixture.stat().st_mtime_ns)
    result = run_cli("audit", fixture, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"format", "items", "by_state", "corrupt_lines", "anomalies", "plan",
                           "per_item"}
    assert report["format"] == "jsonl-state" and report["corrupt_lines"]
    assert set(report["plan"]) == {"skip", "verify", "reconcile", "retry", "review", "run"}
    assert len(report["per_item"]) == report["items"]
    assert (fixture.read_bytes(), fixture.stat().st_mtime_ns) == before


def test_audit_of_an_unsupported_file_is_one_line_listing_the_formats(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    result = run_cli("audit", path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "supported formats" in result.stderr and "Traceback" not in result.stderr
