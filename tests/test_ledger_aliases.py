"""A second name for one ledger file (a symlink alias, a hard link) must not let a
second writer in: every lock, WAL and health marker is named after the canonical path,
and a ledger file with more than one hard link is refused."""

import os
import subprocess
import sys

import pytest

from toolkit.documents import make_corpus
from toolkit.errors import LedgerError
from toolkit.ledger import open_ledger
from toolkit.provider import provider_stats
from toolkit.runner.ops import health, mark_unhealthy

pytestmark = pytest.mark.slow


def _run(tmp_path, ledger):
    command = [sys.executable, "-m", "toolkit", "run", "--inputs", str(tmp_path / "in"),
               "--ledger", str(ledger), "--provider-db", str(tmp_path / "p.db"),
               "--out", str(tmp_path / "out"), "--contract", "non-idempotent",
               "--no-progress"]
    return subprocess.run(command, capture_output=True, text=True)


def _executions(tmp_path):
    return provider_stats(tmp_path / "p.db")["executions"] if (tmp_path / "p.db").exists() else 0


def test_symlink_alias_of_a_held_jsonl_ledger_is_refused_without_any_execution(tmp_path):
    """A writer holds L.jsonl; a real `run` process types alias.jsonl -> L.jsonl. Before,
    the lock followed the typed name (alias.jsonl.lock): both wrote, every document ran
    twice. The alias must meet the same lock: refused, nothing executed, no alias lock."""
    make_corpus(tmp_path / "in", docs=2, poison=0, seed=3)
    os.symlink("L.jsonl", tmp_path / "alias.jsonl")
    with open_ledger(tmp_path / "L.jsonl"):  # the first writer, alive for the whole run
        second = _run(tmp_path, tmp_path / "alias.jsonl")
    assert second.returncode != 0 and "another writer" in second.stderr
    assert _executions(tmp_path) == 0
    assert not (tmp_path / "alias.jsonl.lock").exists()


@pytest.mark.parametrize("name", ["L.jsonl", "L.sqlite"])
def test_hard_linked_ledger_is_refused_by_run_with_one_line_and_no_execution(tmp_path, name):
    """A ledger file with two hard links: the JSONL lock and SQLite's WAL/journal are named
    after the path, so two names are two writers on one file. `run` must refuse it
    (exit 2, one line saying why) before executing anything; the file is unchanged."""
    make_corpus(tmp_path / "in", docs=2, poison=0, seed=3)
    with open_ledger(tmp_path / name) as ledger:
        ledger.add("seed-item")
    os.link(tmp_path / name, tmp_path / f"second{os.path.splitext(name)[1]}")
    before = (tmp_path / name).read_bytes()
    for typed in (tmp_path / name, tmp_path / f"second{os.path.splitext(name)[1]}"):
        refused = _run(tmp_path, typed)
        assert refused.returncode == 2 and "hard links" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert _executions(tmp_path) == 0
    assert (tmp_path / name).read_bytes() == before
    with pytest.raises(LedgerError, match="hard links"):
        open_ledger(tmp_path / name)


def test_health_marker_is_seen_through_a_symlink_alias_of_the_ledger(tmp_path):
    """The ledger is marked not ready under its own name; a run typing a symlink alias
    must see the same marker (it is named after the canonical path), not bypass it."""
    with open_ledger(tmp_path / "L.sqlite") as ledger:
        ledger.add("a")
    mark_unhealthy(tmp_path / "L.sqlite", "disk full")
    os.symlink(tmp_path / "L.sqlite", tmp_path / "alias.sqlite")
    assert health(tmp_path / "alias.sqlite")["ready"] is False
    make_corpus(tmp_path / "in", docs=1, poison=0, seed=3)
    refused = _run(tmp_path, tmp_path / "alias.sqlite")
    assert refused.returncode != 0 and "not ready" in refused.stderr
    assert _executions(tmp_path) == 0
