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


def _health_cli(*args):
    return subprocess.run([sys.executable, "-m", "toolkit", "health", *args],
                          capture_output=True, text=True)


@pytest.mark.parametrize("clear", [False, True], ids=["health", "health-clear"])
def test_hard_linked_ledger_is_refused_by_health_as_run_refuses_it(tmp_path, clear):
    """Fault: the ledger file has a second hard link (outsider o29, S9). Before, ``health``
    and ``health --clear`` said "ready" for a ledger that ``run`` refuses. Property: both
    refuse it with run's one line (exit 2), and nothing is written beside either name."""
    make_corpus(tmp_path / "in", docs=1, poison=0, seed=3)
    assert _run(tmp_path, tmp_path / "L.jsonl").returncode == 0
    os.link(tmp_path / "L.jsonl", tmp_path / "H.jsonl")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = _health_cli("--ledger", str(tmp_path / "H.jsonl"), *(["--clear"] if clear else []))
    assert result.returncode == 2 and "2 hard links" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_health_clear_through_a_symlink_alias_leaves_no_alias_lock(tmp_path):
    """Fault: ``health --clear`` typed through a symlink alias of a JSONL ledger (outsider
    o29, S9). Before, its read of the ledger created ``alias.jsonl.lock`` beside the alias.
    Property: ready, and the only lock is the writer's ``<real path>.lock``."""
    make_corpus(tmp_path / "in", docs=1, poison=0, seed=3)
    (tmp_path / "real").mkdir()
    assert _run(tmp_path, tmp_path / "real" / "L.jsonl").returncode == 0
    os.symlink("real/L.jsonl", tmp_path / "alias.jsonl")
    result = _health_cli("--ledger", str(tmp_path / "alias.jsonl"), "--clear")
    assert result.returncode == 0 and "ready" in result.stdout, result.stderr
    assert not (tmp_path / "alias.jsonl.lock").exists()
