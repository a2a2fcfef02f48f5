"""Resume by one pass over the ledger: ``Ledger.scan`` merged with the batch's candidate keys.

A rerun whose batch is a large share of the ledger reads the ledger once
(``keying.merged`` over ``Ledger.scan``) instead of looking each input's candidate
keys up; a small batch on a large ledger still looks its keys up
(``keying.use_scan``). Both paths must make the same decision for every input:
exactly one candidate key at rest vouches for it, anything else is keyed in full.
"""

import shutil

import pytest

from toolkit.identity import content_digest
from toolkit.ledger import PERMANENT, State, open_ledger
from toolkit.ledger.records import LIGHT_FIELDS, Light
from toolkit.provider import FakeProvider, provider_stats
from toolkit.runner import RetryPolicy, Runner, keying

S = State


def settle(ledger, key, to, **fields):
    """Walk ``key`` from pending to ``to`` by legal moves (done carries an artifact record)."""
    token = ledger.claim(key, "w", 60)
    ledger.move(key, S.PENDING, S.UNKNOWN, token=token)
    if to is S.UNKNOWN:
        return
    if to is S.DONE:
        ledger.move(key, S.UNKNOWN, S.SUBMITTED, token=token, job_id="j")
        ledger.move(key, S.SUBMITTED, S.DONE, token=token, job_id="j", **fields)
    else:
        ledger.move(key, S.UNKNOWN, S.FAILED, token=token, failure=PERMANENT, reason="poison: x")


def test_scan_yields_every_item_as_its_light_row_in_key_order(ledger):
    """Each backend (SQLite, JSONL, PostgreSQL when set): ``scan()`` yields every item once,
    in key order, each field equal to the Item's; ``scan(ordered=False)`` the same set;
    ``item_count`` the number of items."""
    keys = [f"{n:02x}" * 32 for n in (7, 3, 250, 16, 128)]
    for key in keys:
        ledger.add(key, source=f"{key[:4]}.pdf")
    settle(ledger, keys[0], S.DONE, artifact_path="a.pdf", artifact_size=3,
           artifact_sha256="ab" * 32, artifact_mtime_ns=5, artifact_ctime_ns=6, artifact_ino=7)
    settle(ledger, keys[1], S.FAILED)
    settle(ledger, keys[2], S.UNKNOWN)
    rows = list(ledger.scan())
    assert [row.key for row in rows] == sorted(keys)
    items = {item.key: item for item in ledger.items()}
    for row in rows:
        assert type(row) is Light and row.state is items[row.key].state
        assert tuple(row) == tuple(getattr(items[row.key], name) for name in LIGHT_FIELDS)
        assert row.resting is items[row.key].resting
    assert sorted(ledger.scan(ordered=False)) == rows
    assert ledger.item_count() == len(keys)


def test_merge_keeps_exactly_the_wanted_keys_that_exist(ledger):
    """Wanted keys absent from the ledger, repeated, or none at all: the merge returns the
    rows of the wanted keys that exist, nothing else."""
    keys = [f"{n:02x}" * 32 for n in range(6)]
    for key in keys:
        ledger.add(key)
    wanted = [keys[1], keys[4], keys[4], "ff" * 32, "00" * 31]
    found = keying.merged(ledger, wanted)
    assert sorted(found) == [keys[1], keys[4]]
    assert all(found[key].key == key for key in found)
    assert keying.merged(ledger, []) == {}


@pytest.fixture
def fed(ledger, small_corpus):
    """A ledger holding, for the small batch's four healthy inputs: input 0 done, input 1
    poison (failed permanent), input 2 in flight (unknown), input 3 done under BOTH of
    its candidate keys (the plain and the OCR route), plus unrelated items; input 2's other
    candidate key is done (one at rest beside one in flight is not one at rest)."""
    paths = sorted(small_corpus)[:4]
    routes = keying.keyers({})
    candidates = [[keyer(content_digest(path.read_bytes())) for keyer in routes]
                  for path in paths]
    for at, state in enumerate((S.DONE, S.FAILED, S.UNKNOWN, S.DONE)):
        ledger.add(candidates[at][0])
        settle(ledger, candidates[at][0], state, artifact_path="a.pdf", artifact_size=1,
               artifact_sha256="ab" * 32)
    for at in (2, 3):  # the second route's key exists too, done
        ledger.add(candidates[at][1])
        settle(ledger, candidates[at][1], S.DONE, artifact_path="b.pdf", artifact_size=1,
               artifact_sha256="cd" * 32)
    for n in range(4):
        ledger.add(f"{n:02x}" * 32)
    return paths, routes, candidates


def test_scan_vouches_exactly_as_lookups_do(ledger, fed):
    """Keys at rest (done, poison), a key not at rest (unknown) beside a done one, an input
    with both candidate keys done: the merged scan and the per-key look-ups agree input by
    input; only exactly one candidate, at rest, vouches (the other two are keyed in full)."""
    paths, routes, candidates = fed
    by_scan = keying.vouched(ledger, paths, routes, scan=True)
    by_lookup = keying.vouched(ledger, paths, routes)
    assert [row and row.key for row in by_scan] == [item and item.key for item in by_lookup]
    assert [row and row.key for row in by_scan] == [candidates[0][0], candidates[1][0],
                                                   None, None]
    assert by_scan[1].state is S.FAILED and by_scan[1].resting
    assert tuple(by_scan[0]) == tuple(getattr(by_lookup[0], name) for name in LIGHT_FIELDS)


def test_small_rerun_on_a_large_ledger_looks_keys_up_instead_of_scanning(ledger, monkeypatch):
    """The rule by count: a batch under a third of the ledger looks its keys up (no pass over
    every item); at a third or more, one scan; an empty ledger (a first run) neither."""
    assert not keying.use_scan(ledger, 10)  # empty
    for n in range(30):
        ledger.add(f"{n:02x}" * 32)
    assert not keying.use_scan(ledger, 9)
    assert keying.use_scan(ledger, 10)
    assert not keying.use_scan(ledger, 0)
    assert keying.SCAN_SHARE == 3


def run(ledger_path, provider, out, paths):
    runner = Runner(open_ledger(ledger_path), provider, out, worker="w1",
                    policy=RetryPolicy(base_delay=0.0), sleep=lambda s: None)
    try:
        counts = runner.run(paths)
        return runner, counts
    finally:
        runner.close()


@pytest.fixture
def spied(monkeypatch):
    """Which path each rerun took: the scans and the look-ups of candidate keys."""
    calls = {"scan": 0, "get_many": 0}
    real_merged = keying.merged

    def merged(ledger, keys):
        calls["scan"] += 1
        return real_merged(ledger, keys)
    monkeypatch.setattr(keying, "merged", merged)
    real_vouched = keying.vouched

    def vouched(ledger, paths, keyers_, index=None, scan=False):
        calls["get_many"] += not scan
        return real_vouched(ledger, paths, keyers_, index, scan)
    monkeypatch.setattr(keying, "vouched", vouched)
    return calls


def test_rerun_by_scan_with_an_alias_reuses_every_done_item_and_executes_nothing(
        ledger_path, tmp_path, small_corpus, spied):
    """Each backend: a rerun of the done batch plus an alias (a second name for one input's
    bytes) goes by the scan; it counts what the first run counted, reuses every done
    artifact, names the alias, and the provider executes nothing more."""
    provider = FakeProvider(tmp_path / "provider.db", tmp_path / "jobs")
    try:
        folder = tmp_path / "inputs"
        folder.mkdir()
        for path in small_corpus:
            shutil.copy2(path, folder / path.name)
        paths = sorted(folder.iterdir())
        _, first = run(ledger_path, provider, tmp_path / "out", paths)
        executed = provider_stats(tmp_path / "provider.db")["executions"]
        alias = folder / "zz-alias.pdf"
        shutil.copy2(paths[0], alias)
        spied.update(scan=0, get_many=0)
        runner, again = run(ledger_path, provider, tmp_path / "out", [*paths, alias])
        assert spied == {"scan": 1, "get_many": 0}
        assert again == first and first["done"] == 4
        assert runner.reused == 4
        assert runner.aliases == [("zz-alias.pdf", paths[0].name)]
        assert provider_stats(tmp_path / "provider.db")["executions"] == executed
    finally:
        provider.close()


def test_rerun_of_a_small_batch_looks_up_and_decides_the_same(tmp_path, small_corpus, spied):
    """A rerun of one input on a ledger of five items (under a third): look-ups, no scan;
    the input is reused, nothing executes again."""
    provider = FakeProvider(tmp_path / "provider.db", tmp_path / "jobs")
    ledger_path = tmp_path / "ledger.sqlite"
    try:
        run(ledger_path, provider, tmp_path / "out", small_corpus)
        executed = provider_stats(tmp_path / "provider.db")["executions"]
        done = [path for path in sorted(small_corpus) if "poison" not in path.name][:1]
        spied.update(scan=0, get_many=0)
        runner, counts = run(ledger_path, provider, tmp_path / "out", done)
        assert spied["scan"] == 0 and spied["get_many"] >= 1
        assert counts["done"] == 1 and runner.reused == 1
        assert provider_stats(tmp_path / "provider.db")["executions"] == executed
    finally:
        provider.close()
