"""The drill catalogue: every drill as data, each a corpus, a strategy, a contract, a
fault plan and what must hold.

``Drill`` is one row; ``_pair`` makes a safe drill and its naive twin on the same
input, contract and fault; ``_matrix`` crosses contracts with strategies.
``CATALOGUE`` lists them in the order they run and are shown; ``DRILLS`` finds
one by name. Running a drill is ``toolkit.drills.run_drill``.
"""

import dataclasses

from toolkit.drills.captions import NAIVE_WAYS, twin_summary

STRICT = "non-idempotent"


@dataclasses.dataclass(frozen=True, slots=True)
class Drill:
    name: str
    summary: str
    strategy: str = "safe"
    contract: str = STRICT
    faults: tuple[str, ...] = ()
    persistent: bool = False  # the fault stays for the reruns too (an outage, not a blip)
    ledger: str = "sqlite"
    docs: int = 4
    poison: int = 0
    long_docs: int = 0  # documents of 6 pages, processed page by page
    page_by_page_from: int | None = None  # documents with this many pages go page by page
    service_faults: tuple[str, ...] = ()  # over real HTTP: faults the provider service does
    http: bool = False  # the provider as a service process on loopback, not in-process
    workers: int = 1
    runs: int = 2
    disk_full_after: int = 6  # ledger writes that succeed before the disk is "full"
    options: tuple = ({},)  # the request options of run n: options[n % len(options)]
    slow_owner: bool = False  # another live process holds the first item's lease, slowly
    cancel_after_first_run: bool = False  # the operator cancels one in-flight item
    scans: int = 0  # scanned documents and mixed (text + scan + blank) ones, each: OCR route
    expect_valid: bool = True
    expect: tuple[str, ...] = ()  # anomaly kinds the checker must find
    expect_parked: int | None = None  # items left in needs_review, when that is the measure
    note: str = ""  # said in the row: why a naive design is harmless here


def _pair(name, summary, naive, expect, **common):
    """The safe drill and its naive twin on the same input, contract and fault."""
    safe = Drill(name, summary, **common)
    twin = dataclasses.replace(safe, name=f"{name}/{naive}", strategy=naive, expect_valid=False,
                               summary=twin_summary(summary, naive), expect=expect,
                               **_naive_overrides(naive, common))
    return [safe, twin]


def _naive_overrides(naive, common):
    # Some faults act where only the naive design has a seam (its state file,
    # its in-place download); the twin takes the variant that lands there.
    if naive == "rewrite-state" and "torn_jsonl_write" in common.get("faults", ()):
        return {"faults": ("crash_during_state_write",), "ledger": "sqlite"}
    if naive == "output-exists" and common.get("faults"):
        return {"faults": ("crash_mid_download",)}
    return {}


def _matrix():
    drills = []
    for contract in ("idempotent", "non-idempotent", "idempotent,lag=2", "non-idempotent,lag=2",
                     "idempotent,retention=3600", "non-idempotent,retention=3600"):
        for strategy in ("safe", "blind-retry"):
            # A blind retry is harmless only where the provider dedupes a key it surely keeps.
            dedupes = contract.startswith("idempotent")
            harmless = dedupes and "retention" not in contract
            expect = () if strategy == "safe" or harmless else \
                ("blind_resubmit",) if dedupes else ("blind_resubmit", "double_execution")
            name = f"contract[{contract}]" + ("" if strategy == "safe" else f"/{strategy}")
            note = "harmless here: the provider dedupes a key it keeps forever" \
                if strategy != "safe" and harmless else ""
            summary = twin_summary("a lost reply, then a crash after the next intent", strategy)
            drills.append(Drill(name, summary + (f" ({note})" if note else ""),
                                strategy=strategy, contract=contract,
                                faults=("lost_reply", "crash_after_second_intent"),
                                expect_valid=not expect, expect=expect, note=note))
    return drills


CATALOGUE = [
    # The two-ledger article: run 1 ends unknown (reply lost, lookup down), run 2
    # recovers by lookup, run 3 reuses the verified artifact; exactly one submit.
    *_pair("lost-reply", "the provider commits, the reply is lost: recover by lookup, never resubmit",
           "blind-retry", ("double_execution",), faults=("lost_reply", "lookup_unavailable"),
           runs=3),
    Drill("crash-after-intent", "intent committed, nothing sent: parked for review, never resubmitted "
          "blindly", faults=("crash_after_intent",)),
    Drill("crash-after-intent/idempotent", "the same crash where the contract makes a resubmit safe",
          contract="idempotent", faults=("crash_after_intent",)),
    *_pair("crash-after-submit", "the job is accepted, the process dies before the reply",
           "blind-retry", ("double_execution",), faults=("crash_after_submit",)),
    *_pair("crash-before-commit", "the reply is in hand, the process dies before committing it",
           "batch-commit", ("double_execution", "unrecorded_execution"),
           faults=("crash_before_commit",), docs=6),
    *_pair("torn-write", "the process dies halfway through writing its state",
           "rewrite-state", ("double_execution",), faults=("torn_jsonl_write",), ledger="jsonl"),
    *_pair("concurrent-workers", "two workers race for the same items", "no-lease",
           ("double_execution",), workers=2, runs=1),
    *_pair("lookup-unavailable", "the reply is lost and the status API is down for the whole batch",
           "blind-retry", ("double_execution",), faults=("lost_reply", "lookup_unavailable"),
           persistent=True),
    *_pair("lookup-lag", "the reply is lost and a new job is invisible to the first two lookups",
           "blind-retry", ("double_execution",), contract="non-idempotent,lag=2",
           faults=("lost_reply",)),
    *_pair("half-download", "the artifact download stops halfway", "output-exists",
           ("fake_done",), contract="idempotent", faults=("half_download",)),
    *_pair("poison-storm", "poison files in a storm of transient errors", "rewrite-state",
           ("poison_submitted",), contract="idempotent,transient=0.6", docs=6, poison=2, runs=3),
    *_pair("disk-full", "the ledger cannot record the reply: stop taking work, reconcile later",
           "blind-retry", ("double_execution",), faults=("disk_full",)),
    # The job-registry rules (owner recovery, conflicts, cancellation, health, identity).
    # A slow live owner keeps its lease (safe: it renews before each call). In the naive
    # design every worker steals expired leases and never checks its own: the thief
    # finds an intent with no job yet and parks it, the owner submits anyway (a side
    # effect by a lease loser) and its job succeeds: paid for, not delivered.
    Drill("owner-recovery", "a live but slow process holds a lease past its expiry",
          slow_owner=True, runs=1, expect_parked=0),
    Drill("owner-recovery/steal-expired", "a live but slow process holds a lease past its "
          "expiry; " + NAIVE_WAYS["steal-expired"] + " (the owner's job is paid, then parked)",
          strategy="steal-expired", slow_owner=True, runs=1, expect_parked=1,
          expect_valid=False, expect=("execution_by_lease_loser", "parked_after_success")),
    # The fake provider runs a job only when it is polled, so the abandoned first job
    # never bills here; the checker still proves the second key was sent blind.
    *_pair("active-conflict", "the reply is lost while the job still runs: attach, never re-create",
           "timeout-as-failed", ("blind_resubmit",), contract="idempotent,conflict,run-polls=2",
           faults=("lost_reply",)),
    Drill("cancel", "the operator cancels one running item; no later run retries it (the other "
          "three stay submitted: their jobs need 50 polls to run, more than two runs make)",
          contract="non-idempotent,run-polls=50", cancel_after_first_run=True),
    *_pair("health-fail-closed", "the disk fills up before an intent: stop taking work",
           "ignore-write-errors", ("unrecorded_execution", "double_execution"),
           faults=("disk_full",), disk_full_after=5),
    *_pair("identity-change", "the same files again with another target language",
           "output-exists", ("fake_done",), contract="idempotent",
           options=({"target": "de"}, {"target": "fr"})),
    # A long document dies after its second page; pages are billed one by one.
    *_pair("partial-resume", "a 6-page document: the process dies after page 2 is checkpointed",
           "restart-long-docs", ("double_execution",), faults=("crash_after_checkpoint",),
           docs=2, long_docs=2, page_by_page_from=5),
    # Over real HTTP, the faults done by the provider service itself.
    *_pair("http-lost-reply", "over HTTP: the socket times out while the job runs on",
           "blind-retry", ("double_execution",), http=True, service_faults=("slow_submit",),
           docs=3),
    # No naive twin: any HTTP client that checks Content-Length refuses a cut body, so a
    # half file under the final name needs a crash mid-write (half-download/output-exists).
    Drill("http-cut-download", "over HTTP: the artifact response stops halfway; fetched again",
          contract="idempotent", http=True, service_faults=("cut_fetch",), docs=3),
    # Scans go the OCR route (Tesseract, for real): a lost reply, then the process dies
    # inside an OCR job; the provider re-runs the abandoned job, the client looks it up.
    *_pair("scan-batch", "text, scanned and mixed documents: a lost reply, then a crash mid-OCR",
           "blind-retry", ("double_execution",), faults=("lost_reply", "crash_mid_ocr"),
           docs=2, scans=1),
    *_matrix(),
]
DRILLS = {drill.name: drill for drill in CATALOGUE}
