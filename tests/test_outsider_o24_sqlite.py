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


def test_key_with_a_lone_surrogate_is_refused_as_a_bad_key(tmp_path):
    """Fault: a key holding a lone surrogate ('k\\ud800'), which no SQLite text can hold.
    Property: add() raises LedgerError naming the bad key (not a raw UnicodeEncodeError),
    and the ledger's other items are untouched."""
    path = _ledger(tmp_path)
    ledger = open_ledger(str(path))
    try:
        with pytest.raises(LedgerError, match="bad key"):
            ledger.add("k\ud800", "s.pdf")
        assert sorted(item.key for item in ledger.items()) == KEYS
    finally:
        ledger.close()


FIXTURE = __import__("pathlib").Path(__file__).parent.parent / "fixtures/ledgers/toolkit.sqlite"


def test_review_of_a_ledger_with_a_state_not_ours_is_one_line_exit_2(tmp_path, capsys):
    """Fault: the audit fixture's SQLite ledger, whose items hold a state 'paused' that is
    not ours. Property: review answers with one line naming the record, exit 2, no
    traceback, and the file is left byte-identical."""
    path = tmp_path / "fx.sqlite"
    path.write_bytes(FIXTURE.read_bytes())
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    assert main(["review", "--ledger", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "'paused'" in err and "audit" in err, err
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_review_of_a_ledger_with_a_corrupt_event_detail_is_one_line_exit_2(tmp_path, capsys):
    """Fault: the fixture ledger with its 'paused' row set back to 'pending': what is left is
    its event whose detail is not JSON. Property: review refuses with one line naming the
    event, exit 2, no JSONDecodeError traceback."""
    path = tmp_path / "fx.sqlite"
    path.write_bytes(FIXTURE.read_bytes())
    db = sqlite3.connect(path)
    db.execute("UPDATE items SET state='pending' WHERE state='paused'")
    db.commit()
    db.close()
    assert main(["review", "--ledger", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "event seq=" in err, err


def test_run_on_a_ledger_with_a_state_not_ours_refuses_with_exit_2(tmp_path, capsys):
    """Fault: `run` on the fixture ledger holding state 'paused'. Property: one line,
    exit 2 (bad input: the ledger), no traceback from recover_abandoned, and the file is
    byte-identical (the switch to WAL of this rollback-journal file not made)."""
    path = tmp_path / "fx.sqlite"
    path.write_bytes(FIXTURE.read_bytes())
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    (tmp_path / "in").mkdir()
    (tmp_path / "in/a.pdf").write_bytes((FIXTURE.parent / "inputs/a.pdf").read_bytes())
    code = main(["run", "--inputs", str(tmp_path / "in"), "--ledger", str(path),
                 "--provider-db", str(tmp_path / "p.db"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "'paused'" in err, err
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # refused before the WAL
