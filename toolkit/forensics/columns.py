"""The history's event table, packed while the audit folds it (``History`` pushes rows).

An event's op, from and to are three words of a small vocabulary (``VOCABULARY``): one
integer code stands for the three (``CODES``), which is also the check that each is a
known word. The table keeps the integers of a row in one int64 array, its ts in a double
array, key and worker as references to shared strings; its columns come back lazily
(``Field``, ``_Nones``): Python values by iteration, numpy arrays when a frame asks.
"""

import itertools
import struct
import typing
from array import array

from toolkit.forensics.model import EVENT_COLUMNS, STATES
from toolkit.ledger.replay import OP

OPS = frozenset(typing.get_args(OP))  # the ledger's own four (``replay.OP``)
# (op, from, to) -> one small integer, and back: the check that op, from and to are
# known words, and three strings of a row in 8 bytes
VOCABULARY = [(op, frm, to) for op in sorted(OPS) for frm in (None, *STATES) for to in STATES]
CODES = {triple: code for code, triple in enumerate(VOCABULARY)}


class Columns:
    """The event table while it is folded, compact: ``push`` one row.

    Per event, seq goes to an ``array`` of int64, the small integers (attempt, token, line,
    and op/from/to as one code over the small vocabulary) to one of int32 (24 bytes a row,
    not 40: 16 MB a million), ts to one of double; key and worker are references to
    strings shared with the items (no worker list at all while no event names one). A
    value no array holds exactly (an integer beyond its array's width, an integer ts)
    turns the whole table into plain per-column lists for good, so every value is kept
    exactly as read.
    """

    def __init__(self, numbered: bool = True):
        self.numbered = numbered
        self.seqs, self.small, self.times = array("q"), array("i"), array("d")
        assert self.small.itemsize == 4  # struct's "=i" in push_many
        self.keys = []
        self.workers = None  # no worker named yet: no list (8 bytes a row, 8 MB a million)
        self.lists = None  # {name: list}: the exact fallback
        seqs, extend, times, keys = self.seqs.append, self.small.extend, self.times.append, \
            self.keys.append
        _float = float

        def push(seq, ts, code, key, attempt, worker, token, line):
            try:
                if ts.__class__ is not _float:  # an int ts stays an int: the exact way
                    raise TypeError
                seqs(seq)
                extend((attempt, token, line or 0, code))
                times(ts)
            except (OverflowError, TypeError):  # drop the half row, go exact, push it again
                rows = len(self.keys)
                del self.seqs[rows:], self.small[rows * 4:], self.times[rows:]
                self._demote()
                self.push(seq, ts, code, key, attempt, worker, token, line)
                return
            keys(key)
            if worker is not None or self.workers is not None:
                self._named([worker])

        self.push = push

    def _named(self, workers: list) -> None:
        """Append the workers of the rows just pushed; the first named one makes the list
        (None for every row before it)."""
        if self.workers is None:
            self.workers = [None] * (len(self.keys) - len(workers))
        self.workers.extend(workers)

    def push_many(self, seqs, times, codes, keys, attempts, workers, tokens, lines):
        """``push`` for each row of these columns (lists of one batch, in file order), in a
        few C loops. Any value ``push`` would not pack (an integer ts, an integer beyond
        its array's width) sends the whole batch through ``push``, row by row: the exact
        way."""
        if self.lists is None and (not times or set(map(type, times)) == {float}):
            rows = len(keys)
            try:  # the batch's rows packed in a few C calls (struct reads each int
                # directly; array("q", list) parses each through PyArg_Parse)
                wide = struct.pack(f"={rows}q", *seqs)
                small = struct.pack(f"={4 * rows}i", *itertools.chain.from_iterable(
                    zip(attempts, tokens, lines, codes)))
            except struct.error:  # an integer beyond 64 bits, or 32 for the small ones
                pass
            else:
                self.seqs.frombytes(wide)
                self.small.frombytes(small)
                self.times.frombytes(struct.pack(f"={rows}d", *times))
                self.keys.extend(keys)
                if self.workers is not None or workers.count(None) != len(workers):
                    self._named(workers)
                return
        for row in zip(seqs, times, codes, keys, attempts, workers, tokens, lines):
            self.push(*row)

    def _demote(self):
        self.lists = {name: list(values) for name, values in self.finish().items()}
        appends = tuple(self.lists[name].append for name in EVENT_COLUMNS)

        def push(seq, ts, code, key, attempt, worker, token, line):
            op, frm, to = VOCABULARY[code]
            row = (seq, ts, op, key, frm, to, attempt, worker, token, line)
            for append, value in zip(appends, row):
                append(value)

        self.push = push

    def finish(self) -> dict:
        """{name: values}: lazy columns over the arrays (numpy only when a frame asks),
        or the exact lists."""
        if self.lists is not None:
            return self.lists
        small = self.small
        return {"seq": self.seqs, "ts": self.times, "op": Field(small, 3, 0),
                "key": self.keys, "frm": Field(small, 3, 1), "to": Field(small, 3, 2),
                "attempt": Field(small, 0),
                "worker": _Nones(len(self.keys)) if self.workers is None else self.workers,
                "token": Field(small, 1),
                "line": Field(small, 2) if self.numbered else [None] * len(self.keys)}


class _Nones:
    """The worker column of a table whose events name no worker: ``n`` Nones, as values
    by iteration and as a numpy object array when a frame asks, none of them stored."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return itertools.repeat(None, self.n)

    def __array__(self, dtype=None, copy=None):
        import numpy as np

        return np.full(self.n, None, dtype=object)


class Field:
    """One column of the packed small integers (four int32 per row: attempt, token, line,
    code), read in place: as Python values by iteration, as an int64 numpy array when a
    frame asks (``__array__``). ``part`` names op, from or to in the row's vocabulary code."""

    def __init__(self, numbers, index: int, part: int | None = None):
        self.numbers, self.index, self.part = numbers, index, part

    def __len__(self):
        return len(self.numbers) // 4

    def __iter__(self):
        values = itertools.islice(self.numbers, self.index, None, 4)
        if self.part is None:
            return values
        return (VOCABULARY[code][self.part] for code in values)

    def __array__(self, dtype=None, copy=None):
        import numpy as np

        column = np.frombuffer(self.numbers, dtype=np.int32)[self.index::4]
        if self.part is None:
            return column.astype(np.int64)
        return np.array([triple[self.part] for triple in VOCABULARY], dtype=object)[column]
