"""``resolve --all --reason PREFIX``: every item parked for one reason decided in one command.

The parked items come from a real cause: a batch against a provider whose keys are not
idempotent, its ledger's ``done`` lines damaged, then ``ledger --salvage``; or, for the
kill and skip tests, items parked by the ledger's own moves. Each test runs the CLI as a
real process on real files, makes the fault (a real SIGKILL at a syscall, a rival
connection's move) and checks what must still hold.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from toolkit.ledger import State, open_ledger
from toolkit.provider import provider_stats
from toolkit.runner.review import resolve, resolve_all

S = State
SALVAGED = "salvaged from old.jsonl: corrupt lines 7 may hold events of this item"


def toolkit(*args, stdin=None):
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "toolkit", *map(str, args)], input=stdin,
                          capture_output=True, text=True, env=env, timeout=300)


def moves(path, key):
    """The ``move`` events of ``key`` (op, from, to, note)."""
    with open_ledger(path) as ledger:
        return [(e.frm, e.to, e.detail.get("note")) for e in ledger.events()
                if e.key == key and e.op == "move"]


def park(path, keys, reason=SALVAGED):
    """``keys`` parked in ``needs_review`` with ``reason``, by the ledger's own moves."""
    with open_ledger(path) as ledger:
        for key in keys:
            ledger.add(key, f"{key}.pdf")
            ledger.move(key, S.PENDING, S.UNKNOWN)
            ledger.move(key, S.UNKNOWN, S.NEEDS_REVIEW, reason=reason)


@pytest.fixture
def salvaged(tmp_path, small_corpus):
    """A batch run to the end against a non-idempotent provider, on a JSONL ledger whose
    four ``done`` move lines are then damaged; ``ledger --salvage`` writes ``s.jsonl``, in
    which those four items are parked (a done without its artifact fields). Returns a
    namespace: paths, the parked keys, the command to run the batch again."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for path in small_corpus:
        shutil.copy2(path, inputs / path.name)
    old, new, out, db = (tmp_path / "old.jsonl", tmp_path / "s.jsonl", tmp_path / "out",
                         tmp_path / "p.db")

    def run(ledger):
        return toolkit("run", "--inputs", inputs, "--ledger", ledger, "--provider-db", db,
                       "--out", out, "--contract", "non-idempotent", "--no-progress")
    assert run(old).returncode == 0
    lines = old.read_bytes().split(b"\n")
    done = [at for at, line in enumerate(lines)
            if b'"op": "move"' in line and b'"to": "done"' in line]
    assert len(done) == 4
    for at in done:
        lines[at] = b'{"broken'  # an interior line no longer read: the done is lost
    old.write_bytes(b"\n".join(lines))
    salvage = toolkit("ledger", old, "--salvage", new)
    assert salvage.returncode == 0, salvage.stderr
    with open_ledger(new) as ledger:
        keys = sorted(item.key for item in ledger.items() if item.state is S.NEEDS_REVIEW)
    assert len(keys) == 4

    class Batch:
        pass
    batch = Batch()
    batch.ledger, batch.out, batch.db, batch.keys = new, out, db, keys
    batch.run = lambda: run(new)
    return batch


def test_salvage_parked_items_released_in_bulk_then_run_end_done_with_no_double_execution(
        salvaged):
    """Fault: a salvage parked every item whose done line was lost; the provider (keys not
    idempotent) ran each once. Must hold: ``--dry-run`` lists the four and writes nothing;
    ``--all --reason salvaged --release`` records one release per item with the note,
    exactly as a single resolve does; the next run adopts each item's job by lookup and
    ends with every item done, the provider having executed each document once."""
    before = salvaged.ledger.read_bytes()
    dry = toolkit("resolve", "--ledger", salvaged.ledger, "--all", "--reason", "salvaged",
                  "--release", "--note", "jobs seen at the provider", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert [line.split(":")[0] for line in dry.stdout.splitlines()[:-1]] == salvaged.keys
    assert "would have released 4, skipped 0" in dry.stdout
    assert salvaged.ledger.read_bytes() == before
    done = toolkit("resolve", "--ledger", salvaged.ledger, "--all", "--reason", "salvaged",
                   "--release", "--note", "jobs seen at the provider")
    assert done.returncode == 0 and "released 4, skipped 0" in done.stderr
    for key in salvaged.keys:
        assert moves(salvaged.ledger, key) == [(S.NEEDS_REVIEW, S.UNKNOWN,
                                                "jobs seen at the provider")]
    rerun = salvaged.run()
    assert rerun.returncode == 0 and rerun.stdout.startswith("done=4  failed=1"), rerun.stderr
    stats = provider_stats(salvaged.db)
    assert stats["executions"] == 4
    assert all(task["executions"] == 1 for task in stats["per_task"].values())


def test_review_of_parked_items_whose_output_exists_names_the_file_and_accept_artifact(
        salvaged):
    """Fault: parked items whose outputs are under the outputs root (their done lines lost).
    Must hold: ``review`` lists, per item, the file named for its key and says that
    ``--accept-artifact FILE`` is the way out when the output exists (a release parks again
    where keys are not idempotent and the provider has no job); that file, accepted, makes
    the item done with no provider call."""
    shown = toolkit("review", "--ledger", salvaged.ledger, "--out", salvaged.out)
    assert shown.returncode == 0, shown.stderr
    outputs = [line.split()[1] for line in shown.stdout.splitlines()
               if line.startswith("  output ")]
    assert sorted(os.path.basename(path)[-12:-4] for path in outputs) == \
        [key[:8] for key in salvaged.keys]
    assert "--accept-artifact FILE records it as done" in shown.stdout
    assert "where keys are not idempotent" in shown.stdout
    as_json = json.loads(toolkit("review", "--ledger", salvaged.ledger, "--out", salvaged.out,
                                 "--json").stdout)
    first = as_json["needs_review"][0]
    assert [os.path.basename(path) for path in first["outputs"]] == \
        [os.path.basename(outputs[0])]
    took = toolkit("resolve", "--ledger", salvaged.ledger, "--key", first["key"],
                   "--accept-artifact", first["outputs"][0], "--out", salvaged.out,
                   "--note", "the output is whole")
    assert took.returncode == 0 and "needs_review -> done" in took.stderr
    assert provider_stats(salvaged.db)["submit_calls"] == 4


def test_items_parked_for_another_reason_are_skipped_and_their_lines_left_as_they_were(
        tmp_path):
    """Fault: among the parked items, one was parked for another reason, and others are not
    parked at all. Must hold: only the items whose reason starts with the prefix are
    decided; the ledger's bytes before the command are kept as they were, and every line
    appended names a decided item (claim, move, release); the skipped one is reported with
    its reason; a rerun decides nothing and appends nothing."""
    path = tmp_path / "l.jsonl"
    park(path, ["s1", "s2", "s3"])
    park(path, ["damaged"], reason="artifact damaged and not fetchable")
    with open_ledger(path) as ledger:
        ledger.add("waiting", "w.pdf")
    before = path.read_bytes()
    done = toolkit("resolve", "--ledger", path, "--all", "--reason", "salvaged", "--cancel",
                   "--note", "customer withdrew them")
    assert done.returncode == 0 and "cancelled 3, skipped 1" in done.stderr
    assert ("damaged: skipped, unchanged (parked for another reason: artifact damaged and "
            "not fetchable)") in done.stderr
    after = path.read_bytes()
    assert after.startswith(before)
    added = [json.loads(line) for line in after[len(before):].splitlines()]
    assert [(event["key"], event["op"]) for event in added] == \
        [(key, op) for key in ("s1", "s2", "s3") for op in ("claim", "move", "release")]
    again = toolkit("resolve", "--ledger", path, "--all", "--reason", "salvaged", "--cancel",
                    "--note", "customer withdrew them")
    assert again.returncode == 0 and "cancelled 0, skipped 1" in again.stderr
    assert path.read_bytes() == after


def test_items_moved_after_the_listing_are_skipped_unchanged_not_decided(tmp_path):
    """Fault: while a bulk release works through its list, a second connection (another
    operator) cancels one listed item and releases another, which a run parks again for
    another reason. Must hold: each is decided on the item as read under its lease, so
    both are skipped and reported, never moved by the bulk; the rest are released."""
    path = tmp_path / "l.sqlite"
    park(path, ["a", "b", "c", "d"])
    with open_ledger(path) as ledger, open_ledger(path) as rival:
        steps = resolve_all(ledger, "salvaged", "release", "bulk")
        first = next(steps)
        resolve(rival, "b", "cancel", "withdrawn")
        resolve(rival, "c", "release", "looked at it")
        token = rival.claim("c", "w2", ttl=60.0)  # a run reconciles it, and parks it again
        rival.move("c", S.UNKNOWN, S.NEEDS_REVIEW, token=token, worker="w2", reason=(
            "intent recorded, provider has no job, contract forbids a resubmit"))
        rival.release("c", token, "w2")
        rest = list(steps)
    assert first == ("a", "decided", "unknown")
    assert [(key, outcome) for key, outcome, _ in rest] == \
        [("b", "skipped"), ("c", "skipped"), ("d", "decided")]
    assert "moved meanwhile" in rest[0][2] and "reason changed" in rest[1][2]
    assert moves(path, "b")[-1] == (S.NEEDS_REVIEW, S.CANCELLED, "withdrawn")
    assert [note for *_, note in moves(path, "c")][-2:] == ["looked at it", None]


# Writes a bulk decision makes, in order: JSONL, per item: claim, move, release (one
# write(2) each), then its stderr line (two); SQLite: per commit (claim, move, release) four
# pwrite64 into the WAL, the first item's claim ending at the 13th. A kill at write N dies on
# entering it: JSONL 6 = before the 2nd item's claim, 7 = after its claim, 8 = after its
# move, 9 = after its release; SQLite 24 = inside the 2nd item's claim commit, 27 = inside
# its move's, 30 = before its release's, 35 = inside the 3rd item's claim commit.
KILLS = [("jsonl", "write", 6), ("jsonl", "write", 7), ("jsonl", "write", 8),
         ("jsonl", "write", 9), ("sqlite", "pwrite64", 24), ("sqlite", "pwrite64", 27),
         ("sqlite", "pwrite64", 30), ("sqlite", "pwrite64", 35)]


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace (installed by .ci/run)")
@pytest.mark.parametrize("backend, syscall, when", KILLS)
def test_bulk_cancel_killed_midway_leaves_each_item_decided_or_parked_and_a_rerun_ends_it(
        tmp_path, backend, syscall, when):
    """Fault: a real SIGKILL as the bulk command enters its Nth write (strace inject), in
    the middle of an item's claim, move and release. Must hold: every item is either
    cancelled with exactly one move, carrying the note, or still parked with its reason;
    some of each; the same command again decides the rest (exit 0), each item once, and
    leaves no lease on the items it decided."""
    path = tmp_path / f"l.{backend}"
    keys = [f"k{n}" for n in range(6)]
    park(path, keys)
    command = ["resolve", "--ledger", path, "--all", "--reason", "salvaged", "--cancel",
               "--note", "bulk"]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    # no --seccomp-bpf: with it strace 6.1 never delivers an injected signal
    killed = subprocess.run(
        ["strace", "-f", "-qq", "-o", os.devnull, "-e", f"trace={syscall}",
         "-e", f"inject={syscall}:signal=SIGKILL:when={when}", sys.executable, "-m",
         "toolkit", *map(str, command)], capture_output=True, text=True, env=env, timeout=120)
    assert killed.returncode in (-9, 137), killed.stderr
    decided = []
    with open_ledger(path) as ledger:
        for key in keys:
            item = ledger.get(key)
            if item.state is S.CANCELLED:
                decided.append(key)
            else:
                assert (item.state, item.reason) == (S.NEEDS_REVIEW, SALVAGED)
    for key in keys:
        assert moves(path, key)[2:] == ([(S.NEEDS_REVIEW, S.CANCELLED, "bulk")]
                                        if key in decided else [])
    assert 0 < len(decided) < len(keys)
    rerun = toolkit(*command)
    assert rerun.returncode == 0 and f"cancelled {len(keys) - len(decided)}, skipped 0" in \
        rerun.stderr
    with open_ledger(path) as ledger:
        assert all(ledger.get(key).state is S.CANCELLED for key in keys)
        # an item decided before the kill may keep the dead process's lease (its release
        # was not written); one decided by the rerun never does
        assert all(ledger.get(key).lease_owner is None for key in keys if key not in decided)
    for key in keys:
        assert moves(path, key)[2:] == [(S.NEEDS_REVIEW, S.CANCELLED, "bulk")]


@pytest.mark.parametrize("args, message", [
    (["--all", "--release"], "--all needs --reason PREFIX"),
    (["--all", "--reason", "  ", "--cancel"], "--all needs --reason PREFIX"),
    (["--all", "--reason", "salvaged", "--accept-artifact", "x.pdf"],
     "--accept-artifact decides one item"),
    (["--key", "s1", "--reason", "salvaged", "--cancel"], "--reason selects the items of --all"),
    (["--all", "--key", "s1", "--reason", "salvaged", "--cancel"], "not allowed with"),
    (["--reason", "salvaged", "--cancel"], "one of the arguments --key --all is required"),
])
def test_bad_bulk_arguments_are_one_line_and_exit_2_with_the_ledger_unchanged(
        tmp_path, args, message):
    """Fault: a bulk command given a wrong combination. Must hold: one line on stderr naming
    it, exit 2, no traceback, the ledger's bytes unchanged."""
    path = tmp_path / "l.jsonl"
    park(path, ["s1", "s2"])
    before = path.read_bytes()
    done = toolkit("resolve", "--ledger", path, *args, "--note", "n")
    assert done.returncode == 2 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert path.read_bytes() == before


def test_item_leased_by_a_live_worker_is_left_for_later_and_the_others_decided(tmp_path):
    """Fault: a live worker (this test's process) holds one parked item's lease while the
    bulk command runs. Must hold: that item is "not decided", never taken from its owner;
    the items after it are still decided; exit 1 (run again later); once the lease is
    given back, the same command decides it alone."""
    path = tmp_path / "l.sqlite"
    park(path, ["a", "b", "c"])
    with open_ledger(path) as ledger:
        token = ledger.claim("b", "inspector", ttl=600.0)
    command = ["resolve", "--ledger", path, "--all", "--reason", "salvaged", "--release",
               "--note", "bulk"]
    held = toolkit(*command)
    assert held.returncode == 1 and "b: not decided (" in held.stderr
    assert "released 2, skipped 0, 1 held by a live worker: run again later" in held.stderr
    assert [len(moves(path, key)) for key in "abc"] == [3, 2, 3]
    with open_ledger(path) as ledger:
        ledger.release("b", token, "inspector")
    again = toolkit(*command)
    assert again.returncode == 0 and "released 1, skipped 0" in again.stderr
    assert moves(path, "b")[2:] == [(S.NEEDS_REVIEW, S.UNKNOWN, "bulk")]


def test_a_jsonl_ledger_stays_open_after_one_item_is_found_leased(tmp_path):
    """Fault: on a JSONL ledger (claim, move, release all or nothing), the second of three
    parked items is leased by another live worker of this process. Must hold: the refused
    claim writes nothing and does not close the ledger (an error inside the all-or-nothing
    block would): the third item is still decided in the same pass."""
    path = tmp_path / "l.jsonl"
    park(path, ["a", "b", "c"])
    with open_ledger(path) as ledger:
        ledger.claim("b", "inspector", ttl=600.0)
        outcomes = [(key, outcome) for key, outcome, _ in
                    resolve_all(ledger, "salvaged", "cancel", "bulk")]
        assert outcomes == [("a", "decided"), ("b", "later"), ("c", "decided")]
        assert ledger.get("c").state is S.CANCELLED and ledger.get("b").state is S.NEEDS_REVIEW
