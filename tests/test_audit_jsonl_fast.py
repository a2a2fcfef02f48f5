"""The JSONL audit's batch path (a batch of lines decoded in one C loop, its events
pushed to the packed table at once) against the reference reader (json, one dict per
line), on seeded random histories with damage spread over many small batches."""

import io
import json
import random
from unittest import mock

import pandas as pd
import pytest

from toolkit.forensics import audit, history, lines
from toolkit.forensics.report import document, stream_json

STEPS = (["unknown", "submitted", "done"], ["unknown", "failed", "unknown", "submitted", "done"],
         ["unknown", "failed"], ["unknown"], [])


def _event(seq, key, op, frm, to, attempt, detail, rng):
    return {"seq": seq, "ts": 1_700_000_000.0 + seq / 100, "op": op, "key": key, "from": frm,
            "to": to, "attempt": attempt, "worker": rng.choice([None, None, "w1", "w2"]),
            "token": 0, "detail": detail}


def _history(rng: random.Random, items: int) -> list[bytes]:
    """A ledger's lines: every item's story, the stories interleaved as workers write."""
    stories = []
    for number in range(items):
        key, source = f"k{number:04d}", f"dir/doc {number}.pdf"
        story, state, attempt = [], None, 0
        for to in [None, *rng.choice(STEPS)]:
            op, detail = "move", {}
            if to is None:
                op, to, detail = "add", "pending", {"source": source, "digest": "d" * 64}
            elif to == "unknown":
                attempt += 1
            elif to == "failed":
                detail = {"failure": rng.choice(["transient", "permanent"]), "reason": "503"}
            elif to == "done":
                detail = {"artifact_path": f"out/{number}.pdf", "artifact_size": number,
                          "artifact_sha256": "a" * 64}
            story.append((key, op, state, to, attempt, detail))
            state = to
        stories.append(story)
    out, seq = [], 0
    while stories:
        story = rng.choice(stories)
        seq += 1
        key, op, frm, to, attempt, detail = story.pop(0)
        out.append(json.dumps(_event(seq, key, op, frm, to, attempt, detail, rng)).encode())
        if not story:
            stories.remove(story)
    return out


def _damage(rng: random.Random, body: list[bytes]) -> list[bytes]:
    """Each kind of damage a ledger meets, at seeded places: lines the typed decoder
    refuses (cut, not UTF-8, not JSON, wrong types), lines it takes but the fold refuses
    (an event before its add, an illegal move, a second add), and lines the exact table
    keeps apart (an integer ts, a 70-bit seq), plus a snapshot."""
    body = list(body)
    picks = rng.sample(range(len(body)), 12)
    cut, utf8, garbage, typed, orphan, illegal, again, int_ts, big, snap = picks[:10]
    body[cut] = body[cut][: len(body[cut]) // 2]
    body[utf8] = body[utf8][:-2] + b"\xff}"
    body[garbage] = b"{not json"
    body[typed] = body[typed].replace(b'"token": 0', b'"token": "zero"')
    victim = json.loads(body[orphan])
    body[orphan] = json.dumps({**victim, "key": "never-added", "op": "move"}).encode()
    move = json.loads(body[illegal])
    body[illegal] = json.dumps({**move, "to": "cancelled", "from": "done"}).encode()
    first = json.loads(body[again])
    body[again] = json.dumps({**first, "op": "add", "from": None, "to": "pending"}).encode()
    body[int_ts] = json.dumps({**json.loads(body[int_ts]), "ts": 7}).encode()
    body[big] = json.dumps({**json.loads(body[big]), "seq": 2 ** 70}).encode()
    body[snap] = json.dumps({"snapshot": {"key": "snap", "state": "done"}, "seq": 1}).encode()
    return body


def _both(path, chunk):
    """The report read the fast way (batches of about ``chunk`` bytes), and the reference
    way; with the number of events the batch path folded."""
    fold = history.History._make_apply
    folded = []

    def counting(self, columns):
        apply = fold(self, columns)
        if columns is not None:
            return apply

        def counted(*event):
            folded.append(1)
            return apply(*event)

        return counted

    with mock.patch.object(lines, "CHUNK", chunk), \
            mock.patch.object(history.History, "_make_apply", counting):
        fast = audit(path, now=0.0)
    with mock.patch.object(lines, "FAST", False), mock.patch.object(lines, "CHUNK", chunk):
        reference = audit(path, now=0.0)
    return fast, reference, len(folded)


def _json_bytes(report) -> bytes:
    out = io.BytesIO()
    text = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    stream_json(report, text)
    text.detach()  # the bytes stay open to be read
    return out.getvalue()


def _same(fast, reference):
    assert fast.format == reference.format == "toolkit-jsonl"
    assert document(fast) == document(reference)  # counts, anomalies, lines, plan, per_item
    assert _json_bytes(fast) == _json_bytes(reference)
    pd.testing.assert_frame_equal(fast.items, reference.items)
    pd.testing.assert_frame_equal(fast.events, reference.events)


@pytest.mark.parametrize("seed", range(6))
def test_batch_path_equals_reference_on_damaged_histories_with_a_torn_tail(tmp_path, seed):
    """Fault: a seeded history of 120 interleaved items with every kind of damaged line
    spread over ~40 small batches, a header on odd seeds, and a final line cut mid-write.
    Property: the report (per_item, anomalies in order, corrupt lines, the torn line,
    items and events with their dtypes) is byte for byte the json reference's; and the
    clean batches did take the batch path."""
    rng = random.Random(seed)
    body = _damage(rng, _history(rng, 120))
    head = [b'{"format": "resume-toolkit-jsonl/1"}'] if seed % 2 else []
    torn = json.dumps(_event(99999, "k0000", "move", "done", "done", 9, {}, rng)).encode()
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b"\n".join(head + body) + b"\n" + torn[:40])
    fast, reference, folded = _both(path, chunk=1024)
    _same(fast, reference)
    assert any(a.kind == "torn_line" for a in reference.anomalies)
    assert len(reference.corrupt_lines) >= 5
    assert folded > len(body) // 3  # most batches are clean: they went the batch way


@pytest.mark.parametrize("seed", range(3))
def test_batch_path_equals_reference_on_clean_histories_at_any_batch_size(tmp_path, seed):
    """Fault: none, but batch boundaries anywhere (a batch of one line up to the whole
    file). Property: the same report as the reference, and every event folded by the
    batch path (no silent fall back to line by line)."""
    rng = random.Random(100 + seed)
    body = _history(rng, 80)
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b"\n".join(body) + b"\n")
    for chunk in (1, 700, 1 << 21):
        fast, reference, folded = _both(path, chunk)
        _same(fast, reference)
        assert folded == len(body)


def test_orphan_event_in_a_clean_batch_is_corrupt_and_kept_out_of_the_event_table(tmp_path):
    """Fault: an event whose add was never written, in a batch the typed decoder takes
    whole. Property: its line is a corrupt_line (in line order with the others), its key
    is missing_history, and the event table holds every other event but not it."""
    rng = random.Random(7)
    body = _history(rng, 10)
    orphan = json.loads(body[5])
    body.insert(5, json.dumps({**orphan, "key": "ghost", "op": "move"}).encode())
    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b"\n".join(body) + b"\n")
    fast, reference, folded = _both(path, 1 << 21)
    _same(fast, reference)
    assert folded == len(body)
    assert fast.corrupt_lines == [6]
    assert "ghost" not in set(fast.events["key"])
    assert len(fast.events) == len(body) - 1
    assert ("ghost", "missing_history") in {(a.key, a.kind) for a in fast.anomalies}


def test_gc_between_json_chunks_is_paused_and_restored_after_a_broken_stream(tmp_path):
    """What breaks: the cyclic GC, on between per_item chunks, ran full collections over
    every live object of the audit (a million-line audit's JSON took 3.4 s of CPU instead
    of 1.2 s). Must hold: streaming a report of many chunks runs no collection, and the
    GC is on again afterwards, also when the stream fails midway (a closed pipe)."""
    import gc

    from toolkit.forensics import report as report_module

    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b"\n".join(_history(random.Random(5), 3000)) + b"\n")
    audited = audit(path, now=0.0)
    assert len(audited.rows) == 3000

    class Broken(io.RawIOBase):
        calls = 0

        def writable(self):
            return True

        def write(self, data):
            if self.calls == 2:
                raise BrokenPipeError("reader gone")
            self.calls += 1
            return len(data)

    started = []
    collected = lambda phase, info: started.append(1) if phase == "start" else None  # noqa: E731
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    with mock.patch.object(report_module, "CHUNK", 500):
        gc.callbacks.append(collected)
        try:
            gc.collect()  # the count starts at 0: the few objects before the pause set off none
            del started[:]
            stream_json(audited, out)  # 3000 items: ~18,000 new objects, 6 chunks
            ran = len(started)
            broken = io.TextIOWrapper(io.BufferedWriter(Broken(), 1), encoding="utf-8")
            with pytest.raises(BrokenPipeError):
                stream_json(audited, broken)
        finally:
            gc.callbacks.remove(collected)
    assert ran == 0
    assert gc.isenabled()


def test_many_anomalies_go_out_in_chunks_never_as_one_document(tmp_path):
    """What breaks: the JSON's ``anomalies`` list was dumped whole with the head of the
    document (a million-line ledger copied without its outputs has ~230,000 findings: the
    dicts and their text held at once put ~190 MB on the audit's peak). Must hold: with
    chunks of 50, no single write carries more than a few chunks' worth of the document,
    and the bytes equal the one-piece document."""
    from toolkit.forensics import report as report_module

    path = tmp_path / "ledger.jsonl"
    path.write_bytes(b"\n".join(_history(random.Random(9), 2000)) + b"\n")
    audited = audit(path, now=0.0)  # no outputs folder: every done item is a finding
    assert len(audited.anomalies) > 1000

    class Recording(io.RawIOBase):
        def __init__(self):
            self.writes = []

        def writable(self):
            return True

        def write(self, data):
            self.writes.append(bytes(data))
            return len(data)

    sink = Recording()
    whole = io.StringIO()
    report_module.write_json(report_module.document(audited), whole)
    with mock.patch.object(report_module, "CHUNK", 50):
        stream_json(audited, io.TextIOWrapper(sink, encoding="utf-8", write_through=True))
    assert b"".join(sink.writes).decode() == whole.getvalue()
    chunk_bytes = len(whole.getvalue()) * 50 // (len(audited.anomalies) + len(audited.rows))
    assert max(map(len, sink.writes)) < 4 * chunk_bytes
