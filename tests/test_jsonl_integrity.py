"""The JSONL ledger writes only on a file it can prove is its own and whole."""

import json
import subprocess
import sys

import pytest

from toolkit import documents
from toolkit.errors import LedgerError
from toolkit.forensics import audit
from toolkit.ledger import State, open_ledger
from toolkit.ledger.jsonl import HEADER_LINE, JsonlLedger
from toolkit.provider import provider_at

S = State


def toolkit(cwd, *args):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_foreign_state_file_is_refused_and_left_byte_for_byte(tmp_path):
    """--ledger state.jsonl pointing at a {"file","status"} state file (no final newline):
    the old ledger adopted it, cut its last line as a 'torn tail' and appended events.
    Now: one-line refusal, and the user's file is unchanged."""
    path = tmp_path / "state.jsonl"
    data = b'{"file": "a.pdf", "status": "done"}\n{"file": "b.pdf", "status": "pending"}'
    path.write_bytes(data)
    with pytest.raises(LedgerError, match="not a resume-toolkit JSONL ledger"):
        open_ledger(path)
    assert path.read_bytes() == data
    corpus = documents.make_corpus(tmp_path / "in", docs=1, poison=0, seed=1)
    result = toolkit(tmp_path, "run", "--inputs", str(corpus[0].parent), "--ledger", str(path),
                     "--provider-db", "p.sqlite", "--out", "out", "--no-progress")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert path.read_bytes() == data


def test_headerless_ledger_is_upgraded_by_a_writer_never_by_a_view(tmp_path, clock):
    """Every ledger written before the header (the committed fixtures too) is still ours:
    a view reads it and changes nothing; the next writer adds the header in one rewrite,
    keeping every event. A new ledger starts with the header."""
    path = tmp_path / "l.jsonl"
    with open_ledger(path, clock=clock) as ledger:
        ledger.add("a")
        ledger.move("a", S.PENDING, S.UNKNOWN)
    assert path.read_bytes().startswith(HEADER_LINE)
    legacy = path.read_bytes()[len(HEADER_LINE):]
    path.write_bytes(legacy)
    with JsonlLedger(path, view=True) as view:
        assert view.get("a").state is S.UNKNOWN and view.version is None
        with pytest.raises(LedgerError, match="read-only view"):
            view.add("b")
    assert path.read_bytes() == legacy
    with open_ledger(path, clock=clock) as writer:
        assert writer.get("a").state is S.UNKNOWN
        writer.add("b")
    assert path.read_bytes().startswith(HEADER_LINE + legacy)


def test_newer_format_version_is_refused_for_writing(tmp_path):
    """A header naming a version this toolkit does not know: refused, file unchanged."""
    path = tmp_path / "l.jsonl"
    data = json.dumps({"format": "resume-toolkit-ledger-jsonl", "version": 2}).encode() + b"\n"
    path.write_bytes(data)
    with pytest.raises(LedgerError, match="version 2"):
        open_ledger(path)
    assert path.read_bytes() == data


@pytest.mark.slow
def test_zeroed_add_line_of_a_done_item_refuses_writes_and_salvage_parks_it_for_review(tmp_path):
    """Zero the interior add line of an item that is already done (non-idempotent
    provider). The old ledger rejected every later event of that key, re-added it as
    pending and executed it a second time. Now the run halts with one line naming the
    line and the key, nothing is executed, the audit plans review for the key, and
    ``ledger PATH --salvage NEW`` writes a ledger with that key in needs_review on which a
    run finishes with no second execution."""
    corpus = tmp_path / "in"
    documents.make_corpus(corpus, docs=3, poison=0, seed=2)
    run = ["run", "--inputs", str(corpus), "--provider-db", "p.sqlite", "--out", "out",
           "--no-progress", "--contract", "non-idempotent"]
    assert toolkit(tmp_path, *run, "--ledger", "l.jsonl").returncode == 0
    path = tmp_path / "l.jsonl"
    lines = path.read_bytes().split(b"\n")
    number, victim = next((n, json.loads(line)["key"]) for n, line in enumerate(lines, 1)
                          if b'"op": "add"' in line)
    lines[number - 1] = b"\x00" * len(lines[number - 1])  # zeroed blocks, as after a crash
    path.write_bytes(b"\n".join(lines))
    damaged = path.read_bytes()

    refused = toolkit(tmp_path, *run, "--ledger", "l.jsonl")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr  # salvage: O7
    [line] = refused.stderr.strip().splitlines()
    assert f"corrupt lines {number}," in line and victim[:12] in line and "audit" in line
    assert path.read_bytes() == damaged
    with provider_at(tmp_path / "p.sqlite") as provider:
        assert provider.stats()["executions"] == 3

    report = audit(path)
    assert dict(zip(report.items["key"], report.items["action"]))[victim] == "review"

    salvaged = toolkit(tmp_path, "ledger", "l.jsonl", "--salvage", "new.jsonl", "--json")
    assert salvaged.returncode == 0, salvaged.stderr
    assert json.loads(salvaged.stdout)["needs_review"] == [victim]
    assert path.read_bytes() == damaged
    again = toolkit(tmp_path, *run, "--ledger", "new.jsonl")
    assert again.returncode == 0, again.stderr
    with open_ledger(tmp_path / "new.jsonl") as new:
        assert new.get(victim).state is S.NEEDS_REVIEW
        assert sum(item.state is S.DONE for item in new.items()) == 2
    with provider_at(tmp_path / "p.sqlite") as provider:
        assert provider.stats()["executions"] == 3  # no second execution, ever
