"""The shortcuts of a transition's hot path decide exactly what the long way decides."""

import itertools
import os

import pytest

from toolkit.ledger import PERMANENT, TRANSIENT, TRANSITIONS, open_ledger
from toolkit.ledger.transitions import MOVES, why_illegal
from toolkit.liveness import start_ticks

ARTIFACT = {"artifact_path": "out/a.pdf", "artifact_size": 3, "artifact_sha256": "a" * 64}


def test_moves_table_skips_why_illegal_only_on_edges_it_never_refuses():
    """``MOVES`` lets a move skip ``why_illegal`` on an edge marked plain: if it marked an
    edge plain that carries a condition (a retried permanent failure, a transient poison,
    a done without its artifact), the ledger would record that move. Every edge of the
    table is in it and no other; a plain edge is legal for every item; every other edge
    is refused for some item."""
    assert {(frm, to) for frm, tos in MOVES.items() for to in tos} == \
        {(frm, to) for frm, tos in TRANSITIONS.items() for to in tos}
    afters = [{}, {"failure": PERMANENT}, {"failure": TRANSIENT}, ARTIFACT,
              {**ARTIFACT, "failure": PERMANENT}]
    for frm, tos in MOVES.items():
        for to, plain in tos.items():
            verdicts = {why_illegal(frm, to, failure, after) is None
                        for failure, after in itertools.product((None, TRANSIENT, PERMANENT),
                                                                afters)}
            assert verdicts == ({True} if plain else {True, False}), (frm, to)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_claim_in_a_forked_child_records_the_childs_pid_not_the_cached_parents(tmp_path):
    """The ledger reads this process's pid and start time once; a fork must read them
    again, or a child's lease would name its parent -- alive while the child is dead, so
    no one could take the child's orphaned lease before it expires."""
    path = tmp_path / "l.sqlite"
    with open_ledger(path) as ledger:
        ledger.add("parent")
        ledger.add("child")
        ledger.claim("parent", "p", 60)  # fills the cache in this process
    pid = os.fork()
    if pid == 0:  # the child: claim, report by exit status, never return into pytest
        status = 1
        try:
            with open_ledger(path) as ledger:
                ledger.claim("child", "c", 60)
                item = ledger.get("child")
                status = 0 if (item.lease_pid == os.getpid() and
                               item.lease_started == start_ticks(os.getpid())) else 3
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with open_ledger(path) as ledger:
        assert ledger.get("child").lease_pid == pid
        assert ledger.get("parent").lease_pid == os.getpid()
        assert ledger.get("parent").lease_started == start_ticks(os.getpid())
