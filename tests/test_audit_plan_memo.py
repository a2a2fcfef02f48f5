"""The audit's plan answered from a memo (``planner.Planner``) against ``plan_item`` asked
item by item, and the GC pause that leaves no walk over the audit's objects behind."""

import gc
import random
import shutil
import sys
from pathlib import Path

import pytest

from toolkit.forensics import _damage, audit
from toolkit.forensics.checks import LOOKUP_FORMATS, plan_item
from toolkit.forensics.model import KINDS, Raw, gc_paused

from test_audit_sqlite_sql import write_failure_ledger, write_ledger

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "ledgers"
sys.path.insert(0, str(ROOT / "benchmarks"))
from audit_jsonl import write_ledger as write_batch  # noqa: E402  (a seeded batch ledger)
from audit_jsonl import write_sqlite  # noqa: E402


def _per_item(report):
    """(action, why) of every item, ``plan_item`` asked for each one (the reference)."""
    found: dict = {}
    for anomaly in report.anomalies:
        if anomaly.key is not None:
            found.setdefault(anomaly.key, {}).setdefault(anomaly.kind, anomaly.detail)
    damaged = _damage(Raw(corrupt_lines=list(report.corrupt_lines),
                          anomalies=list(report.anomalies))) \
        if report.format == "toolkit-jsonl" else None
    lookup = report.format in LOOKUP_FORMATS
    out = []
    for item, _, _ in report.rows:
        action, why = plan_item(item, found.get(item.key, set()), lookup)
        if damaged and item.state in ("pending", "unknown", "submitted", "partial", "failed") \
                and not (item.state == "failed" and item.failure == "permanent"):
            action, why = "review", damaged
        out.append((item.key, action, why))
    return out


def _ledgers(tmp_path):
    """(path, audit kwargs): the fixture ledgers with and without their folders, seeded
    damaged SQLite histories, and seeded batch ledgers (JSONL and SQLite) with corrupt,
    lost and torn lines."""
    folders = {"artifacts": FIXTURES / "artifacts", "inputs": FIXTURES / "inputs"}
    for name in ("toolkit.jsonl", "toolkit.sqlite", "state.jsonl", "task_items.db", "jobs.db",
                 "crashed.db"):
        copy = tmp_path / name
        shutil.copyfile(FIXTURES / name, copy)
        if name == "crashed.db":
            shutil.copyfile(FIXTURES / "crashed.db-journal", tmp_path / "crashed.db-journal")
        yield copy, {}
        yield copy, folders
    yield tmp_path / "state.jsonl", {"artifacts": FIXTURES / "artifacts",
                                      "output_name": "{stem}.out.pdf"}
    for seed in range(12):
        path = tmp_path / f"history-{seed}.sqlite"
        (write_failure_ledger if seed % 3 == 2 else write_ledger)(path, seed)
        yield path, {}
    for seed in range(2):
        jsonl, db = tmp_path / f"batch-{seed}.jsonl", tmp_path / f"batch-{seed}.sqlite"
        write_batch(jsonl, 3000, seed)
        write_sqlite(db, jsonl)
        yield jsonl, {}
        yield db, {}
        lines = jsonl.read_bytes().split(b"\n")
        rng = random.Random(seed)
        for _ in range(3):
            lines[rng.randrange(1, len(lines) - 2)] = b'{"seq": broken'
        del lines[rng.randrange(1, len(lines) - 2)]  # a seq gap
        damaged = tmp_path / f"damaged-{seed}.jsonl"
        damaged.write_bytes(b"\n".join(lines)[:-40])  # and a torn tail
        yield damaged, {}


def test_every_anomaly_kind_memoized_plan_equals_plan_item_per_item(tmp_path):
    """Fault: ledgers holding every kind of finding (damaged artifacts and inputs, escapes,
    illegal moves, lost adds, second adds, odd details, rows that disagree with their
    events, a hot journal, corrupt and torn lines, seq gaps) in our formats and foreign
    ones, done items whose artifacts were not checked (a ``verify`` that quotes its
    finding) among them. Property: every item's action and why from the memoized plan
    are exactly ``plan_item``'s asked for that item alone, and the counts per action are
    those actions counted."""
    seen = set()
    for path, kwargs in _ledgers(tmp_path):
        report = audit(path, now=0.0, **kwargs)
        got = [(item.key, action, why) for item, action, why in report.rows]
        assert got == _per_item(report), (path.name, kwargs)
        counts = {action: 0 for action in report.plan}
        for _, action, _ in got:
            counts[action] += 1
        assert report.plan == counts
        seen |= {anomaly.kind for anomaly in report.anomalies}
    # the kinds a file can hold without a queue library's tables or a PostgreSQL server
    assert set(KINDS) - seen <= {"opaque_payload", "unaudited_table", "seq_disorder",
                                 "missing_header", "snapshot_mismatch", "unchecked_inputs",
                                 "input_renamed", "stuck_unknown",
                                 "shared_output"}, set(KINDS) - seen  # o39's test: PDFs


def test_many_done_items_unchecked_plan_asks_the_rule_once(tmp_path, monkeypatch):
    """Fault: 3,000 done items copied without their outputs (each a done_without_artifact
    finding whose words name its own artifact). Property: the plan quotes each item's
    own finding in its ``verify`` why, yet ``plan_item`` itself runs only a few times."""
    from toolkit.forensics import checks

    calls = []
    real = checks.plan_item
    monkeypatch.setattr(checks, "plan_item", lambda *a: calls.append(1) or real(*a))
    jsonl = tmp_path / "batch.jsonl"
    write_batch(jsonl, 3000 * 3, 0)
    report = audit(jsonl, now=0.0)
    verify = [(item, why) for item, action, why in report.rows if action == "verify"]
    assert len(verify) > 500
    for item, why in verify:
        assert repr(item.artifact_path) in why
    assert len(calls) < 20


@pytest.mark.parametrize("frozen_before", [False, True])
def test_objects_made_while_paused_are_no_young_generation_walk(frozen_before):
    """Fault: 200,000 objects made while the GC is paused (what an audit of a big ledger
    makes). Property: on the way out they are no longer in the youngest generation, so the
    first collection after does not walk them all; the GC is on again; what the program
    froze itself stays frozen."""
    gc.collect()
    if frozen_before:
        gc.freeze()
    frozen = gc.get_freeze_count()
    try:
        with gc_paused():
            kept = [[index] for index in range(200_000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() == frozen
        if not frozen_before:  # (with something frozen, they are left to the GC: as before)
            # in the oldest generation already: no young collection had to walk them there
            oldest = {id(obj) for obj in gc.get_objects(generation=2)}
            assert all(id(obj) in oldest for obj in kept[::1000])
        assert len(kept) == 200_000
    finally:
        if frozen_before:
            gc.unfreeze()

