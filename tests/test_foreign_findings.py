"""A foreign ``{"file", "status"}`` state file: damaged later lines and spellings of one path.

Later lines win in a state file, so a damaged line written after an item's last readable
record may have held its newer status (a ``done`` after its ``pending``: running it again
would execute it twice). And ``./a.pdf`` and ``a.pdf`` are one file, whatever the writer
thought. Each test writes the file by hand; every answer below is written by hand too.
"""

import json

from toolkit.cli import main
from toolkit.forensics import audit


def state_file(tmp_path, lines) -> str:
    """Each entry a record (dict, one JSON line) or the raw bytes of a damaged line."""
    path = tmp_path / "state.jsonl"
    path.write_bytes(b"".join(line if type(line) is bytes else json.dumps(line).encode() + b"\n"
                              for line in lines))
    return path


def answers(report) -> dict:
    return {item.key: (action, why) for item, action, why in report.rows}


def findings(report, kind) -> dict:
    """{key: its findings of ``kind``, joined}."""
    found = {}
    for a in report.anomalies:
        if a.kind == kind:
            found[a.key] = f"{found[a.key]} | {a.detail}" if a.key in found else a.detail
    return found


def test_corrupt_later_line_naming_a_pending_item_makes_it_review_naming_the_line(tmp_path):
    """What breaks: a.pdf's done record (line 3) was cut mid-write and the next record
    followed it on the same line. Must hold: a.pdf is no longer planned run from its pending
    line 1: it has a missing_history finding and is review with a why naming line 3; the
    corrupt line is still reported exactly; b.pdf, after it, runs as before."""
    path = state_file(tmp_path, [
        {"file": "a.pdf", "status": "pending"},
        {"file": "c.pdf", "status": "done"},
        b'{"file": "a.pdf", "status": "done", "out{"file": "x.pdf", "status": "pending"}\n',
        {"file": "b.pdf", "status": "pending"}])
    report = audit(path)
    action, why = answers(report)["a.pdf"]
    assert action == "review" and "line 3" in why and "line 1" in why
    assert "line 3 is damaged and names it" in findings(report, "missing_history")["a.pdf"]
    assert report.corrupt_lines == [3]
    assert [a.detail for a in report.anomalies if a.kind == "corrupt_line"] == [
        "line 3: not JSON: Expecting ':' delimiter"]  # json's words, as before
    assert answers(report)["b.pdf"][0] == "run" and answers(report)["c.pdf"][0] == "verify"


def test_readable_line_with_a_status_that_is_no_state_still_names_its_item(tmp_path):
    """What breaks: the writer's later line for a failed item says "finished", a word the
    format does not have (a corrupt line, although valid JSON). Must hold: the item is
    review (not retry from its earlier failed line), with a finding naming line 2."""
    path = state_file(tmp_path, [
        {"file": "t.pdf", "status": "failed", "retryable": True},
        {"file": "t.pdf", "status": "finished"}])
    report = audit(path)
    assert answers(report)["t.pdf"][0] == "review" and "line 2" in answers(report)["t.pdf"][1]
    assert report.corrupt_lines == [2]


def test_torn_tail_naming_an_item_makes_it_review_and_stays_a_torn_line(tmp_path):
    """What breaks: the writer died writing q.pdf's done record: the file ends in the
    first 30 bytes of it, no newline. Must hold: q.pdf (pending on line 1) is review with a
    why naming line 2; the torn tail is still one torn_line finding, not used as a record."""
    done = json.dumps({"file": "q.pdf", "status": "done", "output": "q.out.pdf"}).encode()
    path = state_file(tmp_path, [{"file": "q.pdf", "status": "pending"}, done[:30]])
    report = audit(path)
    assert answers(report)["q.pdf"][0] == "review" and "line 2" in answers(report)["q.pdf"][1]
    assert [a.kind for a in report.anomalies if a.key is None] == ["torn_line"]
    assert report.by_state["pending"] == 1


def test_damaged_line_naming_a_done_item_makes_it_review(tmp_path):
    """What breaks: after a.pdf's done record, a later line for it is damaged (it may have
    redone it, or overwritten its output). Must hold: review naming the line, as a readable
    record overriding a done would be (duplicate_key); never skip or verify on a guess."""
    path = state_file(tmp_path, [{"file": "a.pdf", "status": "done"},
                                 b'{"file": "a.pdf", "status": "failed", "error": \xff}\n'])
    assert answers(audit(path))["a.pdf"][0] == "review"


def test_unnamed_damaged_line_puts_in_doubt_only_unsettled_items_recorded_before_it(tmp_path):
    """What breaks: line 4 is binary garbage: no file name can be read from it, so it may
    have been any item's newer record. Must hold: every item not done whose last readable
    record is before line 4 is review naming line 4 (pending a, failed-transient c); a done
    before it keeps its answer (b: verify); items whose last record is after it are
    untouched (d runs, e, re-recorded after it, runs)."""
    path = state_file(tmp_path, [
        {"file": "a.pdf", "status": "pending"},
        {"file": "b.pdf", "status": "done"},
        {"file": "c.pdf", "status": "failed", "retryable": True},
        b"\x00\x9c\xff garbage\n",
        {"file": "d.pdf", "status": "pending"},
        {"file": "e.pdf", "status": "pending"},
        {"file": "e.pdf", "status": "pending", "ts": 5}])
    report = audit(path)
    got = answers(report)
    assert {key: action for key, (action, _) in got.items()} == {
        "a.pdf": "review", "b.pdf": "verify", "c.pdf": "review", "d.pdf": "run",
        "e.pdf": "run"}
    assert "line 4" in got["a.pdf"][1] and "line 4" in got["c.pdf"][1]
    assert sorted(findings(report, "missing_history")) == ["a.pdf", "c.pdf"]


def test_damaged_line_before_an_items_last_record_changes_nothing(tmp_path):
    """Later lines win: a damaged line for a.pdf followed by a readable record of a.pdf
    was superseded. Must hold: a.pdf plans from its last record (run), no finding on it;
    the damaged line is still reported."""
    path = state_file(tmp_path, [
        {"file": "a.pdf", "status": "pending"},
        b'{"file": "a.pdf", "status": "do\n',
        {"file": "a.pdf", "status": "pending", "ts": 7}])
    report = audit(path)
    assert answers(report)["a.pdf"] == ("run", "pending: nothing was sent")
    assert [a.key for a in report.anomalies] == [None] and report.corrupt_lines == [2]


def test_two_spellings_of_one_path_are_one_item_with_a_duplicate_key_finding(tmp_path):
    """What breaks: the writer recorded ./a.pdf done, then a.pdf pending (and dir//b.pdf,
    dir/./b.pdf): to it, four items; the same two files may run twice. Must hold: one item
    per path (keys a.pdf, dir/b.pdf, normalized lexically), each with a duplicate_key finding
    naming both spellings and their lines, planned review; a path spelled one way only
    (./c.pdf) is one item keyed c.pdf, its source as recorded, with no finding."""
    path = state_file(tmp_path, [
        {"file": "./a.pdf", "status": "done"},
        {"file": "dir//b.pdf", "status": "pending"},
        {"file": "a.pdf", "status": "pending"},
        {"file": "dir/./b.pdf", "status": "pending"},
        {"file": "./c.pdf", "status": "pending"}])
    report = audit(path)
    assert {key: action for key, (action, _) in answers(report).items()} == {
        "a.pdf": "review", "dir/b.pdf": "review", "c.pdf": "run"}
    spelled = findings(report, "duplicate_key")
    assert "line 3 spells it 'a.pdf', line 1 './a.pdf'" in spelled["a.pdf"]
    assert "line 4 spells it 'dir/./b.pdf', line 2 'dir//b.pdf'" in spelled["dir/b.pdf"]
    sources = {item.key: item.source for item, _, _ in report.rows}
    assert sources == {"a.pdf": "a.pdf", "dir/b.pdf": "dir/./b.pdf", "c.pdf": "./c.pdf"}


def test_audit_json_per_item_shows_the_doubt_and_the_spelling_on_the_command_line(
        tmp_path, capsys):
    """The same answers through ``audit --json`` (exit 0): per_item carries the findings and
    the why a person reads; the corrupt line is listed by number."""
    path = state_file(tmp_path, [{"file": "./a.pdf", "status": "pending"},
                                 {"file": "a.pdf", "status": "pending"},
                                 {"file": "b.pdf", "status": "pending"},
                                 b'{"file": "b.pdf", "status": "done", "size": 1x}\n'])
    assert main(["audit", str(path), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    rows = {row["key"]: row for row in document["per_item"]}
    assert rows["a.pdf"]["findings"] == ["duplicate_key"] and rows["a.pdf"]["action"] == "review"
    assert rows["b.pdf"]["findings"] == ["missing_history"] and "line 4" in rows["b.pdf"]["why"]
    assert document["corrupt_lines"] == [4] and document["items"] == 2


def test_glued_line_naming_two_files_puts_both_in_doubt_not_only_the_first(tmp_path):
    """Outsider o32 P1. What breaks: b.pdf's record was torn mid-write and c.pdf's done
    record followed on the same line (or two whole records lost their newline between
    them). Must hold: both files the line names are review, not only the first: c.pdf's
    done sits inside that line, and running it again from its pending line 2 would
    execute it twice."""
    for damaged in (b'{"file": "b.pdf", "sta{"file": "c.pdf", "status": "done"}\n',
                    b'{"file": "b.pdf", "status": "done"}{"file": "c.pdf", "status": "done"}\n'):
        path = state_file(tmp_path, [{"file": "b.pdf", "status": "pending"},
                                     {"file": "c.pdf", "status": "pending"}, damaged])
        report = audit(path)
        assert {key: action for key, (action, _) in answers(report).items()} == {
            "b.pdf": "review", "c.pdf": "review"}
        assert "line 3 is damaged and names it" in findings(report, "missing_history")["c.pdf"]


def test_utf16_state_file_is_refused_in_one_line_naming_the_conversion(tmp_path, capsys):
    """Outsider o32 P7. Fault: a state file saved as UTF-16 (Windows PowerShell's ``>``),
    with and without its byte order mark. Must hold: refused, exit 2, one line saying what
    it is and how to convert it, never read as a state file of 0 items; the file unchanged."""
    text = '{"file": "a.pdf", "status": "done"}\r\n{"file": "b.pdf", "status": "pending"}\r\n'
    for encoding in ("utf-16", "utf-16-le", "utf-16-be", "utf-32"):
        path = tmp_path / f"{encoding}.jsonl"
        path.write_bytes(text.encode(encoding))
        before = path.read_bytes()
        capsys.readouterr()
        assert main(["audit", str(path)]) == 2
        err = capsys.readouterr().err
        assert "UTF-16" in err and "iconv" in err and len(err.strip().splitlines()) == 1
        assert path.read_bytes() == before
