"""The audit's answer held lean (issue 22: peak memory): findings that quote an artifact
path are worded when read (``model.Worded``), the rows are parallel columns worded when
read (``model.Rows``), the event table's small integers are int32. Each test checks what
a reader sees against the plain way of building it, on real (seeded, damaged) ledgers."""

import gc
import io
import json
import random
import shutil
import sys
from pathlib import Path

from toolkit.forensics import _damage, audit
from toolkit.forensics.checks import LOOKUP_FORMATS, plan_item
from toolkit.forensics.model import Anomaly, Raw, Rows, Worded
from toolkit.forensics.report import document, dumps, stream_json

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "ledgers"
sys.path.insert(0, str(ROOT / "benchmarks"))
from audit_jsonl import write_ledger as write_batch  # noqa: E402  (a seeded batch ledger)


def _damaged(tmp_path, seed: int) -> Path:
    """A seeded 20,000-line batch ledger with corrupt lines, a copied line, lost add lines
    (orphaned keys: missing_history) and a torn tail."""
    clean = tmp_path / f"batch-{seed}.jsonl"
    write_batch(clean, 20_000, seed)
    lines = clean.read_bytes().split(b"\n")
    rng = random.Random(seed)
    lines = [line for number, line in enumerate(lines)
             if not (b'"op": "add"' in line and number % 97 == 5)]
    for _ in range(4):
        lines[rng.randrange(1, len(lines) - 2)] = b'{"seq": broken'
    lines.insert(rng.randrange(1, len(lines) - 2), lines[rng.randrange(1, len(lines) - 2)])
    damaged = tmp_path / f"damaged-{seed}.jsonl"
    damaged.write_bytes(b"\n".join(lines)[:-40])
    return damaged


def _ledgers(tmp_path):
    for name in ("toolkit.jsonl", "toolkit.sqlite", "state.jsonl", "task_items.db", "jobs.db"):
        shutil.copyfile(FIXTURES / name, tmp_path / name)
        yield tmp_path / name
    clean = tmp_path / "clean.jsonl"
    write_batch(clean, 20_000, 7)
    yield clean
    yield _damaged(tmp_path, 1)


def _reference(report) -> dict:
    """``audit --json``'s document built the plain way: each key's findings in a dict, each
    item planned by ``plan_item`` alone, every detail and why a string of its own."""
    found: dict = {}
    for anomaly in report.anomalies:
        if anomaly.key is not None:
            found.setdefault(anomaly.key, []).append(anomaly)
    damaged = _damage(Raw(corrupt_lines=list(report.corrupt_lines),
                          anomalies=list(report.anomalies))) \
        if report.format == "toolkit-jsonl" else None
    per_item = []
    for item in sorted(report.rows.records, key=lambda record: record.key):
        details: dict = {}
        for anomaly in found.get(item.key, ()):
            details.setdefault(anomaly.kind, anomaly.detail)
        action, why = plan_item(item, details, report.format in LOOKUP_FORMATS)
        if damaged and item.state in ("pending", "unknown", "submitted", "partial", "failed") \
                and not (item.state == "failed" and item.failure == "permanent"):
            action, why = "review", damaged
        per_item.append({"key": item.key, "source": item.source, "state": item.state,
                         "raw_state": item.raw_state, "action": action, "why": why,
                         "findings": [anomaly.kind for anomaly in found.get(item.key, ())]})
    return {**report.to_json(), "per_item": per_item}


def test_damaged_batch_lazy_rows_and_findings_equal_the_plain_document(tmp_path):
    """Fault: ledgers with every finding the fixtures hold, a 20,000-line batch copied
    without its outputs (a done_without_artifact finding per done item, quoted in its
    verify why), and the same batch damaged (corrupt, copied and lost lines, a torn
    tail). Property: the streamed ``audit --json`` is byte for byte the whole document
    dumped at once, and reads back as the document built the plain way; the rows read
    whole, sliced and one by one agree."""
    for path in _ledgers(tmp_path):
        for kwargs in ({}, {"artifacts": FIXTURES / "artifacts", "inputs": FIXTURES / "inputs"}):
            report = audit(path, now=0.0, **kwargs)
            sink = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
            stream_json(report, sink)
            streamed = sink.buffer.getvalue()
            assert streamed == dumps(document(report)) + b"\n", path.name
            assert json.loads(streamed) == _reference(report), path.name
            rows = list(report.rows)
            assert rows == report.rows[:] == [report.rows[at] for at in range(len(rows))]
            assert report.rows[1::3] == rows[1::3] and report.rows[-1] == rows[-1]
            review = report.rows.only("review")
            assert list(review) == [row for row in rows if row[1] == "review"], path.name


def test_many_done_items_unchecked_hold_no_words_of_their_own(tmp_path):
    """Fault: a batch of thousands of done items audited without its outputs folder (each
    a done_without_artifact finding whose words quote its own artifact path, each planned
    verify with those words). Property: no finding and no row keeps those words as a
    string of its own (each is worded when read, from the path the item holds), yet every
    one reads as the words ``check_artifact`` always gave."""
    path = tmp_path / "batch.jsonl"
    write_batch(path, 9_000, 0)
    report = audit(path, now=0.0)
    unchecked = [a for a in report.anomalies if a.kind == "done_without_artifact"]
    assert len(unchecked) > 1_000
    assert isinstance(report.rows, Rows)
    held = {id(obj) for obj in gc.get_referents(*unchecked)}
    held |= {id(obj) for obj in gc.get_referents(report.rows.plans)}
    items = {record.key: record for record in report.rows.records}
    verify = 0
    for anomaly in unchecked:
        words = anomaly.detail
        assert words == (f"{items[anomaly.key].artifact_path!r} recorded but not checked: no "
                         "artifacts folder (no outputs root recorded in <ledger>.roots.json; "
                         "give --artifacts to verify its size and SHA-256)")
        assert id(words) not in held
    for record, action, why in report.rows:
        if action == "verify":
            verify += 1
            assert why.endswith(repr(record.artifact_path) + " recorded but not checked: no "
                                "artifacts folder (no outputs root recorded in <ledger>"
                                ".roots.json; give --artifacts to verify its size and SHA-256)")
    assert verify == len(unchecked)
    # the plans are the few answers shared by items planned alike, not one per item
    assert len({id(plan) for plan in report.rows.plans}) < 20


def test_worded_finding_reads_compares_and_hashes_as_its_anomaly():
    """Fault: a finding worded when read meets code that compares, hashes, prints or
    serializes findings. Property: it is the ``Anomaly`` with those words, both ways."""
    worded = Worded("k", "done_without_artifact", lambda path: f"{path!r} gone", "out/a.pdf")
    plain = Anomaly("k", "done_without_artifact", "'out/a.pdf' gone")
    assert worded == plain and plain == worded and not worded != plain
    assert hash(worded) == hash(plain) and {worded, plain} == {plain}
    assert repr(worded) == repr(plain) and worded.to_json() == plain.to_json()
    assert worded != Anomaly("k", "done_without_artifact", "other")


def test_event_integers_beyond_int32_event_table_exact(tmp_path):
    """Fault: events whose attempt and token are beyond 32 bits (up to the largest int64) in
    a ledger whose small integers are packed as int32. Property: the event table holds
    every value exactly as the file does, in int64 columns."""
    lines = []
    for seq, (attempt, token) in enumerate([(0, 0), (2**31, 2**40), (2**63 - 1, 5)], 1):
        op, frm, to = ("add", None, "pending") if seq == 1 else ("move", "pending", "pending")
        if seq == 2:
            frm, to = "pending", "unknown"
        if seq == 3:
            op, frm, to = "claim", "unknown", "unknown"
        lines.append(json.dumps({"seq": seq, "ts": 1.5 + seq, "op": op, "key": "k", "from": frm,
                                 "to": to, "attempt": attempt, "worker": None, "token": token,
                                 "detail": {"source": "a.pdf"} if seq == 1 else {}}))
    path = tmp_path / "wide.jsonl"
    path.write_text("\n".join(lines) + "\n")
    events = audit(path, now=0.0).events
    assert events["attempt"].tolist() == [0, 2**31, 2**63 - 1]
    assert events["token"].tolist() == [0, 2**40, 5]
    assert events["line"].tolist() == [1, 2, 3]
    assert str(events["attempt"].dtype) == "int64" and str(events["line"].dtype) == "int64"
