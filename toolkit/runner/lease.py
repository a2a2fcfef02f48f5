"""The safe runner's lease while it works on an item: renewed before each provider call,
kept alive by a heartbeat while the call waits (DESIGN.md, "What the safe runner does").

Mixed into ``Runner``: it uses the pipeline's ledger, worker, ``lease_ttl`` and hook, and
``_fenced``, the item the runner's last committed move returned (``Runner._move``).
"""

import contextlib
import threading

from toolkit.errors import LedgerError, StaleTokenError, StateConflictError
from toolkit.runner.pipeline import no_hook


class Lease:
    """Mixed into ``Runner``: ``_renew`` before a provider call, ``_in_flight`` around it."""

    def _renew(self, item, token):
        """Before each provider call: keep the lease alive (fenced: raises if it was lost).

        Not asked of the ledger when our own move of this item just passed the same fence
        and left more than half of the lease (``renew`` would check the token and not
        write): nothing ran since but this thread's code, no provider call, no callback.
        With a hook or a ledger ``on_event`` installed (which may do anything: a fault
        injector takes leases over there), it is always asked. With more than half left,
        only an owner of the same worker name could have claimed it since the move."""
        moved, self._fenced = self._fenced, None
        clock = getattr(self.ledger, "clock", None)  # a wrapped ledger may not say: ask it
        if moved is not None and clock is not None and self.hook is no_hook and \
                getattr(self.ledger, "on_event", None) is None and moved.key == item.key and \
                moved.token == token and moved.lease_owner == self.worker and \
                moved.lease_expires is not None and \
                moved.lease_expires - clock() > self.lease_ttl / 2:
            return
        self.ledger.renew(item.key, token, self.worker, self.lease_ttl, sync=False)

    @contextlib.contextmanager
    def _in_flight(self, item, token):
        """Around one provider call: a heartbeat thread keeps the lease renewed (fenced)
        while the call waits, so a slow submit never lets a live owner's lease expire
        (an owner on another host could otherwise be robbed: only expiry speaks for it).

        Order: the thread starts after the renewal that precedes the call and is stopped
        and joined before the reply is recorded, so it never writes after the caller's
        own next move. A lost lease (StaleTokenError) ends it; the caller's next fenced
        write then fails as it would without the heartbeat.
        """
        stop = threading.Event()
        every = max(self.lease_ttl / 3, 0.01)  # renew() writes only once half is spent

        def beat():
            while not stop.wait(every):
                try:
                    self.ledger.renew(item.key, token, self.worker, self.lease_ttl, sync=False)
                except (StaleTokenError, StateConflictError, LedgerError):
                    return  # lost, or the ledger failed: the caller's own writes will say so
        self._fenced = None  # a provider call: the next renewal asks the ledger
        thread = threading.Thread(target=beat, name=f"lease-{item.key[:8]}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
