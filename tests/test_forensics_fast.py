"""The audit's fast readers (msgspec decoders, packed event columns) against the
reference reader (json, one dict per line): the same report, whatever the file holds."""

import json
import sqlite3
import tempfile
from pathlib import Path
from unittest import mock

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.forensics import audit, lines
from toolkit.ledger.sqlite import SCHEMA

FUZZ = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STATES = ["pending", "unknown", "submitted", "done", "failed", "needs_review", "cancelled"]

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | \
    st.text(max_size=6) | st.sampled_from([2**70, -(2**64), 10**30])
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=2) |
                      st.dictionaries(st.text(max_size=4), inner, max_size=2), max_leaves=5)
events = st.builds(
    lambda seq, ts, op, key, frm, to, attempt, worker, token, detail: {
        "seq": seq, "ts": ts, "op": op, "key": key, "from": frm, "to": to, "attempt": attempt,
        "worker": worker, "token": token, "detail": detail},
    st.integers(0, 40) | st.just(2**70), st.floats(0, 1e9) | st.integers(0, 10),
    st.sampled_from(["add", "move", "claim", "release", "bogus"]), st.sampled_from("abc"),
    st.none() | st.sampled_from(STATES), st.sampled_from(STATES + ["paused"]),
    st.integers(0, 3) | st.just(-(2**63) - 1), st.none() | st.sampled_from(["w1", "w2"]),
    st.integers(0, 2),
    st.fixed_dictionaries({}, optional={
        "source": st.sampled_from(["a.pdf", 7]), "digest": st.text(max_size=3),
        "failure": st.sampled_from(["transient", "permanent"]),
        "artifact_path": st.just("out/a"), "artifact_size": values,
        "artifact_sha256": st.just("0" * 64), "reason": values}))


def _raw_texts(event: dict):
    text = json.dumps(event)
    return st.sampled_from([
        text.encode(),
        f"  {text}\r".encode(),                                      # whitespace around
        text.replace('"seq": ', '"seq": "x", "seq": ', 1).encode(),  # a duplicate name
        text.replace('"detail": {', '"detail": {"n": NaN, ', 1).encode(),  # json-only NaN
        text.replace('"key": "', '"key": "\\ud800', 1).encode(),     # a lone surrogate
        text[:-1].encode() + b', "snapshot": 1}',                     # a stray snapshot name
        text.encode()[:-1] + b"\xff}",                                # not UTF-8
        text.replace('"detail": {', '"detail": {"d": ' + "[" * 70 + "]" * 70 + ", ", 1)
        .encode(),                                                    # deep, for json
    ])


line_bytes = st.one_of(
    events.flatmap(_raw_texts),
    st.builds(lambda key, state: json.dumps({"snapshot": {"key": key, "state": state},
                                             "seq": 1}).encode(),
              st.sampled_from("abc"), st.sampled_from(STATES)),
    values.map(lambda v: json.dumps(v).encode()),
    st.sampled_from([b"", b"{", b"[]", b"null", b"{\"to\": \"done\"}"]),
)
HEADER = b'{"format": "resume-toolkit-jsonl/1"}'


def _both(path):
    """The report read the fast way, and the reference way."""
    fast = audit(path, now=0.0)
    with mock.patch.object(lines, "FAST", False):
        reference = audit(path, now=0.0)
    return fast, reference


def _same(fast, reference):
    assert fast.format == reference.format
    assert fast.to_json() == reference.to_json()  # counts, anomalies, corrupt lines, plan
    pd.testing.assert_frame_equal(fast.items, reference.items)
    if reference.events is None:
        assert fast.events is None
    else:
        pd.testing.assert_frame_equal(fast.events, reference.events)


@FUZZ
@given(st.booleans(), st.lists(events.map(lambda e: json.dumps(e).encode()), min_size=1,
                               max_size=3), st.lists(line_bytes, max_size=20))
def test_fast_event_reader_gives_the_reference_report_for_any_line_soup(headed, first, body):
    """Fault: any mix of valid, odd and damaged lines (duplicate names, NaN, lone
    surrogates, non-UTF-8, deep nesting, 70-bit integers, integer ts, snapshots).
    Property: items, events (values and dtypes), anomalies, corrupt lines and plan are
    exactly those of the json reference reader."""
    data = b"\n".join([HEADER] * headed + first + body) + b"\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ledger.jsonl"
        path.write_bytes(data)
        fast, reference = _both(path)
    assert fast.format == "toolkit-jsonl"
    _same(fast, reference)


state_lines = st.one_of(
    st.builds(lambda file, status, extra: json.dumps({"file": file, "status": status, **extra}),
              st.sampled_from(["a.pdf", "b.pdf", ""]), st.sampled_from(["pending", "done",
                                                                         "failed", "odd"]),
              st.fixed_dictionaries({}, optional={"output": st.just("a.out"), "size": values,
                                                  "ts": st.integers(0, 9) | st.floats(0, 9),
                                                  "retryable": st.booleans()}))
    .map(str.encode),
    values.map(lambda v: json.dumps(v).encode()),
    st.sampled_from([b"{\"file\": \"a.pdf\", \"status\": \"done\", \"size\": NaN}",
                     b"{\"file\": \"a.pdf\", \"file\": 3, \"status\": \"done\"}", b"\xff"]))


@FUZZ
@given(st.lists(state_lines, max_size=15))
def test_fast_generic_reader_gives_the_reference_report_for_a_state_file(body):
    """Fault: a foreign state file with odd and damaged lines. Property: the msgspec
    decoder in front of json changes nothing in the report."""
    data = b"\n".join([b'{"file": "z.pdf", "status": "pending"}', *body]) + b"\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.jsonl"
        path.write_bytes(data)
        fast, reference = _both(path)
    assert fast.format == "jsonl-state"
    _same(fast, reference)


def test_fast_sqlite_detail_reader_gives_the_reference_report_for_odd_details(tmp_path):
    """Fault: a toolkit SQLite ledger whose event details are empty, nested, json-only
    (NaN), not JSON, not an object, a BLOB, empty. Property: the shared empty detail and
    msgspec's decoder give exactly the json reference's report."""
    path = tmp_path / "ledger.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    for statement in SCHEMA.strip().split(";"):
        if statement.strip():
            db.execute(statement)
    details = ['{}', '{"source": "a.pdf", "digest": "d"}', '{"x": ' + "[" * 70 + "]" * 70 + "}",
               '{"reason": NaN}', "not json", "[1]", b'{"reason": "blob"}', "",
               '{"failure": "transient", "failure": "permanent"}']
    seq = 0
    for number, detail in enumerate(details):
        key = f"k{number}"
        for frm, to in ((None, "pending"), ("pending", "unknown"), ("unknown", "failed")):
            seq += 1
            db.execute('INSERT INTO events (seq, ts, op, key, frm, "to", attempt, worker, '
                       "token, detail) VALUES (?, ?, ?, ?, ?, ?, 1, NULL, 0, ?)",
                       (seq, float(seq), "add" if frm is None else "move", key, frm, to,
                        detail if to != "pending" else '{"source": "a.pdf"}'))
        db.execute("INSERT INTO items (key, state, attempt, token, updated) "
                   "VALUES (?, 'failed', 1, 0, 1.0)", (key,))
    db.close()
    fast, reference = _both(path)
    assert fast.format == "toolkit-sqlite"
    assert any(a.kind == "corrupt_record" for a in reference.anomalies)  # the odd ones count
    _same(fast, reference)
