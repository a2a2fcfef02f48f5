"""Resume that does not grow with what is done: the artifact stat record, ``--verify``, streaming.

A rerun trusts a done item's recorded SHA-256 only while the artifact's size,
``mtime_ns``, ``ctime_ns`` and inode are those recorded at ``done`` (like git's
index); any difference, an older record without them, or ``--verify`` hashes
the file in full. Hash calls are counted, never timed.
"""

import json
import os
import sqlite3

import pytest

from toolkit import documents
from toolkit.cli import main as cli_main
from toolkit.ledger import State, open_ledger
from toolkit.provider import FakeProvider, provider_stats
from toolkit.roots import artifact_file
from toolkit.runner import RetryPolicy, Runner, artifacts, pipeline

S = State
STAT = artifacts.STAT_FIELDS


@pytest.fixture
def hashes(monkeypatch):
    """Every full hash of a file the runner asks for: ``documents.verify`` calls, by path."""
    calls = []
    real = documents.verify

    def counting(path, size, sha256):
        calls.append(os.path.basename(path))
        return real(path, size, sha256)
    monkeypatch.setattr(documents, "verify", counting)
    return calls


@pytest.fixture
def batch(tmp_path, small_corpus):
    """run(**options) -> (runner, counts): the safe runner on a 4+1 document batch."""
    provider = FakeProvider(tmp_path / "provider.db", tmp_path / "jobs")
    ledger_path = tmp_path / "ledger.sqlite"

    def run(ledger=ledger_path, **options):
        runner = Runner(open_ledger(ledger), provider, tmp_path / "out", worker="w1",
                        policy=RetryPolicy(base_delay=0.0), sleep=lambda s: None, **options)
        try:
            return runner, runner.run(small_corpus)
        finally:
            runner.close()
    run.provider, run.provider_db, run.ledger = provider, tmp_path / "provider.db", ledger_path
    yield run
    provider.close()


def done_items(ledger_path):
    with open_ledger(ledger_path) as ledger:
        return [item for item in ledger.items() if item.state is S.DONE]


def test_unchanged_artifacts_are_reused_without_a_single_hash(batch, hashes):
    """Fault: none (a plain rerun). Property: a done item whose artifact keeps its recorded
    size, mtime, ctime and inode is reused on its stat alone: zero SHA-256 runs."""
    batch()
    done = done_items(batch.ledger)
    assert len(done) == 4 and all(getattr(item, name) is not None
                                  for item in done for name in STAT)
    hashes.clear()
    runner, counts = batch()
    assert counts["done"] == 4 and runner.reused == 4
    assert hashes == []  # no artifact read: the ledger vouched for each


def test_same_size_rewrite_with_mtime_set_back_is_caught_and_refetched(batch, hashes):
    """Fault: an artifact's bytes rewritten in place, same size, its mtime restored with
    utime (what ``touch -d`` or a careless sync does). Property: the rerun sees the changed
    ctime, hashes that one file, re-fetches it (never re-executes) and hashes no other."""
    batch()
    victim = done_items(batch.ledger)[0]
    path = artifact_file(batch.ledger, victim.artifact_path)
    before = os.stat(path)
    data = path.read_bytes()
    with open(path, "r+b") as handle:  # in place: same inode, same size
        handle.write(bytes([data[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == \
        (before.st_size, before.st_mtime_ns, before.st_ino)
    executions = provider_stats(batch.provider_db)["executions"]
    hashes.clear()
    runner, counts = batch()
    assert counts["done"] == 4 and runner.reused == 3
    assert path.name in hashes  # the damaged one, then only its re-fetched download
    assert all(name == path.name or name.endswith(".part") for name in hashes)
    assert documents.artifact_of(path).sha256 == victim.artifact_sha256
    assert provider_stats(batch.provider_db)["executions"] == executions
    refetched = next(i for i in done_items(batch.ledger) if i.key == victim.key)
    assert refetched.artifact_ctime_ns != victim.artifact_ctime_ns  # the new file's stat
    hashes.clear()
    assert batch()[0].reused == 4 and hashes == []  # and the next rerun trusts it again


def test_file_replaced_by_a_copy_with_a_new_inode_is_rehashed(batch, hashes):
    """Fault: an artifact replaced by a copy of itself (new inode, same bytes and size).
    Property: the rerun hashes exactly that file; its bytes match, so it is reused."""
    batch()
    victim = done_items(batch.ledger)[1]
    path = artifact_file(batch.ledger, victim.artifact_path)
    copy = path.with_name("copy.tmp")
    copy.write_bytes(path.read_bytes())
    os.replace(copy, path)
    hashes.clear()
    runner, counts = batch()
    assert counts["done"] == 4 and runner.reused == 4
    assert hashes == [path.name]


def test_verify_hashes_every_done_artifact(batch, hashes):
    """Fault: none. Property: ``verify=True`` (``run --verify``) hashes each done item's
    artifact once, whatever its stat says."""
    batch()
    hashes.clear()
    runner, counts = batch(verify=True)
    assert runner.reused == 4
    assert sorted(hashes) == sorted(os.path.basename(i.artifact_path)
                                    for i in done_items(batch.ledger))


def test_cli_run_verify_flag_hashes_every_item(tmp_path, small_corpus, hashes, capsys):
    """Fault: none. Property: ``toolkit run --verify`` reaches the runner: a rerun with the
    flag hashes every done artifact, one without it hashes none; exit 0 both times."""
    args = ["run", "--inputs", str(small_corpus[0].parent), "--ledger",
            str(tmp_path / "l.sqlite"), "--provider-db", str(tmp_path / "p.db"),
            "--out", str(tmp_path / "out"), "--no-progress"]
    assert cli_main(args) == 0
    hashes.clear()
    assert cli_main(args) == 0 and hashes == []
    assert cli_main([*args, "--verify"]) == 0 and len(hashes) == 4


@pytest.mark.parametrize("suffix", ["sqlite", "jsonl"])
def test_ledger_without_stat_fields_opens_and_resumes_by_hashing(batch, hashes, tmp_path, suffix):
    """Fault: a ledger written before the stat fields existed (SQLite: no columns;
    JSONL: no fields in its events). Property: it opens, the rerun hashes each done
    artifact once (nothing vouches for it otherwise), reuses all and executes nothing."""
    ledger_path = tmp_path / f"old.{suffix}"
    batch(ledger=ledger_path)
    if suffix == "sqlite":
        db = sqlite3.connect(ledger_path)
        for name in STAT:
            db.execute(f"ALTER TABLE items DROP COLUMN {name}")
        db.commit()
        db.close()
    else:
        lines = []
        for line in ledger_path.read_text().splitlines():
            obj = json.loads(line)
            for name in STAT:
                obj.get("detail", {}).pop(name, None)
            lines.append(json.dumps(obj))
        ledger_path.write_text("\n".join(lines) + "\n")
    assert all(getattr(item, name) is None for item in done_items(ledger_path) for name in STAT)
    executions = provider_stats(batch.provider_db)["executions"]
    hashes.clear()
    runner, counts = batch(ledger=ledger_path)
    assert counts["done"] == 4 and runner.reused == 4 and len(hashes) == 4
    assert provider_stats(batch.provider_db)["executions"] == executions


def test_run_streams_its_batch_one_chunk_at_a_time(batch, monkeypatch, small_corpus):
    """Fault: none. Property (structural, not timed): a run never holds more than one
    chunk of inputs (paths, items read ahead, input snapshots on disk) and never reads the
    whole ledger (``items()``), first run and rerun alike."""
    monkeypatch.setattr(pipeline, "CHUNK", 2)
    held, real_process = [], Runner.process

    def process(self, key):
        snapshots = len(os.listdir(self._snapshots.name)) if self._snapshots else 0
        held.append((len(self._paths), len(self._known), snapshots))
        return real_process(self, key)

    def whole_ledger(self):
        raise AssertionError("a run read every item of the ledger")
    monkeypatch.setattr(Runner, "process", process)
    from toolkit.ledger.sqlite import SqliteLedger
    monkeypatch.setattr(SqliteLedger, "items", whole_ledger)
    for _ in range(2):
        runner, counts = batch()
        assert counts["done"] == 4 and counts["failed"] == 1  # poison never reaches process
    assert len(held) == 8 and max(max(h) for h in held) <= 2


def test_get_many_and_unsettled_select_what_items_holds(ledger):
    """Fault: none. Property: the two reads a streaming run uses instead of ``items()``
    agree with it on every backend: ``get_many`` returns exactly the keys that exist,
    ``unsettled`` exactly the items not at rest (done, poison and parked excluded)."""
    for key in ("a", "b", "c", "d"):
        ledger.add(key)
    token = ledger.claim("b", "w", 60.0)
    ledger.move("b", S.PENDING, S.FAILED, token=token, failure="permanent", reason="poison: x")
    token = ledger.claim("c", "w", 60.0)
    ledger.move("c", S.PENDING, S.UNKNOWN, token=token)
    ledger.move("c", S.UNKNOWN, S.SUBMITTED, token=token, job_id="j")
    ledger.move("c", S.SUBMITTED, S.DONE, token=token, artifact_path="c.pdf", artifact_size=1,
                artifact_sha256="0" * 64, artifact_mtime_ns=1, artifact_ctime_ns=2, artifact_ino=3)
    token = ledger.claim("d", "w", 60.0)
    ledger.move("d", S.PENDING, S.UNKNOWN, token=token)
    every = {item.key: item for item in ledger.items()}
    assert ledger.get_many(["d", "zz", "a", "c"]) == {k: every[k] for k in ("d", "a", "c")}
    assert [item.key for item in ledger.unsettled()] == ["a", "d"]
    assert (every["c"].artifact_mtime_ns, every["c"].artifact_ctime_ns,
            every["c"].artifact_ino) == (1, 2, 3)
