"""Outsider finding R5 (low): a JSONL ledger that ends in one extra blank line (``}\\n\\n``,
what an editor's save or ``echo >> l.jsonl`` leaves) was refused by run, ledger and review
(exit 2, "corrupt lines N (keys affected: not readable)"), and the audit called it a corrupt
line. A blank line (empty, or only spaces, tabs, CRs) is no event and no damage now
(``gaps.blank``, the one rule of the replay and the audit); an event line replaced by a
blank line is still a seq gap: refused, and named by the audit.

Every ledger here is a real one: a real run (the toolkit's writer) of a real corpus.
"""

import json
import shutil

import pytest

from toolkit import documents
from toolkit.cli import main
from toolkit.ledger.jsonl import JsonlLedger

from test_outsider_o27_ledger import _executions, _lines, _run


def _batch(folder):
    """A real non-idempotent batch of 3 run to rest: (ledger path, its bytes)."""
    documents.make_corpus(folder / "in", docs=3, poison=0, seed=11)
    ledger = folder / "l.jsonl"
    assert _run(folder, ledger) == 0
    return ledger, ledger.read_bytes()


def _items(ledger) -> dict:
    """key -> state of a ledger opened whole (no corrupt line, no missing seq)."""
    opened = JsonlLedger(ledger)
    try:
        assert not opened.corrupt_lines and not opened.missing_seqs
        return {i.key: i.state for i in opened.items()}
    finally:
        opened.close()


def _findings(capsys, ledger) -> list:
    """Every finding ``audit --json`` reports, as text (kind and detail)."""
    capsys.readouterr()
    assert main(["audit", str(ledger), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    return [json.dumps(a) for a in report.get("anomalies", [])]


def _accepted(capsys, folder, ledger):
    for args in (["ledger", str(ledger)], ["review", "--ledger", str(ledger)]):
        capsys.readouterr()
        assert main(args) == 0, capsys.readouterr().err
    assert _findings(capsys, ledger) == []


BLANKS = {
    "end": lambda lines: [*lines, b"\n"],
    "end_spaces_cr": lambda lines: [*lines, b"  \t\r\n"],
    "middle": lambda lines: [*lines[:4], b"\n", *lines[4:]],
    "several": lambda lines: [lines[0], b"\n", b" \n", *lines[1:6], b"\r\n", b"\t\n",
                              *lines[6:], b"\n", b"\n"],
}


@pytest.mark.parametrize("where", BLANKS)
def test_blank_line_accepted_by_ledger_review_audit_and_run(tmp_path, capsys, where):
    """Fault: blank lines at the end, in the middle, several (spaces, tabs, CRs).
    Property: ledger and review exit 0, the audit has no finding, the items are the ones
    without the blank lines; a run appends after them (the blank lines stay, nothing is
    cut or rewritten), a rerun is fine, and nothing is executed twice."""
    ledger, before = _batch(tmp_path)
    items = _items(ledger)
    changed = b"".join(BLANKS[where](_lines(ledger)))
    ledger.write_bytes(changed)
    _accepted(capsys, tmp_path, ledger)
    assert _items(ledger) == items
    # new work: one more document, so the run appends
    documents.make_corpus(tmp_path / "more", docs=1, poison=0, seed=12)
    for pdf in (tmp_path / "more").iterdir():
        shutil.copy(pdf, tmp_path / "in" / f"new-{pdf.name}")
    assert _run(tmp_path, ledger) == 0
    after = ledger.read_bytes()
    assert after.startswith(changed) and len(after) > len(changed)
    assert _run(tmp_path, ledger) == 0
    assert _executions(tmp_path)[1] == 1  # no task succeeded twice
    _accepted(capsys, tmp_path, ledger)


def test_event_line_blanked_refused_as_seq_gap_and_named_by_audit(tmp_path, capsys):
    """Fault: an interior event line replaced by a blank line (its event lost). Property:
    still a hole in the history: run and ledger refuse it (exit 2, naming the missing seq),
    and the audit reports a ``seq_gap`` naming that seq."""
    ledger, _ = _batch(tmp_path)
    lines = _lines(ledger)
    seq = json.loads(lines[5])["seq"]
    ledger.write_bytes(b"".join([*lines[:5], b"\n", *lines[6:]]))
    capsys.readouterr()
    assert main(["ledger", str(ledger)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"missing the events of seq {seq} " in err, err
    assert _run(tmp_path, ledger) == 2
    gaps = [f for f in _findings(capsys, ledger) if "seq_gap" in f]
    assert len(gaps) == 1 and f"seq {seq}" in gaps[0], gaps
