"""Outsider findings O1, O2 (audit), O9 on the audit, each reproduced with the real thing:
a real run's inputs and artifacts as ``--csv`` targets (O1), a real JSONL ledger whose lines
are really deleted (O2), real files with odd names really removed (O9), a real add line
deleted under a done item (O9).
"""

import json
import os
import shutil
from pathlib import Path

import pytest

from toolkit.cli import main
from toolkit.documents import make_corpus
from toolkit.forensics import KINDS, audit, render_text
from toolkit.forensics.render import _safe

ROOT = Path(__file__).resolve().parents[1]


def tree(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes: what a refused command must not change."""
    return {str(path.relative_to(folder)): path.read_bytes() if path.is_file() else None
            for path in sorted(folder.rglob("*"))}


def run_batch(root: Path, ledger: str, docs: int = 3, *extra) -> None:
    make_corpus(root / "in", docs=docs, poison=0, seed=25)
    assert main(["run", "--inputs", str(root / "in"), "--ledger", str(root / ledger),
                 "--provider-db", str(root / "p.sqlite"), "--out", str(root / "out"),
                 "--no-progress", *extra]) == 0


@pytest.fixture(scope="module")
def done_batch(tmp_path_factory):
    """A real run of three documents to done, SQLite ledger (copied per test)."""
    root = tmp_path_factory.mktemp("batch")
    run_batch(root, "l.sqlite")
    return root


@pytest.fixture
def batch(tmp_path, done_batch):
    shutil.copytree(done_batch, tmp_path / "b", symlinks=True)
    return tmp_path / "b"


# -- O1: audit --csv never writes into the batch's folders ---------------------------------

def _target(batch: Path, where: str) -> tuple[Path, list]:
    """(the --csv target, the extra audit arguments) for each way a CSV lands on the batch."""
    first_input = sorted((batch / "in").iterdir())[0]
    first_output = sorted((batch / "out").glob("*.pdf"))[0]
    elsewhere = batch.parent / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    (batch.parent / "link-to-in").symlink_to(batch / "in")
    return {
        "an input, --inputs given": (first_input, ["--inputs", batch / "in"]),
        "an input, inputs root recorded": (first_input, []),
        "a new file in --inputs": (batch / "in" / "report.csv", ["--inputs", batch / "in"]),
        "a new file through a symlink to --inputs": (batch.parent / "link-to-in" / "r.csv",
                                                     ["--inputs", batch / "in"]),
        "an artifact, outputs root recorded": (first_output, []),
        "an artifact, --artifacts given": (first_output, ["--artifacts", batch / "out"]),
        "an artifact, --artifacts elsewhere": (first_output, ["--artifacts", elsewhere]),
        "a new file in a subfolder of the outputs": (batch / "out" / "sub" / "r.csv", []),
    }[where]


@pytest.mark.parametrize("where", [
    "an input, --inputs given", "an input, inputs root recorded", "a new file in --inputs",
    "a new file through a symlink to --inputs", "an artifact, outputs root recorded",
    "an artifact, --artifacts given", "an artifact, --artifacts elsewhere",
    "a new file in a subfolder of the outputs"])
def test_csv_target_inside_the_inputs_or_artifacts_is_refused_and_nothing_is_written(
        batch, capsys, where):
    """Fault: ``audit --csv FILE`` names an input of the batch, an artifact, or a new file
    inside the inputs folder or the outputs root (given, recorded beside the ledger, or
    reached through a symlink). Property: exit 2 with one line on stderr naming the
    folder, and every file of the batch keeps its bytes (no CSV, no temporary file)."""
    target, extra = _target(batch, where)
    before = tree(batch)
    assert main(["audit", str(batch / "l.sqlite"), "--csv", str(target),
                 *map(str, extra)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to write there" in err, err
    assert tree(batch) == before


# -- O2: a seq gap in a JSONL ledger is a finding ------------------------------------------

def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _seq(line: bytes):
    return json.loads(line).get("seq")


def _drop(path: Path, lose) -> list:
    """Rewrite ``path`` without the lines for which ``lose(obj)`` is true (a real deletion,
    as an editor or a bad copy makes); the header line is kept. Returns the lost seqs."""
    kept, lost = [], []
    for number, line in enumerate(_lines(path)):
        obj = json.loads(line)
        if number and lose(obj):
            lost.append(obj["seq"])
        else:
            kept.append(line)
    path.write_bytes(b"".join(kept))
    return lost


@pytest.fixture(scope="module")
def jsonl_batch(tmp_path_factory):
    """A real run of three documents to done on a JSONL ledger (copied per test)."""
    root = tmp_path_factory.mktemp("jsonl")
    run_batch(root, "l.jsonl", 3, "--contract", "non-idempotent")
    return root


@pytest.fixture
def jbatch(tmp_path, jsonl_batch):
    shutil.copytree(jsonl_batch, tmp_path / "b", symlinks=True)
    return tmp_path / "b"


def test_every_line_of_one_key_deleted_is_a_seq_gap_finding_in_text_and_json(jbatch, capsys):
    """Fault: every line of one document's key is deleted from a real JSONL ledger (its
    add, intent and done: the item vanishes). Property: the audit does not say
    "findings (0)": a line-level ``seq_gap`` finding (key None) names the missing seqs as
    ranges, in the text report and in ``--json``; the exit status is 0 (the audit ran),
    as for any damage the audit reports."""
    ledger = jbatch / "l.jsonl"
    second = json.loads(_lines(ledger)[2])["key"]
    lost = _drop(ledger, lambda obj: obj["key"] == second)
    assert len(lost) >= 3
    document = json.loads(_json(capsys, ledger))
    gaps = [a for a in document["anomalies"] if a["kind"] == "seq_gap"]
    assert len(gaps) == 1 and gaps[0]["key"] is None, document["anomalies"]
    named = _ranges(lost)
    assert f"no line holds seq {named} ({len(lost)} events)" in gaps[0]["detail"]
    assert main(["audit", str(ledger)]) == 0
    text = capsys.readouterr().out
    assert "findings (0)" not in text and "seq_gap" in text and named.split(",")[0] in text


def _json(capsys, *args) -> str:
    assert main(["audit", *map(str, args), "--json"]) == 0
    return capsys.readouterr().out


def _ranges(seqs) -> str:
    """``[2, 9, 10, 11]`` -> ``'2, 9-11'``."""
    runs = []
    for seq in sorted(seqs):
        if runs and seq == runs[-1][1] + 1:
            runs[-1][1] = seq
        else:
            runs.append([seq, seq])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _unsettled_ledger(path: Path, items: int = 4):
    """``items`` documents added; each but the first claimed and moved to unknown (its
    intent recorded), then released: a ledger in the middle of a batch."""
    from toolkit.ledger import State, open_ledger

    with open_ledger(path) as ledger:
        for n in range(items):
            ledger.add(f"k{n}", source=f"doc-{n}.pdf")
        for n in range(1, items):
            token = ledger.claim(f"k{n}", "w", 60.0)
            ledger.move(f"k{n}", State.PENDING, State.UNKNOWN, token=token, worker="w")
            ledger.release(f"k{n}", token, "w")


def test_a_deleted_intent_line_is_a_seq_gap_and_no_unsettled_item_is_planned_run(tmp_path):
    """Fault: the line recording one item's intent (pending -> unknown: the request may
    have been sent) is deleted. Property: ``seq_gap`` names exactly that seq, and the item
    that now looks pending is planned ``review``, never ``run`` (a second execution)."""
    path = tmp_path / "l.jsonl"
    _unsettled_ledger(path)
    lost = _drop(path, lambda obj: obj["key"] == "k2" and obj["op"] == "move")
    assert len(lost) == 1
    report = audit(path)
    assert [a.kind for a in report.anomalies if a.key is None] == ["seq_gap"]
    assert report.anomalies[0].detail.startswith(f"no line holds seq {lost[0]} (1 event)")
    plan = {item.key: action for item, action, _ in report.rows}
    assert plan["k2"] == "review" and "run" not in plan.values()


def test_many_seq_gaps_are_named_by_the_first_five_ranges_and_a_count(tmp_path):
    """Fault: eight separate intent lines are deleted (eight gaps). Property: the finding
    stays one bounded line: the first five ranges, "and 3 more ranges", and the count of
    every missing event."""
    path = tmp_path / "l.jsonl"
    _unsettled_ledger(path, items=12)
    victims = {f"k{n}" for n in range(1, 9)}
    lost = _drop(path, lambda obj: obj["key"] in victims and obj["op"] == "move")
    assert len(lost) == 8
    [gap] = [a for a in audit(path).anomalies if a.kind == "seq_gap"]
    first_five = ", ".join(map(str, sorted(lost)[:5]))
    assert gap.detail.startswith(f"no line holds seq {first_five} and 3 more ranges "
                                 "(8 events)"), gap.detail


def test_compacted_ledger_with_its_first_event_deleted_is_a_seq_gap_and_intact_is_none(tmp_path):
    """Fault: a compacted JSONL ledger (snapshot lines, all at one seq) whose first event
    after the snapshots is deleted. Property: that seq is a ``seq_gap``; the same ledger
    intact has no finding (snapshot seqs count as present, no false gap)."""
    from toolkit.ledger import State, open_ledger

    path = tmp_path / "l.jsonl"
    _unsettled_ledger(path)
    with open_ledger(path) as ledger:
        ledger.compact()
    with open_ledger(path) as ledger:
        ledger.move("k0", State.PENDING, State.CANCELLED)
        ledger.add("k9", source="doc-9.pdf")
    assert [a for a in audit(path).anomalies if a.key is None] == []
    lost = _drop(path, lambda obj: obj.get("key") == "k0")
    assert len(lost) == 1
    assert [a.kind for a in audit(path).anomalies if a.key is None] == ["seq_gap"]


# -- O9: the details of an orphaned done, and of a missing odd-named input -------------------

def test_done_whose_add_line_is_deleted_keeps_its_recorded_artifact_in_the_audit(jbatch):
    """Fault: the add line of a done document is deleted from a real JSONL ledger (its
    intent, job and done lines remain; the done line records the artifact). Property: the
    item is ``missing_history`` (review), the one missing seq is a ``seq_gap``, and the
    audit does not claim "no artifact path recorded": the done line's artifact is checked
    (it is there and whole, so no artifact finding at all)."""
    ledger = jbatch / "l.jsonl"
    victim = json.loads(_lines(ledger)[2])["key"]  # the second add: seq 2, between two
    lost = _drop(ledger, lambda obj: obj["key"] == victim and obj["op"] == "add")
    report = audit(ledger)
    mine = [(a.kind, a.detail) for a in report.anomalies if a.key == victim]
    assert [kind for kind, _ in mine] == ["missing_history"], mine
    [gap] = [a for a in report.anomalies if a.kind == "seq_gap"]
    assert gap.detail.startswith(f"no line holds seq {lost[0]} (1 event)")
    [(item, action, _)] = [row for row in report.rows if row[0].key == victim]
    assert action == "review" and item.artifact_path and item.artifact_sha256


@pytest.mark.parametrize("odd", [b"bad\xff.pdf", b"new\nline.pdf", b"back\\slash.pdf"])
def test_missing_odd_named_input_is_named_in_the_detail_as_the_source_column_shows_it(
        tmp_path, capsys, odd):
    """Fault: an input whose name is not plain (a byte that is not UTF-8, a newline, a
    backslash) is run to done, then really removed. Property: the ``input_missing`` detail
    names it exactly as the ``source`` column does: the same text in ``--json`` and, once
    escaped, in the text report (never escaped twice)."""
    root = tmp_path
    make_corpus(root / "in", docs=1, poison=0, seed=25)
    [plain] = list((root / "in").iterdir())
    name = os.path.join(os.fsencode(root / "in"), odd)
    os.rename(plain, name)
    assert main(["run", "--inputs", str(root / "in"), "--ledger", str(root / "l.sqlite"),
                 "--provider-db", str(root / "p.sqlite"), "--out", str(root / "out"),
                 "--no-progress"]) == 0
    os.unlink(name)
    capsys.readouterr()
    document = json.loads(_json(capsys, root / "l.sqlite", "--inputs", root / "in"))
    [row] = document["per_item"]
    [finding] = document["anomalies"]
    assert finding["kind"] == "input_missing"
    assert finding["detail"].startswith(f"input '{row['source']}': ")
    report = audit(root / "l.sqlite", inputs=root / "in")
    text = render_text(report)
    assert f"input '{_safe(row['source'])}':" in text  # the detail's first wrapped line


def test_finding_kind_undocumented_seq_gap_is_in_kinds_order_and_in_the_readme_findings():
    """Fault: a finding kind added to the code without its documentation. Property:
    ``seq_gap`` is a kind, listed next to ``corrupt_line`` (the report's order), and
    README's findings list names every kind of ``KINDS``."""
    assert KINDS[KINDS.index("corrupt_line") + 1] == "seq_gap"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    findings = readme.split("\nFindings: ")[1].split("\n\n")[0]
    assert [kind for kind in KINDS if f"`{kind}`" not in findings] == []
