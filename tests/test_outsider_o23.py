"""Outsider o23's findings, each reproduced with the real fault: a write through a shared
``mmap``, a FIFO, a sparse file without newlines, a ``//`` path, an input edited after its
item was done. Reads are counted (the reader's calls), memory is measured with
``tracemalloc``, nothing is timed.
"""

import json
import mmap
import os
import threading
import tracemalloc

import pytest

from toolkit.cli import main
from toolkit.forensics import audit
from toolkit.forensics.foreign import file_key
from toolkit.runner import inputindex

from indexed_batch import batch, inputs, reads, wait_until_settled  # noqa: F401 (fixtures)


def pdf_inputs(inputs):
    return [path for path in inputs if path.read_bytes().startswith(b"%PDF")]


# -- 1. a write through a shared mapping keeps the stat: the documented limit ---------------

def test_mmap_write_that_keeps_the_stat_is_unseen_by_a_rerun_and_caught_only_by_verify(
        batch, reads, inputs):
    """Fault: an input changed by a second write through the same shared ``mmap`` (the
    kernel updates mtime/ctime at the page's first write fault only; a page already dirty
    and writable takes the next write without one). The stat stays identical, as git's
    index cannot see either. Property (the limit, as README rule 5 states it): a plain rerun
    does not read the file and keys it to the old done item (nothing executed); ``run
    --verify`` reads every input, keys the new content as a new item and executes it."""
    victim = pdf_inputs(inputs)[0]
    with open(victim, "r+b") as handle, mmap.mmap(handle.fileno(), 0) as mapped:
        last = mapped[-1]
        mapped[-1] = ord(" ") if last != ord(" ") else ord("\n")  # after %%EOF: still a PDF
        wait_until_settled([victim])
        batch()  # reads the victim as it is now, records its stat
        before = inputindex.stamp(os.stat(victim))
        mapped[-1] = ord("\t")  # the same dirty page: no fault, no time update
        if inputindex.stamp(os.stat(victim)) != before:
            pytest.skip("the kernel wrote the page back between the writes (a sync): the "
                        "next write faulted and moved the stat; the limit is not reproduced")
    executions = batch.executions()
    reads.clear()
    runner, counts = batch()
    assert reads == [] and runner.reused == 4 and batch.executions() == executions
    reads.clear()
    runner, counts = batch(verify=True)
    assert victim.name in reads and counts["done"] == 4
    assert runner.reused == 3 and batch.executions() == executions + 1


# -- 3. a FIFO at the index path ----------------------------------------------------------

def test_fifo_at_the_index_path_does_not_hang_the_run_and_is_replaced(batch, reads, inputs):
    """Fault: a FIFO (no writer) at ``<ledger>.inputs``: a plain open() blocks forever.
    Property: the run does not block; the FIFO is a damaged index (not read): every input is
    read and keyed to its own item, nothing executes, and a regular index replaces it."""
    batch()
    executions = batch.executions()
    batch.index.unlink()
    os.mkfifo(batch.index)
    reads.clear()
    result = {}
    worker = threading.Thread(target=lambda: result.update(counts=batch()[1]), daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():  # hung in open(): a writer releases it, then the test fails
        os.close(os.open(batch.index, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(60)
        pytest.fail("the run blocked opening the FIFO at the index path")
    assert result["counts"]["done"] == 4 and result["counts"]["failed"] == 1
    assert sorted(set(reads)) == sorted(path.name for path in inputs)
    assert batch.executions() == executions and batch.index.is_file()


# -- 4. an index without newlines ---------------------------------------------------------

def peak_bytes_opening_index(ledger) -> int:
    """Python's peak allocation while an index is opened and read through to its end."""
    tracemalloc.start()
    try:
        index = inputindex.InputIndex(ledger, "any keyer", record=False)
        for _ in index._entries:  # every recorded entry after the first, read through
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_sparse_index_without_a_newline_is_read_in_bounded_memory(batch, reads, inputs):
    """Fault: ``<ledger>.inputs`` is a 64 MiB sparse file of zeros (no newline at all):
    reading its first line whole takes 64 MiB (2 GiB in the finding: MemoryError under
    ``ulimit -v``). Property: opening it allocates under 1 MiB; the run keys every input to
    its own item and executes nothing; a regular index replaces it."""
    batch()
    executions = batch.executions()
    with open(batch.index, "wb") as handle:
        handle.truncate(64 << 20)
    assert peak_bytes_opening_index(batch.ledger) < 1 << 20
    reads.clear()
    runner, counts = batch()
    assert counts["done"] == 4 and counts["failed"] == 1 and batch.executions() == executions
    assert batch.index.read_bytes().startswith(inputindex.HEADER.encode())


def test_overlong_line_inside_the_index_is_read_around_in_bounded_memory(batch, reads):
    """Fault: an 8 MiB line without a newline inside the index, between its header and its
    entries (then a newline). Property: reading it allocates under 1 MiB; the line is damage,
    skipped to its end, and the entries after it still vouch: the rerun reads no input."""
    batch()
    header, rest = batch.index.read_bytes().split(b"\n", 1)
    batch.index.write_bytes(header + b"\n" + b"7" * (8 << 20) + b"\n" + rest)
    assert peak_bytes_opening_index(batch.ledger) < 1 << 20
    reads.clear()
    runner, counts = batch()
    assert reads == [] and runner.reused == 4


# -- 2. a leading // in a state file ------------------------------------------------------

def test_leading_double_slash_is_the_same_path_in_a_state_file(tmp_path):
    """Fault: a state file spells one path ``/data/x.pdf`` and ``//data/x.pdf`` (normpath
    keeps a leading ``//``: POSIX leaves it implementation-defined, on Linux it is ``/``).
    Property: one item, duplicate_key findings naming both spellings, planned review;
    a torn tail naming ``//data/b.pdf`` puts ``/data/b.pdf`` in doubt (review)."""
    assert [file_key(name) for name in ("//data/x.pdf", "///data/x.pdf", "//", "//a/../b")] \
        == ["/data/x.pdf", "/data/x.pdf", "/", "/b"]
    one = tmp_path / "s1.jsonl"
    one.write_text('{"file":"/data/x.pdf","status":"done"}\n'
                   '{"file":"//data/x.pdf","status":"pending"}\n')
    report = audit(one)
    assert [(item.key, action) for item, action, _ in report.rows] == [("/data/x.pdf", "review")]
    assert {(a.key, a.kind) for a in report.anomalies} == {("/data/x.pdf", "duplicate_key")}
    assert any("spells it '//data/x.pdf', line 1 '/data/x.pdf'" in a.detail
               for a in report.anomalies)  # and another: the pending overrides the done
    two = tmp_path / "s2.jsonl"
    two.write_text('{"file":"/data/b.pdf","status":"pending"}\n{"file":"//data/b.pdf","status":"do')
    report = audit(two)
    assert [(item.key, action) for item, action, _ in report.rows] == [("/data/b.pdf", "review")]
    assert ("/data/b.pdf", "missing_history") in [(a.key, a.kind) for a in report.anomalies]


# -- 5. a done item whose input changed ---------------------------------------------------

def test_done_item_whose_input_changed_is_planned_review_not_skip(batch, inputs, capsys):
    """Fault: a done item's input edited in place afterwards (its bytes no longer those the
    item was keyed from). Property: ``audit --inputs`` reports ``stale_input`` for it and
    plans ``review`` (README: a changed input is review; skip is done and verified), exit 0;
    the unchanged done items stay ``skip``."""
    batch()
    victim = pdf_inputs(inputs)[0]
    with open(victim, "ab") as handle:
        handle.write(b"\n% edited\n")
    assert main(["audit", str(batch.ledger), "--inputs", str(victim.parent), "--json"]) == 0
    per_item = {row["source"]: row for row in json.loads(capsys.readouterr().out)["per_item"]}
    row = next(row for source, row in per_item.items() if source.endswith(victim.name))
    assert row["state"] == "done" and row["findings"] == ["stale_input"]
    assert row["action"] == "review" and "input changed" in row["why"]
    done = [r for r in per_item.values() if r["state"] == "done" and r is not row]
    assert len(done) == 3 and {r["action"] for r in done} == {"skip"}
