"""Outsider o25's findings on ``audit --inputs`` (O3, O4, O5), each with the real thing: real
runs of real PDFs, inputs really renamed, edited, swapped and symlinked, and ledgers of a
foreign format written as their writers write them. The audit must answer as ``run`` acts:
run finds an input by content (the key is content + options), follows a symlink entry,
and never reads a name outside the folder.
"""

import json
import os
import shutil
import sqlite3

import pytest

from toolkit.cli import main
from toolkit.documents import make_corpus
from toolkit.forensics import audit
from toolkit.documents import is_input_entry
from toolkit.identity import content_digest
from toolkit.ledger import open_ledger
from toolkit.runner.inputs import scan


def run(batch, inputs="in", *extra) -> int:
    return main(["run", "--inputs", str(batch / inputs), "--ledger", str(batch / "l.sqlite"),
                 "--provider-db", str(batch / "p.sqlite"), "--out", str(batch / "out"),
                 "--no-progress", *extra])


def audit_json(capsys, ledger, inputs) -> dict:
    capsys.readouterr()
    assert main(["audit", str(ledger), "--inputs", str(inputs), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def by_source(document) -> dict:
    return {row["source"]: row for row in document["per_item"]}


def details(document, kind) -> list:
    return [a["detail"] for a in document["anomalies"] if a["kind"] == kind]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    make_corpus(root, docs=3, poison=0, seed=25)
    return root


@pytest.fixture
def batch(tmp_path, corpus):
    shutil.copytree(corpus, tmp_path / "in")
    return tmp_path


# -- O3: an input is found by content, as run finds it ----------------------------------------

def test_input_renamed_after_a_failed_run_is_input_renamed_and_planned_as_run_acts(
        batch, capsys):
    """Fault: a real run fails every item (transient), then one input is renamed. Property:
    the audit says ``input_renamed`` naming the file that now holds the content and plans
    ``retry`` (run finds it by content), never ``review`` "put it back"; the rerun does
    finish it (exit 0), and the audit then plans ``skip``, with no ``input_missing``."""
    assert run(batch, "in", "--transient-rate", "1") == 1
    victim = sorted((batch / "in").iterdir())[0]
    victim.rename(batch / "in" / "new.pdf")
    document = audit_json(capsys, batch / "l.sqlite", batch / "in")
    assert [a["kind"] for a in document["anomalies"]] == ["input_renamed"]
    assert victim.name in details(document, "input_renamed")[0]
    assert "'new.pdf'" in details(document, "input_renamed")[0]
    assert by_source(document)[victim.name]["action"] == "retry"
    assert run(batch) == 0
    document = audit_json(capsys, batch / "l.sqlite", batch / "in")
    assert [a["kind"] for a in document["anomalies"]] == ["input_renamed"]
    assert document["plan"]["skip"] == 3


def test_input_names_swapped_after_done_is_input_renamed_never_stale_and_stays_skip(
        batch, capsys):
    """Fault: after a real run to done, two inputs swap names (each name now holds the
    other's content). Property: both are ``input_renamed`` (their content is in the folder:
    a rerun executes nothing), never ``stale_input``; both stay ``skip``."""
    assert run(batch) == 0
    first, second = sorted((batch / "in").iterdir())[:2]
    first.rename(batch / "in" / "swap")
    second.rename(first)
    (batch / "in" / "swap").rename(second)
    document = audit_json(capsys, batch / "l.sqlite", batch / "in")
    assert sorted(a["kind"] for a in document["anomalies"]) == ["input_renamed"] * 2
    assert all("now holds other content" in d for d in details(document, "input_renamed"))
    assert document["plan"]["skip"] == 3


def test_input_edited_after_done_is_review_until_a_later_run_takes_it_up_then_skip(
        batch, capsys):
    """Fault: after a real run to done, one input is edited in place. Property: before a
    rerun the done item is ``stale_input`` and ``review`` (nothing did the new bytes);
    after a real rerun that does the new content as a new item, the old item is history:
    ``skip``, the ``stale_input`` finding kept, its detail naming the new item's key."""
    assert run(batch) == 0
    victim = sorted((batch / "in").iterdir())[0]
    with open(victim, "ab") as handle:
        handle.write(b"\n% edited\n")
    document = audit_json(capsys, batch / "l.sqlite", batch / "in")
    row = by_source(document)[victim.name]
    assert row["findings"] == ["stale_input"] and row["action"] == "review"
    assert "no item holds its new content" in details(document, "stale_input")[0]
    assert run(batch) == 0
    document = audit_json(capsys, batch / "l.sqlite", batch / "in")
    rows = [r for r in document["per_item"] if r["source"] == victim.name]
    old = next(r for r in rows if r["findings"] == ["stale_input"])
    assert old["action"] == "skip" and "history" in old["why"]
    new = next(r for r in rows if r is not old)
    assert new["findings"] == [] and new["action"] == "skip"
    assert new["key"] in details(document, "stale_input")[0]
    assert document["plan"] == {**document["plan"], "skip": 4, "review": 0}


# -- O4: symlink entries are read as run reads them --------------------------------------------

def test_symlink_entry_to_a_file_outside_inputs_is_not_unsafe_and_a_verified_done_is_skip(
        batch, corpus, capsys):
    """Fault: an inputs folder whose entry is a symlink to a file in another folder (run
    accepts it and finishes it). Property: the audit reads it as run does: no
    ``unsafe_input_path``, no finding at all, ``skip``."""
    store, links = batch / "store", batch / "sl"
    store.mkdir()
    links.mkdir()
    source = sorted(corpus.iterdir())[0]
    shutil.copy(source, store / "doc.pdf")
    (links / "a.pdf").symlink_to(os.path.join("..", "store", "doc.pdf"))
    assert run(batch, "sl") == 0
    document = audit_json(capsys, batch / "l.sqlite", links)
    assert document["anomalies"] == [] and document["plan"]["skip"] == 1


def test_dangling_symlink_entry_is_input_missing_while_names_escaping_the_folder_stay_unsafe(
        tmp_path):
    """Fault: a pending item's input entry becomes a symlink to /nonexistent; other items
    name inputs outside the folder: ``../x.pdf``, an absolute path elsewhere, and
    ``sub/x.pdf`` where ``sub`` is a symlink to a folder outside. Property: the dangling
    entry is ``input_missing`` saying so (planned ``review``: it cannot run), never
    ``unsafe_input_path``; each escaping name is ``unsafe_input_path`` and never opened
    (run reads none of them)."""
    inputs, outside = tmp_path / "in", tmp_path / "outside"
    inputs.mkdir()
    outside.mkdir()
    data = b"%PDF-1.4 outside"
    (outside / "x.pdf").write_bytes(data)
    (tmp_path / "x.pdf").write_bytes(data)
    (inputs / "sub").symlink_to(outside)
    (inputs / "link.pdf").symlink_to("/nonexistent/x.pdf")
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        ledger.add("k", source="link.pdf", digest=content_digest(b"%PDF-1.4 gone"))
        for key, name in (("a", "../x.pdf"), ("b", str(outside / "x.pdf")), ("c", "sub/x.pdf")):
            ledger.add(key, source=name, digest=content_digest(data))
    report = audit(tmp_path / "l.sqlite", inputs=inputs)
    assert [(a.key, a.kind) for a in report.anomalies] == [
        ("a", "unsafe_input_path"), ("b", "unsafe_input_path"), ("c", "unsafe_input_path"),
        ("k", "input_missing")]
    assert all(a.detail.endswith("; not opened") for a in report.anomalies[:3])
    assert report.anomalies[3].detail == ("input 'link.pdf': a dangling symlink (its "
                                          "content was not read)")
    assert [action for _, action, _ in report.rows] == ["review"] * 4


def test_audit_entry_rule_disagreeing_with_runs_scan_is_caught_on_a_real_folder(tmp_path):
    """Fault: the audit's copy of run's input rule drifts from ``runner.inputs.scan``.
    Property: on a folder of every kind of entry (``*.PDF``, a PDF without the suffix, text,
    a symlink to a PDF, a dangling ``*.pdf`` link, a directory, a FIFO) both take the same."""
    pdf = b"%PDF-1.4 body"
    (tmp_path / "UPPER.PDF").write_bytes(pdf)
    (tmp_path / "scan-no-suffix").write_bytes(pdf)
    (tmp_path / "notes.txt").write_bytes(b"hello")
    (tmp_path / "linked").symlink_to(tmp_path / "scan-no-suffix")
    (tmp_path / "dangling.pdf").symlink_to(tmp_path / "nowhere")
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "pipe")
    audited = sorted(name for name in os.listdir(tmp_path) if is_input_entry(str(tmp_path / name), name))
    assert audited == sorted(path.name for path in scan(tmp_path))
    assert "notes.txt" not in audited and "linked" in audited


# -- O5: a foreign format's names are checked, and what cannot be is said ---------------------

def test_foreign_state_file_name_gone_is_input_missing_and_unchecked_content_is_said(tmp_path):
    """Fault: a ``{"file", "status"}`` state file (no digests) names an input removed from
    the folder. Property: ``--inputs`` is applied: the missing one is ``input_missing``
    (pending: ``review``, it cannot run), the present one has no finding (``run``), and one
    ``unchecked_inputs`` note says the content of 2 names could not be compared."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "here.pdf").write_bytes(b"%PDF-1.4 here")
    (tmp_path / "state.jsonl").write_text(
        '{"file": "here.pdf", "status": "pending"}\n{"file": "gone.pdf", "status": "pending"}\n')
    report = audit(tmp_path / "state.jsonl", inputs=inputs)
    assert [(a.key, a.kind) for a in report.anomalies] == [
        (None, "unchecked_inputs"), ("gone.pdf", "input_missing")]
    assert "2 item(s) record a name but no input digest" in report.anomalies[0].detail
    assert {item.key: action for item, action, _ in report.rows} == {
        "gone.pdf": "review", "here.pdf": "run"}


def test_foreign_queue_naming_no_inputs_says_inputs_were_not_checked(tmp_path):
    """Fault: ``--inputs`` given for a ``jobs`` table that records no input names at all
    (it used to be ignored silently). Property: one ``unchecked_inputs`` note counting the
    items; nothing else changes."""
    path = tmp_path / "jobs.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE jobs (key TEXT PRIMARY KEY, state TEXT, result TEXT)")
        db.executemany("INSERT INTO jobs VALUES (?, ?, NULL)", [("j1", "unknown"),
                                                                ("j2", "unknown")])
    db.close()
    without = audit(path, now=0)
    report = audit(path, inputs=tmp_path, now=0)
    assert [(a.key, a.kind, a.detail) for a in report.anomalies if a.key is None] == [
        (None, "unchecked_inputs", "--inputs given, but 2 item(s) record no input name: "
         "not checked")]
    assert report.plan == without.plan
