"""The events of the toolkit SQLite ledger read into numbers, a range of seqs at a time, the
later range by a forked child while this process reads the items table and the earlier one.

``read`` is ``sqlfold.scan``'s pass over the rows (``sqlevents``: SQLite names each row's
move by its vocabulary code), in batches, with no Python statement per row: per batch, C
loops turn the rows into numbers (the code, the key's id, the failure the detail sets,
whether a column holds a type the replay refuses), the written details decoded in one
call by the replay's own reader (``many``). It gives a ``Part``; ``merged`` joins two, the
later one's key and failure ids renumbered as one pass over all the rows would have
numbered them (in order of first sight), so the fold sees the same numbers either way.

``Ahead`` is the second core: forked before the items table is read, the child opens the
same file again, numbers the items keys as this process does (reading them itself) and
reads the events from a seq on (``split``), its ``Part`` pickled down a pipe: the keys as
ids (the key column then named by id, ``sqlfold.Keys``: no string per row comes back),
only the keys past the items' looked up here. Only when a second
connection reads exactly the snapshot ours reads (``Snapshot.again``): an ``immutable=1``
connection (no one writes the file; if someone did, ``sqlite.py`` notices by the file's
fingerprint after the whole read, the child's included, and reads it all again with
``mode=ro``) or one to a private copy (``private.py``: a dead writer's WAL), text decoded by sqlite3 itself (the lenient pass collects its undecodable
cells in this process's memory), no other thread (a lock held at the fork would stay held
in the child), nothing frozen in the GC (``pool.start`` thaws) and enough events to pay
for the fork. A child that fails in any way (killed, damage it cannot pack) gives
nothing: this process then reads its range itself, so the result is the same bytes.

Measured at 1,000,000 events (benchmarks/audit_jsonl.py's SQLite ledger, 248,225 items;
fresh processes, a host loaded 4-12 by others). Callgrind, imports subtracted: one process
28.8 G instructions; with the child, this process 19.4 G and the child about 11.9 G (31.3 G
in all, +9%); the bare ``SELECT * FROM events`` 13.6 G. CPU, medians of 3-5 interleaved
pairs: this process 3.0-3.4 s where one process took 4.5-4.7 s; both together 0.5-0.7 s more
than one (the fork's page faults, the pickle both ways, the child's read of the items keys);
the two about as long from the fork on (child 1.8-2.2 s, this process 1.6-2.1 s). Wall, 4
pairs at load 1.5: 4.93 -> 3.87 s, the SELECT 1.86 s (2.65x -> 2.08x). So it shortens the
audit only while a core is idle: on a host busy with other work (load 4-9) it took the
same wall time or a little more, for more CPU.
"""

import gc
import itertools
import operator
import os
import pickle
import signal
import sqlite3
import threading

from toolkit import pool
from toolkit.forensics.sqlchains import BAD, FIRST, NO_FAILURE, UNSET
from toolkit.forensics.sqlevents import typed

BATCH = 1 << 16  # rows per fetch: the row tuples of one batch at a time, then columns
AHEAD_ROWS = 200_000  # fewer events than this: one process reads them all (a fork costs ms)


class _Absent:
    """The type of ``ABSENT`` alone (a failure of type ``object`` is ``BROKEN``'s)."""

    def __reduce__(self):  # unpickled (a child's ``Part``) as the one ABSENT, not a copy
        return "ABSENT"


ABSENT = _Absent()  # the failure of a detail that sets none
_PLAIN = type(None), str  # the failure values the fold judges (others: replayed)


class Snapshot(sqlite3.Connection):
    """A connection that knows whether another one would read the same bytes: ``again``
    is its URI when it was opened ``immutable=1`` or to a private copy (set by
    ``sqlite.connect``), else None."""

    again = None


def failure_ids(failures: list, ids: dict) -> list:
    """The id of each detail's failure (``ABSENT``: none set) in ``ids``, new texts added;
    ``BAD`` for a value of another type (a number, a list: the replay judges those)."""
    if set(map(type, failures)) <= {str, type(None), _Absent}:  # hashable, and no
        for value in set(failures) - ids.keys():  # 1 == True == 1.0 among them
            ids[value] = len(ids)
        return list(map(ids.__getitem__, failures))
    return [ids.setdefault(value, len(ids)) if value.__class__ in _PLAIN or value is ABSENT
            else BAD for value in failures]


class Part:
    """The rows of one range, in seq order: ``columns`` (the reader's ``kept``, as fetched),
    ``code``, ``numbers`` (attempt and token when packed), ``off`` (a type the replay
    refuses), ``key_ids`` (by ``index``), ``fids`` (ids of ``failures``, the failure values
    in order of first sight, ``ABSENT`` and None first), ``add_rows`` (each add with a
    written detail, by row) and ``add_digests`` (its digest when a text, else None)."""

    def __init__(self, reader):
        self.columns = {name: [] for name in reader.kept}
        self.code = self.off = self.key_ids = self.fids = self.add_rows = None
        self.numbers, self.failures, self.add_digests, self.size = {}, [], [], 0


def read(np, cursor, reader, many, index) -> Part:
    """The rows ``cursor`` hands as ``reader`` (``sqlevents``) reads them, as a ``Part``;
    keys numbered by ``index`` ({key: id}), each new one given the next id.

    Raises:
        Unpacked: from ``PACKED.numbers``.
    """
    part = Part(reader)
    extends = [part.columns[name].extend for name in reader.kept]
    codes, numbers, off, failures, key_ids, add_rows = [], [], [], [], [], []
    ids = {ABSENT: UNSET, None: NO_FAILURE}  # failure -> id; the texts from 2 on
    repeat, compress, is_not = itertools.repeat, itertools.compress, operator.is_not
    number, new = index.get, index.setdefault
    at = 0  # the batch's first row
    while rows := cursor.fetchmany(BATCH):
        batch = tuple(zip(*rows))
        del rows
        keys, texts, size = batch[reader.key], batch[reader.text], len(batch[0])
        code, more = reader.numbers(np, batch)
        codes.append(code)
        numbers.append(more)
        for extend, values in zip(extends, batch):
            extend(values)
        ok = typed(batch, reader.checked)
        off.append(np.zeros(size, bool) if ok is None else ~np.array(ok, bool))
        # each row's key by its id: one dict lookup each in C; a key seen first gets the
        # next id (``len`` is read before ``new`` inserts it)
        key_id = np.fromiter(map(number, keys, repeat(-1)), np.int64, size)
        for row in np.flatnonzero(key_id < 0).tolist():
            key_id[row] = new(keys[row], len(index))
        key_ids.append(key_id)
        written = list(map(is_not, texts, repeat(None)))  # NULL: "{}", which sets nothing
        failure, digest = many(list(compress(texts, written)))
        where = np.flatnonzero(np.array(written, bool))
        fid = np.zeros(size, np.int32)  # UNSET
        fid[where] = failure_ids(failure, ids)
        failures.append(fid)
        adds = np.flatnonzero(code[where] == FIRST)  # (of the written details)
        add_rows.append(where[adds] + at)
        part.add_digests += [value if value.__class__ is str else None
                             for value in map(digest.__getitem__, adds.tolist())]
        at += size
    part.code, part.key_ids = concat(np, codes, np.int32), concat(np, key_ids, np.int64)
    part.fids, part.off = concat(np, failures, np.int32), concat(np, off, bool)
    part.add_rows, part.failures, part.size = concat(np, add_rows, np.int64), list(ids), at
    for name in reader.packed:
        part.numbers[name] = concat(np, [more[name] for more in numbers], np.int64)
    return part


def concat(np, parts, dtype):
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def merged(np, first: Part, later: Part, index: dict, numbered: int, new: list) -> Part:
    """``first`` (its keys numbered by ``index``) followed by ``later``, numbered alike but
    for its ids from ``numbered`` on, which name the keys ``new`` (in the order ``later``
    first saw them): each gets its id in ``index``, a key new there too the next one. Its
    failure texts likewise join ``first.failures``. A ``later`` key column of None: every
    key a text, given by its id; the merged one is None too when ``first``'s keys are
    texts (the caller names the keys by id), else rebuilt here."""
    key_ids = later.key_ids
    if new:
        repeat = itertools.repeat
        renumber = np.fromiter(map(index.get, new, repeat(-1)), np.int64, len(new))
        for at in np.flatnonzero(renumber < 0).tolist():
            renumber[at] = index.setdefault(new[at], len(index))
        past = key_ids >= numbered
        key_ids = np.where(past, renumber[np.where(past, key_ids - numbered, 0)], key_ids)
    ids = dict(zip(first.failures, itertools.count()))
    texts = [ids.setdefault(value, len(ids)) for value in later.failures]
    fids = np.array(texts, np.int32)[np.maximum(later.fids, 0)] if texts else later.fids
    keys, later_keys = first.columns.pop("key"), later.columns.pop("key")
    for name, values in first.columns.items():
        values.extend(later.columns[name])
    if later_keys is not None:
        keys += later_keys
    elif set(map(type, keys)) <= {str}:
        keys = None  # every row's key a text: its id says which (``sqlfold.Keys``)
    else:
        keys += map(list(index).__getitem__, key_ids.tolist())
    first.columns["key"] = keys
    first.code = np.concatenate([first.code, later.code])
    first.off = np.concatenate([first.off, later.off])
    first.key_ids = np.concatenate([first.key_ids, key_ids])
    first.fids = np.concatenate([first.fids, np.where(later.fids < 0, later.fids, fids)])
    first.add_rows = np.concatenate([first.add_rows, later.add_rows + first.size])
    first.add_digests += later.add_digests
    for name, values in first.numbers.items():
        first.numbers[name] = np.concatenate([values, later.numbers[name]])
    first.failures, first.size = list(ids), first.size + later.size
    return first


class Ahead:
    """A forked child reading the events from seq ``split`` on (``start``); ``take()``
    gives what it read, or None when it failed (the caller reads that range itself)."""

    def __init__(self, pid, fd, split):
        self.pid, self.fd, self.split = pid, fd, split

    @classmethod
    def start(cls, db, reader, many, rows_before: int, numbering):
        """An ``Ahead`` for ``db`` (a ``Snapshot``), or None when one process is the way
        (see the module's docstring). ``rows_before``: what this process reads before its
        share of the events (the items rows), so that both end at about the same time.
        ``numbering(connection)``: {key: id} of the keys numbered before the events (the
        items rows'), read by the child itself (so its ids are this process's: no lookup
        of its keys here but of those past them)."""
        if db.__class__ is not Snapshot or db.again is None or db.text_factory is not str \
                or not hasattr(os, "fork") or threading.active_count() != 1 \
                or gc.get_freeze_count():
            return None
        # (two statements: SQLite finds a min or a max alone in the index, both by a scan)
        (low,), (high,) = (db.execute(f"SELECT {end}(seq) FROM events").fetchone()
                           for end in ("min", "max"))
        if low is None or high - low + 1 < AHEAD_ROWS:
            return None
        # This process reads the items rows (one costs about what an event row does), then
        # the events before split; the child the items keys alone (about half that), the
        # events from split on, and pickles them: both about done at once (measured on
        # benchmarks/audit_jsonl.py's ledger, a quarter-million items, a million events).
        span = high - low + 1
        split = low + max(0, span - rows_before // 2) // 2
        query = reader.query(" WHERE seq >= ?")

        def task(fd):
            import numpy as np

            child = sqlite3.connect(db.again, uri=True, isolation_level=None)
            child.execute("PRAGMA query_only=1")
            index = numbering(child)  # the items keys, as the parent numbers them
            numbered = len(index)
            part = read(np, child.execute(query, (split,)), reader, many, index)
            new = list(itertools.islice(index, numbered, None))
            if set(map(type, part.columns["key"])) <= {str}:
                part.columns["key"] = None  # each key a text: its id says which
            with open(fd, "wb") as pipe:
                pipe.write(pickle.dumps((part, numbered, new), pickle.HIGHEST_PROTOCOL))

        import numpy  # noqa: F401  (both need it: imported once, here, not again in the child)

        pid, fd = pool.start(task)
        return cls(pid, fd, split)

    def take(self):
        """The child's ``(Part, keys it numbered first, keys it numbered past them)``
        (None: it failed); it is reaped either way."""
        pid, self.pid = self.pid, None
        data, status = pool.wait(pid, self.fd)
        if os.waitstatus_to_exitcode(status) != 0:
            return None
        try:
            return pickle.loads(data)
        except Exception:  # a torn pickle: what a child killed mid-write leaves
            return None

    def close(self):
        """Kill and reap the child if ``take`` never did (an error, an interrupt here)."""
        if self.pid is not None:
            pid, self.pid = self.pid, None
            try:
                os.kill(pid, signal.SIGKILL)
            finally:
                os.waitpid(pid, 0)
                os.close(self.fd)
