"""Outsider findings O27 Q1 and Q9 on the JSONL ledger's history.

Q1: the header line of a salvaged ledger deleted (``tail -n +2``) left a file read as an
older headerless ledger: the salvage mark (only in the header) was gone, and a run on a
non-idempotent provider executed the lost key a second time; one snapshot line deleted
(``sed 3d``) went unnoticed. Now the header counts its snapshot lines (``ledger/header.py``)
and snapshot lines with no header above them, or not the count it records, are damage
(``gaps.snapshot_damage``): refused like a seq gap, named by the audit.

Q9: a duplicated or swapped event line was accepted. Now event seqs strictly increase down
the file (``gaps.out_of_order``): a repeat or a step back is damage, named by line. A second
salvage keeps the first's mark (a chain), and a salvaged ledger keeps its source's mode.
"""

import json
import os
import stat
import threading

from toolkit import documents
from toolkit.cli import main
from toolkit.forensics import audit, render_text
from toolkit.ledger import State, open_ledger
from toolkit.ledger.jsonl import HEADER_LINE, JsonlLedger, read_header
from toolkit.provider.records import provider_stats

S = State


def _run(folder, ledger, *extra):
    return main(["run", "--inputs", str(folder / "in"), "--ledger", str(ledger),
                 "--provider-db", str(folder / "p.db"), "--out", str(folder / "out"),
                 "--contract", "non-idempotent", "--no-progress", *extra])


def _lines(path):
    return path.read_bytes().splitlines(keepends=True)


def _executions(folder) -> tuple[int, int]:
    """(executions, most successes of one task) at the provider."""
    stats = provider_stats(folder / "p.db")
    return stats["executions"], max(t["succeeded"] for t in stats["per_task"].values())


def _salvaged_batch(tmp_path, capsys) -> tuple[str, object]:
    """A real non-idempotent batch of 3 run to rest; every line of one done key deleted;
    ``ledger --salvage`` writes ``S.jsonl`` (marked: a key was lost). (lost key, S path)."""
    documents.make_corpus(tmp_path / "in", docs=3, poison=0, seed=11)
    ledger = tmp_path / "L.jsonl"
    assert _run(tmp_path, ledger) == 0
    lost = json.loads(_lines(ledger)[2])["key"]
    ledger.write_bytes(b"".join(line for line in _lines(ledger)
                                if json.loads(line).get("key") != lost))
    assert main(["ledger", str(ledger), "--salvage", str(tmp_path / "S.jsonl")]) == 0
    capsys.readouterr()
    return lost, tmp_path / "S.jsonl"


def _refused_everywhere(tmp_path, path, capsys, words):
    """``run``, ``ledger``, ``ledger --json`` and ``review`` each refuse ``path``: exit 2,
    one line on stderr naming ``words``, audit and salvage; the file is left as it was."""
    before = path.read_bytes()
    for argv in ([None], ["ledger", str(path)], ["ledger", str(path), "--json"],
                 ["review", "--ledger", str(path)]):
        assert (_run(tmp_path, path) if argv == [None] else main(argv)) == 2
        captured = capsys.readouterr()
        [line] = captured.err.strip().splitlines()
        assert words in line and "audit" in line and "--salvage" in line, line
    assert path.read_bytes() == before


def test_header_deleted_from_a_salvaged_ledger_run_refuses_and_nothing_executes_twice(
        tmp_path, capsys):
    """Fault (Q1, the outsider's commands): a salvaged ledger's header line deleted
    (``tail -n +2 S.jsonl > T.jsonl``): its salvage mark gone with it. Property: run,
    ledger and review refuse T (exit 2, one line: snapshot lines without a header), the
    provider executes nothing more; audit names ``missing_header`` and plans review; a
    salvage of T marks the new ledger again, and the run on it adopts the lost key by
    lookup: every task executed once."""
    lost, salvaged = _salvaged_batch(tmp_path, capsys)
    assert read_header(_lines(salvaged)[0])["salvaged"] is not None
    headerless = tmp_path / "T.jsonl"
    headerless.write_bytes(b"".join(_lines(salvaged)[1:]))
    assert _executions(tmp_path) == (3, 1)

    _refused_everywhere(tmp_path, headerless, capsys, "no header line")
    assert _executions(tmp_path) == (3, 1)
    report = audit(headerless)
    assert [a.kind for a in report.anomalies if a.key is None] == ["missing_header"]
    assert "snapshot lines" in render_text(report)

    again = tmp_path / "U.jsonl"
    assert main(["ledger", str(headerless), "--salvage", str(again)]) == 0
    mark = read_header(_lines(again)[0])["salvaged"]
    assert mark["from"] == "T.jsonl" and "header line" in mark["lost"]
    assert _run(tmp_path, again) == 0
    assert _executions(tmp_path) == (3, 1)  # the lost key looked up and adopted, not resent
    with open_ledger(again) as ledger:
        assert ledger.get(lost).state == S.DONE


def test_snapshot_line_deleted_from_a_salvaged_or_compacted_ledger_is_refused_and_named(
        tmp_path, capsys):
    """Fault (Q1): one snapshot line deleted (``sed 3d``) from a salvaged ledger, and from a
    ledger compacted after a real run. Property: each is refused everywhere (exit 2, one
    line naming the count the header records); audit names ``snapshot_mismatch`` and plans
    every item review; a salvage of it works and keeps the mark."""
    _, salvaged = _salvaged_batch(tmp_path, capsys)
    compacted = tmp_path / "C.jsonl"
    assert _run(tmp_path, compacted, "--new-batch") == 0  # another batch of L's inputs, meant
    with open_ledger(compacted) as ledger:
        assert ledger.compact() == 3
    for path, count in ((salvaged, 2), (compacted, 3)):
        lines = _lines(path)
        path.write_bytes(b"".join(lines[:2] + lines[3:]))
        _refused_everywhere(tmp_path, path, capsys,
                            f"{count - 1} snapshot line{'s' * (count > 2)} where its header "
                            f"records {count}")
        report = audit(path)
        assert [a.kind for a in report.anomalies if a.key is None] == ["snapshot_mismatch"]
        assert set(report.items["action"]) <= {"review", "skip", "verify"}
    new = tmp_path / "S2.jsonl"
    assert main(["ledger", str(salvaged), "--salvage", str(new)]) == 0
    mark = read_header(_lines(new)[0])["salvaged"]
    assert mark["from"] == "S.jsonl" and mark["earlier"][0]["from"] == "L.jsonl"


def test_duplicated_event_line_is_refused_and_audit_names_the_line(tmp_path, capsys):
    """Fault (Q9): the last event line of a real run's ledger copied below itself (a done
    move, twice). Property: run, ledger and review refuse (exit 2, one line naming the line
    and its seq); audit reports ``seq_disorder`` naming that line, not only an illegal
    transition; salvage works and marks the new ledger."""
    documents.make_corpus(tmp_path / "in", docs=2, poison=0, seed=3)
    path = tmp_path / "L.jsonl"
    assert _run(tmp_path, path) == 0
    lines = _lines(path)
    seq = json.loads(lines[-1])["seq"]
    path.write_bytes(b"".join(lines + lines[-1:]))
    where = f"line {len(lines) + 1} (seq {seq} after seq {seq})"
    _refused_everywhere(tmp_path, path, capsys, where)
    report = audit(path)
    [disorder] = [a for a in report.anomalies if a.kind == "seq_disorder"]
    assert where in disorder.detail
    assert main(["ledger", str(path), "--salvage", str(tmp_path / "S.jsonl")]) == 0
    mark = read_header(_lines(tmp_path / "S.jsonl")[0])["salvaged"]
    assert "order" in mark["lost"]


def test_swapped_event_lines_are_refused_and_audit_names_where_the_order_breaks(
        tmp_path, capsys):
    """Fault (Q9): two adjacent event lines of a real run's ledger swapped. Property: the
    ledger refuses it everywhere (exit 2) naming the second line of the pair, whose seq is
    below the one before; audit reports ``seq_disorder`` there and no ``seq_gap``."""
    documents.make_corpus(tmp_path / "in", docs=2, poison=0, seed=3)
    path = tmp_path / "L.jsonl"
    assert _run(tmp_path, path) == 0
    lines = _lines(path)
    lines[3], lines[4] = lines[4], lines[3]
    path.write_bytes(b"".join(lines))
    first, second = (json.loads(line)["seq"] for line in lines[3:5])
    where = f"line 5 (seq {second} after seq {first})"
    _refused_everywhere(tmp_path, path, capsys, where)
    kinds = [a.kind for a in audit(path).anomalies]
    assert "seq_disorder" in kinds and "seq_gap" not in kinds


def test_salvage_of_a_0644_ledger_keeps_its_mode(tmp_path, capsys):
    """Fault (Q9): the salvaged file was written 0600 (a temp file's mode) from a 0644 or
    0640 ledger. Property: the new ledger has the mode of the old one."""
    _, salvaged = _salvaged_batch(tmp_path, capsys)
    assert stat.S_IMODE(os.stat(salvaged).st_mode) == \
        stat.S_IMODE(os.stat(tmp_path / "L.jsonl").st_mode) == 0o644
    os.chmod(salvaged, 0o640)
    lines = _lines(salvaged)
    salvaged.write_bytes(b"".join(lines[:2] + lines[3:]))
    assert main(["ledger", str(salvaged), "--salvage", str(tmp_path / "N.jsonl")]) == 0
    assert stat.S_IMODE(os.stat(tmp_path / "N.jsonl").st_mode) == 0o640


def test_compaction_salvage_and_group_commit_threads_stay_accepted(tmp_path, capsys):
    """Fault: none: the legitimate ways a ledger changes. Property: a real run, compaction,
    another run, a salvage of the intact ledger and a run on it, and 8 threads appending
    under group commit, each reopen with no damage of any kind and audit with no
    line-level finding. (A header written before it counted snapshots is now refused
    over snapshot lines and salvaged once: test_outsider_o28_ledger, R2.)"""
    documents.make_corpus(tmp_path / "in", docs=3, poison=0, seed=5)
    path = tmp_path / "L.jsonl"
    assert _run(tmp_path, path) == 0
    with open_ledger(path) as ledger:
        ledger.compact()
    documents.make_corpus(tmp_path / "in", docs=4, poison=0, seed=5)
    assert _run(tmp_path, path) == 0
    assert main(["ledger", str(path), "--salvage", str(tmp_path / "S.jsonl")]) == 0
    assert _run(tmp_path, tmp_path / "S.jsonl") == 0
    threaded = tmp_path / "G.jsonl"
    with JsonlLedger(threaded, group_commit=True, durable=True) as ledger:
        workers = [threading.Thread(target=lambda n=n: [ledger.add(f"k{n}-{i}")
                                                        for i in range(40)]) for n in range(8)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    legacy = tmp_path / "H.jsonl"  # compacted before the count: salvaged once (O28 R2)
    legacy.write_bytes(HEADER_LINE + b"".join(_lines(path)[1:]))
    assert main(["ledger", str(legacy), "--salvage", str(tmp_path / "H2.jsonl")]) == 0
    for each in (path, tmp_path / "S.jsonl", threaded, tmp_path / "H2.jsonl"):
        with JsonlLedger(each, view=True) as view:
            assert view.corruption() is None, each
        assert not [a for a in audit(each).anomalies if a.key is None], each
        assert main(["ledger", str(each)]) == 0
    assert read_header(_lines(tmp_path / "S.jsonl")[0]).get("salvaged") is None


def test_second_salvage_of_a_salvaged_ledger_keeps_the_first_mark_as_earlier(
        tmp_path, capsys):
    """Fault (Q9): a salvaged ledger (a key lost from ``L.jsonl``) damaged again, one of
    its snapshot lines overwritten with garbage, and salvaged a second time. Property: the
    new header names this salvage's loss and keeps the first's as ``earlier`` (its lost key
    is still lost: never forgotten); the audit's note names both."""
    _, salvaged = _salvaged_batch(tmp_path, capsys)
    first = read_header(_lines(salvaged)[0])["salvaged"]
    lines = _lines(salvaged)
    lines[1] = b"{garbage\n"
    salvaged.write_bytes(b"".join(lines))
    again = tmp_path / "S2.jsonl"
    assert main(["ledger", str(salvaged), "--salvage", str(again)]) == 0
    mark = read_header(_lines(again)[0])["salvaged"]
    assert mark["from"] == "S.jsonl" and "corrupt lines 2" in mark["lost"]
    assert mark["earlier"] == [first] and first["from"] == "L.jsonl"
    [note] = audit(again).notes
    assert "salvaged from S.jsonl (corrupt lines 2" in note
    assert f"earlier from L.jsonl ({first['lost']})" in note
