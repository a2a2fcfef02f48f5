"""Taking an item back: from a dead owner (``recover_abandoned``) or from automation
(``cancel``, an operator's decision). Both claim the item first and decide on what it is
under that lease, never on a listing read before it.
"""

from toolkit.errors import LeaseHeldError, StaleTokenError, ToolkitError
from toolkit.ledger import State, owner_alive, why_illegal
from toolkit.runner.review import unique_key

S = State


def recover_abandoned(ledger, worker: str) -> list[str]:
    """Take over the leases of dead owners; their in-flight items go back to ``unknown``.

    Only an owner on this host whose process is gone (pid and start time)
    counts as dead; a slow live owner keeps its lease, and an owner on another
    host keeps it until it expires (then a claim takes it, fenced). The item is reconciled by lookup next,
    never re-run blindly. Returns the recovered keys.

    The listing is only a hint: after the claim the item is read again, since a
    second recoverer may have moved it in between; the lease goes back in ``finally``.
    """
    recovered = []
    for listed in ledger.unsettled():  # an item at rest has nothing in flight
        if listed.lease_owner is None or owner_alive(listed) is not False:
            continue
        try:
            token = ledger.claim(listed.key, worker, ttl=60.0)
        except LeaseHeldError:
            continue  # another restarted worker got there first
        try:
            item = ledger.get(listed.key)  # what it is now, under our lease
            if item.state is S.SUBMITTED:
                ledger.move(item.key, S.SUBMITTED, S.UNKNOWN, token=token, worker=worker,
                            reason="owner_exited", note=f"owner {listed.lease_owner} exited")
            recovered.append(item.key)
        finally:
            _release_quietly(ledger, listed.key, token, worker)
    return recovered


def _release_quietly(ledger, key, token, worker):
    """Give a lease back; if another owner took it meanwhile, it is theirs (fenced)."""
    try:
        ledger.release(key, token, worker)
    except StaleTokenError:
        pass


def cancel(ledger, provider, key: str, worker: str = "operator") -> State:
    """Cancel one item precisely: its own job at the provider, then ``cancelled`` here.

    ``key`` may be a unique prefix of the task key. An item with no job yet is
    cancelled locally (``failed(transient)`` too: else the next run would retry it); an
    ``unknown`` one is looked up first, so the job it may have started is the one cancelled.
    The decision is made on the item as read *after* the claim, never on the listing.

    Raises:
        ToolkitError: no such item, an ambiguous prefix, or an item at rest.
    """
    full = unique_key(ledger, key)  # one rule for a key's prefix (``resolve --key`` too)
    token = ledger.claim(full, worker, ttl=60.0)
    try:
        item = ledger.get(full)  # re-read under the lease
        if item.resting or why_illegal(item.state, S.CANCELLED, item.failure, {}) is not None:
            what = f"failed({item.failure})" if item.state is S.FAILED else item.state.value
            raise ToolkitError(f"item {item.key[:12]} is {what}: nothing to cancel")
        # Only a submitted item's job id is the job in flight: an unknown one may still
        # carry an earlier attempt's or an earlier page's, a partial one a finished page's.
        job_id = item.job_id if item.state is S.SUBMITTED else None
        if item.state is S.UNKNOWN:
            found = provider.lookup(item.request_key)  # the document's key, or its next page's
            job_id = found and found.job_id
        if job_id is not None:
            provider.cancel(job_id)  # only this job: never "everything with this key"
        ledger.move(item.key, item.state, S.CANCELLED, token=token, worker=worker,
                    reason="cancelled by operator", **({"job_id": job_id} if job_id else {}))
    finally:
        _release_quietly(ledger, full, token, worker)
    return S.CANCELLED
