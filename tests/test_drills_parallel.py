"""`drill all` in parallel processes: the same table, in catalogue order, as one after the other."""

import subprocess
import sys

import pytest

from toolkit.drills import CATALOGUE, chosen_drills, run_catalogue
from toolkit.drills.parallel import run_parallel

# A few quick drills from different parts of the catalogue, safe rows and naive twins.
SUBSET = [drill.name for drill in CATALOGUE if drill.name in {
    "crash-after-intent", "crash-after-submit", "crash-after-submit/blind-retry"}]


def test_subset_is_a_real_mix_of_safe_and_naive_drills():
    assert len(SUBSET) == 3
    assert {drill.strategy == "safe" for drill in chosen_drills(SUBSET)} == {True, False}


@pytest.mark.slow
def test_parallel_catalogue_gives_the_sequential_rows_in_catalogue_order():
    """Drills run two at a time in forked children must give the very rows of a sequential run.

    Drills are independent (own folder, own ledger, own provider): nothing may
    change but the wall time. Progress is reported in catalogue order too.
    """
    sequential = [result.row() for result in run_catalogue(SUBSET)]
    seen = []
    parallel = run_parallel(SUBSET, progress=lambda result: seen.append(result.drill.name),
                            jobs=2)
    assert [result.row() for result in parallel] == sequential
    assert seen == [row["drill"] for row in sequential] == SUBSET
    assert all(result.passed for result in parallel)


def test_a_drill_that_raises_in_its_child_fails_the_catalogue_with_its_traceback(monkeypatch):
    """A child whose drill raises sends its traceback; the parent raises, reaps every child."""
    import psutil

    import toolkit.drills.parallel as parallel

    def boom(drill, workdir=None, strategy=None):
        raise ValueError(f"broken drill {drill.name}")
    monkeypatch.setattr(parallel, "run_drill", boom)
    before = {child.pid for child in psutil.Process().children()}
    with pytest.raises(RuntimeError, match="ValueError: broken drill"):
        parallel.run_parallel(SUBSET[:2], jobs=2)
    assert {child.pid for child in psutil.Process().children()} == before


def test_drill_jobs_below_zero_is_a_one_line_error():
    result = subprocess.run([sys.executable, "-m", "toolkit", "drill", "all", "--jobs", "-1"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


def test_the_longest_drills_start_first():
    """LPT: the OCR (Tesseract) and HTTP (service process, real timeouts) drills, 5-50 s
    each against 0.3-3 s for the rest, are started before every other drill."""
    from toolkit.drills.parallel import cost

    ranked = sorted(CATALOGUE, key=cost, reverse=True)
    slow = [drill for drill in CATALOGUE if drill.scans or drill.http]
    assert len(slow) >= 4
    assert {d.name for d in ranked[:len(slow)]} == {d.name for d in slow}
