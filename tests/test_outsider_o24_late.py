"""Outsider o24's late CLI findings, each reproduced with the real thing: an input file
really renamed or removed (F11), a real refused ``run`` with the folder listed before and
after (F12), a SQLite ledger with a real non-UTF-8 text cell written by sqlite3 (F13), a
JSONL ledger whose add line is really deleted or torn (F10).
"""

import json
import os
import sqlite3

import pytest

from toolkit.cli import main
from toolkit.documents import make_corpus
from toolkit.forensics import audit
from toolkit.identity import content_digest
from toolkit.ledger import State, open_ledger

S = State


def audit_json(capsys, *args):
    assert main(["audit", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def done_batch(tmp_path_factory):
    """A real run of two documents to done, in a folder of its own (copied per test)."""
    root = tmp_path_factory.mktemp("batch")
    make_corpus(root / "in", docs=2, poison=0, seed=11)
    assert main(["run", "--inputs", str(root / "in"), "--ledger", str(root / "l.sqlite"),
                 "--provider-db", str(root / "p.sqlite"), "--out", str(root / "out"),
                 "--no-progress"]) == 0
    return root


# -- F11: a missing input is input_missing, not stale_input ----------------------------------

@pytest.mark.parametrize("fault", ["renamed", "removed"])
def test_input_renamed_or_removed_under_a_done_item_is_input_missing_and_a_verified_done_stays_skip(
        tmp_path, capsys, done_batch, fault):
    """Fault: after a real run, one input file is renamed (or removed) in --inputs.
    Property: ``audit --inputs`` says ``input_missing`` for that item (its content was never
    read), never ``stale_input`` ("content no longer matches"); the done item's artifact is
    verified, so it stays ``skip``; the other item has no finding."""
    import shutil

    batch = tmp_path / "b"
    shutil.copytree(done_batch, batch, symlinks=True)
    victim = sorted((batch / "in").iterdir())[0]
    if fault == "renamed":
        victim.rename(victim.with_name("renamed-" + victim.name))
    else:
        victim.unlink()
    document = audit_json(capsys, batch / "l.sqlite", "--inputs", batch / "in")
    kinds = [(a["kind"], a["detail"]) for a in document["anomalies"]]
    if fault == "renamed":  # run finds it by content: input_renamed names where (o25 O3)
        assert [kind for kind, _ in kinds] == ["input_renamed"], kinds
        assert victim.name in kinds[0][1] and "renamed-" + victim.name in kinds[0][1]
    else:
        assert [kind for kind, _ in kinds] == ["input_missing"], kinds
        assert victim.name in kinds[0][1] and "not read" in kinds[0][1]
    assert document["plan"]["skip"] == 2 and document["by_state"]["done"] == 2


def _ledger_with_missing_inputs(tmp_path):
    """One pending, unknown, failed(transient) and cancelled item whose input was recorded
    with its digest, then removed from the folder; and one pending whose input is present."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    path = tmp_path / "l.sqlite"
    with open_ledger(path) as ledger:
        for name in ("pending.pdf", "unknown.pdf", "transient.pdf", "cancelled.pdf",
                     "present.pdf"):
            data = f"%PDF-1.4 {name}".encode()
            (inputs / name).write_bytes(data)
            ledger.add(name, source=name, digest=content_digest(data))
        for key in ("unknown.pdf", "transient.pdf"):
            token = ledger.claim(key, "w", 60.0)
            ledger.move(key, S.PENDING, S.UNKNOWN, token=token, worker="w")
            if key == "transient.pdf":
                ledger.move(key, S.UNKNOWN, S.FAILED, token=token, worker="w",
                            failure="transient", reason="busy")
            ledger.release(key, token, "w")
        ledger.move("cancelled.pdf", S.PENDING, S.CANCELLED)
    for name in ("pending.pdf", "unknown.pdf", "transient.pdf", "cancelled.pdf"):
        (inputs / name).unlink()
    return path, inputs


def test_input_removed_under_items_not_done_is_input_missing_and_what_would_resend_it_is_review(
        tmp_path, capsys):
    """Fault: inputs of a pending, an unknown, a transient-failed and a cancelled item are
    removed from --inputs (real files, really unlinked). Property: each has ``input_missing``
    (never ``stale_input``); pending, unknown and failed(transient) are planned ``review``
    (none can run without its bytes; the unknown's why says to look its key up first), the
    cancelled one stays ``skip``, the item whose input is present stays ``run``."""
    path, inputs = _ledger_with_missing_inputs(tmp_path)
    report = audit(path, inputs=inputs)
    kinds = {(a.key, a.kind) for a in report.anomalies if a.kind != "stuck_unknown"}
    assert kinds == {(key, "input_missing") for key in
                     ("pending.pdf", "unknown.pdf", "transient.pdf", "cancelled.pdf")}
    plan = {item.key: (action, why) for item, action, why in report.rows}
    assert {key: action for key, (action, _) in plan.items()} == {
        "pending.pdf": "review", "unknown.pdf": "review", "transient.pdf": "review",
        "cancelled.pdf": "skip", "present.pdf": "run"}
    assert "look up its key" in plan["unknown.pdf"][1]
    assert all("cannot be read" in plan[key][1] for key in
               ("pending.pdf", "unknown.pdf", "transient.pdf"))


def test_input_missing_kind_is_listed_in_the_readme_findings(tmp_path):
    """Fault: a new finding kind added without its documentation. Property: README's list
    of findings names ``input_missing`` and says what it is planned."""
    readme = (os.path.dirname(os.path.dirname(__file__)) + "/README.md")
    with open(readme, encoding="utf-8") as handle:
        text = handle.read()
    assert "`input_missing`" in text


# -- F12: a refused run leaves the folder as it found it -------------------------------------

@pytest.fixture(scope="module")
def pdfs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pdfs")
    make_corpus(folder, docs=2, poison=0, seed=12)
    return folder


def _listing(folder):
    return sorted(os.path.relpath(os.path.join(top, name), folder)
                  for top, dirs, files in os.walk(folder) for name in dirs + files)


def _corrupt_jsonl(folder, corpus):
    """A real run's JSONL ledger, an interior line zeroed, copied without its lock file."""
    work = folder.parent / "w"
    work.mkdir()
    assert main(["run", "--inputs", str(corpus), "--ledger", str(work / "l.jsonl"),
                 "--provider-db", str(work / "p.sqlite"), "--out", str(work / "out"),
                 "--no-progress"]) == 0
    lines = (work / "l.jsonl").read_bytes().split(b"\n")
    lines[2] = b"\0" * len(lines[2])
    (folder / "l.jsonl").write_bytes(b"\n".join(lines))
    return "l.jsonl"


def _foreign_sqlite(folder, corpus):
    with sqlite3.connect(folder / "l.sqlite") as db:
        db.execute("CREATE TABLE x (a)")
    return "l.sqlite"


def _foreign_jsonl(folder, corpus):
    (folder / "l.jsonl").write_text('{"a": 1}\n')
    return "l.jsonl"


REFUSED = {"corrupt-jsonl": (_corrupt_jsonl, 2, "corrupt lines 3"),
           "sqlite-not-a-ledger": (_foreign_sqlite, 2, "not a resume-toolkit ledger"),
           "jsonl-not-a-ledger": (_foreign_jsonl, 2, "not a resume-toolkit JSONL ledger"),
           "unknown-suffix": (lambda folder, corpus: "l.txt", 2, "not a ledger"),
           "no-such-folder": (lambda folder, corpus: "nodir/l.sqlite", 2, "no folder")}


@pytest.mark.parametrize("fault", sorted(REFUSED))
def test_run_refused_for_its_ledger_leaves_no_provider_database_lock_or_marker(
        tmp_path, capsys, pdfs, fault):
    """Fault: ``run`` on a ledger it must refuse: a JSONL ledger with a zeroed interior line
    (copied without its lock), an SQLite file or a JSONL file that is not a ledger, an
    unknown suffix, a folder that does not exist. The provider's database used to be
    created first. Property: one line on stderr (exit 2: bad input, and for the corrupt
    ledger, damage a person salvages, as ``ledger`` and ``review`` say), and the folder listed after the run is the
    folder listed before it: no provider database or jobs folder, no lock, no health
    marker, no --out; the ledger's bytes are unchanged."""
    make, status, words = REFUSED[fault]
    folder = tmp_path / "batch"
    folder.mkdir()
    name = make(folder, pdfs)
    capsys.readouterr()
    ledger = folder / name
    before_bytes = ledger.read_bytes() if ledger.exists() else None
    before = _listing(folder)
    assert main(["run", "--inputs", str(pdfs), "--ledger", str(ledger),
                 "--provider-db", str(folder / "p.sqlite"), "--out", str(folder / "out"),
                 "--no-progress"]) == status
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err
    assert _listing(folder) == before
    assert (ledger.read_bytes() if ledger.exists() else None) == before_bytes


def _headerless_capped_at_half(tmp_path):
    """A 1,000-item JSONL ledger written before headers (its header line cut, no lock), the
    folder's listing and the ledger's bytes, and a ``preexec_fn`` capping a child's files at
    half the ledger's size (RLIMIT_FSIZE): its header upgrade cannot be written whole."""
    import resource

    path = tmp_path / "l.jsonl"
    with open_ledger(path, durable=False) as ledger:
        for number in range(1000):
            ledger.add(f"k{number}")
    path.write_bytes(path.read_bytes().split(b"\n", 1)[1])  # no header: an older ledger
    (tmp_path / "l.jsonl.lock").unlink()
    before, data = _listing(tmp_path), path.read_bytes()
    limit = len(data) // 2

    def cap():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return path, before, data, cap


def test_headerless_jsonl_upgrade_cut_by_a_file_size_limit_leaves_no_upgrade_file_nor_provider(
        tmp_path, pdfs):
    """Fault: a JSONL ledger written before headers (a run gives it its header by writing
    ``<ledger>.upgrade`` and renaming it over the file) and a real RLIMIT_FSIZE smaller than
    the file: the write of ``.upgrade`` fails with EFBIG. Property: exit 1, one line; the
    ledger's bytes are unchanged; no ``.upgrade`` file and no provider database or jobs
    folder are left; what the folder gains is the documented health marker alone (a storage
    failure fails closed) and the lock a writer may hold."""
    import subprocess
    import sys

    path, before, data, cap = _headerless_capped_at_half(tmp_path)

    result = subprocess.run(
        [sys.executable, "-m", "toolkit", "run", "--inputs", str(pdfs), "--ledger",
         str(path), "--provider-db", str(tmp_path / "p.sqlite"), "--out", str(tmp_path / "out"),
         "--no-progress"], capture_output=True, text=True, preexec_fn=cap)
    assert result.returncode == 1 and "File too large" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert path.read_bytes() == data
    assert sorted(set(_listing(tmp_path)) - set(before)) == ["l.jsonl.health", "l.jsonl.lock"]


OPEN_UNDER_LIMIT = """
import sys
from toolkit.errors import StorageError
from toolkit.ledger import open_ledger
from toolkit.ledger.jsonl import JsonlLedger
opener = {"open_ledger": open_ledger, "JsonlLedger": JsonlLedger}[sys.argv[1]]
try:
    opener(sys.argv[2]).close()
except StorageError as exc:
    print(exc)
    sys.exit(3)
"""


@pytest.mark.parametrize("opener", ["open_ledger", "JsonlLedger"])
def test_headerless_jsonl_upgrade_cut_by_a_file_size_limit_in_a_library_open_leaves_no_upgrade_file(
        tmp_path, opener):
    """Fault: a JSONL ledger written before headers, opened through the library (no ``run``,
    no CLI) in a child under a real RLIMIT_FSIZE smaller than the file: the write of
    ``<ledger>.upgrade`` fails with EFBIG. Property: the open is refused (StorageError,
    "File too large"); the ledger's bytes are unchanged and no ``.upgrade`` file is left:
    the ledger that made it removes it, whoever opened it. Only the lock stays (a storage
    failure is not a refusal for what the file holds)."""
    import subprocess
    import sys

    path, before, data, cap = _headerless_capped_at_half(tmp_path)

    result = subprocess.run([sys.executable, "-c", OPEN_UNDER_LIMIT, opener, str(path)],
                            capture_output=True, text=True, preexec_fn=cap)
    assert result.returncode == 3 and "File too large" in result.stdout, result
    assert path.read_bytes() == data
    assert sorted(set(_listing(tmp_path)) - set(before)) == ["l.jsonl.lock"]


# -- F13: ledger and review on a SQLite text cell that is not UTF-8 ---------------------------

def _sqlite_with_undecodable_cell(path, column="source"):
    with open_ledger(path) as ledger:
        ledger.add("a", source="a.pdf")
        ledger.add("b", source="b.pdf")
    with sqlite3.connect(path) as db:  # the fault as a foreign writer leaves it: raw bytes
        db.execute(f"UPDATE items SET {column} = CAST(X'66ff6f' AS TEXT) WHERE key = 'b'")
    db.close()


@pytest.mark.parametrize("command", [["ledger", "{path}"], ["ledger", "{path}", "--json"],
                                     ["review", "--ledger", "{path}"]])
def test_non_utf8_text_cell_in_sqlite_ledger_is_one_line_naming_key_and_column_exit_2_unchanged(
        tmp_path, capsys, command):
    """Fault: a real SQLite ledger whose items row 'b' holds a source cell of bytes that are
    not UTF-8 (written by sqlite3: CAST(X'66ff6f' AS TEXT)). Property: ``ledger`` and
    ``review`` exit 2 with one line naming the row's key and the column and pointing to
    ``audit``, never the private copy's path; the folder and the file are unchanged."""
    path = tmp_path / "l.sqlite"
    _sqlite_with_undecodable_cell(path)
    before, data = _listing(tmp_path), path.read_bytes()
    capsys.readouterr()
    assert main([part.format(path=path) for part in command]) == 2
    captured = capsys.readouterr()
    [line] = captured.err.strip().splitlines()
    assert "key='b'" in line and "column source" in line and "audit" in line
    assert "toolkit-view" not in line and captured.out == ""
    assert path.read_bytes() == data and _listing(tmp_path) == before


# -- F10: a lost add line is named as such ------------------------------------------------------

def _jsonl_with_a_claimed_item(path):
    """A real JSONL ledger: items a, b, c added; b claimed and moved to unknown."""
    with open_ledger(path) as ledger:
        for key in ("a", "b", "c"):
            ledger.add(key, source=f"{key}.pdf")
        token = ledger.claim("b", "w", 60.0)
        ledger.move("b", S.PENDING, S.UNKNOWN, token=token, worker="w")
        ledger.release("b", token, "w")
    lines = path.read_bytes().split(b"\n")
    number = next(n for n, line in enumerate(lines, 1)
                  if b'"op": "add"' in line and b'"key": "b"' in line)
    return lines, number


def _missing_history(path):
    return [a.detail for a in audit(path).anomalies if a.kind == "missing_history"]


@pytest.mark.parametrize("fault", ["deleted", "torn"])
def test_add_line_deleted_or_torn_is_named_as_a_missing_add_line_in_the_detail(tmp_path, fault):
    """Fault: the add line of item b (claimed and moved since) is deleted from the JSONL
    ledger, or cut to its first 40 bytes (an interior torn line). Property: b's one
    missing_history detail says its add line is missing and names the line of its first
    event left; when deleted, that no line before it is unusable (deleted or never
    written); when torn, that the unusable line before it may have held the add."""
    path = tmp_path / "l.jsonl"
    lines, number = _jsonl_with_a_claimed_item(path)
    if fault == "deleted":
        del lines[number - 1]
        first = number + 1  # c's add moved up into its place, then b's claim
    else:
        lines[number - 1] = lines[number - 1][:40]
        first = number + 2  # c's add, then b's claim
    path.write_bytes(b"\n".join(lines))
    [detail] = _missing_history(path)
    assert detail.startswith(f"line {first}: its add line is missing"), detail
    assert "claim" in detail
    if fault == "deleted":
        assert "deleted or never written" in detail and "unusable line " not in detail
    else:
        assert f"unusable line {number} before it may have held the add" in detail


def test_add_event_row_deleted_from_a_sqlite_ledger_is_named_a_missing_add_event(tmp_path):
    """Fault: the add row of item b deleted from a real SQLite ledger's events table.
    Property: b's missing_history detail says its add event is missing, by seq (a table
    has no lines), and names the op of its first event left."""
    path = tmp_path / "l.sqlite"
    with open_ledger(path) as ledger:
        for key in ("a", "b"):
            ledger.add(key, source=f"{key}.pdf")
        token = ledger.claim("b", "w", 60.0)
        ledger.move("b", S.PENDING, S.UNKNOWN, token=token, worker="w")
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM events WHERE key = 'b' AND op = 'add'")
    db.close()
    [detail] = _missing_history(path)
    assert "its add event is missing" in detail and detail.startswith("event seq="), detail
