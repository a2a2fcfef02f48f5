"""Outsider o24's findings on views and the audit's evidence: a view of a damaged JSONL
ledger says the damage instead of hiding an item (F9); the audit never calls a done item
``skip`` (done and verified) when it could not check its artifacts (F7)."""

import json

import pytest

from toolkit.cli import main
from toolkit.ledger import open_ledger


def _jsonl_with_lost_add(tmp_path):
    """A JSONL ledger of three items whose second line (the first item's add) is garbage:
    its later lines are unusable, so a reader that skips them sees two items, not three."""
    path = tmp_path / "g.jsonl"
    with open_ledger(path) as ledger:
        for number in range(3):
            ledger.add(f"k{number}", source=f"d{number}.pdf")
    lines = path.read_bytes().splitlines(keepends=True)
    assert json.loads(lines[1])["key"] == "k0" and json.loads(lines[1])["op"] == "add"
    lines[1] = b"{garbage\n"
    path.write_bytes(b"".join(lines))
    return path


@pytest.mark.parametrize("view", [["ledger", "{}"], ["ledger", "{}", "--json"],
                                  ["review", "--ledger", "{}"]],
                         ids=["ledger", "ledger-json", "review"])
def test_view_of_jsonl_ledger_with_a_lost_add_line_names_the_damage_and_exits_2(
        tmp_path, capsys, view):
    """Fault: an interior line of a JSONL ledger (an item's add) is corrupt. Property: the
    ``ledger`` and ``review`` views do not list the readable items as if they were all
    (the lost item silently absent, exit 0): one line naming the damaged line and
    ``audit``, exit 2 (as a SQLite ledger holding a record not ours), nothing on stdout,
    the file unchanged."""
    path = _jsonl_with_lost_add(tmp_path)
    before = path.read_bytes()
    code = main([part.format(path) for part in view])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    error = captured.err.strip()
    assert len(error.splitlines()) == 1
    assert "corrupt lines 2 " in error and f"python -m toolkit audit {path}" in error
    assert path.read_bytes() == before


def test_view_of_an_intact_jsonl_ledger_still_lists_every_item(tmp_path, capsys):
    """Property (the other side of the refusal): an undamaged JSONL ledger is listed whole,
    exit 0."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path) as ledger:
        for number in range(3):
            ledger.add(f"k{number}", source=f"d{number}.pdf")
    assert main(["ledger", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["items"] == 3



def _done_ledger(folder):
    """A toolkit JSONL ledger (hand-written events) with one done item whose artifact, its
    size and SHA-256, is recorded; the artifact itself exists nowhere."""
    header = {"format": "resume-toolkit-ledger-jsonl", "version": 1}
    steps = [("add", None, "pending", 0, {"source": "a.pdf"}), ("move", "pending", "unknown", 1, {}),
             ("move", "unknown", "submitted", 1, {}),
             ("move", "submitted", "done", 1, {"artifact_path": "a.out.pdf", "artifact_size": 9,
                                               "artifact_sha256": "ab" * 32})]
    lines = [header] + [{"seq": seq, "ts": 1.0 + seq, "op": op, "key": "k0", "from": frm,
                         "to": to, "attempt": attempt, "worker": None, "token": 0,
                         "detail": detail}
                        for seq, (op, frm, to, attempt, detail) in enumerate(steps, 1)]
    path = folder / "l.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_audit_of_a_ledger_copied_without_its_roots_file_never_plans_skip(tmp_path):
    """Fault: a toolkit ledger copied without ``<ledger>.roots.json`` (and no --artifacts):
    its done items' artifacts cannot be looked at. Property: they are not ``skip`` (done
    and verified) but ``verify``, the finding and the why saying the artifact was not
    checked and naming the missing roots file."""
    from toolkit.forensics import audit

    report = audit(_done_ledger(tmp_path))
    [(item, action, why)] = report.rows
    assert item.state == "done" and action == "verify"
    assert "not checked" in why and ".roots.json" in why
    assert [a.kind for a in report.anomalies] == ["done_without_artifact"]


def test_audit_with_artifacts_folder_still_checks_and_plans_from_what_it_found(tmp_path):
    """Property (the other side): given --artifacts, the same item is checked: its artifact
    absent there is ``artifact_missing``, planned ``reconcile`` (look up, re-fetch)."""
    from toolkit.forensics import audit

    (tmp_path / "out").mkdir()
    report = audit(_done_ledger(tmp_path), artifacts=tmp_path / "out")
    [(_, action, _)] = report.rows
    assert action == "reconcile"
    assert [a.kind for a in report.anomalies] == ["artifact_missing"]
