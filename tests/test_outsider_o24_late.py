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
