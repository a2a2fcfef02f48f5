"""Outsider o24's findings on SQLite ledgers holding a bad record, each with the real
damage written into a real ledger file: a text cell that is not UTF-8 (CAST(X'..' AS
TEXT)), a state that is not ours, a key no SQLite text can encode. Nothing is timed.
"""

import hashlib
import json
import sqlite3

import pytest

from toolkit.cli import main
from toolkit.ledger import LedgerError, open_ledger

KEYS = [f"k{i}" for i in range(4)]


def _ledger(tmp_path):
    path = tmp_path / "l.sqlite"
    ledger = open_ledger(str(path))
    for key in KEYS:
        ledger.add(key, f"{key}.pdf", sync=False)
    ledger.close()
    return path


def _audit(capsys, path):
    code = main(["audit", str(path), "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else None, err


@pytest.mark.parametrize("table, column", [("items", "key"), ("items", "reason"),
                                           ("events", "detail")])
def test_non_utf8_cell_is_a_finding_and_every_other_item_is_answered(
        tmp_path, capsys, table, column):
    """Fault: one text cell of a toolkit SQLite ledger made non-UTF-8 bytes (78 FF), in
    items.key, items.reason or an event's detail. Property: audit still answers (exit 0 or
    1, never 2), every item is in per_item, the damaged one named with a corrupt_record
    finding whose odd byte is kept escaped (\\xff)."""
    path = _ledger(tmp_path)
    db = sqlite3.connect(path)
    if table == "events":
        db.execute("UPDATE events SET detail=CAST(X'7B78FF' AS TEXT) WHERE key='k1'")
    else:
        db.execute(f"UPDATE items SET {column}=CAST(X'6B31FF' AS TEXT) WHERE key='k1'")
    db.commit()
    db.close()
    code, report, err = _audit(capsys, path)
    assert code in (0, 1), err
    per_item = {entry["key"]: entry for entry in report["per_item"]}
    for key in ("k0", "k2", "k3"):
        assert per_item[key]["findings"] == [] and per_item[key]["state"] == "pending"
    damaged = "k1\\xff" if column == "key" else "k1"
    assert "corrupt_record" in per_item[damaged]["findings"], per_item[damaged]
    details = [a["detail"] for a in report["anomalies"]
               if a["key"] == damaged and a["kind"] == "corrupt_record"]
    assert any(f"column {column} is not UTF-8" in detail for detail in details), details
