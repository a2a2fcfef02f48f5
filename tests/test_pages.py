"""Long documents page by page: per-page checkpoints, ``partial``, resume at the next page."""

import collections
import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Crash, run_until_rest, sigkill_at_executions
from toolkit import documents
from toolkit.checker import check
from toolkit.drills import collect_history
from toolkit.errors import PermanentError
from toolkit.identity import document_of, file_task_key, page_key
from toolkit.ledger import State, open_ledger
from toolkit.provider import Contract, FakeProvider, parse_contract, provider_at, provider_stats
from toolkit.runner import RetryPolicy, Runner
from toolkit.runner.naive import RestartLongDocs
from toolkit.runner.reclaim import cancel
from toolkit.runner.pipeline import routed_options

S = State
PAGES = 6
FROM = 5  # documents of 5 pages or more go page by page


@pytest.fixture
def batch(tmp_path):
    """(inputs, run(hook, **options) -> counts, provider): 2 short documents and 2 long ones."""
    inputs = documents.make_corpus(tmp_path / "in", docs=2, poison=0, long_docs=2,
                                   long_pages=PAGES)
    provider = FakeProvider(tmp_path / "provider.db", tmp_path / "jobs",
                            Contract(idempotent_keys=False))

    def run(hook=None, strategy=Runner, **options):
        runner = strategy(open_ledger(tmp_path / "ledger.sqlite"), provider, tmp_path / "out",
                          policy=RetryPolicy(base_delay=0.0), hook=hook,
                          sleep=lambda seconds: None, page_by_page_from=FROM, **options)
        try:
            return runner.run(inputs)
        except Crash:
            return None
        finally:
            runner.close()
    yield inputs, run, provider
    provider.close()


def crash_after_page(page):
    def hook(point, key, **context):
        if point == "after_checkpoint" and context["page"] == page and not hook.fired:
            hook.fired = True
            raise Crash()
    hook.fired = False
    return hook


def page_executions(provider) -> collections.Counter:
    return collections.Counter(x["task_key"] for x in provider.executions()
                               if x["status"] == "succeeded")


def ledger_items(tmp_path):
    with open_ledger(tmp_path / "ledger.sqlite") as ledger:
        return {item.source: item for item in ledger.items()}


def history(tmp_path, provider, inputs, options=({},)):
    return collect_history(tmp_path / "ledger.sqlite", provider, inputs, provider.contract,
                           options, FROM)


def test_crash_after_a_page_checkpoint_resumes_at_the_next_page_without_reexecuting(
        tmp_path, batch):
    inputs, run, provider = batch
    assert run(crash_after_page(2)) is None
    long_doc = ledger_items(tmp_path)["long-000.pdf"]
    assert long_doc.state is S.PARTIAL and long_doc.pages_done == 2  # evidence, never done
    assert documents.verify(tmp_path / "out" / long_doc.artifact_path, long_doc.artifact_size,
                            long_doc.artifact_sha256)
    assert len(documents.page_texts(tmp_path / "out" / long_doc.artifact_path)) == 2

    assert run()["done"] == 4
    executed = page_executions(provider)
    assert set(executed.values()) == {1}  # every page, and every short document, exactly once
    assert sum(executed.values()) == 2 + 2 * PAGES
    done = ledger_items(tmp_path)["long-000.pdf"]
    assert done.state is S.DONE and done.pages_done == PAGES
    assert len(documents.page_texts(tmp_path / "out" / done.artifact_path)) == PAGES
    assert check(history(tmp_path, provider, inputs)).valid is True


def test_restart_from_page_one_after_the_same_crash_executes_finished_pages_again(
        tmp_path, batch):
    inputs, run, provider = batch
    run(crash_after_page(2))
    run(strategy=RestartLongDocs)
    executed = page_executions(provider)
    assert sum(executed.values()) == 2 + 2 * PAGES + 2  # pages 1 and 2 billed twice
    verdict = check(history(tmp_path, provider, inputs))
    assert verdict.valid is False and "double_execution" in verdict.anomalies
    doubled = {a.key for a in verdict.anomalies["double_execution"]}
    long_key = ledger_items(tmp_path)["long-000.pdf"].key
    assert doubled == {page_key(long_key, 1), page_key(long_key, 2)}


def test_transient_page_failure_retries_that_page_with_a_new_key_keeping_finished_pages(
        tmp_path, batch, monkeypatch):
    inputs, run, provider = batch
    real, failed = documents.process, []

    def disk_full_on_page_4(source, output, options):
        if options.get("page") == 4 and not failed:
            failed.append(options)
            raise OSError(28, "No space left on device")  # the provider's own disk: transient
        return real(source, output, options)
    monkeypatch.setattr("toolkit.provider.fake.documents.process", disk_full_on_page_4)
    assert run()["done"] == 4
    assert failed
    long_key = ledger_items(tmp_path)["long-000.pdf"].key
    page_calls = [c["idem_key"] for c in provider.calls()
                  if c["op"] == "submit" and document_of(c["task_key"]) == long_key]
    assert page_calls == [f"{page_key(long_key, n)}:1" for n in range(1, 5)] + \
        [f"{page_key(long_key, 4)}:2"] + [f"{page_key(long_key, n)}:2" for n in range(5, 7)]
    assert check(history(tmp_path, provider, inputs)).valid is True


def _forget_job_outputs(tmp_path):
    """The provider no longer holds any finished job's output (its retention ended)."""
    for path in (tmp_path / "jobs").rglob("*"):
        if path.is_file():
            path.unlink()


def test_damaged_checkpoint_is_rebuilt_from_its_pages_jobs_never_re_executed(tmp_path, batch):
    """Fault: the checkpoint of pages 1-3 truncated after a crash. Property: the rerun fetches
    pages 1-3 again from their jobs, joins them to the recorded SHA-256 and goes on at page 4:
    the document ends done, no page executed twice (o36 finding 4: it was parked for good)."""
    inputs, run, provider = batch
    run(crash_after_page(3))
    checkpoint = tmp_path / "out" / ledger_items(tmp_path)["long-000.pdf"].artifact_path
    with open(checkpoint, "r+b") as handle:
        handle.truncate(100)
    counts = run()
    assert ledger_items(tmp_path)["long-000.pdf"].state is S.DONE and counts["done"] == 4
    assert max(page_executions(provider).values()) == 1  # fetched again, never re-executed


def test_damaged_checkpoint_whose_pages_are_gone_is_parked_for_review_never_resumed(
        tmp_path, batch):
    inputs, run, provider = batch
    run(crash_after_page(3))
    checkpoint = tmp_path / "out" / ledger_items(tmp_path)["long-000.pdf"].artifact_path
    with open(checkpoint, "r+b") as handle:
        handle.truncate(100)
    _forget_job_outputs(tmp_path)
    counts = run()
    item = ledger_items(tmp_path)["long-000.pdf"]
    assert item.state is S.NEEDS_REVIEW and "checkpoint" in item.reason
    assert "could not be fetched again" in item.reason
    assert counts["done"] == 3
    assert max(page_executions(provider).values()) == 1  # nothing re-executed on a bad checkpoint


def test_other_options_never_resume_another_identitys_checkpoint(tmp_path, batch):
    inputs, run, provider = batch
    run(crash_after_page(2), options={"target": "de"})
    german = ledger_items(tmp_path)["long-000.pdf"]
    run(options={"target": "fr"})
    with open_ledger(tmp_path / "ledger.sqlite") as ledger:
        french = [i for i in ledger.items() if i.source == "long-000.pdf" and i.key != german.key]
        assert ledger.get(german.key).state is S.PARTIAL  # untouched: another request
    assert len(french) == 1 and french[0].state is S.DONE and french[0].pages_done == PAGES
    assert "Facture" in documents.page_texts(tmp_path / "out" / french[0].artifact_path)[0]
    first_french_page = [c for c in provider.calls()
                         if c["op"] == "submit" and document_of(c["task_key"]) == french[0].key][0]
    assert first_french_page["idem_key"] == f"{page_key(french[0].key, 1)}:1"  # from page 1


def test_page_routing_is_part_of_the_request_identity(tmp_path):
    path = documents.make_corpus(tmp_path, docs=0, poison=0, long_docs=1, long_pages=PAGES)[0]
    whole = file_task_key(path, routed_options({}, PAGES, None))
    paged = file_task_key(path, routed_options({}, PAGES, FROM))
    assert whole != paged
    assert routed_options({}, PAGES, PAGES + 1) == {}  # a shorter document than the threshold


def test_partial_item_is_cancelled_locally_without_cancelling_a_finished_page_job(
        tmp_path, batch):
    inputs, run, provider = batch
    run(crash_after_page(2), lease_ttl=0.0)  # the lease of a dead process: expired at once
    key = ledger_items(tmp_path)["long-000.pdf"].key
    with open_ledger(tmp_path / "ledger.sqlite") as ledger:
        assert cancel(ledger, provider, key) is S.CANCELLED
        assert ledger.get(key).state is S.CANCELLED
    assert not [c for c in provider.calls() if c["op"] == "cancel"]
    run()
    assert ledger_items(tmp_path)["long-000.pdf"].state is S.CANCELLED  # never retried
    assert not any(document_of(c["task_key"]) == key and c["idem_key"].endswith("p3:1")
                   for c in provider.calls())


def test_done_short_of_pages_or_missing_a_page_execution_is_fake_done(tmp_path, batch):
    inputs, run, provider = batch
    run()
    h = history(tmp_path, provider, inputs)
    assert check(h).valid is True
    key = ledger_items(tmp_path)["long-000.pdf"].key
    short = {**h.items, key: dataclasses.replace(h.items[key], pages_done=2)}
    verdict = check(dataclasses.replace(h, items=short))  # "done" after page 2 of 6
    assert [a.key for a in verdict.anomalies["fake_done"]] == [key]
    assert f"done after page 2 of {PAGES}" in verdict.anomalies["fake_done"][0].detail
    without_page_3 = tuple(x for x in h.executions if x.task_key != page_key(key, 3))
    verdict = check(dataclasses.replace(h, executions=without_page_3))
    assert [a.key for a in verdict.anomalies["fake_done"]] == [key]
    assert "page(s) [3]" in verdict.anomalies["fake_done"][0].detail


def test_each_page_needs_its_own_intent_before_it_executes(tmp_path, batch):
    """Moving page 3's intent after page 3's submit is caught, though pages 1-2 had intents."""
    inputs, run, provider = batch
    run()
    h = history(tmp_path, provider, inputs)
    key = ledger_items(tmp_path)["long-000.pdf"].key
    submit = next(c for c in h.calls if c.op == "submit" and c.task_key == page_key(key, 3))
    intent = next(e for e in h.events if e.key == key and e.op == "move"
                  and e.to is S.UNKNOWN and e.detail.get("pages_done") == 2)
    late = tuple(dataclasses.replace(e, ts=submit.ts + 1) if e is intent else e for e in h.events)
    verdict = check(dataclasses.replace(h, events=late))
    assert [a.key for a in verdict.anomalies["unrecorded_execution"]] == [page_key(key, 3)]


def test_process_one_page_and_reject_a_page_the_document_lacks(tmp_path):
    path = documents.make_corpus(tmp_path, docs=0, poison=0, long_docs=1, long_pages=3)[0]
    one = documents.process(path, tmp_path / "p2.pdf", {"page": 2})
    assert len(documents.page_texts(one.path)) == 1
    assert "Seite 2 von 3" in documents.page_texts(one.path)[0]
    with pytest.raises(PermanentError, match="no page 4"):
        documents.process(path, tmp_path / "p4.pdf", {"page": 4})
    first = documents.concat([tmp_path / "p2.pdf", tmp_path / "p2.pdf"], tmp_path / "a.pdf")
    again = documents.concat([tmp_path / "p2.pdf", tmp_path / "p2.pdf"], tmp_path / "b.pdf")
    assert first.sha256 == again.sha256  # assembly is byte-identical


def test_old_sqlite_ledger_gains_the_pages_column_and_keeps_its_items(tmp_path):
    path = tmp_path / "old.sqlite"
    with open_ledger(path) as ledger:
        ledger.add("k1", source="a.pdf")
    db = sqlite3.connect(path)  # make it look like a ledger written before pages_done existed
    db.execute("ALTER TABLE items DROP COLUMN pages_done")
    db.commit()
    db.close()
    with open_ledger(path) as ledger:
        item = ledger.get("k1")
        assert item.state is S.PENDING and item.pages_done is None
        ledger.move("k1", S.PENDING, S.UNKNOWN, pages_done=0)
        assert ledger.get("k1").pages_done == 0
        assert ledger.get("k1").request_key == f"{page_key('k1', 1)}:1"


def test_cli_page_by_page_bad_values_are_one_line_errors(tmp_path):
    documents.make_corpus(tmp_path / "in", docs=1, poison=0)
    base = [sys.executable, "-m", "toolkit", "run", "--inputs", str(tmp_path / "in"),
            "--ledger", str(tmp_path / "l.sqlite"), "--provider-db", str(tmp_path / "p.db"),
            "--out", str(tmp_path / "out")]
    for extra, message in ((["--page-by-page-from", "0"], "must be >= 1"),
                           (["--page-by-page-from", "3", "--strategy", "no-lease"],
                            "does not send long documents page by page")):
        done = subprocess.run(base + extra, capture_output=True, text=True)
        assert done.returncode != 0 and message in done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "l.sqlite").exists()  # refused before anything was recorded


@pytest.mark.parametrize("contract", ["idempotent", "non-idempotent"])
def test_sigkill_mid_document_then_rerun_executes_every_page_at_most_once(tmp_path, contract):
    inputs = documents.make_corpus(tmp_path / "in", docs=1, poison=0, long_docs=2, long_pages=8)
    db = tmp_path / "provider.db"
    command = [sys.executable, "-m", "toolkit", "run", "--inputs", str(tmp_path / "in"),
               "--ledger", str(tmp_path / "ledger.sqlite"), "--provider-db", str(db),
               "--out", str(tmp_path / "out"), "--contract", contract, "--json",
               "--page-by-page-from", "5"]

    cut = []

    def a_long_document_was_cut():
        if (tmp_path / "ledger.sqlite").exists():
            with open_ledger(tmp_path / "ledger.sqlite") as ledger:
                cut.append(any(item.pages_done is not None and item.state is not S.DONE
                               for item in ledger.items()))
    # inside the first long document, then inside the second
    kills = sigkill_at_executions(command, db, (3, 7, 12), a_long_document_was_cut)
    assert kills >= 2 and any(cut)  # at least one kill cut a long document
    final = run_until_rest(command)
    assert final.returncode == 0, final.stderr
    by_state = json.loads(final.stdout)["by_state"]
    stats = provider_stats(db)
    assert all(row["succeeded"] <= 1 for row in stats["per_task"].values())
    units = [unit for unit in stats["per_task"] if "#p" in unit]
    if contract == "idempotent":
        assert by_state["done"] == 3 and len(units) == 16
        assert stats["succeeded"] == 1 + 16  # not one page more than the work
    else:
        assert all(row["submit_calls"] == 1 for row in stats["per_task"].values())
        assert by_state["done"] + by_state["needs_review"] == 3
    with provider_at(db, parse_contract(contract)) as provider:
        verdict = check(collect_history(tmp_path / "ledger.sqlite", provider, inputs,
                                        provider.contract, ({},), 5))
    assert verdict.valid is True, verdict.anomalies


def test_audit_plans_resume_for_an_intact_checkpoint_and_review_for_a_damaged_one(tmp_path, batch):
    from toolkit.forensics import audit

    inputs, run, provider = batch
    run(crash_after_page(2))
    item = ledger_items(tmp_path)["long-000.pdf"]
    report = audit(tmp_path / "ledger.sqlite", artifacts=tmp_path / "out", inputs=tmp_path / "in")
    row = report.items.set_index("key").loc[item.key]
    assert (row["state"], row["action"]) == ("partial", "run") and "next page" in row["why"]
    with open(tmp_path / "out" / item.artifact_path, "r+b") as handle:
        handle.truncate(10)
    report = audit(tmp_path / "ledger.sqlite", artifacts=tmp_path / "out", inputs=tmp_path / "in")
    row = report.items.set_index("key").loc[item.key]
    assert row["action"] == "review" and "checkpoint" in row["why"]


def test_old_postgres_ledger_gains_the_pages_column_and_keeps_its_items(pg_url):
    import psycopg

    with open_ledger(pg_url) as ledger:
        ledger.add("k1", source="a.pdf")
    with psycopg.connect(pg_url, autocommit=True) as conn:  # as written before pages_done existed
        conn.execute("ALTER TABLE items DROP COLUMN pages_done")
    with open_ledger(pg_url) as ledger:
        assert ledger.get("k1").state is S.PENDING and ledger.get("k1").pages_done is None
        ledger.move("k1", S.PENDING, S.UNKNOWN, pages_done=0)
        assert ledger.get("k1").request_key == f"{page_key('k1', 1)}:1"


def test_cancel_between_pages_cancels_the_page_in_flight_not_a_finished_page(tmp_path):
    inputs = documents.make_corpus(tmp_path / "in", docs=0, poison=0, long_docs=1,
                                   long_pages=PAGES)
    provider = FakeProvider(tmp_path / "provider.db", tmp_path / "jobs",
                            Contract(idempotent_keys=False, run_polls=3))

    def die_after_page_3_submit(point, key, **context):
        if point == "after_submit" and context["job"].idem_key.endswith("#p3:1"):
            raise Crash()
    runner = Runner(open_ledger(tmp_path / "ledger.sqlite"), provider, tmp_path / "out",
                    policy=RetryPolicy(base_delay=0.0), sleep=lambda s: None, lease_ttl=0.0,
                    hook=die_after_page_3_submit, page_by_page_from=FROM)
    with pytest.raises(Crash):
        runner.run(inputs)
    runner.close()
    with open_ledger(tmp_path / "ledger.sqlite") as ledger:
        item = ledger.items()[0]
        assert item.state is S.UNKNOWN and item.pages_done == 2 and item.job_id  # page 2's job
        cancel(ledger, provider, item.key)
    jobs = {job.idem_key: job.status.value for job in provider.jobs()}
    assert jobs[f"{page_key(item.key, 3)}:1"] == "cancelled"
    assert jobs[f"{page_key(item.key, 2)}:1"] == "succeeded"
    provider.close()


def test_failed_page_is_not_sent_again_on_a_damaged_checkpoint(tmp_path, batch, monkeypatch):
    inputs, run, provider = batch
    real = documents.process

    def page_4_fails(source, output, options):
        if options.get("page") == 4:
            raise OSError(28, "No space left on device")
        return real(source, output, options)
    monkeypatch.setattr("toolkit.provider.fake.documents.process", page_4_fails)
    run()  # page 4 fails on every attempt of this run: the budget is spent
    item = ledger_items(tmp_path)["long-000.pdf"]
    assert (item.state, item.failure, item.pages_done) == (S.FAILED, "transient", 3)
    monkeypatch.setattr("toolkit.provider.fake.documents.process", real)
    with open(tmp_path / "out" / item.artifact_path, "r+b") as handle:
        handle.truncate(100)
    _forget_job_outputs(tmp_path)  # else the checkpoint is rebuilt from its pages' jobs
    sent = len(provider.calls())
    run()
    item = ledger_items(tmp_path)["long-000.pdf"]
    assert item.state is S.NEEDS_REVIEW and "checkpoint" in item.reason
    assert not [c for c in provider.calls()[sent:]
                if c["op"] == "submit" and document_of(c["task_key"]) == item.key]


def test_damaged_page_by_page_output_is_assembled_again_from_its_pages_never_re_executed(
        tmp_path, batch):
    inputs, run, provider = batch
    run()
    item = ledger_items(tmp_path)["long-000.pdf"]
    executed = provider.stats()["executions"]
    with open(tmp_path / "out" / item.artifact_path, "r+b") as handle:
        handle.truncate(200)
    run()
    again = ledger_items(tmp_path)["long-000.pdf"]
    assert again.state is S.DONE and again.artifact_sha256 == item.artifact_sha256
    assert documents.verify(tmp_path / "out" / again.artifact_path, again.artifact_size,
                            again.artifact_sha256)
    assert provider.stats()["executions"] == executed
    for job in provider.jobs():  # the provider lost its results: nothing to assemble from
        if document_of(job.task_key) == item.key:
            Path(job.artifact_path).unlink()
    Path(tmp_path / "out" / item.artifact_path).unlink()
    run()
    assert ledger_items(tmp_path)["long-000.pdf"].state is S.NEEDS_REVIEW
    assert provider.stats()["executions"] == executed


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_two_worker_processes_send_each_page_of_each_long_document_once(tmp_path, backend,
                                                                         request):
    from toolkit.runner.workers import run_workers

    ledger = tmp_path / "ledger.sqlite" if backend == "sqlite" else \
        request.getfixturevalue("pg_url")
    inputs = documents.make_corpus(tmp_path / "in", docs=2, poison=0, long_docs=3,
                                   long_pages=PAGES)
    result = run_workers(ledger, tmp_path / "provider.db", inputs, tmp_path / "out", 2,
                         Contract(idempotent_keys=False), policy=RetryPolicy(base_delay=0.0),
                         page_by_page_from=FROM)
    assert result.errors == [] and result.counts["done"] == 5 and result.unsettled == 0
    stats = provider_stats(tmp_path / "provider.db")
    units = [unit for unit in stats["per_task"] if "#p" in unit]
    assert len(units) == 3 * PAGES and stats["succeeded"] == 2 + 3 * PAGES
    assert all(row["submit_calls"] == 1 for row in stats["per_task"].values())


def test_cheap_page_count_for_routing_equals_preflights_for_healthy_long_and_poison(tmp_path):
    """Routing reads only the page count; it must key exactly as the full preflight would."""
    paths = documents.make_corpus(tmp_path, docs=3, poison=8, long_docs=1, long_pages=PAGES)
    (tmp_path / "missing.pdf").unlink(missing_ok=True)
    for path in [*paths, tmp_path / "missing.pdf"]:
        assert documents.page_count(path) == documents.preflight(path).pages, path.name


def test_page_by_page_output_gets_the_same_file_mode_as_a_whole_document_output(tmp_path, batch):
    """Fault: outputs joined from pages were written through a 0600 temp file while
    fetched whole documents get the umask's mode. Property: every output of the batch
    has one and the same mode."""
    inputs, run, provider = batch
    run()
    modes = {item.source: os.stat(tmp_path / "out" / item.artifact_path).st_mode & 0o777
             for item in ledger_items(tmp_path).values() if item.state is S.DONE}
    assert len(modes) == 4 and len(set(modes.values())) == 1, modes
