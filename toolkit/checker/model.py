"""The checker's vocabulary: what it reads (a ``History`` of ledger events and items,
provider ``Call``s and ``Execution``s, ``ArtifactOnDisk``) and what it returns (a
``Verdict`` of ``Anomaly``s by kind, ``KINDS`` in report order).

Plain frozen dataclasses with no behaviour but their JSON form; the rules that
judge them are ``toolkit.checker``, the fixture format ``checker.fixtures``.
"""

import dataclasses

from toolkit.ledger import Event, Item

KINDS = ("double_execution", "submit_after_done", "fake_done", "lost_item",
         "unrecorded_execution", "blind_resubmit", "execution_by_lease_loser", "poison_submitted",
         "illegal_transition")


@dataclasses.dataclass(frozen=True)
class Call:
    """One provider call, from the provider's own call log."""

    seq: int
    ts: float
    op: str  # submit | lookup | poll | fetch | cancel
    idem_key: str | None
    task_key: str | None
    job_id: str | None
    # submit: created, deduped, conflict, transient, rejected; lookup: found, not_found, unavailable
    outcome: str
    worker: str | None = None  # the caller's worker and fencing token (submits; None: unknown)
    token: int | None = None


@dataclasses.dataclass(frozen=True)
class Execution:
    """One execution whose result the provider committed."""

    seq: int
    ts: float
    job_id: str
    idem_key: str
    task_key: str
    status: str  # succeeded | failed
    artifact_size: int | None
    artifact_sha256: str | None


@dataclasses.dataclass(frozen=True)
class ArtifactOnDisk:
    """What is really on disk at the end for an item that says done."""

    path: str
    exists: bool
    size: int | None
    sha256: str | None


@dataclasses.dataclass(frozen=True)
class History:
    """Everything the checker reads; ``calls``/``executions`` None: provider records unavailable."""

    events: tuple[Event, ...]
    items: dict[str, Item]
    calls: tuple[Call, ...] | None
    executions: tuple[Execution, ...] | None
    artifacts: dict[str, ArtifactOnDisk]
    inputs: dict[str, dict]  # task key -> {"source", "poison": bool[, "pages": n if by page]}
    idempotent_keys: bool = True
    key_retention: float | None = None


@dataclasses.dataclass(frozen=True)
class Anomaly:
    """One broken invariant on one task ``key``; ``witnesses`` prove it (events, calls, ...)."""

    kind: str
    key: str | None
    detail: str
    witnesses: tuple = ()

    def to_json(self) -> dict:
        return {"key": self.key, "kind": self.kind, "detail": self.detail}


@dataclasses.dataclass(frozen=True)
class Verdict:
    """``valid``: no anomaly (True), some (False), cannot tell (None, see ``notes``).

    ``anomalies`` holds only the kinds found; ``possibly_executed``, the items
    whose execution nobody can rule out.
    """

    valid: bool | None
    anomalies: dict[str, list[Anomaly]]
    notes: tuple[str, ...] = ()
    possibly_executed: tuple[str, ...] = ()
    costly: dict = dataclasses.field(default_factory=dict)  # kind -> [Anomaly]: wasteful, not unsafe

    def to_json(self) -> dict:
        return {"valid": self.valid,
                "anomalies": [a.to_json() for kind in KINDS for a in self.anomalies.get(kind, ())],
                "notes": list(self.notes), "possibly_executed": list(self.possibly_executed)}
