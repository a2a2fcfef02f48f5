"""Outsider T6: line 1 of a JSONL ledger damaged by hand was read three ways. ``"version":
0`` or ``-1`` was accepted silently; a file starting with two BOMs was read by ``run`` (the
replay skipped one BOM, the header reader the second) and called corrupt by the audit; a
ledger cut to 20 bytes (inside its header) was taken by ``run`` as a new ledger (every
request sent again) and the audit then said "findings (0)". Now one validator
(``header.header_problem``, ``header.cut_header``) gives one refusal (run, ledger) and one
finding (audit, ``corrupt_line`` on line 1) for each, in the same words.
"""

import json

import pytest

from toolkit import documents
from toolkit.cli import main
from toolkit.forensics import audit
from toolkit.ledger.header import CUT_HEADER

from test_outsider_o27_ledger import _run


@pytest.fixture
def ledger(tmp_path):
    documents.make_corpus(tmp_path / "in", docs=2, poison=0, seed=1)
    path = tmp_path / "L.jsonl"
    assert _run(tmp_path, path) == 0
    return path


def _version(value):
    def edit(data):
        head, rest = data.split(b"\n", 1)
        return json.dumps({**json.loads(head), "version": value}).encode() + b"\n" + rest
    return edit


def _two_boms(data):
    return b"\xef\xbb\xbf" * 2 + data


def _cut_to_20(data):
    return data[:20]


@pytest.mark.parametrize("damage, words", [
    (_version(0), "names format version 0 in line 1, and versions start at 1"),
    (_version(-1), "names format version -1 in line 1, and versions start at 1"),
    (_two_boms, "has corrupt lines 1"),
    (_cut_to_20, CUT_HEADER)], ids=["version-0", "version-minus-1", "two-boms", "cut-to-20"])
def test_hand_damaged_line_one_is_refused_by_run_and_a_finding_of_the_audit(
        tmp_path, ledger, capsys, damage, words):
    """Run and ``ledger`` refuse it (one line, no traceback, naming salvage), the file
    is left as it was; the audit reports line 1 as a ``corrupt_line`` (never
    "findings (0)")."""
    ledger.write_bytes(damage(ledger.read_bytes()))
    before = ledger.read_bytes()
    capsys.readouterr()
    for argv in (None, ["ledger", str(ledger)]):
        code = _run(tmp_path, ledger) if argv is None else main(argv)
        err = capsys.readouterr().err
        assert code != 0 and len(err.strip().splitlines()) == 1, err
        assert words in err and "--salvage" in err and "Traceback" not in err, err
    assert ledger.read_bytes() == before
    findings = [a for a in audit(ledger).anomalies if a.kind == "corrupt_line"]
    assert [a.detail[:7] for a in findings] == ["line 1:"], findings
    if damage is not _two_boms:  # the ledger's own words (a BOM: the JSON parser's)
        assert words in findings[0].detail


def test_ledger_cut_inside_its_header_is_salvaged_marked(tmp_path, ledger, capsys):
    """The way out of the cut-header refusal: salvage writes a new ledger marked as
    salvaged (every request looked up before it is sent), nothing executed twice."""
    ledger.write_bytes(ledger.read_bytes()[:20])
    new = tmp_path / "S.jsonl"
    assert main(["ledger", str(ledger), "--salvage", str(new)]) == 0, capsys.readouterr().err
    header = json.loads(new.read_bytes().split(b"\n", 1)[0])
    assert "header line (cut inside it)" in header["salvaged"]["lost"]
