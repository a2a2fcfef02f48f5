"""Outsider S4: a JSONL ledger truncated or emptied IN PLACE while a run writes it
(``: > L``, ``head -n 30 L > h; cat h > L``) went unnoticed: the run ended exit 0, and the
file it left (event lines, no header, seqs not from 1) was refused by ``run``, ``ledger``
and ``ledger --salvage`` alike as "not a resume-toolkit JSONL ledger": no way out.

Now the writer, which knows where its appends end, checks the file's size after each
append (the one ``stat`` that already checks the path names its file): any other size
halts the run, exit 1, one line (truncated or written by another program; salvage). And
such a file is read as a damaged ledger of ours: salvage parks what the lost lines may
have held, and the run on the salvaged ledger executes nothing twice.
"""

import subprocess

from toolkit import documents
from toolkit.cli import main
from toolkit.ledger import State
from toolkit.ledger.jsonl import JsonlLedger
from toolkit.provider.records import provider_stats

from test_outsider_o28_ledger import _interrupted_run, _lines, _run, _twice


def _emptied(ledger):
    ledger.write_bytes(b"")  # ``: > L``: the same inode, truncated in place


def _head_30(ledger):
    subprocess.run(f"head -n 30 '{ledger}' > '{ledger}.h' && cat '{ledger}.h' > '{ledger}'",
                   shell=True, check=True)


def _halted(code, err):
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1, err
    assert "truncated or written by another program" in err and "--salvage" in err, err
    assert "Traceback" not in err


def test_ledger_emptied_mid_run_halts_with_one_line_and_salvage_reads_what_is_left(
        tmp_path, capsys):
    """What is left depends on where the stop fell: nothing (the file emptied between the
    run's last append and its check) or the run's next line (no header, its seq far from
    1). Either way the run halts and salvage writes a new ledger from it."""
    _halted(*_interrupted_run(tmp_path, _emptied, lines=40))
    executions = provider_stats(tmp_path / "p.db")["executions"]
    assert main(["ledger", str(tmp_path / "l.jsonl"), "--salvage",
                 str(tmp_path / "S.jsonl")]) == 0, capsys.readouterr().err
    with JsonlLedger(tmp_path / "S.jsonl", view=True) as salvaged:
        assert salvaged.salvaged  # marked either way: the run looks up before it sends
    _run(tmp_path, tmp_path / "S.jsonl")
    stats = provider_stats(tmp_path / "p.db")
    assert _twice(tmp_path) == 0  # the documents sent before the cut: never again
    assert stats["executions"] == len(stats["per_task"]) >= executions


def test_headerless_lines_with_seqs_not_from_1_are_a_damaged_ledger_salvage_reads(
        tmp_path, capsys):
    """The file ``: > L`` mid-run leaves, made exactly: a real batch's event lines from
    line 31 on (no header, no add line, seqs from 30): ``run`` and ``ledger`` refuse it as
    damaged (naming salvage), never as a foreign file; salvage parks every item (the lost
    lines may have held any key's intent) and the run on the salvaged ledger executes
    nothing twice."""
    documents.make_corpus(tmp_path / "in", docs=8, poison=0, seed=3)
    ledger = tmp_path / "l.jsonl"
    assert _run(tmp_path, ledger) == 0
    ledger.write_bytes(b"".join(_lines(ledger)[30:]))
    executions = provider_stats(tmp_path / "p.db")["executions"]
    capsys.readouterr()
    for argv in (["ledger", str(ledger)], None):
        assert (main(argv) if argv else _run(tmp_path, ledger)) != 0
        err = capsys.readouterr().err
        assert "not a resume-toolkit JSONL ledger" not in err and "--salvage" in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert main(["ledger", str(ledger), "--salvage", str(tmp_path / "S.jsonl")]) == 0, \
        capsys.readouterr().err
    with JsonlLedger(tmp_path / "S.jsonl", view=True) as salvaged:
        assert salvaged.salvaged and "seq 1-29" in salvaged.salvaged["lost"]
        assert {item.state for item in salvaged.items()} <= {State.NEEDS_REVIEW, State.DONE}
    _run(tmp_path, tmp_path / "S.jsonl")
    assert provider_stats(tmp_path / "p.db")["executions"] == executions
    assert _twice(tmp_path) == 0


def test_ledger_cut_in_place_mid_run_halts_with_one_line(tmp_path):
    _halted(*_interrupted_run(tmp_path, _head_30, lines=40))
