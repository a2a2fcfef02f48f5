"""The one transition policy: states, edges, and the conditions an edge carries.

``Ledger.move`` refuses what ``why_illegal`` names; the checker's
``illegal_transition`` and the forensic replay report the same reasons, and
``describe()`` prints the table for the docs. Nothing else encodes the policy.
"""

import enum
import re


class State(str, enum.Enum):
    PENDING = "pending"
    UNKNOWN = "unknown"
    SUBMITTED = "submitted"
    DONE = "done"
    FAILED = "failed"
    NEEDS_REVIEW = "needs_review"
    CANCELLED = "cancelled"
    PARTIAL = "partial"

    def __str__(self):
        return self.value


S = State
TRANSITIONS: dict[State, frozenset[State]] = {
    # intent before side effect; poison is failed(permanent) before any submit
    S.PENDING: frozenset({S.UNKNOWN, S.FAILED, S.CANCELLED}),
    # reconcile by lookup: found running -> submitted, found done -> done, ...
    S.UNKNOWN: frozenset({S.SUBMITTED, S.DONE, S.FAILED, S.NEEDS_REVIEW, S.CANCELLED}),
    # a dead owner's in-flight item goes back to unknown, to be looked up
    S.SUBMITTED: frozenset({S.DONE, S.FAILED, S.UNKNOWN, S.NEEDS_REVIEW, S.CANCELLED,
                            S.PARTIAL}),
    # page by page: some pages checkpointed, the next page's intent comes next
    S.PARTIAL: frozenset({S.UNKNOWN, S.NEEDS_REVIEW, S.CANCELLED}),
    # done -> done: a damaged artifact re-fetched (never re-executed)
    S.DONE: frozenset({S.DONE, S.NEEDS_REVIEW}),
    # a transient failure leaves (a new attempt, or an operator's cancel); a permanent
    # one only to cancelled (a person closes it: ``resolve --cancel``), never retried
    S.FAILED: frozenset({S.UNKNOWN, S.CANCELLED}),
    # an operator decides a parked item (``resolve``): release it to be reconciled again,
    # cancel it, or accept a verified artifact (done, with path, size and sha256)
    S.NEEDS_REVIEW: frozenset({S.UNKNOWN, S.CANCELLED, S.DONE}),
    S.CANCELLED: frozenset(),
}
TERMINAL = frozenset({S.DONE, S.NEEDS_REVIEW, S.CANCELLED})
TRANSIENT, PERMANENT = "transient", "permanent"
ARTIFACT_FIELDS = ("artifact_path", "artifact_size", "artifact_sha256")
_PATH, _SIZE, _SHA256 = ARTIFACT_FIELDS
# By value: the forensic replay works on the strings a file holds.
EDGES = frozenset((frm.value, to.value) for frm, tos in TRANSITIONS.items() for to in tos)
# The same edges by member, for the ledger's own calls (a State hashes by its name, so a
# member pair is not found among the value pairs; str() per call would cost more).
_MEMBER_EDGES = frozenset((frm, to) for frm, tos in TRANSITIONS.items() for to in tos)
SHA256 = re.compile(r"[0-9a-f]{64}")
DONE_WITHOUT_ARTIFACT = "done without its artifact fields (path, size, sha256)"


def why_illegal(frm, to, failure_before, after) -> str | None:
    """None when the move ``frm -> to`` is legal, else why not (one line).

    ``failure_before``: the item's failure before the move; ``after``: a mapping
    with the item's ``failure`` and artifact fields after it. States may be
    ``State`` members or their string values.
    """
    if frm.__class__ is not State or to.__class__ is not State or (
            (frm, to) not in _MEMBER_EDGES):  # values, a mix or no edge: compare as text
        frm, to = str(frm), str(to)
        if (frm, to) not in EDGES:
            return f"no edge {frm} -> {to}"
    # A State is a str: == "failed" holds for the member and for its value alike.
    if frm == "failed" and failure_before != TRANSIENT and to != "cancelled":
        return f"a {failure_before or 'unclassified'} failure was retried or released"
    if frm == "pending" and to == "failed" and after.get("failure") != PERMANENT:
        return "pending -> failed only as permanent (poison found before any submit)"
    # the three ARTIFACT_FIELDS one by one: no generator per done (a million-line audit
    # replays a quarter-million of them)
    if to == "done" and (after.get(_PATH) is None or after.get(_SIZE) is None
                         or after.get(_SHA256) is None):
        return DONE_WITHOUT_ARTIFACT
    return None


class _Unreadable:
    """An item-after-the-move that ``why_illegal`` may not read (``MOVES``)."""

    def get(self, name):
        raise LookupError(name)


def _plain(frm: State, to: State) -> bool:
    """Does ``why_illegal`` find ``frm -> to`` legal whatever the item holds? Asked with a
    failure no rule accepts and an item it may not read: any condition makes it refuse
    or reach for the item, so True means the edge carries no condition at all."""
    try:
        return why_illegal(frm, to, object(), _Unreadable()) is None
    except LookupError:
        return False


# The one lookup a ledger move makes: MOVES[frm].get(to) is None when there is no such
# edge, True when the edge carries no condition (most moves of a batch: pending ->
# unknown, unknown -> submitted), False when ``why_illegal`` must judge the item. Derived
# from ``TRANSITIONS`` and ``why_illegal`` here, once: the rule stays in those two.
MOVES: dict[State, dict[State, bool]] = {
    frm: {to: _plain(frm, to) for to in tos} for frm, tos in TRANSITIONS.items()}


def bad_artifact(after) -> str | None:
    """Why the artifact fields of a new done cannot name a verified file, or None.

    ``Ledger.move`` refuses such a write; ``why_illegal`` does not ask it, so the
    checker and the forensic replay judge recorded histories by their edges alone.
    """
    path, size, digest = after.get(_PATH), after.get(_SIZE), after.get(_SHA256)  # no generator
    if not isinstance(path, str) or not path:
        return f"artifact_path must be a non-empty path, not {path!r}"
    if type(size) is not int or size < 0:
        return f"artifact_size must be an integer >= 0, not {size!r}"
    if not isinstance(digest, str) or not SHA256.fullmatch(digest):
        return f"artifact_sha256 must be 64 lowercase hex digits, not {digest!r}"
    return None


def describe() -> str:
    """The table as text, one line per from-state (for the docs and ``--help``)."""
    lines = []
    for frm, tos in TRANSITIONS.items():
        targets = ", ".join(to.value for to in State if to in tos) or "(final)"
        lines.append(f"{frm.value:>12} -> {targets}")
    lines += ["", "failed -> unknown only from failed(transient) (a permanent failure is only "
              "cancelled); pending -> failed only as failed(permanent); every move into done "
              "carries artifact path, size and sha256."]
    return "\n".join(lines)
