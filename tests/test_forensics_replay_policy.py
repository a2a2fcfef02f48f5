"""The replay's shortcut past the transition policy: the moves it does not ask about.

``history.PLAIN_MOVES`` are the move codes the forensic replay folds without calling
``why_illegal`` (derived from it once, at import). If the policy ever came to depend on
the item for one of them, the replay would miss an illegal transition.
"""

import itertools

from toolkit.forensics.history import PLAIN_MOVES, VOCABULARY
from toolkit.ledger.transitions import ARTIFACT_FIELDS, why_illegal

FAILURES = (None, "transient", "permanent", "odd")
AFTERS = ({}, {"failure": "permanent"}, {"failure": None},
          dict.fromkeys(ARTIFACT_FIELDS), {"artifact_path": "a.pdf", "artifact_size": 1,
                                           "artifact_sha256": "0" * 64, "failure": "transient"})


def test_plain_moves_are_legal_whatever_the_item_holds_and_every_other_move_is_asked():
    """What breaks: a skipped move that the policy would refuse for some item (a failed
    retry, a pending -> failed, a done without artifact). Must hold: every plain code is
    legal for every failure before and every item after; every move code that is not
    plain is illegal for at least one of them (so it must be asked each time)."""
    assert PLAIN_MOVES, "nothing skipped: the shortcut is gone"
    for code, (op, frm, to) in enumerate(VOCABULARY):
        if op != "move" or frm is None:
            assert code not in PLAIN_MOVES
            continue
        answers = {why_illegal(frm, to, failure, after)
                   for failure, after in itertools.product(FAILURES, AFTERS)}
        if code in PLAIN_MOVES:
            assert answers == {None}, (frm, to, answers)
        else:
            assert answers != {None}, (frm, to)
