"""Outsider o26 P1: a salvaged ledger forgot a key every line of which was lost.

Every line of one key deleted from a JSONL ledger (a seq gap) is refused by ``run``, and
``ledger --salvage`` writes a ledger that does not know the key at all. Before the fix a
rerun on it took the input up as new work (pending, intent, submit) and a
non-idempotent provider executed the document a second time. Now salvage marks its
output (the header line), and on a marked ledger every new request is looked up before
it is sent: found, it is adopted and fetched; no answer, or an artifact under ``--out``
named by the key, parks it in ``needs_review``; "not found" is new work. A ledger that
was never salvaged sends new work without a lookup, as before.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.documents import make_corpus, verify
from toolkit.forensics import audit, render_text
from toolkit.ledger import open_ledger
from toolkit.ledger.jsonl import JsonlLedger, header_version
from toolkit.ledger.salvage import salvage
from toolkit.provider import provider_stats
from toolkit.provider.records import provider_records

pytestmark = pytest.mark.slow


def _run(tmp_path, ledger, contract="non-idempotent", *extra):
    return subprocess.run(
        [sys.executable, "-m", "toolkit", "run", "--inputs", str(tmp_path / "in"), "--ledger",
         str(ledger), "--provider-db", str(tmp_path / "p.db"), "--out", str(tmp_path / "out"),
         "--contract", contract, "--no-progress", *extra],
        capture_output=True, text=True, timeout=300)


def _delete_key(path: Path, key: str) -> int:
    """Delete every line of ``key`` (its add included): a seq gap. How many went."""
    lines = path.read_bytes().splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line).get("key") != key]
    path.write_bytes(b"".join(kept))
    return len(lines) - len(kept)


def _lookups(tmp_path) -> dict[str, int]:
    """Lookups the provider answered (or refused), per task key."""
    counts: dict[str, int] = {}
    for call in provider_records(tmp_path / "p.db")["calls"]:
        if call["op"] == "lookup":
            counts[call["task_key"]] = counts.get(call["task_key"], 0) + 1
    return counts


def _lost_batch(tmp_path, docs=3, *extra, long_docs=0) -> tuple[str, dict]:
    """A real batch run to rest on a non-idempotent provider; every line of one done key
    deleted; the ledger refused, then salvaged into ``S.jsonl``. (lost key, stats)."""
    make_corpus(tmp_path / "in", docs=docs, poison=0, seed=7, long_docs=long_docs,
                long_pages=4)
    ledger = tmp_path / "L.jsonl"
    first = _run(tmp_path, ledger, "non-idempotent", *extra)
    assert first.returncode == 0, first.stderr
    with open_ledger(ledger) as opened:
        lost = max(opened.items(), key=lambda item: (item.pages_done or 0, item.key))
    assert lost.state == "done"
    assert _delete_key(ledger, lost.key) >= 4
    refused = _run(tmp_path, ledger, "non-idempotent", *extra)
    assert refused.returncode == 2 and "missing" in refused.stderr, refused.stderr
    result = salvage(ledger, tmp_path / "S.jsonl")
    assert result["seq_gaps"] and lost.key not in result["needs_review"]
    return lost.key, provider_stats(tmp_path / "p.db")

def _parked_unsent(tmp_path, contract):
    """(the lost key, its item) after a rerun of the salvaged ledger under ``contract``:
    nothing submitted, nothing executed again, the item parked in ``needs_review``."""
    lost, before = _lost_batch(tmp_path)
    rerun = _run(tmp_path, tmp_path / "S.jsonl", contract)
    assert "Traceback" not in rerun.stderr
    after = provider_stats(tmp_path / "p.db")
    assert (after["submit_calls"], after["executions"]) == (before["submit_calls"], 3)
    with open_ledger(tmp_path / "S.jsonl") as salvaged:
        item = salvaged.get(lost)
    assert item.state == "needs_review", item
    return lost, item


def test_every_line_of_a_key_deleted_then_salvaged_the_rerun_executes_it_once_and_ends_done(
        tmp_path):
    """Fault: every line of one done key deleted (real file edit), the ledger salvaged.
    Property: the rerun on the salvaged ledger looks the key up, adopts the provider's
    job and fetches it: the provider executed the document once in all (before: twice),
    the item ends done with a verified artifact, no submit was sent for it."""
    lost, before = _lost_batch(tmp_path)
    rerun = _run(tmp_path, tmp_path / "S.jsonl")
    assert rerun.returncode == 0, rerun.stderr
    after = provider_stats(tmp_path / "p.db")
    assert after["per_task"][lost]["executions"] == 1
    assert after["executions"] == before["executions"] == 3
    assert after["submit_calls"] == before["submit_calls"]
    with open_ledger(tmp_path / "S.jsonl") as salvaged:
        item = salvaged.get(lost)
        assert salvaged.salvaged is not None
    assert item.state == "done" and item.job_id is not None
    assert verify(tmp_path / "out" / item.artifact_path, item.artifact_size,
                  item.artifact_sha256)
    assert _lookups(tmp_path) == {lost: 1}  # the two keys the salvage kept: no lookup


def test_every_line_of_a_long_document_deleted_then_salvaged_no_page_is_executed_twice(
        tmp_path):
    """Fault: every line of a long document routed page by page (4 page requests, each its
    own key) deleted, the ledger salvaged. Property: the rerun looks up each page's
    request before sending it (4 lookups), adopts each job and assembles the document
    again: no page executed twice, the item done with a verified artifact."""
    paged = ("--page-by-page-from", "3")
    lost, before = _lost_batch(tmp_path, 1, *paged, long_docs=1)
    rerun = _run(tmp_path, tmp_path / "S.jsonl", "non-idempotent", *paged)
    assert rerun.returncode == 0, rerun.stderr
    after = provider_stats(tmp_path / "p.db")
    assert (after["submit_calls"], after["executions"]) == \
        (before["submit_calls"], before["executions"])
    with open_ledger(tmp_path / "S.jsonl") as salvaged:
        item = salvaged.get(lost)
    assert item.state == "done" and item.pages_done == 4, item
    assert verify(tmp_path / "out" / item.artifact_path, item.artifact_size,
                  item.artifact_sha256)
    assert sorted(_lookups(tmp_path).items()) == [(f"{lost}#p{n}", 1) for n in range(1, 5)]


def test_every_line_of_a_key_deleted_and_no_lookup_answers_parks_it_unsent(tmp_path):
    """Fault: as above, and the provider's lookup is unavailable on the rerun. Property:
    the lost key is never submitted; it ends ``needs_review`` with a reason that says the
    ledger was salvaged, that no lookup answered, and names its artifact under --out
    (the evidence a person checks before ``resolve``)."""
    lost, item = _parked_unsent(tmp_path, "non-idempotent,unavailable")
    assert "salvaged" in item.reason and "lookup" in item.reason, item.reason
    artifact = next((tmp_path / "out").glob(f"*.{lost[:8]}.pdf"))
    assert artifact.name in item.reason, item.reason


def test_every_line_of_a_key_deleted_on_a_provider_that_forgot_it_is_parked_by_its_artifact(
        tmp_path):
    """Fault: as above, and the provider no longer knows the job (its key retention ran
    out: "not found"). Property: the artifact under --out named by the key is evidence of
    an execution: the key is parked in ``needs_review`` naming it, never submitted."""
    lost, item = _parked_unsent(tmp_path, "non-idempotent,retention=0.001")
    assert "not found" in item.reason and f".{lost[:8]}.pdf" in item.reason, item.reason


def test_new_document_on_a_salvaged_ledger_is_looked_up_once_then_sent_and_unsalvaged_never(
        tmp_path):
    """Fault: none for the new document itself: a document added after the salvage.
    Property: on the salvaged ledger it costs its lookup and those of the later attempts
    (attempt 1, then 2..10: 9 "not found" in a row, a retry the lost lines may have held:
    runner/salvaged.py) and is executed once, not parked; on a ledger never salvaged the same batch sends
    its new work with no lookup at all (counted at the provider)."""
    lost, _ = _lost_batch(tmp_path, docs=2)
    make_corpus(tmp_path / "more", docs=3, poison=0, seed=8)  # doc-000..002: new content
    for path in sorted((tmp_path / "more").glob("*.pdf")):
        path.rename(tmp_path / "in" / f"new-{path.name}")
    rerun = _run(tmp_path, tmp_path / "S.jsonl")
    assert rerun.returncode == 0, rerun.stderr
    with open_ledger(tmp_path / "S.jsonl") as salvaged:
        states = {item.key: item.state.value for item in salvaged.items()}
    new = set(states) - {lost, *_lookups_before(tmp_path)}
    assert states and set(states.values()) == {"done"}, states
    stats = provider_stats(tmp_path / "p.db")
    assert all(stats["per_task"][key]["executions"] == 1 for key in states)
    looked = _lookups(tmp_path)
    assert looked.get(lost) == 1 and all(looked.get(key) == 10 for key in new), looked
    # A ledger never salvaged: the same inputs, a fresh ledger and provider: no lookups
    # (another batch of inputs L ran: --new-batch says it is meant).
    (tmp_path / "p.db").rename(tmp_path / "p-salvaged.db")
    fresh = _run(tmp_path, tmp_path / "fresh.jsonl", "non-idempotent", "--new-batch")
    assert fresh.returncode == 0, fresh.stderr
    assert _lookups(tmp_path) == {}
    assert provider_stats(tmp_path / "p.db")["executions"] == len(states)


def test_retries_on_a_salvaged_ledger_look_each_new_attempt_up_once_before_sending_it(
        tmp_path):
    """Fault: the provider refuses submits transiently (seeded, 50 %) on the rerun of a
    salvaged ledger with new documents, so items go failed(transient) and are retried
    under new attempt keys. Property: every attempt's key is looked up exactly once, before
    its first submit (a lost history may have sent it); every document executes once."""
    _lost_batch(tmp_path, docs=2)
    make_corpus(tmp_path / "more", docs=4, poison=0, seed=9)
    for path in sorted((tmp_path / "more").glob("*.pdf")):
        path.rename(tmp_path / "in" / f"new-{path.name}")
    first = len(provider_records(tmp_path / "p.db")["calls"])
    _run(tmp_path, tmp_path / "S.jsonl", "non-idempotent,transient=0.5,seed=3")
    looked: dict[str, int] = {}
    for call in provider_records(tmp_path / "p.db")["calls"][first:]:
        if call["op"] == "lookup":
            looked[call["idem_key"]] = looked.get(call["idem_key"], 0) + 1
        elif call["op"] == "submit":
            assert looked.get(call["idem_key"]) == 1, (call, looked)
    retried = {key.rpartition(":")[0] for key in looked if not key.endswith(":1")}
    assert retried and set(looked.values()) == {1}, looked
    per_task = provider_stats(tmp_path / "p.db")["per_task"]
    assert {task: counts["executions"] for task, counts in per_task.items()
            if counts["executions"] != 1} == {}


def _lookups_before(tmp_path) -> set[str]:
    """The keys the salvaged ledger knew (kept by the salvage from the first run)."""
    with JsonlLedger(tmp_path / "L.jsonl", view=True) as old:
        return {item.key for item in old.items()}


def test_salvage_mark_survives_compaction_and_audit_names_it(tmp_path):
    """Fault: a salvaged ledger compacted afterwards (a rewrite of the whole file).
    Property: the mark is kept (a compaction must not turn a salvaged ledger into one
    whose new keys are sent unlooked); the header still reads as version 1 to the
    format check; ``audit`` says the ledger was salvaged."""
    _lost_batch(tmp_path, docs=2)
    new = tmp_path / "S.jsonl"
    mark = JsonlLedger(new, view=True)
    assert mark.salvaged is not None and mark.salvaged["from"] == "L.jsonl"
    mark.close()
    with JsonlLedger(new) as ledger:
        ledger.compact()
    assert header_version(new.read_bytes().split(b"\n")[0]) == 1
    with JsonlLedger(new, view=True) as again:
        assert again.salvaged == mark.salvaged
    assert "salvaged from L.jsonl" in render_text(audit(new))
