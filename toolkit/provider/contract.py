"""The provider's promise and its answers: ``Contract``, ``Job``, ``JobStatus``.

Vocabulary shared by every provider implementation (the in-process
``FakeProvider`` now, an HTTP client later) and by the runner that must decide
from the contract, never from hope. Imports nothing but ``errors``.
"""

import math
from dataclasses import asdict, dataclass
from enum import StrEnum

from ..errors import ToolkitError

LOOKUPS = ("consistent", "lagging", "unavailable")
CONTRACT_FORMS = ("idempotent | non-idempotent, then optional comma-joined lag=N, retention=SECONDS, "
                  "conflict, unavailable, run-polls=N, transient=RATE, seed=N (e.g. idempotent,lag=2)")


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE = frozenset({JobStatus.QUEUED, JobStatus.RUNNING})


def _num(value) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(frozen=True, slots=True)
class Contract:
    """What the provider promises; the runner decides from this, never from hope.

    ``lag``: a new job is invisible to its first ``lag`` lookups (``lookup="lagging"``).
    ``key_retention``: seconds (provider clock) after creation during which a key
    is found and deduplicated. ``run_polls``: 0 executes in ``submit``, N on the
    N-th ``poll``. ``transient_rate``: chance that a submit raises
    ``TransientError``, drawn from (seed, key, that key's call number).
    """

    idempotent_keys: bool = True
    lookup: str = "consistent"
    lag: int = 0
    key_retention: float | None = None
    active_conflict: bool = False
    run_polls: int = 0
    transient_rate: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if self.lookup not in LOOKUPS:
            raise ValueError(f"lookup must be one of {LOOKUPS}, got {self.lookup!r}")
        if self.lag < 0 or (self.lag and self.lookup != "lagging"):
            raise ValueError("lag must be >= 0 and needs lookup='lagging'")
        if self.key_retention is not None and not 0 < self.key_retention < math.inf:
            raise ValueError("key_retention must be a finite number of seconds > 0, or None")
        if self.run_polls < 0 or not 0.0 <= self.transient_rate <= 1.0:
            raise ValueError("run_polls must be >= 0 and transient_rate within [0, 1]")

    def describe(self) -> str:
        """Short spec string; ``parse_contract(c.describe()) == c``."""
        parts = [("idempotent" if self.idempotent_keys else "non-idempotent", True),
                 (f"lag={self.lag}", self.lookup == "lagging"),
                 ("unavailable", self.lookup == "unavailable"),
                 (f"retention={_num(self.key_retention or 0)}", self.key_retention is not None),
                 ("conflict", self.active_conflict), (f"run-polls={self.run_polls}", self.run_polls),
                 (f"transient={_num(self.transient_rate)}", self.transient_rate),
                 (f"seed={self.seed}", self.seed)]
        return ",".join(text for text, present in parts if present)


_FLAGS = {"idempotent": ("idempotent_keys", True), "non-idempotent": ("idempotent_keys", False),
          "conflict": ("active_conflict", True), "unavailable": ("lookup", "unavailable")}
_VALUED = {"lag": ("lag", int), "retention": ("key_retention", float), "run-polls": ("run_polls", int),
           "transient": ("transient_rate", float), "seed": ("seed", int)}


def parse_contract(spec: str) -> Contract:
    """Parse a CLI contract spec such as ``idempotent,lag=2``.

    Raises:
        ToolkitError: one line naming the problem and listing the valid forms.
    """
    values = {}
    try:
        for part in (p.strip().lower() for p in spec.split(",")):
            name, eq, raw = part.partition("=")
            if not eq and part in _FLAGS:
                field, value = _FLAGS[part]
            elif eq and name in _VALUED:
                field, value = _VALUED[name][0], _VALUED[name][1](raw)
            else:
                raise ValueError(f"unknown part {part!r}")
            if field in values:
                raise ValueError(f"{field} given twice")
            values[field] = value
        if "lag" in values:
            values.setdefault("lookup", "lagging")
        return Contract(**values)
    except (ValueError, TypeError) as exc:
        raise ToolkitError(f"bad contract {spec!r} ({exc}); valid: {CONTRACT_FORMS}") from exc


@dataclass(frozen=True, slots=True)
class Job:
    """A snapshot of one provider job."""

    job_id: str
    idem_key: str
    task_key: str
    payload_hash: str
    status: JobStatus
    failure: str | None  # "transient" | "permanent" when failed
    reason: str | None
    artifact_path: str | None
    artifact_size: int | None
    artifact_sha256: str | None
    created: float
    updated: float

    @property
    def terminal(self) -> bool:
        return self.status not in ACTIVE

    def to_dict(self) -> dict:
        return {**asdict(self), "status": str(self.status)}


class ProviderConflict(ToolkitError):
    """Submit while the key's job is still active (HTTP 409 style); ``job`` names it."""

    def __init__(self, job: Job):
        self.job, self.key = job, job.idem_key
        super().__init__(f"idempotency key {job.idem_key} is active in job {job.job_id} ({job.status})")
