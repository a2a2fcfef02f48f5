"""Outsider o39 finding 4: ``ledger L --salvage NEW.sqlite`` wrote items rows with no event
at all, so the audit of NEW flagged every item (``history_mismatch``: "item row has no add
event") and planned ``review`` even for done items whose artifacts verify, where the same
salvage written as ``NEW.jsonl`` (snapshot lines) audits clean. An SQLite ledger has no
snapshot line: the salvage now writes each item's shortest legal history (its add, then
the moves the transition policy allows to its state, noted as salvage's), and both
salvages audit alike, item by item.

The ledger is a real run's (five documents, one of them poison), with one item in each
other state added through the ledger's own API; it is salvaged whole (nothing lost: every
state kept) and after a line was damaged (every item not settled for good parked).
"""

import sqlite3

import pytest

from toolkit.cli import main
from toolkit.documents import make_corpus
from toolkit.forensics import audit
from toolkit.ledger import State
from toolkit.ledger.jsonl import JsonlLedger

S = State


def _every_state(batch):
    """A finished run's ledger (done items, a failed permanent one) plus one item in each
    other state; returns its path."""
    make_corpus(batch / "in", docs=5, poison=1, seed=3)
    ledger = batch / "l.jsonl"
    assert main(list(map(str, ["run", "--inputs", batch / "in", "--ledger", ledger,
                               "--provider-db", batch / "p.db", "--out", batch / "out",
                               "--no-progress"]))) == 0
    with JsonlLedger(ledger) as writer:
        for n, path in enumerate([[], [S.UNKNOWN], [S.UNKNOWN, S.SUBMITTED],
                                  [S.UNKNOWN, S.FAILED], [S.UNKNOWN, S.NEEDS_REVIEW],
                                  [S.CANCELLED], [S.UNKNOWN, S.SUBMITTED, S.PARTIAL]]):
            key = f"{n:x}" * 64
            writer.add(key, source=f"extra-{n}.pdf")
            frm = S.PENDING
            for to in path:
                fields = {"failure": "transient"} if to is S.FAILED else \
                    {"job_id": f"job-x{n}"} if to is S.SUBMITTED else \
                    {"pages_done": 1} if to is S.PARTIAL else \
                    {"reason": "parked by hand"} if to is S.NEEDS_REVIEW else {}
                writer.move(key, frm, to, **fields)
                frm = to
        assert {item.state for item in writer.items()} == set(State)
    return ledger


def _per_item(path, artifacts):
    """{key: (state, action, its finding kinds)} of the audit, and its notes."""
    report = audit(path, artifacts=artifacts)
    items = report.items
    kinds = {}
    for anomaly in report.anomalies:
        kinds.setdefault(anomaly.key, set()).add(anomaly.kind)
    return {key: (state, action, sorted(kinds.get(key, ())))
            for key, state, action in zip(items["key"], items["state"], items["action"])}, \
        report.notes


@pytest.mark.parametrize("damaged", [False, True])
def test_sqlite_salvage_audits_item_by_item_as_the_jsonl_salvage(tmp_path, capsys, damaged):
    """Both salvages of one ledger: the same state, action and findings for every item (on
    main, every item of the SQLite one: history_mismatch, review), and the same note of
    the salvage's mark (on main, none for SQLite)."""
    batch = tmp_path / "batch"
    ledger = _every_state(batch)
    with JsonlLedger(ledger, view=True) as view:
        count = len(view.items())
    if damaged:
        lines = ledger.read_bytes().splitlines(keepends=True)
        lines[3] = b"{garbage\n"
        ledger.write_bytes(b"".join(lines))
    for new in ("s.jsonl", "s.sqlite"):
        assert main(["ledger", str(ledger), "--salvage", str(tmp_path / new),
                     "--out", str(batch / "out")]) == 0
    capsys.readouterr()
    as_jsonl, jsonl_notes = _per_item(tmp_path / "s.jsonl", batch / "out")
    as_sqlite, sqlite_notes = _per_item(tmp_path / "s.sqlite", batch / "out")
    assert as_sqlite == as_jsonl
    assert sqlite_notes == jsonl_notes and len(jsonl_notes) == damaged  # the salvage mark
    assert len(as_jsonl) == count and {"skip", "review"} <= {a for _, a, _ in as_jsonl.values()}
    if not damaged:  # every state kept, each item's plan its own
        assert {state for state, _, _ in as_jsonl.values()} == {s.value for s in State}
    with sqlite3.connect(tmp_path / "s.sqlite") as db:  # each history begins with its add
        firsts = db.execute("SELECT op, count(*) FROM events WHERE seq IN "
                            "(SELECT min(seq) FROM events GROUP BY key) GROUP BY op").fetchall()
    assert firsts == [("add", count)]
