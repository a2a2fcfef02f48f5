"""Fuzzing the JSONL reader: whatever the bytes, a report or a one-line error, and the
same verdict as the ledger's own reader on damaged real ledgers."""

import json
import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.errors import ToolkitError
from toolkit.forensics import KINDS, audit, lines, render_text
from toolkit.ledger import open_ledger

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STATES = ["pending", "unknown", "submitted", "done", "failed", "needs_review", "cancelled",
          "partial"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                               max_size=3),
    max_leaves=8)
events = st.builds(
    lambda seq, op, key, frm, to, attempt, detail: {
        "seq": seq, "ts": float(seq), "op": op, "key": key, "from": frm, "to": to,
        "attempt": attempt, "worker": None, "token": 0, "detail": detail},
    st.integers(0, 50), st.sampled_from(["add", "move", "claim", "release", "bogus"]),
    st.sampled_from(["a", "b", "c"]), st.none() | st.sampled_from(STATES),
    st.sampled_from(STATES + ["paused"]), st.integers(0, 3),
    st.fixed_dictionaries({}, optional={
        "source": st.sampled_from(["a.pdf", "../x"]), "failure": st.sampled_from(
            ["transient", "permanent"]), "artifact_path": st.sampled_from(["out/a", "/etc/x"]),
        "artifact_size": json_values, "artifact_sha256": st.text(max_size=4)}))
line_bytes = st.one_of(
    events.map(lambda e: json.dumps(e).encode()),
    events.map(lambda e: json.dumps(e).encode()).flatmap(
        lambda raw: st.integers(0, len(raw)).map(lambda cut: raw[:cut])),  # torn mid-write
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from([b"", b"\xff\xfe", b"[" * 3000, b"{\"snapshot\": {}}", b"\r"]),
)
FIRST = json.dumps({"seq": 0, "ts": 0.0, "op": "add", "key": "a", "from": None,
                    "to": "pending", "attempt": 0, "worker": None, "token": 0,
                    "detail": {}}).encode()


def write(tmp: str, data: bytes) -> Path:
    path = Path(tmp) / "fuzz.jsonl"
    path.write_bytes(data)
    return path


@FUZZ
@given(st.lists(line_bytes, max_size=25), st.booleans(), st.sampled_from([None, 5, 64]))
def test_any_line_soup_gives_a_consistent_report_never_a_traceback(body, newline_at_end, chunk):
    """Arbitrary lines after one valid event: the audit returns a report whose numbers
    add up, whose line numbers are real, and which renders and serializes."""
    data = b"\n".join([FIRST, *body]) + (b"\n" if newline_at_end else b"")
    total = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    with tempfile.TemporaryDirectory() as tmp, \
            mock.patch.object(lines, "CHUNK", chunk or lines.CHUNK), \
            mock.patch.object(lines, "MAX_LINE", 40 if chunk else lines.MAX_LINE):
        report = audit(write(tmp, data), artifacts=tmp, inputs=tmp)
    assert report.format == "toolkit-jsonl"
    assert report.corrupt_lines == sorted(set(report.corrupt_lines))
    assert all(1 <= number <= total for number in report.corrupt_lines)
    assert sum(report.plan.values()) == len(report.items) == sum(report.by_state.values())
    assert {anomaly.kind for anomaly in report.anomalies} <= set(KINDS)
    assert json.loads(json.dumps(report.to_json())) == report.to_json()
    assert all(line.isprintable() for line in render_text(report).splitlines())


@FUZZ
@given(st.binary(max_size=200))
def test_any_bytes_at_all_give_a_report_or_a_one_line_toolkit_error(data):
    with tempfile.TemporaryDirectory() as tmp:
        try:
            report = audit(write(tmp, data))
        except ToolkitError as exc:
            assert "\n" not in str(exc) and "supported formats" in str(exc)
        else:
            assert sum(report.plan.values()) == len(report.items)


def reference_lines(data: bytes, limit: int):
    """What the chunked reader must yield, computed the obvious way."""
    pieces = data.split(b"\n")
    tail = pieces.pop()
    out = []
    for raw in pieces:
        if len(raw) > limit:
            out.append(("bad", f"{len(raw)} bytes"))
            continue
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(("bad", "utf-8"))
    return out, ((len(pieces) + 1, len(tail)) if tail else None)


@FUZZ
@given(st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")) |
                st.sampled_from([b"x" * 50, "é".encode() * 12]), max_size=20),
       st.booleans(), st.integers(1, 40))
def test_chunked_line_reader_agrees_with_a_plain_split_for_any_chunk_size(pieces, end, chunk):
    data = b"\n".join(pieces) + (b"\n" if end else b"")
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(lines, "MAX_LINE", 24):
        reader = lines.LineReader(write(tmp, data), chunk=chunk)
        got = []
        for first, batch in reader.batches():
            assert first == len(got) + 1
            got += [text if isinstance(text, str) else
                    ("bad", "utf-8" if "UTF-8" in text.why else text.why.split(",")[0])
                    for text in batch]
    expected, torn = reference_lines(data, 24)
    assert got == expected and reader.torn == torn


def event_line(key, frm, to, op="move"):
    return json.dumps({"seq": 99, "ts": 1.0, "op": op, "key": key, "from": frm, "to": to,
                       "attempt": 1, "worker": None, "token": 0, "detail": {}}).encode()


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["add", "intent", "ack", "done", "fail"]),
                          st.sampled_from(["a", "b", "c", "d"])), max_size=30),
       st.lists(st.tuples(st.integers(0, 60), st.sampled_from(
           [b"garbage", b"[]", b"\xff", b"", b"{\"to\": \"done\"}",
            event_line("zz", "pending", "unknown"),          # a move before its add
            event_line("a", "pending", "done"),              # skips the intent
            event_line("a", None, "pending", op="add")])),   # a second add
           max_size=4),
       st.integers(0, 80))
def test_audit_of_a_damaged_real_ledger_agrees_with_the_ledgers_own_replay(ops, junk, cut):
    """Real ledger writes, then interior junk lines and a torn tail: the audit's items,
    states and unusable lines are exactly what JsonlLedger reconstructs on open."""
    moves = {"intent": ("pending", "unknown"), "ack": ("unknown", "submitted"),
             "done": ("submitted", "done"), "fail": ("unknown", "failed")}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.jsonl"
        with open_ledger(path, durable=False, clock=lambda: 1.0) as ledger:
            for op, key in [("add", "a"), ("add", "b"), *ops]:  # one line survives the cut
                item = ledger.get(key)
                if op == "add":
                    ledger.add(key, "a.pdf")
                elif item is not None and item.state.value == moves[op][0]:
                    extra = {"failure": "transient"} if op == "fail" else \
                        {"artifact_path": "a.out.pdf", "artifact_size": 1,
                         "artifact_sha256": "0" * 64} if op == "done" else {}
                    ledger.move(key, *moves[op], **extra)
        rows = path.read_bytes().split(b"\n")[:-1]
        for position, raw in sorted(junk, reverse=True):
            rows.insert(min(position, len(rows)), raw)
        tail = rows.pop()[:cut] if rows and cut < 80 else b""
        path.write_bytes(b"".join(row + b"\n" for row in rows) + tail)
        report = audit(path)
        with open_ledger(path) as ledger:
            replayed = {item.key: item.state.value  # orphans: events whose add line was lost
                        for item in [*ledger.orphans.values(), *ledger.items()]}
            unusable = ledger.corrupt_lines + ([ledger.torn_tail["line"]]
                                               if ledger.torn_tail else [])
    assert dict(zip(report.items["key"], report.items["state"])) == replayed
    assert report.corrupt_lines == sorted(unusable)
