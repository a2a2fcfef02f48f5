"""A zeroed interior span of a JSONL ledger can hide any key's last events: the intent
of a document already executed, for instance. Salvage must not hand that key back as
``pending`` (a rerun would execute it twice on a non-idempotent provider), and audit's
plan must agree with salvage (review, never run)."""

import json
import subprocess
import sys

import pytest

from conftest import sigkill_at_executions
from toolkit.documents import make_corpus
from toolkit.forensics import audit
from toolkit.ledger import open_ledger
from toolkit.ledger.jsonl import JsonlLedger
from toolkit.ledger.salvage import salvage
from toolkit.provider import provider_stats

pytestmark = pytest.mark.slow


def _command(tmp_path, ledger):
    return [sys.executable, "-m", "toolkit", "run", "--inputs", str(tmp_path / "in"),
            "--ledger", str(ledger), "--provider-db", str(tmp_path / "p.db"),
            "--out", str(tmp_path / "out"), "--contract", "non-idempotent", "--no-progress"]


def _zero_after_add(path, key) -> list[int]:
    """Zero (NUL bytes, newline kept) every line of ``key`` after its add; their numbers."""
    lines = path.read_bytes().split(b"\n")
    zeroed = []
    for number, raw in enumerate(lines, start=1):
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if record.get("key") == key and record.get("op") != "add":
            lines[number - 1] = b"\0" * len(raw)
            zeroed.append(number)
    path.write_bytes(b"\n".join(lines))
    return zeroed


def test_zeroed_intent_of_an_executed_key_is_parked_by_salvage_not_resent(tmp_path):
    """A real run is SIGKILLed once the provider executed one document; that key's
    intent and later lines are then zeroed (no key readable in them). Salvage must park
    it (and every unsettled item) in needs_review; audit plans review for it, not run;
    a rerun on the salvaged ledger executes nothing again."""
    make_corpus(tmp_path / "in", docs=3, poison=0, seed=5)
    ledger = tmp_path / "L.jsonl"
    assert sigkill_at_executions(_command(tmp_path, ledger), tmp_path / "p.db", [1]) == 1
    with JsonlLedger(ledger, view=True) as opened:
        sent = next(e.key for e in opened.events() if e.op == "move" and e.to == "unknown")
    executed = provider_stats(tmp_path / "p.db")["executions"]
    assert _zero_after_add(ledger, sent)
    report = audit(ledger)
    plan = dict(zip(report.items["key"], report.items["action"]))
    assert plan[sent] == "review" and "run" not in {plan[k] for k in plan}
    result = salvage(ledger, tmp_path / "S.jsonl")
    assert sent in result["needs_review"]
    with open_ledger(tmp_path / "S.jsonl") as salvaged:
        assert salvaged.get(sent).state == "needs_review"
    subprocess.run(_command(tmp_path, tmp_path / "S.jsonl"), capture_output=True, text=True)
    again = provider_stats(tmp_path / "p.db")["executions"]
    assert again == executed
