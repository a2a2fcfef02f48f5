"""The hot path's shortcuts keep the ledger's guarantees (issue 23, "close the gap").

A JSONL append checks, after its fsync, that the ledger's path still names the file it
holds; the check now runs inline and takes its one stat by a path converted once, falling
to ``JsonlLedger._check_named`` for anything but "same file". These tests make each way a
path can stop naming the file happen for real (rename over it, unlink, rename it away,
a second name before the replacement) between two transitions, and require the next
transition to fail with StorageError, the next after it too (the run stops), and nothing of
the refused transitions to reach the ledger's memory. ``item_of`` now builds an Item by
slot stores and a class change: it must be the very Item the dataclass builds.
"""

import dataclasses
import os
import shutil

import pytest

from toolkit.errors import StorageError
from toolkit.ledger import Item, State
from toolkit.ledger.jsonl import JsonlLedger
from toolkit.ledger.records import ITEM_FIELDS, ItemRow, item_of


def _cp_mv(path):
    shutil.copy2(path, path.with_name("l.tmp"))
    os.replace(path.with_name("l.tmp"), path)


def _moved_away(path):
    os.rename(path, path.with_name("elsewhere.jsonl"))


def _linked_then_replaced(path):
    os.link(path, path.with_name("backup.jsonl"))  # our file keeps one name: nlink 1
    _cp_mv(path)


@pytest.mark.parametrize("change", [_cp_mv, os.unlink, _moved_away, _linked_then_replaced],
                         ids=["replaced", "removed", "moved-away", "linked-then-replaced"])
def test_ledger_path_changed_between_appends_next_transition_raises_and_run_stops(
        tmp_path, change):
    """Fault: between two transitions the ledger's path stops naming the open file (in
    the moved-away and linked cases the file keeps a link, so its own fstat would say
    nothing). Property: the next transition raises StorageError naming the replacement,
    so does the one after it, and the item stays as the last accepted transition left it."""
    path = tmp_path / "l.jsonl"
    ledger = JsonlLedger(path)
    try:
        ledger.add("k", "k.pdf")
        token = ledger.claim("k", "w", 60)  # appends since the open: the inline check ran
        change(path)
        for _ in range(2):
            with pytest.raises(StorageError, match="replaced or removed"):
                ledger.move("k", State.PENDING, State.UNKNOWN, token=token, worker="w")
        item = ledger.get("k")
        assert item.state is State.PENDING and item.token == token
        assert [event.op for event in ledger.events()] == ["add", "claim"]
    finally:  # the halt was said where it was seen (an append): close adds no second one
        ledger.close()


def test_ledger_path_unchanged_many_appends_every_transition_accepted(tmp_path):
    """No fault: the inline check must not refuse a ledger whose path still names its file
    (after a reopen, when the file it holds is a new descriptor, too)."""
    path = tmp_path / "l.jsonl"
    for round_ in range(2):
        with JsonlLedger(path) as ledger:
            for number in range(20):
                key = f"k{round_}-{number}"
                ledger.add(key, f"{key}.pdf")
                token = ledger.claim(key, "w", 60)
                ledger.move(key, State.PENDING, State.UNKNOWN, token=token, worker="w")
    with JsonlLedger(path, view=True) as ledger:
        assert ledger.counts()["unknown"] == 40


def test_item_of_any_row_is_the_item_the_dataclass_builds():
    """Fault: a field stored into another slot, or an object that is not a real Item.
    Property: ``item_of(row)`` equals ``Item(*row)`` field by field, is of type Item,
    hashes alike, stays frozen, and a row of another length is refused."""
    rows = [tuple(range(len(ITEM_FIELDS))),
            ItemRow(*dataclasses.astuple(Item("k", State.DONE, "a.pdf", 2, 3, "job",
                                              artifact_path="o.pdf", artifact_size=1,
                                              artifact_sha256="a" * 64, updated=5.0)))]
    for row in rows:
        item = item_of(row)
        assert type(item) is Item and item == Item(*row) and hash(item) == hash(Item(*row))
        assert dataclasses.astuple(item) == tuple(row)
        with pytest.raises(dataclasses.FrozenInstanceError):
            item.key = "other"
    for bad in (tuple(range(len(ITEM_FIELDS) - 1)), tuple(range(len(ITEM_FIELDS) + 1))):
        with pytest.raises(ValueError):
            item_of(bad)


@pytest.mark.parametrize("keep", [0, 1], ids=["emptied", "cut-to-header"])
def test_ledger_cut_in_place_between_appends_next_transition_raises(tmp_path, keep):
    """Fault: between two transitions the ledger is truncated in place (``: > l``, or cut
    to its first lines): the same file, so the inline stat's inode matches. Property: the
    very next transition raises StorageError naming the truncation (the inline check
    compares the size too), not only the close at the end of the run."""
    path = tmp_path / "l.jsonl"
    ledger = JsonlLedger(path)
    try:
        ledger.add("k", "k.pdf")
        token = ledger.claim("k", "w", 60)  # appends since the open: the inline check ran
        lines = path.read_bytes().splitlines(keepends=True)
        with open(path, "r+b") as handle:  # in place: same inode
            handle.truncate(len(b"".join(lines[:keep])))
        with pytest.raises(StorageError, match="truncated"):
            ledger.move("k", State.PENDING, State.UNKNOWN, token=token, worker="w")
    finally:
        ledger.close()
