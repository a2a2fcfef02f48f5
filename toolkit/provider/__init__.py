"""The fake remote service: what it promises and what it does.

``contract``: the vocabulary every provider shares (``Contract`` and its CLI
spec, ``Job``, ``JobStatus``, ``ProviderConflict``). ``fake``: ``FakeProvider``,
real PDF work behind a durable SQLite job table. ``records``: that database's
counters, call log and execution log, and read-only readers for post-mortems.
Importing this package loads neither PyMuPDF nor psutil.
"""

from .contract import (ACTIVE, CONTRACT_FORMS, LOOKUPS, Contract, Job, JobStatus,
                       ProviderConflict, parse_contract)
from .fake import FakeProvider, provider_at
from .records import SCHEMA, provider_records, provider_stats

__all__ = ["ACTIVE", "CONTRACT_FORMS", "LOOKUPS", "SCHEMA", "Contract", "FakeProvider", "Job",
           "JobStatus", "ProviderConflict", "parse_contract", "provider_at", "provider_records",
           "provider_stats"]
