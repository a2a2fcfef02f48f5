"""Outsider findings on ``run`` and ``drill``: bad flag values and the summary's strays.

Every run is a real ``python -m toolkit`` process.
"""

import json
import shutil

import pytest
from conftest import run_cli

from toolkit.ledger import open_ledger


@pytest.mark.parametrize("value", ["x", "1.5", "nan", ""])
def test_bad_jobs_value_is_one_line_error_exit_2_not_argparse_usage(value):
    """Fault: ``drill all --jobs <not an int>``. Property: one line on stderr naming
    ``--jobs``, exit 2, no usage block, no drill run (stdout empty)."""
    result = run_cli("drill", "all", "--jobs", value)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--jobs" in lines[0] and "usage:" not in result.stderr, \
        result.stderr
    assert result.stdout == ""


def test_bad_int_flag_of_run_is_one_line_error_exit_2():
    """Fault: ``run --workers x`` (every subcommand shares the rule). Property: one line,
    exit 2."""
    result = run_cli("run", "--workers", "x")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "usage:" not in result.stderr


@pytest.mark.slow
def test_removed_input_left_not_at_rest_is_counted_in_run_summary_so_it_matches_ledger(
        tmp_path, small_corpus):
    """Fault: a run leaves its items not at rest (the provider refuses every submit), then
    one input is deleted and the batch is rerun. Property: the rerun's summary counts the
    stray item (``items`` and ``by_state`` equal the ledger's), says ``strays=1``, exits 1."""
    folder = tmp_path / "in"
    folder.mkdir()
    docs = [doc for doc in small_corpus if "poison" not in doc.name][:3]
    for doc in docs:
        shutil.copyfile(doc, folder / doc.name)
    args = ["--inputs", folder, "--ledger", tmp_path / "l.sqlite", "--provider-db",
            tmp_path / "p.sqlite", "--out", tmp_path / "out", "--no-progress"]
    assert run_cli("run", *args, "--transient-rate", "1").returncode == 1
    (folder / docs[0].name).unlink()
    text = run_cli("run", *args)
    assert text.returncode == 1, text.stderr
    assert "(items=3, strays=1)" in text.stdout, text.stdout
    again = run_cli("run", *args, "--json")
    summary = json.loads(again.stdout)
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        states = [item.state.value for item in ledger.items()]
    assert summary["items"] == len(states) == 3 and summary["strays"] == 1
    assert {k: v for k, v in summary["by_state"].items() if v} == \
        {state: states.count(state) for state in set(states)}


def test_removed_input_beside_other_unsettled_items_is_still_named_with_its_cancel(
        tmp_path, small_corpus):
    """Fault (outsider o42 F6): every submit refused (transient), so all items stay
    ``failed`` transient; one input is deleted and the batch rerun, still refused. Must
    hold: the rerun says both things, the others "run the same command again" and the
    removed one by name with its ``cancel`` command; exit 1. Before: only "2 item(s) not
    at rest: run the same command again", which never settles the third."""
    folder = tmp_path / "in"
    folder.mkdir()
    docs = [doc for doc in small_corpus if "poison" not in doc.name][:3]
    for doc in docs:
        shutil.copyfile(doc, folder / doc.name)
    args = ["run", "--inputs", folder, "--ledger", tmp_path / "l.sqlite", "--provider-db",
            tmp_path / "p.sqlite", "--out", tmp_path / "out", "--no-progress",
            "--transient-rate", "1"]
    assert run_cli(*args).returncode == 1
    (folder / docs[0].name).unlink()
    rerun = run_cli(*args)
    assert rerun.returncode == 1, rerun.stderr
    assert "2 item(s) not at rest: run the same command again" in rerun.stderr
    assert f"({docs[0].name}, failed)" in rerun.stderr and " cancel " in rerun.stderr, \
        rerun.stderr
