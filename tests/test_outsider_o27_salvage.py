"""Outsider o27, salvage: what ``ledger --salvage`` read, rebuilt and left, and what a run
on the salvaged ledger then found.

Q2: a live writer's ledger was salvaged (an unfinished history read as a finished one: a
run on the new file executed most documents twice); now refused as ``run`` refuses it,
exit 1 naming the pid, and a salvage leaves no ``<source>.lock`` that was not there.
Q3: a done rebuilt from its release line alone (no artifact fields) was kept as done,
and the run parked it as "artifact damaged and not fetchable"; now salvage parks it with
that reason, and ``resolve --release`` + run recovers it by lookup. Q4: an output moved
into a subfolder of ``--out`` or renamed in upper case was no evidence. Q5: a retry whose
lines were lost was never looked up. Q6: a symlink alias of the ledger let the salvaged
ledger land in the inputs folder.

Every fault is made on real files of real runs (a non-idempotent fake provider; its
database counts executions), the live writer is a real process.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.documents import make_corpus, verify
from toolkit.ledger import open_ledger
from toolkit.provider import provider_stats
from toolkit.provider.records import provider_records

pytestmark = pytest.mark.slow

TOOLKIT = [sys.executable, "-m", "toolkit"]


def _run(tmp_path, ledger, contract="non-idempotent", *extra):
    return subprocess.run(
        [*TOOLKIT, "run", "--inputs", str(tmp_path / "in"), "--ledger", str(ledger),
         "--provider-db", str(tmp_path / "p.db"), "--out", str(tmp_path / "out"),
         "--contract", contract, "--no-progress", *extra],
        capture_output=True, text=True, timeout=300)


def _salvage(ledger, new):
    return subprocess.run([*TOOLKIT, "ledger", str(ledger), "--salvage", str(new)],
                          capture_output=True, text=True, timeout=120)


def _release(ledger, key):
    done = subprocess.run([*TOOLKIT, "resolve", "--ledger", str(ledger), "--key", key,
                           "--release", "--note", "checked at the provider"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _cut(path: Path, keep) -> list[dict]:
    """Delete the event lines ``keep(event)`` rejects (the header stays): a seq gap."""
    lines = path.read_bytes().splitlines(keepends=True)
    cut = [json.loads(line) for line in lines[1:] if not keep(json.loads(line))]
    path.write_bytes(lines[0] + b"".join(line for line in lines[1:] if keep(json.loads(line))))
    return cut


def _batch(tmp_path, docs=3, *extra) -> dict:
    """A real batch run to rest on a non-idempotent provider: its items by key."""
    make_corpus(tmp_path / "in", docs=docs, poison=0, seed=7)
    first = _run(tmp_path, tmp_path / "L.jsonl", "non-idempotent", *extra)
    assert "Traceback" not in first.stderr, first.stderr
    with open_ledger(tmp_path / "L.jsonl") as ledger:
        return {item.key: item for item in ledger.items()}


def _executions(tmp_path, key) -> int:
    return provider_stats(tmp_path / "p.db")["per_task"][key]["executions"]

def _done_once(tmp_path, key) -> None:
    """The salvaged ledger's ``key`` is done, its artifact verified, executed once."""
    with open_ledger(tmp_path / "S.jsonl") as salvaged:
        item = salvaged.get(key)
    assert item.state == "done", item
    assert verify(tmp_path / "out" / item.artifact_path, item.artifact_size,
                  item.artifact_sha256)
    assert _executions(tmp_path, key) == 1


def test_live_writer_salvage_is_refused_naming_its_pid_and_nothing_is_written(tmp_path):
    """Fault: a real live process holds the JSONL ledger as its writer (opened by the
    ledger API, as ``run`` opens it) while ``ledger --salvage`` is asked for. Property:
    exit 1, one line naming the writer's pid, no new ledger; once the writer is killed
    (SIGKILL), the same salvage succeeds."""
    _batch(tmp_path)
    ledger, new = tmp_path / "L.jsonl", tmp_path / "N.jsonl"
    writer = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom toolkit.ledger import open_ledger\n"
         f"ledger = open_ledger({str(ledger)!r})\nprint('open', flush=True)\nsys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "open"
        refused = _salvage(ledger, new)
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        assert str(writer.pid) in refused.stderr and "busy" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr and len(refused.stderr.splitlines()) == 1
        assert not new.exists()
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    done = _salvage(ledger, new)
    assert done.returncode == 0 and new.exists(), done.stderr


def test_salvage_of_a_ledger_without_a_lock_file_leaves_no_lock_file_behind(tmp_path):
    """Fault: a ledger with a seq gap (one key's lines deleted), copied alone into a folder
    of its own (no ``.lock`` beside it), salvaged. Property: the folder holds exactly what
    it held (no ``L.jsonl.lock`` left), and the new ledger's folder only the new ledger;
    beside the original, where a run left its lock file, that lock file stays."""
    items = _batch(tmp_path)
    lost = sorted(items)[0]
    _cut(tmp_path / "L.jsonl", lambda event: event["key"] != lost)
    alone, new = tmp_path / "copy", tmp_path / "new"
    alone.mkdir(), new.mkdir()
    (alone / "L.jsonl").write_bytes((tmp_path / "L.jsonl").read_bytes())
    done = _salvage(alone / "L.jsonl", new / "N.jsonl")
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(alone)) == ["L.jsonl"]
    assert sorted(os.listdir(new)) == ["N.jsonl"]
    assert (tmp_path / "L.jsonl.lock").exists()
    again = _salvage(tmp_path / "L.jsonl", new / "M.jsonl")
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "L.jsonl.lock").exists()


def test_done_with_only_its_release_line_left_is_parked_by_salvage_then_recovered_by_lookup(
        tmp_path):
    """Fault: of one done key, the claim, intent, submitted and done lines deleted (its add
    and release lines survive: the release rebuilds a done with no artifact fields).
    Property: the salvage parks it in ``needs_review`` with a reason that says so (not
    "0 in needs_review"); after ``resolve --release`` the run looks it up, adopts the
    provider's job and fetches it: done, a verified artifact, executed once in all."""
    items = _batch(tmp_path)
    key = sorted(items)[0]
    cut = _cut(tmp_path / "L.jsonl", lambda event: event["key"] != key or
               event["op"] in ("add", "release"))
    assert [event["op"] for event in cut] == ["claim", "move", "move", "move"]
    done = _salvage(tmp_path / "L.jsonl", tmp_path / "S.jsonl")
    assert done.returncode == 0 and "1 in needs_review" in done.stdout, done.stdout
    with open_ledger(tmp_path / "S.jsonl") as salvaged:
        item = salvaged.get(key)
    assert item.state == "needs_review" and "artifact fields" in item.reason, item
    _release(tmp_path / "S.jsonl", key)
    rerun = _run(tmp_path, tmp_path / "S.jsonl")
    assert rerun.returncode == 0, rerun.stderr
    _done_once(tmp_path, key)
    assert provider_stats(tmp_path / "p.db")["executions"] == 3


@pytest.mark.parametrize("moved", ["subfolder", "upper-case"])
def test_output_moved_or_renamed_under_out_is_still_evidence_of_a_lost_key(tmp_path, moved):
    """Fault: every line of one done key deleted, the ledger salvaged; the provider has
    forgotten the key ("not found": retention); its output moved into ``out/old/``, or
    renamed with the key in upper case. Property: the file under --out still carries the
    key: the rerun parks the key in ``needs_review`` naming that file, never submitting
    it (the provider executed it once in all)."""
    items = _batch(tmp_path)
    key = sorted(items)[0]
    _cut(tmp_path / "L.jsonl", lambda event: event["key"] != key)
    assert _salvage(tmp_path / "L.jsonl", tmp_path / "S.jsonl").returncode == 0
    output = tmp_path / "out" / items[key].artifact_path
    if moved == "subfolder":
        (tmp_path / "out" / "old").mkdir()
        target = tmp_path / "out" / "old" / output.name
    else:
        target = output.with_name(output.name.replace(key[:8], key[:8].upper()))
        assert target.name != output.name
    output.rename(target)
    rerun = _run(tmp_path, tmp_path / "S.jsonl", "non-idempotent,retention=0.001")
    assert "Traceback" not in rerun.stderr
    with open_ledger(tmp_path / "S.jsonl") as salvaged:
        item = salvaged.get(key)
    assert item.state == "needs_review", item
    assert str(target) in item.reason and "not found" in item.reason, item.reason
    assert _executions(tmp_path, key) == 1


def test_symlinked_folder_under_out_is_not_searched_for_evidence(tmp_path):
    """Fault: as above, the output moved out of --out into a folder that a symlink under
    --out points at. Property: the search does not follow the symlinked folder out of
    --out: no file under --out carries the key, "not found" is new work, sent once."""
    items = _batch(tmp_path)
    key = sorted(items)[0]
    _cut(tmp_path / "L.jsonl", lambda event: event["key"] != key)
    assert _salvage(tmp_path / "L.jsonl", tmp_path / "S.jsonl").returncode == 0
    (tmp_path / "elsewhere").mkdir()
    output = tmp_path / "out" / items[key].artifact_path
    output.rename(tmp_path / "elsewhere" / output.name)
    (tmp_path / "out" / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    rerun = _run(tmp_path, tmp_path / "S.jsonl", "non-idempotent,retention=0.001")
    assert rerun.returncode == 0, rerun.stderr
    with open_ledger(tmp_path / "S.jsonl") as salvaged:
        assert salvaged.get(key).state == "done"
    assert _executions(tmp_path, key) == 2  # forgotten by the provider, no trace: resent


def test_lost_retry_lines_are_found_by_looking_up_the_later_attempts(tmp_path):
    """Fault: a run with transient submit refusals (50 %, seed 3); of a key that succeeded
    at attempt 3, the lines of attempt 3 (intent, submitted, done, release) deleted: the
    salvage rebuilds failed(transient) at attempt 2 and parks it. Property: after
    ``resolve --release`` the run's lookup of attempt 2 finds nothing (it was refused),
    so attempt 3 is looked up, its job adopted and fetched: done, executed once, no new
    submit (before: parked again, "contract forbids a resubmit")."""
    items = _batch(tmp_path, 8, "--transient-rate", "0.5", "--seed", "3")
    key = next(key for key, item in sorted(items.items())
               if item.state == "done" and item.attempt >= 3)
    attempt = items[key].attempt
    cut = _cut(tmp_path / "L.jsonl", lambda event: event["key"] != key or
               event["attempt"] < attempt or event["op"] == "claim")
    assert [event["detail"].get("note") for event in cut][:1] == ["retry"], cut
    assert _salvage(tmp_path / "L.jsonl", tmp_path / "S.jsonl").returncode == 0
    with open_ledger(tmp_path / "S.jsonl") as salvaged:
        item = salvaged.get(key)
    assert item.state == "needs_review" and item.attempt == attempt - 1, item
    _release(tmp_path / "S.jsonl", key)
    submits = provider_stats(tmp_path / "p.db")["submit_calls"]
    rerun = _run(tmp_path, tmp_path / "S.jsonl")
    assert rerun.returncode == 0, rerun.stderr
    _done_once(tmp_path, key)
    assert provider_stats(tmp_path / "p.db")["submit_calls"] == submits
    looked = [call["idem_key"] for call in provider_records(tmp_path / "p.db")["calls"]
              if call["op"] == "lookup" and call["task_key"] == key]
    assert looked == [f"{key}:{attempt - 1}", f"{key}:{attempt}"], looked


def test_symlink_alias_of_the_ledger_cannot_salvage_into_the_inputs_folder(tmp_path):
    """Fault: the ledger named through a symlink alias in another folder (no roots file
    beside the alias), the salvaged ledger named inside the batch's inputs folder.
    Property: refused as the real path is (exit 2, one line naming the inputs root), and
    nothing is written into the inputs folder."""
    _batch(tmp_path)
    (tmp_path / "alias").mkdir()
    alias = tmp_path / "alias" / "alias.jsonl"
    alias.symlink_to(tmp_path / "L.jsonl")
    before = sorted(os.listdir(tmp_path / "in"))
    for name in (tmp_path / "L.jsonl", alias):
        refused = _salvage(name, tmp_path / "in" / "N.jsonl")
        assert refused.returncode == 2, (name, refused.stdout, refused.stderr)
        assert "inputs root" in refused.stderr and "Traceback" not in refused.stderr
    assert sorted(os.listdir(tmp_path / "in")) == before


def test_every_line_of_a_key_retried_once_deleted_then_salvaged_its_retry_is_adopted(tmp_path):
    """Fault: a run with transient submit refusals (50 %, seed 3); every line of a key
    done at attempt 2 or later (attempt 1 refused: no job of it) deleted, the ledger
    salvaged. Property: the rerun's lookup of attempt 1 finds nothing, but its output
    under --out carries the key, so the later attempts are looked up: the executed one is
    adopted and fetched (done, executed once, no submit), not parked for a person."""
    items = _batch(tmp_path, 8, "--transient-rate", "0.5", "--seed", "3")
    key = next(key for key, item in sorted(items.items())
               if item.state == "done" and item.attempt >= 2)
    _cut(tmp_path / "L.jsonl", lambda event: event["key"] != key)
    assert _salvage(tmp_path / "L.jsonl", tmp_path / "S.jsonl").returncode == 0
    submits = provider_stats(tmp_path / "p.db")["submit_calls"]
    rerun = _run(tmp_path, tmp_path / "S.jsonl", "non-idempotent", "--transient-rate", "0")
    assert "Traceback" not in rerun.stderr
    _done_once(tmp_path, key)
    assert provider_stats(tmp_path / "p.db")["submit_calls"] == submits
