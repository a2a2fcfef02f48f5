"""The one process pool (toolkit.pool) under crash points and parallel drills.

Real forks, real pipes, a real SIGKILL: the order tasks start in, the order
results come back in, what a killed child leaves, and that an interrupted
parent leaves no child behind.
"""

import os
import signal

import psutil
import pytest

from toolkit import pool


def _children() -> set[int]:
    return {child.pid for child in psutil.Process().children()}


def test_tasks_start_in_the_given_order_and_results_come_back_in_task_order(tmp_path):
    """LPT: ``order`` says which task starts first; the results keep the tasks' order."""
    started = tmp_path / "started"

    def task(i):
        def run(fd):
            with open(started, "a") as log:  # one short O_APPEND write per child
                log.write(f"{i}\n")
            os.write(fd, f"result {i}".encode())
        return run
    seen = []
    results = pool.run([task(i) for i in range(4)], jobs=1, order=[2, 0, 3, 1],
                       done=lambda index, result: seen.append(index))
    assert started.read_text().split() == ["2", "0", "3", "1"]
    assert seen == [2, 0, 3, 1]
    assert [data for data, _ in results] == [b"result 0", b"result 1", b"result 2", b"result 3"]
    assert all(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 for _, status in results)


def test_a_child_killed_by_sigkill_gives_its_bytes_so_far_and_its_wait_status():
    """A child that SIGKILLs itself mid-task: the parent reads what it wrote, then reaps it."""
    def killed(fd):
        os.write(fd, b"before the kill")
        os.kill(os.getpid(), signal.SIGKILL)

    def raises(fd):
        raise ValueError("broken")
    (data, status), (_, failed) = pool.run([killed, raises], jobs=2)
    assert data == b"before the kill"
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert os.WIFEXITED(failed) and os.WEXITSTATUS(failed) == pool.FAILED


def test_done_returning_true_starts_no_further_task():
    """A failed drill stops the catalogue: no task starts after ``done`` says stop."""
    def task(fd):
        os.write(fd, b"x")
    ran = pool.run([task] * 3, jobs=1, done=lambda index, result: True)
    assert ran[0][0] == b"x" and ran[1:] == [None, None]


def test_an_interrupted_parent_kills_and_reaps_the_children_still_running():
    """``done`` raises while a child still runs (it would run forever): the child is killed
    and reaped before the exception propagates; no child outlives the pool."""
    before = _children()

    def forever(fd):
        os.write(fd, b"started")
        signal.pause()

    def quick(fd):
        pass

    def done(index, result):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        pool.run([forever, quick], jobs=2, order=[0, 1], done=done)
    assert _children() == before


def test_a_child_keeps_the_parents_objects_frozen_and_the_parent_thaws_at_once():
    """Fault: a forked child's full collection writes the GC header of every inherited
    object, copying the parent's pages (thousands of faults per crash point).
    Property: in the child every object of the parent is in the permanent generation
    (``gc.freeze``); the parent itself is thawed when ``start`` returns, so its own
    garbage is still collected."""
    import gc

    assert gc.get_freeze_count() == 0

    def task(fd):
        os.write(fd, str(gc.get_freeze_count()).encode())
    ((data, status),) = pool.run([task], jobs=1)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert int(data) > 1000  # the interpreter, pytest and toolkit: all frozen in the child
    assert gc.get_freeze_count() == 0
