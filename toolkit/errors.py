"""Every error the toolkit raises on purpose: one root, a few typed leaves.

Retryable versus permanent is a type (``TransientError`` / ``PermanentError``),
never a string to match.
"""


class ToolkitError(Exception):
    """Root of all toolkit errors; bad user input is a plain ``ToolkitError``."""


class IllegalTransitionError(ToolkitError):
    """The transition table has no edge ``frm -> to``."""

    def __init__(self, frm, to, why: str | None = None):
        self.frm, self.to, self.why = frm, to, why
        super().__init__(f"illegal transition {frm} -> {to}" + (f": {why}" if why else ""))


class StateConflictError(ToolkitError):
    """The item is not in the from-state the caller named (``actual`` None: no such item)."""

    def __init__(self, key, expected, actual):
        self.key, self.expected, self.actual = key, expected, actual
        super().__init__(f"item {key}: expected state {expected}, found {actual}")


class StaleTokenError(ToolkitError):
    """A write presented a fencing token older than the item's current one."""

    def __init__(self, key, token, current):
        self.key, self.token, self.current = key, token, current
        super().__init__(f"item {key}: stale fencing token {token} (current {current})")


class LeaseHeldError(ToolkitError):
    """Another live worker holds the item's lease."""

    def __init__(self, key, owner, expires):
        self.key, self.owner, self.expires = key, owner, expires
        super().__init__(f"item {key}: lease held by {owner} until {expires:.3f}")


class LedgerError(ToolkitError):
    """The ledger cannot be opened, locked or written (unknown suffix, second writer, disk full)."""


class StorageError(LedgerError):
    """The storage under a ledger (or the fake provider's database) failed: disk full, I/O error.

    Not bad input: the batch halts, fails closed, and a run after the cause is fixed
    (and health cleared) goes on. The command line answers it with exit status 1.
    """


class LedgerBusyError(LedgerError):
    """Another live process holds the ledger's single-writer lock (a running batch on a
    JSONL ledger). Not bad input, and not a failing disk (health stays as it is): "run
    again when it ends". The command line answers it with exit status 1."""


class NotReadyError(ToolkitError):
    """The ledger is marked not ready (an earlier run failed closed): not bad input, but
    "fix the cause, clear health, run again". The command line answers it with exit 1."""


class TransientError(ToolkitError):
    """A failure worth retrying later: timeout, rate limit, 5xx, lookup unavailable."""


class PermanentError(ToolkitError):
    """A failure that no retry will fix: poison input, business rejection."""


class KeyReuseError(ToolkitError):
    """One idempotency key was submitted with two different payloads."""

    def __init__(self, key):
        self.key = key
        super().__init__(f"idempotency key {key} reused with a different payload")
