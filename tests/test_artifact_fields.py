"""The one transition policy refuses a done whose artifact fields cannot name a verified
file, and a move to failed without its class, with the typed ledger error."""

import pytest

from toolkit.errors import IllegalTransitionError
from toolkit.ledger import State

S = State
GOOD = {"artifact_path": "out/a.pdf", "artifact_size": 10, "artifact_sha256": "ab" * 32}
GARBAGE = [
    {"artifact_path": "x", "artifact_size": -1, "artifact_sha256": "zz"},
    {"artifact_path": "", "artifact_size": 10, "artifact_sha256": "ab" * 32},
    {"artifact_path": "out/a.pdf", "artifact_size": -1, "artifact_sha256": "ab" * 32},
    {"artifact_path": "out/a.pdf", "artifact_size": "10", "artifact_sha256": "ab" * 32},
    {"artifact_path": "out/a.pdf", "artifact_size": True, "artifact_sha256": "ab" * 32},
    {"artifact_path": "out/a.pdf", "artifact_size": 10, "artifact_sha256": "zz"},
    {"artifact_path": "out/a.pdf", "artifact_size": 10, "artifact_sha256": ""},
    {"artifact_path": "out/a.pdf", "artifact_size": 10, "artifact_sha256": "AB" * 32},
]


@pytest.mark.parametrize("fields", GARBAGE, ids=lambda f: "-".join(map(repr, f.values())))
def test_done_with_garbage_artifact_fields_is_refused_and_nothing_is_recorded(ledger, fields):
    """A caller records done with an impossible artifact (negative size, a sha256 that is
    not 64 lowercase hex, an empty path): refused with IllegalTransitionError on every
    backend; the item stays submitted and no event is written."""
    ledger.add("k")
    ledger.move("k", S.PENDING, S.UNKNOWN)
    ledger.move("k", S.UNKNOWN, S.SUBMITTED, job_id="j")
    events = len(ledger.events())
    with pytest.raises(IllegalTransitionError, match="artifact_"):
        ledger.move("k", S.SUBMITTED, S.DONE, **fields)
    assert ledger.get("k").state is S.SUBMITTED and len(ledger.events()) == events
    assert ledger.move("k", S.SUBMITTED, S.DONE, **GOOD).state is S.DONE


def test_pending_to_failed_without_a_class_is_the_typed_transition_error(ledger):
    """pending -> failed with no failure kind: IllegalTransitionError (it was a plain
    ValueError, which callers catching ledger errors missed); nothing is recorded."""
    ledger.add("k")
    with pytest.raises(IllegalTransitionError):
        ledger.move("k", S.PENDING, S.FAILED)
    assert ledger.get("k").state is S.PENDING and len(ledger.events()) == 1
