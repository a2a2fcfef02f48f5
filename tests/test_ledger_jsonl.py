"""What only the append-only backend has: torn tails, corrupt lines, one writer, compaction."""

import json

import pytest

from toolkit.errors import LedgerError
from toolkit.ledger import State, open_ledger

S = State


def _write_three(path, clock):
    with open_ledger(path, clock=clock) as ledger:
        for key in ("a", "b", "c"):
            ledger.add(key)
        ledger.move("a", S.PENDING, S.UNKNOWN)


def test_torn_final_line_is_ignored_reported_and_cut_before_the_next_append(tmp_path, clock):
    path = tmp_path / "l.jsonl"
    _write_three(path, clock)
    whole = path.read_bytes()
    last = whole.rstrip(b"\n").rsplit(b"\n", 1)[1]
    path.write_bytes(whole[: len(whole) - len(last) // 2 - 1])  # the move line, cut mid-way
    with open_ledger(path, clock=clock) as ledger:
        assert ledger.torn_tail == {"line": 5, "bytes": len(last) - len(last) // 2}  # after the header
        assert ledger.corrupt_lines == []
        assert ledger.get("a").state is S.PENDING  # the torn transition never happened
        ledger.move("a", S.PENDING, S.UNKNOWN, note="retried intent")
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(line) for line in lines[:-1])
    with open_ledger(path, clock=clock) as reopened:
        assert reopened.torn_tail is None and reopened.corrupt_lines == []
        assert [event.seq for event in reopened.events()] == [1, 2, 3, 4]
        assert reopened.get("a").state is S.UNKNOWN


# (b"\x0b": a vertical tab, which JSON does not take as whitespace; a blank line is skipped)
@pytest.mark.parametrize("garbage", [b"{not json", b"\xff\xfe\xfd", b"[1, 2]", b'{"seq": 2}',
                                     b"\x0b"])
def test_interior_corrupt_line_is_reported_by_number_and_refuses_writes(tmp_path, clock, garbage):
    """A corrupt interior line is reported and skipped for reading, but the ledger refuses
    every write (one line naming the line and pointing to audit): writing on would build on
    a history it cannot read whole. The file is left byte for byte as it was."""
    path = tmp_path / "l.jsonl"
    _write_three(path, clock)
    lines = path.read_bytes().split(b"\n")
    lines.insert(2, garbage)
    path.write_bytes(b"\n".join(lines))
    before = path.read_bytes()
    with open_ledger(path, clock=clock) as ledger:
        assert ledger.corrupt_lines == [3]
        assert [item.key for item in ledger.items()] == ["a", "b", "c"]
        assert ledger.get("a").state is S.UNKNOWN
        with pytest.raises(LedgerError, match="corrupt lines 3 .*toolkit audit") as refused:
            ledger.add("d")
        assert "\n" not in str(refused.value)
        with pytest.raises(LedgerError, match="corrupt lines 3"):
            ledger.compact()
    assert path.read_bytes() == before


def test_second_writer_gets_a_clear_error_and_the_first_keeps_writing(tmp_path, clock):
    path = tmp_path / "l.jsonl"
    with open_ledger(path, clock=clock) as first:
        first.add("a")
        with pytest.raises(LedgerError, match="another writer"):
            open_ledger(path, clock=clock)
        first.add("b")
    with open_ledger(path, clock=clock) as again:
        assert [item.key for item in again.items()] == ["a", "b"]


def test_second_writer_in_another_process_is_refused(tmp_path, clock):
    import subprocess
    import sys

    path = tmp_path / "l.jsonl"
    with open_ledger(path, clock=clock) as first:
        first.add("a")
        code = ("import sys\nfrom toolkit.ledger import open_ledger\nfrom toolkit.errors import LedgerError\n"
                "try:\n    open_ledger(sys.argv[1])\nexcept LedgerError as e:\n    print(e); sys.exit(3)\n")
        child = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert child.returncode == 3 and "another writer" in child.stdout


def test_compact_keeps_every_item_and_drops_damage(tmp_path, clock):
    path = tmp_path / "l.jsonl"
    _write_three(path, clock)
    with open(path, "ab") as handle:
        handle.write(b"{torn")
    with open_ledger(path, clock=clock) as ledger:
        items = ledger.items()
        assert ledger.compact() == 3
        assert ledger.items() == items
        ledger.move("b", S.PENDING, S.UNKNOWN)
    assert not (tmp_path / "l.jsonl.compact").exists()
    with open_ledger(path, clock=clock) as reopened:
        assert reopened.torn_tail is None and reopened.corrupt_lines == []
        assert reopened.get("b").state is S.UNKNOWN and reopened.get("a").state is S.UNKNOWN
        assert [event.seq for event in reopened.events()] == [5]


# -- the line encoder: its pre-encoded parts against the reference encoding ---------------

def _reference_line(event) -> bytes:
    return (json.dumps(event.to_json(), sort_keys=True) + "\n").encode()


def test_event_line_is_byte_for_byte_the_reference_json_of_the_event():
    """The fast line encoder (constant keys pre-encoded, values escaped one by one) must
    write exactly what ``json.dumps(event.to_json(), sort_keys=True)`` writes, for every
    kind of value a transition carries -- escapes, non-ASCII, a lone surrogate of an
    undecodable file name, NaN and infinity, bools and big ints in the detail, an int
    clock and a float one: a byte of difference would change what readers and the
    forensic tools see."""
    import math
    import random

    from toolkit.ledger import Event
    from toolkit.ledger.jsonl import event_line

    rng = random.Random(23)
    texts = ["", "a", 'q"uote', "back\\slash", "new\nline", "\x00\x7f", "caf\u00e9",
             "\u2028", "\U0001f600", "bad-\udcff-name.pdf", "k" * 64]
    scalars = [None, True, False, 0, -1, 2**70, 1.5, 1e16, -0.0, math.nan, math.inf, *texts]
    for _ in range(1000):
        seq, token = rng.randrange(2**40), rng.randrange(2**40)
        ts = rng.choice([rng.random() * 2e9, rng.randrange(2**40), math.nan, -math.inf, 1e-7])
        frm, to = rng.choice([None, *State]), rng.choice(list(State))
        attempt = rng.choice([0, 1, 99, True])
        op, key, worker = rng.choice(texts), rng.choice(texts), rng.choice([None, *texts])
        detail = {rng.choice(texts): rng.choice(scalars) for _ in range(rng.randrange(5))}
        event = Event(seq, ts, op, key, frm, to, attempt, worker, token, detail)
        assert event_line(seq, ts, op, key, frm, to, attempt, worker, token, detail) == \
            _reference_line(event), event


def test_respaced_orjson_line_is_the_reference_line_and_serves_ordinary_events():
    """The orjson path (``_respaced``: one C call, respaced) must write exactly the
    reference bytes or step aside (None) -- for separators, braces and brackets inside
    strings, nested details, floats at the edges of its range (1e-4, 1e16, where the two
    encoders' exponents differ), an enum or a date orjson would write and the reference
    refuses. And it must not be dead: every event of an ordinary lifecycle takes it."""
    import datetime
    import enum
    import random

    from toolkit.ledger import Event
    from toolkit.ledger.lines import _respaced, event_line

    class Colour(enum.Enum):
        RED = 1

    rng = random.Random(2323)
    texts = ["", "out/doc-000001.pdf", "a:b", "c,d", '{"x"}', "[y]", "host/1b2c-3d", "k" * 64,
             'q"uote', "caf\u00e9", "\x7f", "bad-\udcff-name.pdf"]
    for _ in range(3000):
        floats = [rng.random() * 2e9, rng.random() * 2e-4, rng.uniform(9e15, 2e16), 0.0, -0.0,
                  rng.uniform(-1, 1) * 10 ** rng.uniform(-6, 17)]
        scalars = [None, True, 7, -1, 2**63, 2**64, *floats, *texts, {"n": 1}, [1, "x"]]
        seq, token, attempt = rng.randrange(2**40), rng.randrange(2**40), rng.randrange(5)
        ts = rng.choice([*floats, rng.randrange(2**40)])
        frm, to = rng.choice([None, *State]), rng.choice(list(State))
        op, key, worker = rng.choice(["move", *texts]), rng.choice(texts), rng.choice([None, *texts])
        detail = {rng.choice(texts): rng.choice(scalars) for _ in range(rng.randrange(6))}
        event = Event(seq, ts, op, key, frm, to, attempt, worker, token, detail)
        fast = _respaced(seq, ts, op, key, frm, to, attempt, worker, token, detail)
        assert fast in (None, _reference_line(event)), event
        assert event_line(seq, ts, op, key, frm, to, attempt, worker, token, detail) == \
            _reference_line(event), event
    for foreign in (Colour.RED, datetime.date(2026, 12, 1)):  # the reference raises on them
        assert _respaced(1, 1.5, "move", "k", None, State.PENDING, 0, None, 0,
                         {"x": foreign}) is None
    lease = {"lease_owner": "w", "lease_host": "host/1b2c-3d", "lease_pid": 4242,
             "lease_started": 123456, "lease_expires": 1764573000.25}
    for parts in [(1764572940.5, "add", "k" * 64, None, State.PENDING, 0, None, 0,
                   {"source": "doc-000001.pdf", "digest": "d" * 64}),
                  (1764572940.5, "claim", "k" * 64, State.PENDING, State.PENDING, 0, "w", 1, lease),
                  (1764572940.5, "move", "k" * 64, State.SUBMITTED, State.DONE, 1, "w", 1,
                   {"job_id": "job-000001", "artifact_path": "out/doc-000001.pdf",
                    "artifact_size": 12345, "artifact_sha256": "a" * 64}),
                  (1764572940.5, "release", "k" * 64, State.DONE, State.DONE, 1, "w", 1,
                   dict.fromkeys(lease))]:
        assert _respaced(9, *parts) == _reference_line(Event(9, *parts))


def test_detail_column_text_decodes_to_the_same_values_as_the_reference_encoder():
    """``detail_json`` (orjson, with the standard library for what orjson refuses or
    would alter) must store every detail so that it reads back exactly: a lone
    surrogate, a 70-bit integer, NaN and infinity included (orjson writes NaN as null)."""
    import math

    from toolkit.ledger.records import detail_json

    details = [{}, {"source": "a.pdf", "digest": "d" * 64}, {"source": "caf\u00e9.pdf"},
               {"source": "bad-\udcff-name.pdf"}, {"artifact_size": 2**70},
               {"lease_expires": math.inf}, {"x": math.nan, "y": None},
               {"note": "intent", "nested": {"a": [1, None]}}]
    for detail in details:
        back = json.loads(detail_json(detail))
        assert list(back) == sorted(detail)  # keys sorted
        for name, value in detail.items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(back[name])
            else:
                assert back[name] == value, (detail, text)
