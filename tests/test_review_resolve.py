"""An operator decides parked items: ``review`` lists them, ``resolve`` records one decision.

The parked item comes from a real cause: a run dies right after an item's intent, against
a provider whose keys are not idempotent; the next run looks the key up, finds no job and
may not resubmit, so it parks the item in ``needs_review``.
"""

import json
import subprocess
import sys

import pytest

from conftest import Crash, crash_once_at
from toolkit.cli import main
from toolkit.documents.render import pdf_bytes
from toolkit.forensics import audit
from toolkit.ledger import State, open_ledger
from toolkit.provider import Contract, FakeProvider
from toolkit.runner import RetryPolicy, Runner

S = State


def run_batch(tmp_path, provider, inputs, hook=None):
    runner = Runner(open_ledger(tmp_path / "ledger.sqlite"), provider, tmp_path / "out",
                    policy=RetryPolicy(base_delay=0.0), hook=hook, sleep=lambda seconds: None)
    try:
        return runner.run(inputs)
    finally:
        runner.close()


@pytest.fixture
def parked(tmp_path, small_corpus):
    """(ledger path, provider, corpus, parked key): one item in needs_review for real."""
    provider = FakeProvider(tmp_path / "provider.db", tmp_path / "jobs",
                            Contract(idempotent_keys=False))
    crash = crash_once_at("after_intent")
    with pytest.raises(Crash):
        run_batch(tmp_path, provider, small_corpus, crash)
    counts = run_batch(tmp_path, provider, small_corpus)
    assert counts["needs_review"] == 1
    yield tmp_path / "ledger.sqlite", provider, small_corpus, crash.keys[0]
    provider.close()


def cli(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return status, out, err


def snapshot(path):
    with open_ledger(path) as ledger:
        return ledger.items(), len(ledger.events())


def test_review_lists_the_parked_item_with_its_reason_job_lookups_and_history(parked, capsys):
    """Must hold: every needs_review item, with why it was parked and the evidence: no job,
    one lookup answered (not found), its history from add to the park."""
    path, _, _, key = parked
    status, out, _ = cli(capsys, "review", "--ledger", path, "--json")
    [item] = json.loads(out)["needs_review"]
    assert status == 0 and item["key"] == key
    assert "contract forbids a resubmit" in item["reason"]
    assert (item["job_id"], item["lookups"], item["artifact_path"]) == (None, 1, None)
    assert item["history"][0].startswith("add") and "needs_review" in item["history"][-1]
    status, text, _ = cli(capsys, "review", "--ledger", path)
    assert status == 0 and key in text and "lookups 1" in text


def test_ledger_json_prints_every_item_with_state_attempt_quarantine_reason_and_artifact(
        parked, capsys):
    """Must hold: ``ledger PATH --json`` lists every item (not only counts): the poison input
    quarantined by preflight with its ``poison:`` reason, each done item with its artifact,
    the parked one with why it was parked."""
    path, _, _, key = parked
    status, out, _ = cli(capsys, "ledger", path, "--json")
    document = json.loads(out)
    rows = {row["key"]: row for row in document["per_item"]}
    assert status == 0 and len(rows) == document["items"] == 5
    [poison] = [row for row in rows.values() if row["state"] == "failed"]
    assert poison["failure"] == "permanent" and poison["reason"].startswith("poison:")
    done = [row for row in rows.values() if row["state"] == "done"]
    assert len(done) == 3 and all(row["artifact_path"] and len(row["artifact_sha256"]) == 64
                                  and row["artifact_size"] > 0 and row["attempt"] == 1
                                  for row in done)
    assert "contract forbids a resubmit" in rows[key]["reason"]


def test_release_goes_back_to_unknown_and_the_next_run_looks_up_never_resubmits(parked, capsys,
                                                                                 tmp_path):
    """What breaks: the operator releases an item whose intent was recorded but whose submit
    may or may not have happened. Must hold: it goes back to unknown with the note in the
    event, and the next run reconciles it by lookup: with no job and a non-idempotent
    provider it is parked again, never sent blindly (the provider saw no call for it)."""
    path, provider, corpus, key = parked
    status, _, err = cli(capsys, "resolve", "--ledger", path, "--key", key, "--release",
                         "--note", "checked the provider console: nothing ran")
    assert status == 0 and "needs_review -> unknown" in err
    with open_ledger(path) as ledger:
        assert ledger.get(key).state is S.UNKNOWN and ledger.get(key).lease_owner is None
        move = [e for e in ledger.events() if e.key == key and e.op == "move"][-1]
        assert (move.frm, move.to) == (S.NEEDS_REVIEW, S.UNKNOWN)
        assert move.detail["note"] == "checked the provider console: nothing ran"
    counts = run_batch(tmp_path, provider, corpus)
    assert counts["needs_review"] == 1 and key not in provider.stats()["per_task"]


def test_accept_artifact_records_a_verified_pdf_as_done_and_the_audit_skips_it(parked, capsys,
                                                                              tmp_path):
    """Must hold: a whole PDF inside the outputs root becomes the item's artifact (path
    relative to the root, size, SHA-256); the audit verifies it (skip) and the next run
    leaves it alone (no submit for it)."""
    path, provider, corpus, key = parked
    made = tmp_path / "out" / "recovered.pdf"
    made.write_bytes(pdf_bytes(["recovered from the provider's console"]))
    status, _, _ = cli(capsys, "resolve", "--ledger", path, "--key", key, "--accept-artifact",
                       made, "--note", "downloaded by hand")
    assert status == 0
    with open_ledger(path) as ledger:
        item = ledger.get(key)
    assert (item.state, item.artifact_path, item.artifact_size) == \
        (S.DONE, "recovered.pdf", made.stat().st_size)
    report = audit(path, artifacts=tmp_path / "out")
    assert dict(zip(report.items["key"], report.items["action"]))[key] == "skip"
    assert not [a for a in report.anomalies if a.key == key]
    assert run_batch(tmp_path, provider, corpus)["done"] == 4
    assert key not in provider.stats()["per_task"]


def make_small(path, out=None):
    """keys: parked (needs_review), waiting (pending); an outputs folder (``out``, else
    beside the ledger) with a cut PDF."""
    with open_ledger(path) as ledger:
        ledger.add("parked", "a.pdf")
        ledger.move("parked", S.PENDING, S.UNKNOWN)
        ledger.move("parked", S.UNKNOWN, S.NEEDS_REVIEW, reason="artifact damaged")
        ledger.add("waiting", "b.pdf")
    out = path.parent / "out" if out is None else out
    out.mkdir()
    (out / "cut.pdf").write_bytes(pdf_bytes(["half"])[:-150])
    return path


@pytest.fixture(params=["sqlite", "jsonl"])
def small_ledger(request, tmp_path):
    return make_small(tmp_path / f"l.{request.param}")


def test_cancel_records_cancelled_with_the_note_on_both_file_ledgers(small_ledger, capsys):
    status, _, _ = cli(capsys, "resolve", "--ledger", small_ledger, "--key", "parked",
                       "--cancel", "--note", "customer withdrew it")
    with open_ledger(small_ledger) as ledger:
        assert status == 0 and ledger.get("parked").state is S.CANCELLED
        assert ledger.events()[-2].detail["note"] == "customer withdrew it"  # then the release


@pytest.mark.parametrize("args, message", [
    (["--key", "nope", "--release"], "no item 'nope'"),
    (["--key", "waiting", "--cancel"], "is pending, not needs_review"),
    (["--key", "parked", "--accept-artifact", "{out}/cut.pdf", "--out", "{out}"],
     "not a whole, readable PDF"),
    (["--key", "parked", "--accept-artifact", "{out}/missing.pdf", "--out", "{out}"],
     "no such file"),
    (["--key", "parked", "--release", "--note", " "], "--note must say why"),
])
def test_bad_resolve_input_is_one_line_exit_2_and_changes_nothing(small_ledger, args, message,
                                                                 capsys):
    """Bad input (unknown key, an item not parked, a file that is not a whole PDF, a missing
    file, an empty note): one line on stderr, exit 2, no event written."""
    out = str(small_ledger.parent / "out")
    args = [arg.replace("{out}", out) for arg in args]
    before = snapshot(small_ledger)
    note = [] if "--note" in args else ["--note", "n"]
    status, _, err = cli(capsys, "resolve", "--ledger", small_ledger, *args, *note)
    assert (status, err.count("\n")) == (2, 1) and message in err
    assert snapshot(small_ledger) == before


def test_resolve_on_a_missing_ledger_is_exit_2_and_creates_nothing(tmp_path, capsys):
    status, _, err = cli(capsys, "resolve", "--ledger", tmp_path / "typo.jsonl", "--key", "k",
                         "--release", "--note", "n")
    assert status == 2 and "no ledger" in err and list(tmp_path.iterdir()) == []


HOLD = """
import sys
from toolkit.ledger import open_ledger
ledger = open_ledger(sys.argv[1])
if sys.argv[2] == "lease":
    ledger.claim("parked", "live-worker", ttl=3600.0)
    ledger.close()  # the lease stays recorded; this process stays alive
print("holding", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


@pytest.mark.slow
@pytest.mark.parametrize("suffix, hold, said", [
    ("jsonl", "lock", "another writer"),   # a running batch holds the JSONL writer lock
    ("sqlite", "lease", "live worker"),    # a live worker holds the item's lease
    ("postgres", "lease", "live worker"),  # the same, on a server (needs TOOLKIT_TEST_PG)
])
def test_resolve_against_a_live_holder_is_refused_exit_1_then_succeeds_once_it_exits(
        tmp_path, suffix, hold, said, capsys, request):
    """What breaks: a live process holds the ledger (JSONL: its one writer) or the item's
    lease (SQLite and PostgreSQL: many writers, fenced by leases) while the operator
    resolves. Must hold: resolve answers "run again" (exit 1, one line) and writes nothing,
    while review still lists the item (a private copy of a file; a PostgreSQL read); once
    that process has exited, the same command succeeds (a dead owner's lease is taken,
    fenced)."""
    if suffix == "postgres":
        path = make_small(request.getfixturevalue("pg_url"), tmp_path / "out")
    else:
        path = make_small(tmp_path / f"l.{suffix}")
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), hold],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "holding\n"
        # JSONL: the file's bytes (the holder's lock keeps us out); SQLite: items and events
        look = (lambda: path.read_bytes()) if suffix == "jsonl" else (lambda: snapshot(path))
        before = look()
        status, _, err = cli(capsys, "resolve", "--ledger", path, "--key", "parked",
                             "--release", "--note", "n")
        assert (status, err.count("\n")) == (1, 1) and said in err
        assert look() == before
        status, out, _ = cli(capsys, "review", "--ledger", path, "--json")  # never waits
        assert status == 0 and [i["key"] for i in json.loads(out)["needs_review"]] == ["parked"]
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    status, _, _ = cli(capsys, "resolve", "--ledger", path, "--key", "parked",
                       "--release", "--note", "n")
    with open_ledger(path) as ledger:
        assert status == 0 and ledger.get("parked").state is S.UNKNOWN


# -- the same decisions on a PostgreSQL ledger (needs TOOLKIT_TEST_PG; CI starts a server) ------

def park_three(url, out):
    """keys a, b, c parked (needs_review) in a PostgreSQL ledger; ``out`` holds a whole PDF."""
    with open_ledger(url) as ledger:
        for key in ("a", "b", "c"):
            ledger.add(key, f"{key}.pdf")
            ledger.move(key, S.PENDING, S.UNKNOWN)
            ledger.move(key, S.UNKNOWN, S.NEEDS_REVIEW, reason="no job found, no resubmit")
    out.mkdir()
    (out / "c.pdf").write_bytes(pdf_bytes(["c, recovered by hand"]))


def test_release_cancel_and_accept_on_postgres_are_each_one_move_event_with_the_note(
        pg_url, tmp_path, capsys):
    """Fault: three items parked in a PostgreSQL ledger (its schema, its own transactions).
    Must hold: review lists all three; release, cancel and accept-artifact each record one
    needs_review move (the note in its detail) between the operator's claim and release;
    the accepted PDF is the item's artifact (relative to --out: a URL records no root) and
    the audit of the URL verifies it (skip); review then lists nothing."""
    out = tmp_path / "out"
    park_three(pg_url, out)
    status, listed, _ = cli(capsys, "review", "--ledger", pg_url, "--json")
    assert status == 0 and [i["key"] for i in json.loads(listed)["needs_review"]] == \
        ["a", "b", "c"]
    for key, decision in (("a", ["--release"]), ("b", ["--cancel"]),
                          ("c", ["--accept-artifact", out / "c.pdf", "--out", out])):
        status, _, err = cli(capsys, "resolve", "--ledger", pg_url, "--key", key, *decision,
                             "--note", f"decided {key}")
        assert status == 0 and err.count("\n") == 1
    with open_ledger(pg_url) as ledger:
        states = {key: ledger.get(key).state for key in "abc"}
        accepted = ledger.get("c")
        moves = {e.key: e for e in ledger.events() if e.op == "move" and e.frm is S.NEEDS_REVIEW}
        after = {key: [e.op for e in ledger.events() if e.key == key][-3:] for key in "abc"}
    assert states == {"a": S.UNKNOWN, "b": S.CANCELLED, "c": S.DONE}
    assert {key: (e.to, e.worker, e.detail["note"]) for key, e in moves.items()} == {
        key: (states[key], "operator", f"decided {key}") for key in "abc"}
    assert after == {key: ["claim", "move", "release"] for key in "abc"}
    assert (accepted.artifact_path, accepted.artifact_size) == \
        ("c.pdf", (out / "c.pdf").stat().st_size)
    report = audit(pg_url, artifacts=out)
    assert dict(zip(report.items["key"], report.items["action"]))["c"] == "skip"
    status, listed, _ = cli(capsys, "review", "--ledger", pg_url, "--json")
    assert status == 0 and json.loads(listed)["needs_review"] == []


def test_a_second_resolve_on_postgres_is_refused_and_writes_nothing(pg_url, tmp_path, capsys):
    """Fault: two operators decide the same item, one after the other (the second one
    read the review list before the first decided). Must hold: the second is refused with
    one line, exit 2 (the item is no longer needs_review), and no event is written."""
    park_three(pg_url, tmp_path / "out")
    assert cli(capsys, "resolve", "--ledger", pg_url, "--key", "a", "--cancel",
               "--note", "first")[0] == 0
    before = snapshot(pg_url)
    status, _, err = cli(capsys, "resolve", "--ledger", pg_url, "--key", "a", "--release",
                         "--note", "second")
    assert (status, err.count("\n")) == (2, 1) and "is cancelled, not needs_review" in err
    assert snapshot(pg_url) == before


def test_a_resolve_overtaken_on_postgres_between_its_read_and_its_lease_is_refused(pg_url,
                                                                                   tmp_path):
    """Fault: a concurrent resolve on another connection cancels the item after this one
    read it as needs_review and before it took the lease (the race, forced: the other
    decision runs inside this one's claim). Must hold: this one re-reads under its lease,
    refuses ("moved to cancelled meanwhile", run again), records no move, and gives its
    lease back; the item stays cancelled, decided once."""
    from toolkit.errors import NotReadyError
    from toolkit.runner.review import resolve

    park_three(pg_url, tmp_path / "out")
    with open_ledger(pg_url) as mine, open_ledger(pg_url) as theirs:
        claim = mine.claim

        def overtaken_claim(key, *args, **kwargs):
            resolve(theirs, key, "cancel", "the other operator", worker="other")
            return claim(key, *args, **kwargs)

        mine.claim = overtaken_claim
        with pytest.raises(NotReadyError, match="moved to cancelled meanwhile"):
            resolve(mine, "a", "release", "too late")
        item = mine.get("a")
        moves = [e for e in mine.events() if e.key == "a" and e.op == "move"
                 and e.frm is S.NEEDS_REVIEW]
    assert item.state is S.CANCELLED and item.lease_owner is None
    assert [(e.to, e.worker) for e in moves] == [(S.CANCELLED, "other")]
