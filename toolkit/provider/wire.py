"""What the provider service and its client share on the wire: address, headers, digests.

Neither side imports the other: the service (``service``) and the client
(``client``) both import this module.
"""

import base64
import dataclasses

HOST = "127.0.0.1"
CONTRACT_HEADER = "Toolkit-Contract"
JOB_HEADER = "Toolkit-Job"
MAX_UPLOAD = 64 * 2**20
CHUNK = 64 * 2**10


@dataclasses.dataclass(frozen=True, slots=True)
class ServiceFaults:
    """Faults the service does to itself: slow submits (lost replies), cut downloads,
    refused submits (503 before anything is accepted)."""

    slow_submits: int = 0  # the first N submits: the job stays running ``slow_seconds``
    slow_seconds: float = 0.0
    cut_fetches: int = 0  # the first N artifact responses stop after half their bytes
    drop_submits: int = 0  # the first N submits: accepted and run, then the connection drops
    refuse_submits: int = 0  # the first N submits: 503 transient, nothing accepted


def content_digest(sha256_hex: str) -> str:
    """RFC 9530 ``Content-Digest`` value for a SHA-256 given in hex."""
    return f"sha-256=:{base64.b64encode(bytes.fromhex(sha256_hex)).decode()}:"


def parse_digest(value: str | None) -> str | None:
    """The hex SHA-256 of a ``Content-Digest`` header, or None if absent or malformed."""
    if not value or not value.startswith("sha-256=:") or not value.endswith(":"):
        return None
    try:
        raw = base64.b64decode(value[len("sha-256=:"):-1], validate=True)
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 else None
