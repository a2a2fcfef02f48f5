"""The safe runner's lease while it works on an item: renewed before each provider call,
kept alive by a heartbeat while the call waits (DESIGN.md, "What the safe runner does").

Mixed into ``Runner``: it uses the pipeline's ledger, worker, ``lease_ttl`` and hook, and
``_fenced``, the item the runner's last committed move returned (``Runner._move``).
"""

import contextlib
import threading
import time

from toolkit.errors import LedgerError, StaleTokenError, StateConflictError
from toolkit.runner.pipeline import no_hook


class Lease:
    """Mixed into ``Runner``: ``_renew`` before a provider call, ``_in_flight`` around it."""

    _heartbeat = None  # this run's ``Heartbeat``, made at its first provider call

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
        """Around one provider call: a heartbeat keeps the lease renewed (fenced) while the
        call waits, so a slow submit never lets a live owner's lease expire (an owner on
        another host could otherwise be robbed: only expiry speaks for it).

        Order: the heartbeat is armed after the renewal that precedes the call and
        disarmed before the reply is recorded; disarming waits for a renewal in progress,
        so it never writes after the caller's own next move. A lost lease
        (StaleTokenError) ends its renewals for this call; the caller's next fenced write
        then fails as it would without the heartbeat.
        """
        self._fenced = None  # a provider call: the next renewal asks the ledger
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(self._beat, max(self.lease_ttl / 3, 0.01))
        self._heartbeat.arm(item, token)
        try:
            yield
        finally:
            self._heartbeat.disarm()

    def _beat(self, item, token) -> None:
        self.ledger.renew(item.key, token, self.worker, self.lease_ttl, sync=False)

    def run(self, inputs):
        """The run, then its heartbeat stopped and joined: no thread outlives a run."""
        try:
            return super().run(inputs)
        finally:
            self._stop_heartbeat()

    def close(self):
        self._stop_heartbeat()  # a caller that used ``process`` outside ``run``
        super().close()

    def _stop_heartbeat(self) -> None:
        heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is not None:
            heartbeat.stop()


INFINITE = float("inf")


class Heartbeat:
    """One thread per run renewing the lease of the provider call in flight, parked between
    calls (a thread started and joined per call cost ~80 µs of CPU, several per item).

    ``beat(item, token)`` runs every ``every`` seconds of a call (the first after
    ``every``: ``renew`` writes only once half the lease is spent, ``every`` is a
    third), holding the lock: ``disarm`` takes it, so it returns only once no
    renewal is in progress, as joining a per-call thread did.
    """

    def __init__(self, beat, every: float):
        self._beat, self._every = beat, every
        self._cond = threading.Condition()
        self._call = None  # [item, token, due] of the call in flight; None between calls
        self._stopped = False
        self._thread = None

    def arm(self, item, token) -> None:
        with self._cond:
            self._call = [item, token, time.monotonic() + self._every]
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lease-heartbeat",
                                                daemon=True)
                self._thread.start()
            else:
                self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._call = None

    def stop(self) -> None:
        with self._cond:
            self._stopped, self._call = True, None
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                call = self._call
                # None: no call, or a call whose renewals ended (its due is infinite, which
                # Condition.wait cannot take as a timeout): park until the next arm or stop
                wait = None if call is None or call[2] == INFINITE else call[2] - time.monotonic()
                if wait is None or wait > 0:
                    self._cond.wait(wait)
                    continue
                call[2] = time.monotonic() + self._every
                try:
                    self._beat(call[0], call[1])
                except (StaleTokenError, StateConflictError, LedgerError):
                    call[2] = INFINITE  # lost, or the ledger failed: the caller's
                    # own writes will say so; no more renewals for this call
