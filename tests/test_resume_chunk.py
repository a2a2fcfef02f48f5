"""A rerun settles a chunk of done items in one pass: the stat rule per chunk, enqueue's path.

``artifacts.unchanged_all`` is ``unchanged`` for a whole chunk (the one stat rule of
docs/design.md rule 5, in one frame); ``enqueue`` takes a vouched item without a call per
input, and a chunk ``run`` hands it in order without sorting it again. Each test makes
the fault with real files (rewrites, copies, removals, a real second name) and checks
what must still hold; nothing is timed.
"""

import dataclasses
import os
import shutil

from toolkit import documents
from toolkit.ledger import State, open_ledger
from toolkit.provider import FakeProvider, provider_stats
from toolkit.roots import artifact_file
from toolkit.runner import Runner, artifacts
from toolkit.runner.intake import InOrder

from indexed_batch import batch, inputs  # noqa: F401  (fixtures: the safe runner, 4+1 docs)
from test_resume_stat import hashes  # noqa: F401  (a fixture: the full hashes a run asks for)

S = State


def done_items(ledger_path):
    with open_ledger(ledger_path) as ledger:
        return sorted((item for item in ledger.items() if item.state is S.DONE),
                      key=lambda item: item.key)


def rewrite_in_place_and_copy(rewritten, copied):
    """``rewritten``: one byte changed in place, same inode and size, its mtime set back
    (only ctime moves); ``copied``: replaced by a copy of itself (same bytes, new inode)."""
    before = os.stat(rewritten)
    data = rewritten.read_bytes()
    with open(rewritten, "r+b") as handle:
        handle.write(bytes([data[0] ^ 0xFF]))
    os.utime(rewritten, ns=(before.st_atime_ns, before.st_mtime_ns))
    shutil.copyfile(copied, copied.with_name("copy.tmp"))
    os.replace(copied.with_name("copy.tmp"), copied)


def test_artifacts_changed_four_ways_in_one_chunk_each_fail_the_stat_rule_alone(batch):
    """Fault: within one chunk of done items, one artifact rewritten in place with its mtime
    set back, one replaced by a copy of itself (new inode), one removed; a fourth kept.
    Property: ``unchanged_all`` answers each pair in order, exactly as ``unchanged`` does
    one by one: only the untouched file is vouched for by its stat; a record without
    stat fields never is."""
    batch()
    done = done_items(batch.ledger)
    paths = [artifact_file(batch.ledger, item.artifact_path) for item in done]
    kept, rewritten, copied, removed = paths
    rewrite_in_place_and_copy(rewritten, copied)
    removed.unlink()
    bare = dataclasses.replace(done[0], **dict.fromkeys(artifacts.STAT_FIELDS))  # older record
    pairs = [*zip(paths, done), (kept, bare)]
    found = artifacts.unchanged_all([path for path, _ in pairs], [item for _, item in pairs])
    assert found == [True, False, False, False, False]
    assert found == [artifacts.unchanged(path, item) for path, item in pairs]


def test_rerun_of_a_chunk_with_one_artifact_rewritten_hashes_and_refetches_only_that_one(
        batch, hashes):
    """Fault: one done item's artifact rewritten in place (same size, mtime set back) among
    done items whose artifacts are untouched. Property: the chunk's pass reuses the
    others on their stat (no hash); the changed one goes to ``process``, is hashed,
    re-fetched (never executed again), and the batch ends as it did."""
    first, counts = batch()
    victim = done_items(batch.ledger)[2]
    path = artifact_file(batch.ledger, victim.artifact_path)
    before = os.stat(path)
    data = path.read_bytes()
    with open(path, "r+b") as handle:
        handle.write(bytes([data[-1] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    executions = provider_stats(batch.provider_db)["executions"]
    hashes.clear()
    runner, again = batch()
    assert again == counts and runner.reused == 3
    assert path.name in hashes and all(name == path.name or name.endswith(".part")
                                       for name in hashes)
    assert provider_stats(batch.provider_db)["executions"] == executions
    assert documents.artifact_of(path).sha256 == victim.artifact_sha256


def test_rerun_with_inputs_unsorted_as_text_and_one_under_a_second_name_ends_the_same(
        batch, hashes, tmp_path):
    """Fault: the rerun is given its inputs in reverse order, as strings, plus a second name
    for one document's bytes (a real copy); the poison input is among them. Property:
    ``enqueue`` still sorts what it is given (only ``run``'s own chunks come in order):
    the same items, all reused on their stat (no hash), the copy said as an alias of the
    first name, the poison still quarantined and never processed, nothing executed."""
    _, counts = batch()
    executions = provider_stats(batch.provider_db)["executions"]
    twin = tmp_path / "zz-second-name.pdf"
    shutil.copyfile(batch.corpus[0], twin)
    hashes.clear()
    given = [str(path) for path in reversed([*batch.corpus, twin])]
    runner, again = batch(inputs=given)
    assert again == counts and runner.reused == counts["done"] and hashes == []
    assert [name for name, _ in runner.aliases] == [twin.name]
    assert len(runner.quarantined) == counts["failed"] == 1
    assert provider_stats(batch.provider_db)["executions"] == executions


def test_enqueue_sorts_a_plain_list_and_takes_an_in_order_chunk_as_given(batch):
    """Fault: inputs handed to ``enqueue`` out of order. Property: a plain list is sorted
    (keys in path order, whatever order it came in); an ``InOrder`` chunk, which ``run``
    builds only from its sorted inputs, is taken as given."""
    batch()
    ordered = sorted(batch.corpus, key=str)
    runner = Runner(open_ledger(batch.ledger), FakeProvider(batch.provider_db, batch.ledger
                                                            .with_name("jobs")),
                    batch.ledger.with_name("out"), worker="w1")
    try:
        in_path_order = runner.enqueue(list(reversed(ordered)))
        runner._let_go()
        runner._seen.clear()
        as_given = runner.enqueue(InOrder(reversed(ordered)))
    finally:
        runner.provider.close()
        runner.close()
    assert in_path_order == list(reversed(as_given)) and len(set(in_path_order)) == 5


def test_ordered_pass_settles_only_untouched_artifacts_and_hands_changed_ones_to_process(
        batch, hashes, monkeypatch):
    """Fault: a rerun of the whole batch (one read of the ledger: the ordered pass settles
    done items in bulk) where one artifact was rewritten in place, same size, its mtime set
    back (only ctime moved) and another replaced by a copy of itself (new inode, same
    bytes). Property: the pass settles exactly the two untouched items (no ``process`` call,
    no hash); the two changed ones reach ``process`` and are hashed: the rewritten one is
    re-fetched (never executed again), the copy reused on its hash; the counts are the
    first run's."""
    first, counts = batch()
    done = done_items(batch.ledger)
    rewritten, copied = (artifact_file(batch.ledger, item.artifact_path) for item in done[:2])
    rewrite_in_place_and_copy(rewritten, copied)
    processed, real = [], Runner._own_process

    def spy(self, key):
        processed.append(key)
        return real(self, key)
    monkeypatch.setattr(Runner, "process", spy)
    monkeypatch.setattr(Runner, "_own_process", spy)  # still the runner's own: the pass runs
    executions = provider_stats(batch.provider_db)["executions"]
    hashes.clear()
    runner, again = batch()
    assert again == counts and runner.reused == 3  # the rewritten one: re-fetched
    assert sorted(processed) == sorted(item.key for item in done[:2])
    assert {name for name in hashes if not name.endswith(".part")} == \
        {rewritten.name, copied.name}
    assert provider_stats(batch.provider_db)["executions"] == executions
    assert documents.artifact_of(rewritten).sha256 == done[0].artifact_sha256
