"""health is a view that includes the ledger's own integrity check: a JSONL ledger
with corrupt interior lines (which `run` refuses to write on) is not ready."""

import subprocess
import sys

import pytest

from toolkit.ledger import open_ledger

pytestmark = pytest.mark.slow


def _health(path, *flags):
    return subprocess.run([sys.executable, "-m", "toolkit", "health", "--ledger", str(path),
                           *flags], capture_output=True, text=True)


@pytest.mark.parametrize("flags", [(), ("--clear",)], ids=["health", "health-clear"])
def test_interior_corruption_makes_health_not_ready_and_changes_nothing(tmp_path, flags):
    """A zeroed interior line: `run` refuses the ledger, so `health` (and `--clear`) must
    say not ready (exit 1), one line naming the line and pointing to audit and salvage,
    and leave the file byte for byte as it was."""
    ledger = tmp_path / "L.jsonl"
    with open_ledger(ledger) as opened:
        for key in ("a", "b", "c"):
            opened.add(key)
    lines = ledger.read_bytes().split(b"\n")
    lines[2] = b"\0" * len(lines[2])
    ledger.write_bytes(b"\n".join(lines))
    before = ledger.read_bytes()
    result = _health(ledger, *flags)
    assert result.returncode == 1
    [line] = result.stdout.strip().splitlines()
    assert line.startswith("not ready") and "corrupt lines 3" in line
    assert "audit" in line and "--salvage" in line
    assert ledger.read_bytes() == before


def test_plain_health_on_a_headerless_torn_jsonl_is_a_view_that_changes_nothing(tmp_path):
    """A JSONL ledger written before headers, ending in a torn line: plain `health` only
    looks (no header added, torn tail kept); upgrading is for `--clear` or a run."""
    ledger = tmp_path / "L.jsonl"
    with open_ledger(ledger) as opened:
        opened.add("a")
    body = ledger.read_bytes().split(b"\n", 1)[1]
    ledger.write_bytes(body + b'{"seq": 9, "ts"')
    before = ledger.read_bytes()
    assert _health(ledger).returncode == 0
    assert ledger.read_bytes() == before


def test_run_refused_by_a_not_ready_marker_exits_1_run_again_not_2_bad_input(tmp_path):
    """An earlier run failed closed (the health marker): a new `run` refuses to start, and
    that is "fix the cause, clear, run again" (exit 1), not bad input (exit 2)."""
    from toolkit.documents import make_corpus
    from toolkit.runner.ops import mark_unhealthy

    make_corpus(tmp_path / "in", docs=1, poison=0, seed=2)
    with open_ledger(tmp_path / "L.sqlite") as opened:
        opened.add("a")
    assert mark_unhealthy(tmp_path / "L.sqlite", "disk full")
    refused = subprocess.run(
        [sys.executable, "-m", "toolkit", "run", "--inputs", str(tmp_path / "in"),
         "--ledger", str(tmp_path / "L.sqlite"), "--provider-db", str(tmp_path / "p.db"),
         "--out", str(tmp_path / "out"), "--no-progress"], capture_output=True, text=True)
    assert refused.returncode == 1 and "not ready" in refused.stderr
