"""The uncrashed run is forked by the exploring process itself, and judged beside the points.

Before, the exploring process forked a supervisor of its own for the uncrashed run
(in snapshot mode, the recording), which forked the run, judged it and exited,
before any point could start: a fork and an exit of a process the size of the
exploring one, in the serial part of the exploration. Now ``explore`` forks the
run itself (``point._record``), and the run's judgement is one more call among the
points (``point._explore_point`` given the run's messages); a run that did not
rest is rerun and judged first, as before, to refuse the exploration. What must
hold: snapshot mode forks only the run and one supervisor per job, all from the
exploring process; the uncrashed row is the one the real mode gives. No timer:
the forks are counted.
"""

import os

from toolkit import pool
from toolkit.explore import Plan, explore


def test_snapshot_exploration_forks_only_the_uncrashed_run_and_one_supervisor_per_job(
        monkeypatch, tmp_path):
    forkers = tmp_path / "forkers"
    real = pool.start

    def counted(task):  # inherited by every forked child: each fork appends its forker
        with open(forkers, "a") as log:
            log.write(f"{os.getpid()}\n")
        return real(task)
    monkeypatch.setattr(pool, "start", counted)
    result = explore(Plan(docs=2, mode="snapshot", jobs=2))
    assert result.mode == "snapshot" and result.supervisors == 2
    assert forkers.read_text().split() == [str(os.getpid())] * 3  # the run, 2 supervisors
    assert result.total()["recovered"] == len(result.rows) == 26
    assert result.baseline["verdict"] == "valid" and result.baseline["runs"] == 0


def test_uncrashed_row_judged_beside_the_points_equals_the_real_modes():
    """The uncrashed run's row (outcome, counts, verdict) is the same in both modes, and
    each crash point's ``new`` anomalies are taken against it (here: none)."""
    snapshot, real = (explore(Plan(docs=1, every=3, mode=mode, jobs=2))
                      for mode in ("snapshot", "real"))
    assert snapshot.baseline == real.baseline
    assert snapshot.baseline["outcome"] == "done=1" and snapshot.baseline["submits"] == 1
    assert not any(row["new"] for row in snapshot.rows + real.rows)
