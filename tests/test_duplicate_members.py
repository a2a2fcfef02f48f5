"""A JSON line that names a member twice (outsider o39, finding 6) is one verdict for the
ledger, ``run`` and the audit: damage (a corrupt line), never the last value taken as
meant; in a foreign state file a ``corrupt_line``, never ``run``/``skip`` from a guessed
value. And ``resolve`` on a ledger its user may read but not write (o39, finding 8) says
it cannot write. Ledgers are a real run's; the read-only one is opened by a real non-root
process (uid 65534)."""

import contextlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from toolkit.cli import main
from toolkit.documents import make_corpus
from toolkit.forensics import audit, jsonl as audit_jsonl, lines as audit_lines
from toolkit.ledger import open_ledger, replay


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """A real run of three documents: its ledger's lines (line 1 the header)."""
    root = tmp_path_factory.mktemp("batch")
    make_corpus(root / "in", docs=3, poison=0)
    assert main(["run", "--inputs", str(root / "in"), "--ledger", str(root / "l.jsonl"),
                 "--provider-db", str(root / "p.db"), "--out", str(root / "out"),
                 "--no-progress"]) == 0
    return root, (root / "l.jsonl").read_bytes().split(b"\n")


def _edited(tmp_path, batch, number, edit, every=None):
    """A copy of the batch (its ledger's line ``number`` edited, after ``every`` line)
    in ``tmp_path``."""
    root, lines = batch
    for name in ("in", "out"):
        shutil.copytree(root / name, tmp_path / name)
    shutil.copy(root / "p.db", tmp_path / "p.db")
    lines = list(lines) if every is None else list(map(every, lines))
    lines[number - 1] = edit(lines[number - 1])
    (tmp_path / "l.jsonl").write_bytes(b"\n".join(lines))
    return tmp_path / "l.jsonl"


def _done_line(lines) -> int:
    """The number of the first line moving an item to done."""
    return next(n for n, line in enumerate(lines, 1) if b'"to": "done"' in line
                and b'"op": "move"' in line)


@pytest.fixture(params=[True, False], ids=["fast", "reference"])
def paths(request, monkeypatch):
    """Each reading: the typed decoders, then every line the reference (json) way."""
    monkeypatch.setattr(replay, "FAST", request.param)
    monkeypatch.setattr(audit_lines, "FAST", request.param)


def test_done_line_naming_to_twice_is_corrupt_for_ledger_run_and_audit(
        tmp_path, batch, paths, capsys):
    """Fault: a real run's done line edited to ``"to": "done", "to": "pending"`` (json and
    msgspec keep the last: pending; the next release line says done again). Property: one
    verdict: ``ledger`` and ``run`` refuse the ledger naming that line as corrupt (exit 2),
    the audit lists it in ``corrupt_lines`` with the duplicate's name and plans the item
    ``review``."""
    number = _done_line(batch[1])
    path = _edited(tmp_path, batch, number,
                   lambda line: line.replace(b'"to": "done"', b'"to": "done", "to": "pending"'))
    assert main(["ledger", str(path)]) == 2
    assert f"corrupt lines {number}" in capsys.readouterr().err
    assert main(["run", "--inputs", str(tmp_path / "in"), "--ledger", str(path),
                 "--provider-db", str(tmp_path / "p.db"), "--out", str(tmp_path / "out"),
                 "--no-progress"]) == 2
    assert f"corrupt lines {number}" in capsys.readouterr().err
    report = audit(str(path))
    assert report.corrupt_lines == [number]
    assert any("duplicate member name 'to'" in a.detail for a in report.anomalies)
    key = json.loads(batch[1][number - 1])["key"]
    plan = {record.key: action for record, action, _, _ in report.rows.read(0, None)}
    assert plan[key] == "review"


def test_detail_member_named_twice_is_corrupt_and_colons_in_values_are_not(
        tmp_path, batch, paths, monkeypatch):
    """Fault: a done line whose detail names ``job_id`` twice, in a line whose worker
    (``host:pid``) holds a colon, so the colon count cannot rule it out; one naming ``to``
    twice whose worker's colon is escaped (``\\u003a``: a colon no byte count sees).
    Property: the ledger and the audit both call each corrupt; the same line without the
    duplicate (its colons in values) is read whole by both."""
    number = _done_line(batch[1])
    path = _edited(tmp_path, batch, number,
                   lambda line: line.replace(b'"job_id": ', b'"job_id": "x", "job_id": '))
    with open_ledger(path, view=True) as ledger:
        assert ledger.corrupt_lines == [number] and ledger.damaged
    assert audit(str(path)).corrupt_lines == [number]
    # the worker's colon escaped (\u003a: decoded, no byte counts it) and "to" twice, in a
    # ledger whose only colons in values are the workers' (a lease owner's made a dash)
    escaped = _edited(
        tmp_path / "escaped", batch, number,
        lambda line: line.replace(b'"worker": "vm:', b'"worker": "vm\\u003a').replace(
            b'"to": ', b'"to": "pending", "to": '),
        lambda line: line.replace(b'"lease_owner": "vm:', b'"lease_owner": "vm-'))
    monkeypatch.setattr(audit_jsonl, "BATCH", 2)  # its line in a batch of its own
    with open_ledger(escaped, view=True) as ledger:
        assert ledger.corrupt_lines == [number]
    assert audit(str(escaped)).corrupt_lines == [number]
    clean = _edited(tmp_path / "clean", batch, number, lambda line: line)
    assert b":" in json.loads(batch[1][number - 1])["worker"].encode()
    with open_ledger(clean, view=True) as ledger:
        assert not ledger.corrupt_lines and len(list(ledger.items())) == 3
    assert audit(str(clean)).corrupt_lines == []


def test_state_file_member_named_twice_is_corrupt_line_never_run(tmp_path, paths):
    """Fault (o39's repro): a state file whose line names ``status`` twice (done, then
    pending) and one naming ``file`` twice (b.pdf, c.pdf), after pending records of b and c.
    Property: both lines are ``corrupt_line`` (json would plan a.pdf ``run``: sent again
    though done, and lose b.pdf); b.pdf and c.pdf, both named by the damaged line, are
    ``review``, none ``run``."""
    path = tmp_path / "d.jsonl"
    path.write_text("".join(line + "\n" for line in [
        '{"file":"b.pdf","status":"pending"}', '{"file":"c.pdf","status":"pending"}',
        '{"file":"a.pdf","status":"done","status":"pending"}',
        '{"file":"b.pdf","file":"c.pdf","status":"done"}']))
    report = audit(str(path))
    assert report.corrupt_lines == [3, 4]
    plan = {record.key: action for record, action, _, _ in report.rows.read(0, None)}
    assert plan == {"b.pdf": "review", "c.pdf": "review"}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_resolve_on_ledger_readable_not_writable_says_it_cannot_write(batch):
    """Fault: ``resolve`` by a user (uid 65534, a real process: fork, setuid) who may read
    the ledger (mode 444) but not write it. Property: the one-line error says it cannot
    write the ledger (not that it cannot read it), exit 2, the file unchanged."""
    # a folder that user reaches and writes (the lock file beside the ledger is made)
    folder = Path(tempfile.mkdtemp(prefix="readonly-ledger-"))
    os.chmod(folder, 0o777)
    path = _edited(folder / "b", batch, 1, lambda line: line)
    os.chmod(folder / "b", 0o777)
    os.chmod(path, 0o444)
    before = path.read_bytes()
    key = json.loads(batch[1][1])["key"][:8]
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: another user, the modules already loaded
            try:
                os.close(read)
                os.setgid(65534)
                os.setuid(65534)
                err = io.StringIO()
                with contextlib.redirect_stderr(err):
                    code = main(["resolve", "--ledger", str(path), "--key", key, "--release",
                                 "--note", "n"])
                os.write(write, f"{code}\n{err.getvalue()}".encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            out = pipe.read().decode()
        os.waitpid(pid, 0)
        code, err = out.split("\n", 1)
        assert code == "2", out
        assert err.startswith(f"error: cannot write JSONL ledger {str(path)!r}"), err
        assert err.count("\n") == 1
        assert path.read_bytes() == before
    finally:
        shutil.rmtree(folder)
