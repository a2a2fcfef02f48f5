"""The SQLite ledger's row cache and its transaction, so a transition needs no ``SELECT``.

``_RowCache`` keeps the item row this connection last wrote or read, valid while
``PRAGMA data_version`` (``DATA_VERSION``) says no other connection committed;
``_LedgerTxn`` is the ledger's one transaction object, which takes the group
commit's writer lock first and tells the cache whether the transaction committed.
Used by ``toolkit.ledger.sqlite`` only.
"""

import operator

from toolkit.ledger import State
from toolkit.ledger.records import ITEM_FIELDS as ITEM_COLUMNS  # the items table's columns, in order
from toolkit.ledger.records import ItemRow
from toolkit.ledger.sqlite_damage import damage_of, damaged_in_run
from toolkit.storage import sqlite_txn

_ROW = tuple.__new__  # an ItemRow in one C call


class _RowCache:
    """The row this connection last wrote or read, so a transition needs no ``SELECT``.

    Valid while ``PRAGMA data_version`` -- read inside each ``BEGIN IMMEDIATE``, where
    our write lock holds every other writer off -- is the value read when the row was
    kept: SQLite changes it whenever another connection (this process's or another's)
    has committed since, and never for this connection's own commits. A miss, or any
    doubt, is a ``SELECT`` as before; a rolled-back transaction forgets the row.

    A written row is kept only as SQLite will give it back: column affinity turns an
    int into a float in a REAL column (kept, converted) and a NaN into NULL, a float
    into an int in an INTEGER one, a number into text in a TEXT one (not kept: those
    items are read back, so a later transition sees exactly what a re-read would).
    """

    __slots__ = ("row", "version", "pending", "plans", "affinity", "reals")

    def __init__(self):
        self.row = self.version = self.pending = None
        self.affinity = None  # until ``declare``: nothing is kept
        self.reals = lambda row: ()
        self.plans = {}  # a row's tuple of value types -> its conversion plan, or False

    def declare(self, declared: dict) -> None:
        """The items table's declared column types (``PRAGMA table_info``), by name."""
        self.affinity = tuple(_AFFINITY.get(declared.get(name)) for name in ITEM_COLUMNS)
        reals = [i for i, kind in enumerate(self.affinity) if kind is float]
        # The REAL columns' values in one C call (an itemgetter of two or more: a tuple).
        self.reals = (operator.itemgetter(*reals, *reals[:1]) if reals else lambda row: ())
        self.plans.clear()

    def _plan(self, types: tuple):
        if self.affinity is None:
            return False
        to_float = []
        for index, (kind, column) in enumerate(zip(types, self.affinity)):
            if kind is type(None) or kind is column or (index == 1 and kind is State):
                continue
            if kind is int and column is float:
                to_float.append(index)
                continue
            return False
        return tuple(to_float)

    def stored(self, new):
        """``new`` (an ItemRow) as SQLite stores it, or None when not sure."""
        types = tuple(map(type, new))  # one C call; so is the lookup
        plan = self.plans.get(types)
        if plan is None:
            plan = self._plan(types)
            if len(self.plans) < 64:  # a handful of shapes in practice; bounded anyway
                self.plans[types] = plan
        if plan is False:
            return None
        for value in self.reals(new):
            if value != value:  # NaN: stored as NULL
                return None
        if not plan:
            return new
        values = list(new)
        for index in plan:
            values[index] = float(values[index])
        return _ROW(ItemRow, values)


_AFFINITY = {"INTEGER": int, "REAL": float, "TEXT": str}
DATA_VERSION = "PRAGMA data_version"


class _LedgerTxn(sqlite_txn):
    """The ledger's transaction: ``sqlite_txn``, the group's writer lock first (group
    commit), and the row cache told whether the transaction committed.

    One per ledger, entered again for every transaction (never nested: the ledger's
    lock is held around it, and SQLite refuses a BEGIN inside a transaction anyway).
    An error that is the file's own bytes (``sqlite_damage.DAMAGE``: pages or WAL frames
    gone under the run) is the ledger's damage, exit 2 with the way out, never a storage
    error to run again on; only this error path asks.
    """

    __slots__ = ("cache", "flushes", "writer", "path")  # writer: the flushes whose writer lock is held

    def __init__(self, db, what, cache, path):
        super().__init__(db, what)
        self.cache, self.flushes, self.writer, self.path = cache, None, None, path

    def _damage(self, error):
        why = damage_of(error)
        return None if why is None else damaged_in_run(self.path, why)

    def __enter__(self):
        if self.flushes is not None:
            self.flushes.hold_writer()  # the processes' writers queue in the kernel first
            self.writer = self.flushes
        try:
            self.cache.pending = None
            return super().__enter__()
        except BaseException as error:
            if self.writer is not None:
                self.writer, writer = None, self.writer
                writer.free_writer()
            if (damage := self._damage(error)) is not None:
                raise damage from error
            raise

    def __exit__(self, kind, exc, tb) -> bool:
        cache = self.cache
        try:
            suppressed = super().__exit__(kind, exc, tb)
        except BaseException as error:
            cache.row = None  # rolled back, or not known to be committed
            if (damage := self._damage(error)) is not None:
                raise damage from error
            raise
        finally:
            if self.writer is not None:
                self.writer, writer = None, self.writer
                writer.free_writer()
        if kind is not None:
            cache.row = None
            if (damage := self._damage(exc)) is not None:  # a statement's, in the block
                raise damage from exc
        elif cache.pending is not None:
            cache.row = cache.pending
        return suppressed
