"""Every key's chain of events judged at once (numpy), for the SQLite fold (``sqlfold``).

The policy stays in ``transitions.why_illegal``: ``QUIET_MOVES`` is derived by asking it,
as ``history.PLAIN_MOVES`` is, and every other move is judged by calling it (once per
distinct (move, failure before, failure after)). Not done in SQL: the chain check
(``LAG(to) OVER (PARTITION BY key ORDER BY seq)`` sorts every row, no index on key, about
1.0 s at a million events).
"""

from toolkit.forensics.history import CODES, PLAIN_MOVES, VOCABULARY
from toolkit.forensics.model import STATES
from toolkit.ledger.transitions import DONE_WITHOUT_ARTIFACT, PERMANENT, TRANSIENT, why_illegal


class _Unread:
    """The item's failure before a move, which ``why_illegal`` must not look at."""

    def _refuse(self, *args):
        raise LookupError("failure")

    __eq__ = __ne__ = __bool__ = __str__ = __format__ = __hash__ = _refuse


class _World:
    """An item after the move whose every field holds ``value``."""

    def __init__(self, value):
        self.value = value

    def get(self, name):
        return self.value


# The values an item's failure and artifact fields are probed with: absent, the words
# the policy knows, and things of other types.
PROBES = (None, TRANSIENT, PERMANENT, "", "x", 0, -1, 1.5, "0" * 64, [], {}, object())


def _quiet_moves() -> frozenset:
    """The move codes the replay never reports, whatever the item held before or holds
    after: ``why_illegal`` never reads the failure before, and in every probed world
    answers None or ``DONE_WITHOUT_ARTIFACT`` (which the replay leaves to the
    done_without_artifact check of the item row). The plain moves, plus the moves into
    done."""
    quiet = set()
    for code, (op, frm, to) in enumerate(VOCABULARY):
        if op != "move" or frm is None:
            continue
        if code in PLAIN_MOVES:
            quiet.add(code)
            continue
        try:
            verdicts = {why_illegal(frm, to, _Unread(), _World(value)) for value in PROBES}
        except LookupError:
            continue
        if verdicts <= {None, DONE_WITHOUT_ARTIFACT}:
            quiet.add(code)
    return frozenset(quiet)


class _Failure:
    """The item after a judged move, as ``why_illegal`` reads it: its failure alone. Any
    other field asked for (the artifact's) is a verdict the fold cannot give: the key is
    replayed."""

    __slots__ = ("failure",)

    def __init__(self, failure):
        self.failure = failure

    def get(self, name):
        if name != "failure":
            raise LookupError(name)
        return self.failure


QUIET_MOVES = _quiet_moves()
# The fold's numbers: a state's index in STATES (``NO_STATE``: a from of None; as a key's
# verdict, ``SLOW_STATE``: the key is replayed); per vocabulary code, its op's kind and its
# from and to.
ADD, MOVE, OTHER = 0, 1, 2
NO_STATE = SLOW_STATE = len(STATES)
_OP_KIND = [ADD if op == "add" else MOVE if op == "move" else OTHER for op, _, _ in VOCABULARY]
_FROM = [NO_STATE if frm is None else STATES.index(frm) for _, frm, _ in VOCABULARY]
_TO = [STATES.index(to) for _, _, to in VOCABULARY]
FIRST = CODES[("add", None, "pending")]  # the one first event a key folds from
_PASSED = sorted(PLAIN_MOVES | QUIET_MOVES)  # the moves no failure can make illegal
BAD, UNSET, NO_FAILURE = -1, 0, 1  # failure ids: a value the fold does not judge; none set;
# null; then each text the details set, in order of first sight (``values``)


def verdicts(np, ids, code, fid, off, values):
    """(the key ids that have rows, ascending; per such key the index in STATES of the state
    its rows fold to, or ``SLOW_STATE``; per such key its first row) for rows named by key
    id ``ids`` (numpy arrays, one entry per row in seq order).

    A key folds when its first row is an add (None -> pending), each later row is no add
    and starts from the state the row before it left (a claim or release keeps it), every
    row has the replay's types (``off`` False), a detail that is an object and a failure of
    None or text (``fid``: ids of ``values``, or ``BAD``), and every move the policy judges
    gets None or ``DONE_WITHOUT_ARTIFACT`` from ``why_illegal`` (asked once per distinct
    move, failure before and failure after)."""
    rows = len(ids)
    if not rows:
        return np.zeros(0, np.int64), np.zeros(0, np.int8), np.zeros(0, np.int64)
    order = np.argsort(ids, kind="stable")  # by key, each key's rows in seq order
    key, code, fid, bad = ids[order], code[order], fid[order], off[order]
    bad |= (code < 0) | (fid == BAD)
    code = np.where(code < 0, FIRST, code)  # (off already) any code, to index the tables
    kind, frm, to = (np.array(table, np.int8)[code] for table in (_OP_KIND, _FROM, _TO))
    starts = np.ones(rows, bool)
    starts[1:] = key[1:] != key[:-1]
    bad |= starts & (code != FIRST)  # an event before its add
    # a second add; a row that does not start where the one before it left the key
    later = ~starts
    bad[1:] |= later[1:] & ((kind[1:] == ADD) | (frm[1:] != to[:-1]))
    bad |= (kind == OTHER) & (to != frm)  # a claim or release that changes the state
    # the failure the key holds after each row: the last one a detail set, the add's
    # None whatever its detail says (forward-filled; each key starts at its add)
    fid = np.where(starts, NO_FAILURE, fid)
    held = np.where(fid != UNSET, np.arange(rows), 0)
    np.maximum.accumulate(held, out=held)
    held = fid[held]
    judged = np.flatnonzero(later & (kind == MOVE) & ~np.isin(code, _PASSED))
    if len(judged):
        width = len(values) + 1  # ids + 1: BAD is 0
        cases = (code[judged].astype(np.int64) * width + held[judged - 1] + 1) * width \
            + held[judged] + 1
        distinct, index = np.unique(cases, return_inverse=True)
        refused = np.array([_refused(case, width, values) for case in distinct.tolist()],
                           bool)
        bad[judged] |= refused[index]
    begins = np.flatnonzero(starts)  # the sorted rows where each key begins
    slow = np.logical_or.reduceat(bad, begins)
    ends = np.append(begins[1:], rows) - 1
    return key[begins], np.where(slow, SLOW_STATE, to[ends]), order[begins]


def _refused(case: int, width: int, values: list) -> bool:
    """Whether the replay reports a move: its code and the failure ids before and after
    (each plus one) packed in ``case``."""
    case, after = divmod(case, width)
    code, before = divmod(case, width)
    if before == 0 or after == 0:  # BAD: the key is replayed anyway
        return True
    _, frm, to = VOCABULARY[code]
    try:
        why = why_illegal(frm, to, values[before - 1], _Failure(values[after - 1]))
    except LookupError:
        return True
    return why is not None and why != DONE_WITHOUT_ARTIFACT
