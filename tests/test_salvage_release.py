"""A salvaged ledger's parked items released by a person, then run (outsider o33 Q2).

Salvage parks every item not settled for good: the lost lines MAY hold a request of it.
Released (``resolve --release``, one key or ``--all --reason salvaged``), such an item is
``unknown``; where keys are not idempotent the run looked it up once round (attempts n..
n+9), found nothing, and parked it again ("intent recorded, provider has no job, contract
forbids a resubmit"): a document never sent was never done, and every release looped.
Now a released item on a salvaged ledger is decided as a new request is: a job found is
adopted (never executed again); none found, it is sent, once.

Every fault is made on real files of real runs (CLI processes; a non-idempotent fake
provider whose database counts executions): lines of a real ledger deleted, salvaged.
"""

import json
import shutil
import subprocess
import sys

import pytest

from toolkit.documents import make_corpus, verify
from toolkit.ledger import open_ledger
from toolkit.provider import provider_stats
from toolkit.provider.records import provider_records

pytestmark = pytest.mark.slow

TOOLKIT = [sys.executable, "-m", "toolkit"]


def _toolkit(*args):
    return subprocess.run([*TOOLKIT, *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def _run(tmp_path, ledger, *extra):
    return _toolkit("run", "--inputs", tmp_path / "in", "--ledger", ledger, "--provider-db",
                    tmp_path / "p.db", "--out", tmp_path / "out", "--contract",
                    "non-idempotent", "--no-progress", *extra)


def _keys(ledger) -> dict[str, str]:
    with open_ledger(ledger) as opened:
        return {item.source: item.key for item in opened.items()}


@pytest.fixture
def salvaged_batch(tmp_path):
    """Three documents run to done; three more added and every request of theirs refused
    (a transient storm: the provider holds no job of them); then every line of one done
    document and of the three refused ones but its ``add`` deleted (the lines that held
    their intents lost), and ``ledger L --salvage S --out OUT``. Returns (the keys of the
    never executed documents, the key of the executed one whose lines were lost)."""
    make_corpus(tmp_path / "all", docs=6, poison=0, seed=7)
    names = sorted(path.name for path in (tmp_path / "all").iterdir())
    (tmp_path / "in").mkdir()
    for name in names[:3]:
        shutil.copy2(tmp_path / "all" / name, tmp_path / "in" / name)
    ledger = tmp_path / "L.jsonl"
    assert _run(tmp_path, ledger).returncode == 0
    for name in names[3:]:
        shutil.copy2(tmp_path / "all" / name, tmp_path / "in" / name)
    storm = _run(tmp_path, ledger, "--transient-rate", "1.0", "--seed", "1")
    assert "Traceback" not in storm.stderr, storm.stderr
    keys = _keys(ledger)
    unsent, sent = [keys[name] for name in names[3:]], keys[names[0]]
    stats = provider_stats(tmp_path / "p.db")["per_task"]
    assert all(stats.get(key, {}).get("executions", 0) == 0 for key in unsent)
    assert stats[sent]["executions"] == 1
    lines = ledger.read_bytes().splitlines(keepends=True)
    lost = {*unsent, sent}
    ledger.write_bytes(lines[0] + b"".join(
        line for line in lines[1:]
        if json.loads(line)["key"] not in lost or json.loads(line)["op"] == "add"))
    return unsent, sent


def _salvage(tmp_path, name):
    new = tmp_path / name
    done = _toolkit("ledger", tmp_path / "L.jsonl", "--salvage", new, "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    with open_ledger(new) as opened:
        parked = {item.key for item in opened.items() if item.state == "needs_review"}
    return new, parked


def _all_done_once(tmp_path, ledger, unsent, sent):
    """Every document done (artifact verified), each executed exactly once: the never
    sent ones once by this run, the sent one adopted (not executed again)."""
    with open_ledger(ledger) as opened:
        items = list(opened.items())
    assert {item.state for item in items} == {"done"}, [(i.key[:8], i.state, i.reason)
                                                         for i in items]
    for item in items:
        assert verify(tmp_path / "out" / item.artifact_path, item.artifact_size,
                      item.artifact_sha256)
    stats = provider_stats(tmp_path / "p.db")
    assert {key: stats["per_task"][key]["executions"] for key in [*unsent, sent]} == \
        dict.fromkeys([*unsent, sent], 1)
    assert stats["executions"] == 6


@pytest.mark.parametrize("name", ["S.jsonl", "S.sqlite"])
def test_salvage_parked_never_sent_released_in_bulk_each_sent_once_and_done(
        tmp_path, salvaged_batch, name):
    """Fault: a salvage (JSONL or SQLite new ledger) parked three documents whose refused
    intents the lost lines held (the provider has no job of them) and one whose executed
    job they held. Property: after ``resolve --all --reason salvaged --release`` one run
    ends every document done, exit 0: each never executed one sent and executed exactly
    once (after its attempts were looked up), the executed one adopted (0 doubles)."""
    unsent, sent = salvaged_batch
    new, parked = _salvage(tmp_path, name)
    assert parked == {*unsent, sent}
    released = _toolkit("resolve", "--ledger", new, "--all", "--reason", "salvaged",
                        "--release", "--note", "ok")
    assert released.returncode == 0 and "released 4, skipped 0" in released.stderr, \
        released.stderr
    submits = provider_stats(tmp_path / "p.db")["submit_calls"]
    rerun = _run(tmp_path, new)
    assert rerun.returncode == 0, (rerun.stdout, rerun.stderr)
    _all_done_once(tmp_path, new, unsent, sent)
    assert provider_stats(tmp_path / "p.db")["submit_calls"] == submits + 3
    calls = provider_records(tmp_path / "p.db")["calls"]
    for key in unsent:  # looked up (attempt n and the later ones) before the one send
        ops = [call["op"] for call in calls if call["task_key"] == key][-12:]
        assert "lookup" in ops and ops.count("submit") == 1, ops
    again = _run(tmp_path, new)
    assert again.returncode == 0 and provider_stats(tmp_path / "p.db")["executions"] == 6


def test_salvage_parked_never_sent_released_one_key_at_a_time_each_sent_once_and_done(
        tmp_path, salvaged_batch):
    """Fault: as above, the parked items released one ``--key`` at a time (the single
    resolve). Property: the same: every document done, each executed exactly once, the
    executed one adopted; no item parked again."""
    unsent, sent = salvaged_batch
    new, parked = _salvage(tmp_path, "S.jsonl")
    for key in sorted(parked):
        done = _toolkit("resolve", "--ledger", new, "--key", key, "--release", "--note",
                        "checked at the provider")
        assert done.returncode == 0, done.stderr
    rerun = _run(tmp_path, new)
    assert rerun.returncode == 0, (rerun.stdout, rerun.stderr)
    _all_done_once(tmp_path, new, unsent, sent)


def test_salvage_parked_released_item_whose_key_names_a_file_is_parked_naming_it_not_sent(
        tmp_path, salvaged_batch):
    """Fault: a released never-sent item of a salvaged ledger, and a file under --out
    named for its key (``<stem>.<key8>.pdf``: it may be the output of a send the lost lines
    held, its job since forgotten). Property: the run does not send it (0 executions); it
    is parked with a reason naming the file; the other released items are done."""
    unsent, sent = salvaged_batch
    new, _ = _salvage(tmp_path, "S.jsonl")
    stray = tmp_path / "out" / f"copy.{unsent[0][:8]}.pdf"
    shutil.copy2(next((tmp_path / "out").glob("*.pdf")), stray)
    assert _toolkit("resolve", "--ledger", new, "--all", "--reason", "salvaged", "--release",
                    "--note", "ok").returncode == 0
    rerun = _run(tmp_path, new)
    assert rerun.returncode == 0, (rerun.stdout, rerun.stderr)
    with open_ledger(new) as opened:
        item = opened.get(unsent[0])
        others = [opened.get(key).state for key in [*unsent[1:], sent]]
    assert item.state == "needs_review" and str(stray) in item.reason, item
    assert others == ["done"] * 3
    assert provider_stats(tmp_path / "p.db")["per_task"].get(unsent[0], {}).get(
        "executions", 0) == 0


def test_salvage_parked_long_document_never_started_released_is_sent_page_by_page_once(
        tmp_path):
    """Fault: a long document (4 pages, ``--page-by-page-from 4``) whose every page
    request was refused (a transient storm: no job), then every line of it but its ``add``
    deleted: salvaged, it is parked as ``pending`` was (no page on record), and released.
    Property: the run asks for and sends its first page, then the rest, one request per
    page (never one whole-document request, which the checkpoint step could not take: it
    raised a TypeError), executed once each; done with no reason left from the release
    (a page's intent clears it, so a later crash is judged as this ledger's own intent)."""
    make_corpus(tmp_path / "in", docs=0, poison=0, seed=7, long_docs=1, long_pages=4)
    ledger, paged = tmp_path / "L.jsonl", ("--page-by-page-from", "4")
    storm = _run(tmp_path, ledger, *paged, "--transient-rate", "1.0", "--seed", "1")
    assert "Traceback" not in storm.stderr, storm.stderr
    (key,) = _keys(ledger).values()
    lines = ledger.read_bytes().splitlines(keepends=True)
    ledger.write_bytes(lines[0] + b"".join(line for line in lines[1:]
                                           if json.loads(line)["op"] == "add"))
    new, parked = _salvage(tmp_path, "S.jsonl")
    assert parked == {key}
    assert _toolkit("resolve", "--ledger", new, "--all", "--reason", "salvaged", "--release",
                    "--note", "ok").returncode == 0
    rerun = _run(tmp_path, new, *paged)
    assert rerun.returncode == 0 and "Traceback" not in rerun.stderr, rerun.stderr
    with open_ledger(new) as opened:
        item = opened.get(key)
    assert (item.state, item.pages_done, item.reason) == ("done", 4, None), item
    sent = [call["idem_key"] for call in provider_records(tmp_path / "p.db")["calls"]
            if call["op"] == "submit" and call["outcome"] != "transient"]
    assert sent == [f"{key}#p{page}:1" for page in range(1, 5)], sent
    per_page = {task: stats["executions"] for task, stats in
                provider_stats(tmp_path / "p.db")["per_task"].items() if task.startswith(key)}
    assert sorted(per_page.values()) == [1] * 4, per_page
