"""One liveness helper (toolkit.liveness) for leases and the provider's executors."""

import os
import socket
import subprocess
import sys

import pytest

from toolkit import liveness
from toolkit.ledger import Item, owner_alive
from toolkit.provider.fake import _executor_alive


def lease(**fields):
    return Item(key="k", lease_owner="w", **fields)


def test_owner_recorded_before_a_reboot_is_dead_even_with_the_same_pid_and_ticks():
    """A lease recorded on this host in an earlier boot: whatever process has that pid and
    start ticks now is another one. The old check compared the host name only and, with
    the boot folded in, called it 'another host' (unknown): the lease waited for expiry."""
    me = lease(lease_host=f"{socket.gethostname()}/00000000-0000-0000-0000-000000000000",
               lease_pid=os.getpid(), lease_started=liveness.my_start())
    assert owner_alive(me) is False
    same_boot = lease(lease_host=liveness.host_id(), lease_pid=os.getpid(),
                      lease_started=liveness.my_start())
    assert owner_alive(same_boot) is True
    assert owner_alive(lease(lease_host="elsewhere/x", lease_pid=1, lease_started=1)) is None


def test_live_owner_stays_alive_when_the_boot_time_psutil_derives_from_the_clock_moves(
        monkeypatch):
    """psutil's create_time() is boot time (read from the wall clock) plus start ticks: a
    clock step moves it, and the old exact float comparison then declared a live owner
    dead and let it be robbed. (The step itself is not taken on a shared machine; its
    effect on psutil is: the boot time moves by one second.) Ticks do not move."""
    import psutil
    import psutil._pslinux as pslinux

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ticks = liveness.start_ticks(child.pid)
        created = psutil.Process(child.pid).create_time()
        stepped = psutil.boot_time() + 1.0
        monkeypatch.setattr(pslinux, "boot_time", lambda: stepped)
        assert psutil.Process(child.pid).create_time() != created  # what the old check read
        recorded = lease(lease_host=liveness.host_id(), lease_pid=child.pid, lease_started=ticks)
        assert owner_alive(recorded) is True
        assert owner_alive(lease(lease_host=liveness.host_id(), lease_pid=child.pid,
                                 lease_started=ticks + 1)) is False  # a reused pid
    finally:
        child.kill()
        child.wait()
    assert owner_alive(recorded) is False  # gone (and reaped)


@pytest.mark.parametrize("offset,expected", [(0, True), (1, False)])
def test_provider_executor_liveness_uses_the_same_exact_ticks(offset, expected):
    """The provider's executor check is the same helper: another live process recorded
    with its exact start ticks is alive; off by one tick (a recycled pid) it is not. The
    old copy accepted any start within 0.01 s."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        row = {"executor_pid": child.pid,
               "executor_started": liveness.start_ticks(child.pid) + offset,
               "job_id": "job-1", "exec_no": 1}
        assert _executor_alive(row) is expected
    finally:
        child.kill()
        child.wait()
