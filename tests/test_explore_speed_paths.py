"""Snapshot mode's speed paths give what the slow paths give.

Crash points of snapshot mode share their supervisor processes (``SHARED``
points, one after another, per forked child: ``child.fork_shared``) instead of
forking one per point. These tests prove that the rows do not depend on it,
that the caches a shared supervisor installs are installed once, and what a
shared supervisor that raises or is SIGKILLed leaves of its points' results.
Real forks, real pipes, a real SIGKILL; no timer.
"""

import os
import signal

import pytest

from toolkit import documents
from toolkit import explore as explore_module
from toolkit.explore import Plan, explore
from toolkit.explore.child import fork, fork_shared, killed_by_sigkill
from toolkit.explore.memo import install

from test_explore import same_rows


@pytest.mark.slow
@pytest.mark.parametrize("strategy, docs, contract", [("safe", 2, "non-idempotent"),
                                                      ("blind-retry", 1, "non-idempotent")])
def test_points_sharing_a_supervisor_get_the_rows_of_one_fresh_supervisor_each(
        monkeypatch, strategy, docs, contract):
    """A point recovered in a process that recovered and judged others before (other
    folders) gets the row a fresh fork of the exploring parent gets: step, verdict,
    anomalies, counts and outcome, at every point, for a safe design and a violating one."""
    plan = Plan(strategy=strategy, docs=docs, contract=contract, mode="snapshot", jobs=2)
    shared = explore(plan)
    monkeypatch.setattr(explore_module, "SHARED", 1)  # one supervisor per point
    fresh = explore(plan)
    assert (shared.mode, fresh.mode) == ("snapshot", "snapshot")
    assert fresh.supervisors == len(fresh.rows)
    assert shared.supervisors <= 2 < len(shared.rows)  # jobs=2: a few processes, many points
    assert same_rows(shared) == same_rows(fresh)
    assert shared.total()["recovered"] == len(shared.rows)
    if strategy == "blind-retry":  # the comparison covers violating points too
        assert shared.violations()


def test_memo_installed_twice_in_one_supervisor_wraps_the_documents_calls_once(tmp_path):
    """A shared supervisor installs the memo at each of its points: the second install
    must not wrap the first one's wrappers (each call would go through both)."""
    memo = (tmp_path / "provider-work", {})

    def body(fd):
        before = (documents.process, documents.preflight, documents.ocr_routed)
        install(memo)
        once = (documents.process, documents.preflight, documents.ocr_routed)
        install(memo)
        twice = (documents.process, documents.preflight, documents.ocr_routed)
        return {"wrapped": once != before, "again": twice != once}

    messages, status = fork(body)  # a forked child: the exploring process never installs it
    assert status == 0
    assert [(m["wrapped"], m["again"]) for m in messages if m["t"] == "end"] == [(True, False)]


def _calls(count, fail_at=None, kill_at=None):
    def body(fd, i):
        if i == fail_at:
            raise ValueError(f"point {i} failed")
        if i == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"i": i, "pid": os.getpid()}
    return [(body, (i,), {}) for i in range(count)]


def test_shared_supervisors_return_each_call_result_in_call_order_and_tick_each():
    """Seven calls, at most three per child: three children, results in call order."""
    ticks = []
    results = fork_shared(_calls(7), jobs=2, size=3, done=lambda i, r: ticks.append(i))
    ends = [next(m for m in messages if m["t"] == "end") for messages, _ in results]
    assert [end["i"] for end in ends] == list(range(7))
    assert len({end["pid"] for end in ends}) == 3
    assert sorted(ticks) == list(range(7))
    assert all(status == 0 for _, status in results)


def test_call_raising_in_a_shared_supervisor_reports_its_error_and_spares_other_children():
    """Call 4 raises: it gets the error; the calls its child ran before keep their results,
    the ones after it in that child get none; the other children's calls all end."""
    results = fork_shared(_calls(9, fail_at=4), jobs=2, size=3)  # children: 0 3 6 | 1 4 7 | 2 5 8
    kinds = {i: [m["t"] for m in messages] for i, (messages, _) in enumerate(results)}
    assert kinds[4] == ["error"] and "point 4 failed" in results[4][0][0]["error"]
    assert kinds[1] == ["end"] and kinds[7] == []
    assert all(kinds[i] == ["end"] for i in (0, 3, 6, 2, 5, 8))
    assert results[4][1] != 0 and results[0][1] == 0


def test_sigkilled_shared_supervisor_keeps_the_results_it_sent_before_its_death():
    """A real SIGKILL at call 4: calls 1 (sent before) survive; 4 and 7 have no message and
    the SIGKILL status; the other children are untouched."""
    results = fork_shared(_calls(9, kill_at=4), jobs=2, size=3)
    assert [m["t"] for m in results[1][0]] == ["end"]
    assert results[4][0] == [] and results[7][0] == []
    assert killed_by_sigkill(results[4][1]) and killed_by_sigkill(results[1][1])
    assert all(results[i][1] == 0 and results[i][0] for i in (0, 3, 6, 2, 5, 8))
