"""The toolkit SQLite ledger's ``events`` table as the lean fold (``sqlfold.scan``) fetches it.

SQLite names each row's (op, from, to) by its vocabulary code (``CODE``: a ``CASE`` over
the words, compared as bytes, so a code is exactly ``CODES.get`` of the row's values) and
hands an empty detail as NULL. Every value a row hands to Python costs about as much as
the row itself (sqlite3 asks SQLite for its type, then for it, each call under the
connection's mutex): ``PACKED`` hands attempt, token and the code as one integer
(``WORD``), when attempt and token are integers it can hold. A ledger with any other
attempt or token (a REAL, a text, a negative number: damage) is read by ``PLAIN``, every
column as it is.
"""

import sqlite3

from toolkit.forensics.history import VOCABULARY
from toolkit.forensics.model import STATES


def _code_sql() -> str:
    """SQL for a row's vocabulary code, ``CODES[(op, frm, to)]``, or -1 when a word is none
    of the vocabulary's or no text (a BLOB, a number: NULL through the sum). Compared as
    bytes (``COLLATE BINARY``: a column declared NOCASE would match "ADD"); a NULL from
    only as None."""
    ops, frms, tos = sorted({op for op, _, _ in VOCABULARY}), (None, *STATES), STATES
    assert all(code == (ops.index(op) * len(frms) + frms.index(frm)) * len(tos) + tos.index(to)
               for code, (op, frm, to) in enumerate(VOCABULARY))  # VOCABULARY's own order

    def case(column, words, shift=0):
        whens = " ".join(f"WHEN '{word}' THEN {index + shift}" for index, word in enumerate(words))
        return f"CASE {column} COLLATE BINARY {whens} END"

    return (f"coalesce((({case('op', ops)}) * {len(frms)} + (CASE WHEN frm IS NULL THEN 0 "
            f"ELSE {case('frm', STATES, 1)} END)) * {len(tos)} + {case(chr(34) + 'to' + chr(34), tos)}, -1)")


CODE = _code_sql()
DETAIL = "CASE WHEN detail = '{}' COLLATE BINARY THEN NULL ELSE detail END"
# WORD's fields, low bits first: the code plus one (0: -1), token, attempt.
CODE_BITS, TOKEN_BITS, ATTEMPT_BITS = 9, 32, 21
assert len(VOCABULARY) < 1 << CODE_BITS and CODE_BITS + TOKEN_BITS + ATTEMPT_BITS < 63
WORD = (f"CASE WHEN typeof(attempt) = 'integer' AND typeof(token) = 'integer' "
        f"AND attempt BETWEEN 0 AND {(1 << ATTEMPT_BITS) - 1} "
        f"AND token BETWEEN 0 AND {(1 << TOKEN_BITS) - 1} "
        f"THEN (((attempt << {TOKEN_BITS}) | token) << {CODE_BITS}) | (({CODE}) + 1) END")
NONE = type(None)


class Unpacked(Exception):
    """A row whose attempt or token ``WORD`` cannot hold (its WORD is NULL)."""


class _Reader:
    """``query``: the rows of ``selected``, in seq order, ``where`` (SQL) says which."""

    selected = ""

    def query(self, where: str = "") -> str:
        return f"SELECT {self.selected} FROM events{where} ORDER BY seq"


class _Packed(_Reader):
    """seq, ts, key and worker as they are; attempt, token and the code from ``WORD``."""

    selected = f"seq, ts, key, worker, {WORD}, {DETAIL}"
    packed = ("attempt", "token")  # the columns ``numbers`` gives
    kept = ("seq", "ts", "key", "worker")  # the batch's first columns, kept as fetched
    key, text = 2, 5  # the batch's key and detail columns
    # the types History.check accepts for the columns handed as they are (what sqlite3
    # hands out: int, float, str, bytes, None); seq is the rowid (``usable``): an int
    checked = ((1, frozenset({int, float})), (2, frozenset({str})), (3, frozenset({str, NONE})))

    @staticmethod
    def numbers(np, batch) -> tuple:
        """(the rows' codes, {"attempt": array, "token": array}).

        Raises:
            Unpacked: a row's WORD is NULL.
        """
        try:
            word = np.array(batch[4], np.int64)
        except TypeError:  # None: the rows are read again, PLAIN
            raise Unpacked from None
        code = (word & ((1 << CODE_BITS) - 1)).astype(np.int32) - 1
        return code, {"attempt": word >> (CODE_BITS + TOKEN_BITS),
                      "token": (word >> CODE_BITS) & ((1 << TOKEN_BITS) - 1)}


class _Plain(_Reader):
    """Every column as it is, the code from ``CODE``."""

    selected = f"seq, ts, key, attempt, worker, token, {CODE}, {DETAIL}"
    packed = ()
    kept = ("seq", "ts", "key", "attempt", "worker", "token")
    key, text = 2, 7
    checked = tuple(enumerate(map(frozenset, ({int}, {int, float}, {str}, {int}, {str, NONE},
                                               {int}))))

    @staticmethod
    def numbers(np, batch) -> tuple:
        return np.array(batch[6], np.int32), {}


PACKED, PLAIN = _Packed(), _Plain()


def typed(batch: tuple, checked):
    """Per row, whether every ``checked`` column holds a type the replay accepts: None when
    every row does (a set of types per column: C loops), else a bool per row."""
    if all(set(map(type, batch[index])) <= kinds for index, kinds in checked):
        return None
    return [all(type(batch[index][row]) in kinds for index, kinds in checked)
            for row in range(len(batch[0]))]


def usable(db) -> bool:
    """True when ``seq`` is the events table's rowid (an integer, unique): the replayed
    rows are then fetched by seq. Anything else (a PostgreSQL ledger's connection too: its
    SQL has no pragmas) is read the reference way."""
    if not isinstance(db, sqlite3.Connection):
        return False
    pk = db.execute("SELECT name, upper(type) FROM pragma_table_info('events') "
                    "WHERE pk > 0").fetchall()
    if pk != [("seq", "INTEGER")]:
        return False
    try:
        db.execute("SELECT rowid FROM events LIMIT 0")
    except sqlite3.OperationalError:  # a WITHOUT ROWID table
        return False
    return True
