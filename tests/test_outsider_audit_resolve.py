"""Faults an outside tester found in ``audit --csv``, ``--output-name``, ``resolve`` and the
views, each on a real batch ledger (a run that parked an item, as in
test_review_resolve.py) or a real foreign state file."""

import csv
import json
import os
import shutil
import subprocess
import sys

import pytest

from test_review_resolve import cli, make_small, parked, snapshot  # noqa: F401 (fixture)
from toolkit.documents.render import pdf_bytes
from toolkit.ledger import State, open_ledger

S = State


# -- 1, 11: --csv never writes onto the audited ledger, never leaves half a file --------------

@pytest.mark.parametrize("target", ["{L}", "link.csv", "{L}-wal", "{L}-shm", "{L}-journal",
                                    "{L}.roots.json", "{L}.lock", "{L}.inputs", "hard.csv"])
def test_csv_onto_the_audited_ledger_or_a_companion_is_refused_exit_2_nothing_written(
        parked, tmp_path, capsys, target):
    """What breaks: ``--csv`` names the ledger itself, a symlink or hard link to it, or one
    of its companion files. Must hold: one line, exit 2, every existing file byte-identical,
    no companion created."""
    path = parked[0]
    os.symlink(path, tmp_path / "link.csv")
    os.link(path, tmp_path / "hard.csv")
    before = {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    name = target.replace("{L}", str(path))
    status, _, err = cli(capsys, "audit", path, "--csv", tmp_path / name)
    assert (status, err.count("\n")) == (2, 1) and "refusing to write over it" in err
    assert {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


@pytest.mark.slow
def test_csv_write_past_rlimit_fsize_leaves_the_old_csv_whole_and_no_partial_file(
        parked, tmp_path, capsys):
    """What breaks: the CSV write hits a real RLIMIT_FSIZE (EFBIG) part-way. Must hold: exit 1
    (a storage error, as for --json: free space, run again), one line naming the target,
    the previous CSV byte-identical, no temporary file left."""
    path = parked[0]
    target = tmp_path / "report" / "items.csv"
    target.parent.mkdir()
    previous = b'"key","source","state"\n"k0","a.pdf","done"\n'  # an earlier audit's CSV
    target.write_bytes(previous)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100)); "
            "from toolkit.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code, "audit", str(path), "--csv", str(target)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert str(target) in done.stderr and "too large" in done.stderr
    assert target.read_bytes() == previous
    assert os.listdir(target.parent) == ["items.csv"]


# -- 5: the CSV is exact ------------------------------------------------------------------------

def test_csv_keeps_a_carriage_return_name_in_its_cell_and_sizes_as_integers(parked, tmp_path,
                                                                           capsys):
    """What breaks: a source name holds ``\\r`` and ``\\t`` (beside a real run's done items
    and a parked one with no artifact). Must hold: a csv reader gets one row per item with
    the name whole, and every size is written as an integer (never ``2914.0``)."""
    path = parked[0]
    name = "tab\there\r.pdf"
    with open_ledger(path) as ledger:
        ledger.add("odd", name)
        sizes = {item.key: item.artifact_size for item in ledger.items()}
    target = tmp_path / "items.csv"
    status, _, _ = cli(capsys, "audit", path, "--csv", target)
    with open(target, newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    assert status == 0 and len(rows) == len(sizes) == 6
    by_key = {row["key"]: row for row in rows}
    assert by_key["odd"]["source"] == name
    assert {key: row["artifact_size"] for key, row in by_key.items()} == \
        {key: "" if size is None else str(size) for key, size in sizes.items()}
    assert sum(size is not None for size in sizes.values()) == 3


# -- 2, 12, 6: resolve refuses what it cannot record truthfully --------------------------------

@pytest.mark.parametrize("out", ["elsewhere", "/"])
def test_accept_with_an_out_other_than_the_recorded_root_is_refused_exit_2_nothing_written(
        parked, tmp_path, capsys, out):
    """What breaks: the ledger records its outputs root (out/) and the operator gives another
    --out (a folder holding the PDF, or ``/``): the path would be stored relative to a root
    the ledger does not know. Must hold: exit 2, one line, no event written."""
    path, _, _, key = parked
    (tmp_path / "elsewhere").mkdir()
    made = tmp_path / "elsewhere" / "recovered.pdf"
    made.write_bytes(pdf_bytes(["recovered"]))
    before = snapshot(path)
    root = tmp_path / "elsewhere" if out == "elsewhere" else out
    status, _, err = cli(capsys, "resolve", "--ledger", path, "--key", key, "--accept-artifact",
                         made, "--out", root, "--note", "n")
    assert (status, err.count("\n")) == (2, 1) and "not the outputs root" in err
    assert snapshot(path) == before


def test_accept_of_another_items_recorded_artifact_is_refused_exit_2_nothing_written(
        parked, capsys):
    """What breaks: the operator accepts, for the parked item, a file that is already the
    verified output of a done item: two items would share one file. Must hold (refused,
    not reported later): exit 2, one line naming the other item, no event written."""
    path, _, _, key = parked
    with open_ledger(path) as ledger:
        done = next(item for item in ledger.items() if item.state is S.DONE)
    before = snapshot(path)
    status, _, err = cli(capsys, "resolve", "--ledger", path, "--key", key, "--accept-artifact",
                         path.parent / "out" / done.artifact_path, "--note", "n")
    assert (status, err.count("\n")) == (2, 1) and done.key in err
    assert "already the artifact" in err and snapshot(path) == before


@pytest.mark.parametrize("suffix", ["jsonl", "sqlite"])
def test_resolve_on_an_empty_ledger_file_is_exit_2_and_writes_nothing(tmp_path, capsys, suffix):
    """What breaks: the --ledger file exists but is empty (0 bytes). Must hold: exit 2, one
    line; the file stays 0 bytes and nothing (lock, schema, header) appears beside it."""
    path = tmp_path / f"e.{suffix}"
    path.write_bytes(b"")
    status, _, err = cli(capsys, "resolve", "--ledger", path, "--key", "k", "--release",
                         "--note", "n")
    assert (status, err.count("\n")) == (2, 1) and "is empty" in err
    assert path.read_bytes() == b"" and os.listdir(tmp_path) == [path.name]


# -- 3: a decision recorded during a live run with another --out -------------------------------

def test_accept_during_a_live_run_with_another_out_is_copied_verified_before_out_is_recorded(
        parked, tmp_path, capsys):
    """What breaks: while a run writes to out2/ (the ledger records out/), the operator
    accepts out/acc.pdf for the parked item: recorded relative to out/, after the run's scan.
    Must hold: at its end the run copies the accepted file into out2/ verified (size and
    SHA-256, from the recorded root) before it names out2/ the recorded root, so it claims
    rest with every done artifact in out2/ (no "run again"), and the audit finds every
    artifact; a rerun changes nothing. (Before o36 finding 2 the run said "run again" and
    only the rerun copied it.)"""
    from toolkit import roots
    from toolkit.forensics import audit
    from toolkit.runner import RetryPolicy, Runner

    path, provider, corpus, key = parked
    new = tmp_path / "new.pdf"
    new.write_bytes(pdf_bytes(["a new document"]))
    inputs = [*corpus, new]
    accepted = tmp_path / "out" / "acc.pdf"
    accepted.write_bytes(pdf_bytes(["accepted by hand"]))
    said = []

    def resolve_meanwhile(point, item_key, **context):
        if point == "before_intent" and not said:
            said.append(cli(capsys, "resolve", "--ledger", path, "--key", key,
                            "--accept-artifact", accepted, "--note", "by hand")[0])

    def run_out2(hook=None):
        runner = Runner(open_ledger(path), provider, tmp_path / "out2", hook=hook,
                        policy=RetryPolicy(base_delay=0.0), sleep=lambda seconds: None)
        try:
            return runner, runner.run(inputs)
        finally:
            runner.close()

    runner, counts = run_out2(resolve_meanwhile)
    assert said == [0] and counts["done"] >= 4
    with open_ledger(path) as ledger:
        item = ledger.get(key)
    assert item.state is S.DONE and item.artifact_path == "acc.pdf"
    assert runner.local_errors == [] and runner.unsettled == 0  # the CLI: exit 0
    assert roots.recorded(path)["out"].name == "out2"
    assert (tmp_path / "out2" / "acc.pdf").read_bytes() == accepted.read_bytes()
    report = audit(path, artifacts=tmp_path / "out2")
    assert not [a for a in report.anomalies if a.kind.startswith("artifact")]
    runner, _ = run_out2()  # the same command again
    assert runner.local_errors == [] and roots.recorded(path)["out"].name == "out2"


# -- 8: a resolve that fails on a full disk leaves a JSONL ledger as it was --------------------

@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace (installed by .ci/run)")
def test_resolve_hitting_enospc_after_its_claim_leaves_the_jsonl_ledger_byte_identical(
        tmp_path):
    """What breaks: the disk fills between the claim line and the move line (strace makes the
    2nd and 3rd write(2) fail with a real ENOSPC: the move, then the release). Must hold:
    exit 1 (run again), the error names the cause, and the ledger's bytes are exactly as
    before: no claim event left behind without its decision."""
    path = make_small(tmp_path / "l.jsonl")
    before = path.read_bytes()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        ["strace", "-f", "-qq", "--seccomp-bpf", "-o", os.devnull, "-e", "trace=write",
         "-e", "inject=write:error=ENOSPC:when=2..3", sys.executable, "-m", "toolkit",
         "resolve", "--ledger", str(path), "--key", "parked", "--release", "--note", "n"],
        capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and "No space left on device" in done.stderr
    assert path.read_bytes() == before
    with open_ledger(path) as ledger:  # and it still takes the decision once there is room
        assert ledger.get("parked").state is S.NEEDS_REVIEW


# -- 10: a view's error names the user's file ---------------------------------------------------

@pytest.mark.parametrize("view", [["review", "--ledger"], ["ledger"]])
def test_view_of_a_foreign_state_file_names_the_users_path_not_the_private_copy(
        tmp_path, capsys, view):
    """What breaks: ``review`` / ``ledger`` is pointed at a foreign ``{"file","status"}``
    state file (they read a private copy). Must hold: exit 2, one line naming the path the
    user gave, never the temporary copy, and no talk of writing (a view writes nothing)."""
    path = tmp_path / "st.jsonl"
    path.write_text('{"file": "h.pdf", "status": "done"}\n')
    status, _, err = cli(capsys, *view, path)
    assert (status, err.count("\n")) == (2, 1) and f"'{path}' is not a resume-toolkit" in err
    assert "toolkit-view" not in err and "writ" not in err
    assert os.listdir(tmp_path) == ["st.jsonl"]


# -- 4: escaped names are one to one, and the audit finds each input by its real name ----------

@pytest.mark.slow
def test_raw_ff_byte_and_literal_backslash_x_names_stay_distinct_and_audit_inputs_finds_both(
        tmp_path, capsys):
    """What breaks: one input is named with a raw 0xFF byte, another literally ``bad\\\\xff.pdf``
    (and a newline name beside a literal backslash-n). Must hold: a real run records four
    different sources; ``audit --inputs`` finds every input by the name it was escaped from
    (no false stale_input); the text views show four different names."""
    from toolkit.documents import make_corpus

    docs = make_corpus(tmp_path / "f", docs=4, poison=0, seed=21)
    inputs = tmp_path / "in"
    inputs.mkdir()
    names = [b"bad\xff.pdf", b"bad\\xff.pdf", b"a\nb.pdf", b"a\\nb.pdf"]
    for doc, name in zip(sorted(docs), names):
        os.rename(doc, os.path.join(os.fsencode(inputs), name))
    path = tmp_path / "l.sqlite"
    status, _, _ = cli(capsys, "run", "--inputs", inputs, "--ledger", path, "--provider-db",
                       tmp_path / "p.sqlite", "--out", tmp_path / "out", "--no-progress")
    with open_ledger(path) as ledger:
        sources = sorted(item.source for item in ledger.items())
    assert status == 0 and len(set(sources)) == 4
    status, out, _ = cli(capsys, "audit", path, "--inputs", inputs, "--json")
    document = json.loads(out)
    assert status == 0 and not [a for a in document["anomalies"] if a["kind"] == "stale_input"]
    status, out, _ = cli(capsys, "ledger", path, "--json")
    shown = cli(capsys, "ledger", path)[1]
    assert len({row["source"] for row in json.loads(out)["per_item"]}) == 4
    # stored bad\\xff.pdf, bad\\\\xff.pdf, a<newline>b.pdf, a\\\\nb.pdf; shown as stored, the
    # newline escaped, no backslash doubled again (o40 LOW 2): four different texts
    cells = [line.split()[3] for line in shown.splitlines()[2:] if len(line.split()) > 3]
    assert sorted(cells) == sorted(["bad\\xff.pdf", "bad\\\\xff.pdf", "a\\nb.pdf",
                                    "a\\\\nb.pdf"]), shown
