"""Drills over real HTTP: the provider runs as its own service process on loopback.

The faults are the service's own (``ServiceFaults``), not hooks: a submit
whose job runs longer than the client's read timeout (the socket really
times out while the job goes on), an artifact response that stops after
half its bytes (the connection really closes early). The history is read
back through the same HTTP API once no job is still running.
"""

import contextlib
import time

from toolkit.errors import ToolkitError

# The client's read timeout has room for a normal reply on two loaded cores (a 0.5 s
# timeout also expired on ordinary submits there, and a blind retry's count then
# depended on the load); only the one slow submit outlasts it.
READ_TIMEOUT = 2.0  # seconds the client waits for a reply
SLOW_SECONDS = 3.0  # a slow submit's job runs this long: longer than READ_TIMEOUT
# A drill without a slow submit teaches something else (a cut download): there a read
# timeout could only come from the machine's load, and its extra lookup made the printed
# call log flap. Such drills wait as long as the client's own default; a reply that slow
# still times out and shows.
CALM_READ_TIMEOUT = 30.0
SERVICE_FAULTS = ("slow_submit", "cut_fetch")


@contextlib.contextmanager
def http_provider(work, contract, faults=()):
    """A started ``serve-provider`` process and an ``HttpProvider`` on it; both stopped after.

    ``faults``: names among ``SERVICE_FAULTS``, each done once (the first submit,
    the first artifact download).
    """
    from toolkit.provider.client import HttpProvider, ServiceProcess
    from toolkit.provider.service import ServiceFaults

    unknown = set(faults) - set(SERVICE_FAULTS)
    if unknown:
        raise ToolkitError(f"unknown service fault(s) {sorted(unknown)}; known: {SERVICE_FAULTS}")
    service = ServiceProcess(work / "provider.db", work / "provider-jobs", contract,
                             faults=ServiceFaults(
                                 slow_submits=int("slow_submit" in faults),
                                 slow_seconds=SLOW_SECONDS if "slow_submit" in faults else 0.0,
                                 cut_fetches=int("cut_fetch" in faults)))
    service.start()
    provider = None
    try:
        provider = HttpProvider(service.url, read_timeout=read_timeout(faults))
        yield provider
    finally:
        if provider is not None:
            provider.close()
        service.stop()


def read_timeout(faults) -> float:
    """The client's read timeout in a drill with service ``faults``: short only where the
    drill's own fault is a reply that outlasts it."""
    return READ_TIMEOUT if "slow_submit" in faults else CALM_READ_TIMEOUT


def settle(provider, seconds: float = 30.0) -> None:
    """Wait (bounded) until the service runs no job: an abandoned job's execution counts too."""
    from toolkit.provider import ACTIVE

    deadline = time.monotonic() + seconds
    while any(job.status in ACTIVE for job in provider.jobs()):
        if time.monotonic() > deadline:
            raise ToolkitError("jobs still running at the provider service")
        time.sleep(0.05)
