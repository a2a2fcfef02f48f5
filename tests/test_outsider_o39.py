"""Faults outsider o39 found in the audit (findings 2, 3, 5, 7, 8): items that
``--output-name`` gives one file, names no file can have, non-UTF-8 keys that met a literal
backslash key, a source the format does not give, and the CLI's edges (``--csv ''``,
``--action`` past the text cap, an empty key). Every file is real; foreign databases are
written by sqlite3 (or by litequeue itself)."""

import json
import shutil
import sqlite3

import pytest

from toolkit.cli import main
from toolkit.documents import make_corpus
from toolkit.forensics import audit, render_text


def _state_file(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _kinds(report, key):
    return {a.kind for a in report.anomalies if a.key == key}


def _plan(report):
    return {record.key: action for record, action, _, _ in report.rows.read(0, None)}


# -- 2: --output-name gives different items one file ---------------------------------------

def test_output_name_collision_plans_review_with_shared_output_never_skip(tmp_path):
    """Fault: three done items (``jan/report.pdf``, ``feb/report.pdf``, ``report.PDF``)
    that ``'{stem}.pdf'`` maps to one whole PDF. Property: each gets ``shared_output`` and
    is planned ``review`` (one file cannot be the output of three documents); an item the
    rule gives a file of its own is still ``skip``."""
    corpus = tmp_path / "fx"
    make_corpus(corpus, docs=2, poison=0)
    pdfs = sorted(corpus.glob("*.pdf"))
    art = tmp_path / "art"
    art.mkdir()
    shutil.copy(pdfs[0], art / "report.pdf")
    shutil.copy(pdfs[1], art / "alone.pdf")
    state = _state_file(tmp_path / "s.jsonl", [
        '{"file":"jan/report.pdf","status":"done"}', '{"file":"feb/report.pdf","status":"done"}',
        '{"file":"report.PDF","status":"done"}', '{"file":"alone.pdf","status":"done"}'])
    report = audit(str(state), artifacts=str(art), output_name="{stem}.pdf")
    plan = _plan(report)
    for key in ("jan/report.pdf", "feb/report.pdf", "report.PDF"):
        assert "shared_output" in _kinds(report, key), report.anomalies
        assert plan[key] == "review", plan
    assert plan["alone.pdf"] == "skip" and not _kinds(report, "alone.pdf")


def test_output_name_hard_link_is_one_file_for_two_items(tmp_path):
    """Fault: ``a.pdf`` and ``b.pdf`` in the artifacts folder are one file (a hard link:
    what a case-insensitive file system makes of ``A.pdf`` and ``a.pdf``). Property: the
    two items the rule maps to them are ``shared_output``, ``review``."""
    corpus = tmp_path / "fx"
    make_corpus(corpus, docs=1, poison=0)
    art = tmp_path / "art"
    art.mkdir()
    shutil.copy(next(corpus.glob("*.pdf")), art / "a.pdf")
    (art / "b.pdf").hardlink_to(art / "a.pdf")
    state = _state_file(tmp_path / "s.jsonl", ['{"file":"a.pdf","status":"done"}',
                                               '{"file":"b.pdf","status":"done"}'])
    report = audit(str(state), artifacts=str(art), output_name="{name}")
    assert _plan(report) == {"a.pdf": "review", "b.pdf": "review"}
    assert {a.kind for a in report.anomalies} == {"shared_output"}


# -- 3: a name no file can have -------------------------------------------------------------

@pytest.mark.parametrize("flags", [["--output-name", "{stem}.pdf"], ["--inputs"]],
                         ids=["output-name", "inputs"])
def test_lone_surrogate_name_is_an_unsafe_path_finding_not_a_traceback(tmp_path, capsys,
                                                                        flags):
    """Fault: a state file names ``c\\ud800.pdf`` (a JSON lone surrogate: no file system
    encoding holds it), audited with ``--artifacts --output-name`` or ``--inputs``.
    Property: exit 0, the item gets ``unsafe_artifact_path`` / ``unsafe_input_path`` and
    ``review``, no traceback."""
    art = tmp_path / "art"
    art.mkdir()
    state = _state_file(tmp_path / "sur.jsonl", ['{"file": "c\\ud800.pdf", "status": "done"}'])
    args = ["--artifacts", str(art), *flags] if flags[0] == "--output-name" else \
        ["--inputs", str(art)]
    assert main(["audit", str(state), "--json", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    kinds = {a["kind"] for a in out["anomalies"]}
    assert kinds & {"unsafe_artifact_path", "unsafe_input_path"}, out["anomalies"]
    assert [row["action"] for row in out["per_item"]] == ["review"]


def test_lone_surrogate_celery_output_is_unsafe_artifact_path(tmp_path):
    """Fault: a foreign result names the output ``x\\ud800.pdf``. Property: a finding, no
    UnicodeEncodeError."""
    art = tmp_path / "art"
    art.mkdir()
    state = _state_file(tmp_path / "s.jsonl",
                        ['{"file": "a.pdf", "status": "done", "output": "x\\ud800.pdf"}'])
    report = audit(str(state), artifacts=str(art))
    assert "unsafe_artifact_path" in _kinds(report, "a.pdf")


# -- 5: escaping of non-UTF-8 keys is one to one --------------------------------------------

def test_non_utf8_key_and_its_literal_escape_stay_two_items(tmp_path):
    """Fault: a jobs table holds the key bytes ``a\\xffb`` and the text ``a\\xffb`` (a real
    backslash). Property: two items, no false ``duplicate_key``; the keys are escaped as
    ``ledger`` stores input names (``roots.escaped_name``)."""
    db = tmp_path / "j.db"
    with sqlite3.connect(db) as con:
        con.execute("create table jobs(key TEXT, state TEXT, result TEXT)")
        con.execute("insert into jobs values(CAST(x'61ff62' AS TEXT), 'done', NULL), "
                    "('a\\xffb', 'unknown', NULL)")
    con.close()
    report = audit(str(db))
    assert sorted(_plan(report)) == ["a\\\\xffb", "a\\xffb"]
    assert "duplicate_key" not in {a.kind for a in report.anomalies}


# -- 7: a source the format does not give ---------------------------------------------------

def test_litequeue_missing_source_is_a_dash_in_text_never_nan(tmp_path):
    """Fault: litequeue payloads that name nothing (empty, a 5000-character line).
    Property: their source is ``-`` in the text report (null in JSON, an empty CSV cell),
    never ``nan``; the long line's reason says it is one line too long for a file name."""
    litequeue = pytest.importorskip("litequeue")
    db = tmp_path / "lq.db"
    queue = litequeue.LiteQueue(str(db))
    queue.put("a.pdf")  # a source beside the missing ones: pandas' str column, NaN for None
    queue.put("")
    queue.put("x" * 5000)
    queue.conn.close()
    report = audit(str(db))
    text = render_text(report)
    sources = [line.split()[1] for line in text.split("items needing action")[1].splitlines()
               if line[:1] not in ("", " ", "-", "k") and len(line.split()) > 3]
    assert sorted(sources) == ["-", "-", "a.pdf"], text
    assert "nan" not in text
    detail = next(a.detail for a in report.anomalies if a.kind == "opaque_payload")
    assert "not one line of text" not in detail and "5000 characters" in detail, detail


# -- 8: the CLI's edges ---------------------------------------------------------------------

def test_csv_empty_name_is_refused_exit_2(tmp_path, capsys):
    """Fault: ``audit X --csv ''``. Property: exit 2 with one line, as ``--artifacts ''``."""
    state = _state_file(tmp_path / "s.jsonl", ['{"file":"a.pdf","status":"pending"}'])
    assert main(["audit", str(state), "--csv", ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--csv ''" in err, err


def test_action_lists_every_item_planned_so_past_the_text_cap(tmp_path, capsys):
    """Fault: 45 pending items and ``--action run``. Property: the text lists all 45 (the
    cap of 40 applies only without --action, and says --action lists them all)."""
    state = _state_file(tmp_path / "s.jsonl",
                        [f'{{"file":"d{n:02}.pdf","status":"pending"}}' for n in range(45)])
    assert main(["audit", str(state), "--action", "run"]) == 0
    out = capsys.readouterr().out
    assert all(f"d{n:02}.pdf" in out for n in range(45)) and "more" not in out
    assert main(["audit", str(state)]) == 0
    out = capsys.readouterr().out
    assert "… and 5 more (--action ACTION lists every item planned so" in out


def test_empty_task_items_key_is_called_empty(tmp_path):
    """Fault: a task_items row whose biz_no is ''. Property: its corrupt_record says the
    key is empty (it is a string)."""
    db = tmp_path / "t.db"
    with sqlite3.connect(db) as con:
        con.execute("create table task_items(seq INTEGER, biz_no TEXT, status TEXT)")
        con.execute("insert into task_items values(1, '', 'done'), (2, 'b', 'pending')")
    con.close()
    details = [a.detail for a in audit(str(db)).anomalies if a.kind == "corrupt_record"]
    assert details == ["task_items row seq=1: key '' is empty"], details
