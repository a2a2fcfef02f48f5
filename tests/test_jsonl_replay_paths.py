"""The JSONL replay's two ways to read a line (replay.py) give one verdict.

msgspec's typed decoder takes the lines this toolkit writes; json.loads (the reference)
reads every other line. Each test below writes real files and opens them both ways
(``replay.FAST``), or checks what the replay no longer keeps (the events, read again).
"""

import json
import os

import pytest

from toolkit.errors import LedgerError
from toolkit.ledger import State, open_ledger, replay
from toolkit.ledger.header import HEADER_LINE
from toolkit.ledger.jsonl import JsonlLedger
from toolkit.ledger.lines import event_line

S = State
KEY1, KEY2 = "a" * 64, "b" * 64


def _line(seq, key, op="add", frm=None, to=S.PENDING, detail=None, **kw) -> bytes:
    args = {"ts": 1.5 + seq, "attempt": 0, "worker": None, "token": 0, **kw}
    return event_line(seq, args["ts"], op, key, frm, to, args["attempt"], args["worker"],
                      args["token"], {"source": "x.pdf"} if detail is None else detail)


GOOD = _line(2, KEY2).decode()[:-1]
TAIL = _line(3, KEY2, op="move", frm=S.PENDING, to=S.UNKNOWN, attempt=1, detail={})


def _odd(old: str, new: str) -> bytes:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1).encode("utf-8", "surrogatepass")


# Lines either decoder may take or refuse: the same verdict is due for each.
ODD = {
    "nan_ts": _odd('"ts": 3.5', '"ts": NaN'),
    "infinity_ts": _odd('"ts": 3.5', '"ts": -Infinity'),
    "nan_detail": _odd('"source": "x.pdf"', '"source": NaN'),
    "huge_float_detail": _odd('"source": "x.pdf"', '"source": 1e400'),
    "duplicate_seq": _odd('"seq": 2', '"seq": 7, "seq": 2'),
    "duplicate_to": _odd('"to": "pending"', '"to": "done", "to": "pending"'),
    "duplicate_detail_key": _odd('"source": "x.pdf"', '"source": 1, "source": "y.pdf"'),
    "duplicate_snapshot": _odd('"seq": 2', '"snapshot": 1, "seq": 2'),
    "big_seq": _odd('"seq": 2', '"seq": 123456789012345678901234567890'),
    "big_token": _odd('"token": 0', '"token": 99999999999999999999999'),
    "big_detail": _odd('"source": "x.pdf"', '"source": 99999999999999999999999'),
    "digits_4300": _odd('"attempt": 0', '"attempt": ' + "9" * 4300),
    "digits_4301": _odd('"attempt": 0', '"attempt": ' + "9" * 4301),
    "int_ts_overflows_float": _odd('"ts": 3.5', '"ts": 1' + "0" * 400),
    "lone_surrogate_key": _odd(KEY2, "\\ud800"),
    "lone_surrogate_detail": _odd('"x.pdf"', '"\\udc80"'),
    "lone_surrogate_worker": _odd('"worker": null', '"worker": "\\ud83d"'),
    "pair_escaped": _odd('"x.pdf"', '"\\ud83d\\ude00 \\u00e9"'),
    "utf8_surrogate_bytes": _odd('"x.pdf"', '"\ud800"'),
    "bom": b"\xef\xbb\xbf" + GOOD.encode(),
    "not_utf8": GOOD.encode().replace(b"x.pdf", b"x\xff.pdf"),
    "utf16": GOOD.encode("utf-16"),
    "float_seq": _odd('"seq": 2', '"seq": 2.0'),
    "bool_attempt": _odd('"attempt": 0', '"attempt": false'),
    "string_seq": _odd('"seq": 2', '"seq": "2"'),
    "string_ts": _odd('"ts": 3.5', '"ts": "3.5"'),
    "int_ts": _odd('"ts": 3.5', '"ts": 3'),
    "negative_zero_ts": _odd('"ts": 3.5', '"ts": -0.0'),
    "exponent_ts": _odd('"ts": 3.5', '"ts": 35E-1'),
    "bogus_from": _odd('"from": null', '"from": "limbo"'),
    "upper_to": _odd('"to": "pending"', '"to": "PENDING"'),
    "worker_int": _odd('"worker": null', '"worker": 7'),
    "key_int": _odd(f'"key": "{KEY2}"', '"key": 7'),
    "op_unknown": _odd('"op": "add"', '"op": "frobnicate"'),
    "detail_pairs": _odd('{"source": "x.pdf"}', '[["source", "x.pdf"]]'),
    "detail_nested": _odd('"source": "x.pdf"', '"source": {"a": [1]}'),
    "detail_null": _odd('{"source": "x.pdf"}', "null"),
    "extra_field": _odd('"seq": 2', '"seq": 2, "zzz": [1, {"q": null}]'),
    "missing_worker": _odd('"worker": null', '"workers": null'),
    "snapshot_line": json.dumps({"snapshot": {"key": KEY2, "state": "pending"},
                                 "seq": 2}).encode(),
    "array": b"[1, 2]",
    "null": b"null",
    "empty": b"",
    "spaces": b" \t ",
    "trailing_garbage": GOOD.encode() + b" x",
    "two_values": GOOD.encode() + GOOD.encode(),
    "carriage_return": GOOD.encode() + b"\r",
    "control_char": _odd('"x.pdf"', '"x\tpdf"'),
    "deep": _odd('"source": "x.pdf"', '"source": ' + "[" * 5000 + "]" * 5000),
    "orphan_move": _line(2, "c" * 64, op="move", frm=S.PENDING, to=S.UNKNOWN)[:-1],
    "header_again": HEADER_LINE[:-1],
}


def _verdict(path, fast: bool, monkeypatch, view=True):
    """Everything the open decides, as text (a NaN compares equal to itself so)."""
    monkeypatch.setattr(replay, "FAST", fast)
    try:
        ledger = JsonlLedger(path, view=view)
    except Exception as exc:  # noqa: BLE001 -- the refusal is part of the verdict
        return f"refused {type(exc).__name__}: {exc}"
    with ledger:
        try:
            events = ledger.events()
        except Exception as exc:  # noqa: BLE001
            events = f"{type(exc).__name__}: {exc}"
        return repr({name: getattr(ledger, name) for name in (
            "corrupt_lines", "missing_seqs", "disorder", "snapshot_damage", "torn_tail",
            "unattributed_lines", "version", "salvaged", "_seq", "_events_read", "_size",
            "_valid_end")} | {"affected": sorted(ledger.affected_keys),
                              "orphans": sorted(ledger.orphans.items()),
                              "items": ledger.items(), "events": events,
                              "corruption": ledger.corruption(), "damaged": ledger.damaged})


@pytest.mark.parametrize("name", sorted(ODD))
def test_odd_line_same_verdict_both_decoders(tmp_path, monkeypatch, name):
    """Each odd line between two good ones: the same items, events and damage verdict
    from msgspec's typed path as from json.loads alone."""
    path = tmp_path / "l.jsonl"
    path.write_bytes(HEADER_LINE + _line(1, KEY1) + ODD[name] + b"\n" + TAIL)
    reference = _verdict(path, False, monkeypatch)
    assert _verdict(path, True, monkeypatch) == reference


def test_all_odd_lines_one_file_same_verdict_both_decoders(tmp_path, monkeypatch):
    """Every odd line in one file (seqs disordered, gaps, orphans, a torn tail): one
    verdict, also when the blocks read are a few bytes long (lines cut across blocks).
    Not the ts that overflows a float nor the deep line: each refuses the whole open
    (both ways alike: OverflowError, RecursionError), as it did before msgspec."""
    path = tmp_path / "l.jsonl"
    body = b"".join(line + b"\n" + _line(10 + i, KEY1, op="move", frm=S.PENDING,
                                         to=S.PENDING, detail={})
                    for i, (name, line) in enumerate(ODD.items())
                    if name not in ("int_ts_overflows_float", "deep"))
    path.write_bytes(HEADER_LINE + _line(1, KEY1) + body + b'{"seq": 99, "ke')
    assert replay._parts(TAIL) is not None  # the typed path takes the toolkit's lines
    reference = _verdict(path, False, monkeypatch)
    assert "corrupt_lines" in reference and _verdict(path, True, monkeypatch) == reference
    monkeypatch.setattr(replay, "BLOCK", 7)
    assert _verdict(path, True, monkeypatch) == reference
    assert _verdict(path, False, monkeypatch) == reference


def test_no_header_snapshots_gaps_same_verdict_both_decoders(tmp_path, monkeypatch):
    """A ledger without its header whose snapshot lines sit below events, with a hole
    in its seqs and a line copied: the damage rules read the same either way."""
    path = tmp_path / "l.jsonl"
    snapshot = json.dumps({"snapshot": {"key": KEY2, "state": "done"}, "seq": 4}).encode()
    path.write_bytes(_line(5, KEY1) + snapshot + b"\n" + _line(8, KEY1, op="move",
                     frm=S.PENDING, to=S.UNKNOWN, attempt=1, detail={}) * 2)
    reference = _verdict(path, False, monkeypatch)
    assert "missing_header" in reference and "seq 6-7" in reference
    assert _verdict(path, True, monkeypatch) == reference


def test_replayed_events_read_again_equal_written(tmp_path):
    """The replay keeps no event: ``events()`` reads them again from the file; with the
    writes made since, after the upgrade of a ledger without a header (one line lower)
    and a torn tail cut, they are the history written, in order."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path) as ledger:
        for key in (KEY1, KEY2):
            ledger.add(key, "x.pdf")
        ledger.move(KEY1, S.PENDING, S.UNKNOWN)
        written = ledger.events()
    path.write_bytes(path.read_bytes().split(b"\n", 1)[1] + b'{"seq": 4')  # no header, torn
    with JsonlLedger(path) as ledger:
        assert ledger.version == 1 and path.read_bytes().startswith(HEADER_LINE)
        claimed = ledger.claim(KEY2, "w", 60)
        events = ledger.events()
    assert events[:3] == written and events[3].op == "claim" and events[3].token == claimed
    with JsonlLedger(path, view=True) as view:
        assert view.events() == events and view.events() == events
    with JsonlLedger(path) as ledger:
        ledger.compact()
        assert ledger.events() == []


def test_file_rewritten_in_place_under_view_events_refused(tmp_path):
    """A view's events are read again when asked: a file rewritten in place since the
    open (same inode, fewer lines) is refused with one line, never a short history."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path) as ledger:
        for key in (KEY1, KEY2):
            ledger.add(key, "x.pdf")
    view = JsonlLedger(path, view=True)
    with open(path, "r+b") as handle:  # in place: os.truncate keeps the inode
        lines = handle.read().splitlines(keepends=True)
        handle.seek(0)
        handle.truncate()
        handle.write(lines[0] + lines[1] + b" " * len(lines[2]))
        os.fsync(handle.fileno())
    with view, pytest.raises(LedgerError, match="changed under this process"):
        view.events()
