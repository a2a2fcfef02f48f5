"""Outsider o39 finding 1: a ledger's final intent line cut by hand anywhere from its first
byte up to ``"note": "in`` (before the note reads ``"int``), or right after the key's 64
hex (before its closing quote), named no key: the audit planned ``run`` for the item whose
request had been sent, and a rerun (its witness removed) executed that document again on a
non-idempotent provider. Such a tail may be an intent (the writer sorts the fields, so the
key comes after the note): it now names every item holding a lease in a state an intent
moves from (``ledger.torn.tail_keys``, one rule for the writer and the audit), which is
marked and looked up before its next send.

The ledger comes from a real run of three documents that finished; its last intent line
is then cut at every byte offset, each cut audited and rerun from the same folder. (A cut
at offset 0 removes the whole line: no torn line is left, and the ledger reads as a run
killed between its claim and its intent, which sent nothing; the witness catches that one.)
"""

import shutil

import pytest

from toolkit.cli import main
from toolkit.documents import make_corpus
from toolkit.forensics import audit
from toolkit.provider import provider_stats

pytestmark = pytest.mark.slow


def _finished_run(batch):
    """A whole non-idempotent run of three documents in ``batch``; its CLI arguments."""
    make_corpus(batch / "in", docs=3, poison=0, seed=5)
    args = ["run", "--inputs", batch / "in", "--ledger", batch / "l.jsonl", "--provider-db",
            batch / "p.db", "--out", batch / "out", "--contract", "non-idempotent",
            "--no-progress"]
    args = list(map(str, args))
    assert main(args) == 0
    assert provider_stats(batch / "p.db")["executions"] == 3
    return args


def test_intent_line_cut_at_any_offset_is_reconciled_and_never_executed_twice(tmp_path, capsys):
    """At every offset of the last intent line: the audit plans ``reconcile`` for its key
    (on main: ``run`` from offset 1 to the cut before ``"int`` and after the 64 hex), and a
    rerun with the witness removed ends with each document executed exactly once."""
    batch, pristine = tmp_path / "batch", tmp_path / "pristine"
    args = _finished_run(batch)
    shutil.copytree(batch, pristine)  # restored before each cut: the same paths each time
    data = (batch / "l.jsonl").read_bytes()
    start = data.rfind(b"\n", 0, data.rfind(b'"note": "intent"')) + 1
    line = data[start:data.index(b"\n", start)]
    key = line.split(b'"key": "')[1][:64].decode()
    planned, executed = {}, {}
    for offset in range(1, len(line) + 1):  # up to the whole line but its newline
        shutil.rmtree(batch)
        shutil.copytree(pristine, batch)
        (batch / "l.jsonl").write_bytes(data[:start + offset])
        report = audit(batch / "l.jsonl")
        planned[offset] = dict(zip(report.items["key"], report.items["action"]))[key]
        (batch / "out" / ".witness.json").unlink()  # what protects it is the ledger's mark
        assert main(args) == 0, capsys.readouterr().err
        stats = provider_stats(batch / "p.db")
        executed[offset] = sorted(t["executions"] for t in stats["per_task"].values())
    capsys.readouterr()
    wrong_plans = {o: a for o, a in planned.items() if a != "reconcile"}
    executed_twice = {o: e for o, e in executed.items() if e != [1, 1, 1]}
    assert (wrong_plans, executed_twice) == ({}, {})
