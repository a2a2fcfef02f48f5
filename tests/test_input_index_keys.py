"""The inputs' index remembers each input's request key: an unchanged input is keyed with no hash.

Beside an input's stat and content digest, ``<ledger>.inputs`` records the key that
digest has under the run's first keyer, and its header names that keyer
(``TaskKeyer.fingerprint``: key version, options, how the material is spelled). A
rerun whose input keeps its stat takes the recorded key when the fingerprint is its
own; any other keyer takes only the digest. Each test makes a real change (other
options, another key version, bytes rewritten in place, names swapped by rename) and
checks both sides: what is remembered is used (no key computed), and nothing is used
wrongly (what is new work executes, and the index left behind holds, for every input,
its content's digest and that digest's key). Keys and reads are counted, never timed.
"""

import io
import os

from toolkit import identity
from toolkit.identity import TaskKeyer, content_digest, task_keyer
from toolkit.runner import inputindex

from indexed_batch import batch, inputs, keyed, reads, wait_until_settled  # noqa: F401


def assert_index_tells_the_truth(batch, keyer: TaskKeyer) -> None:
    """The index names ``keyer``, and each of its lines holds the digest of the bytes now at
    its path and that digest's key under ``keyer``: a later run may trust every line."""
    header, *lines = batch.index.read_text(encoding="utf-8").splitlines(keepends=True)
    assert header == inputindex.header(keyer.fingerprint)
    entries = list(filter(None, map(inputindex._parse, lines)))  # each line but the seals
    assert len(entries) == len(batch.corpus)
    # every line is in a block whose seal holds: a reader trusts them all
    assert list(inputindex._recorded(io.StringIO("".join(lines), newline="\n"),
                                     inputindex._seed(header))) == entries
    for name, _, digest, key, _ in entries:
        with open(name, "rb") as handle:
            assert digest == content_digest(handle.read()), name
        assert key == keyer(digest), name


def pdfs(inputs):
    return [path for path in inputs if path.read_bytes().startswith(b"%PDF")]


def test_rerun_of_unchanged_inputs_computes_no_key_and_reuses_every_item(batch, reads, keyed):
    """Fault: none (a plain rerun). Property: the first run keys each input it reads (4
    documents and the poison) and records the keys; the rerun reads none and keys none,
    and still finds every item (4 reused, the poison quarantined)."""
    batch()
    assert keyed[0] == len(batch.corpus)
    reads.clear()
    runner, counts = batch()
    assert reads == [] and keyed == [0, 0]
    assert runner.reused == 4 and counts["done"] == 4 and counts["failed"] == 1
    assert_index_tells_the_truth(batch, task_keyer({}))


def test_rerun_with_other_options_keys_every_input_anew_and_executes_each_once(batch, keyed):
    """Fault: the options change between runs on one ledger (``target``: part of every key).
    Property: no key recorded under the old options is taken for the new ones: each input is
    keyed again from its recorded digest, and the 4 documents execute once more (a new
    request each); the index is rewritten with the new keys, which the next run with those
    options takes (no key computed), and a run back with the old options keys anew too."""
    batch()
    executions = batch.executions()
    runner, counts = batch(options={"target": "fr"})
    assert keyed[0] == len(batch.corpus)
    assert counts["done"] == 4 and batch.executions() == executions + 4
    assert_index_tells_the_truth(batch, task_keyer({"target": "fr"}))
    runner, counts = batch(options={"target": "fr"})  # the second route's keys are computed:
    # the ledger holds items no first key names (the old options'), as without the index
    assert keyed[0] == 0 and runner.reused == 4 and batch.executions() == executions + 4
    runner, counts = batch()
    assert keyed[0] == len(batch.corpus) and runner.reused == 4
    assert batch.executions() == executions + 4
    assert_index_tells_the_truth(batch, task_keyer({}))


def test_rerun_under_a_new_key_version_takes_no_recorded_key(batch, keyed, monkeypatch):
    """Fault: the key scheme's version changes between runs (an upgrade: ``KEY_VERSION``).
    Property: every input is keyed again under the new version (a recorded key is the old
    scheme's) and each document is new work, executed once; the next run under that
    version takes the keys the index now holds."""
    batch()
    executions = batch.executions()
    monkeypatch.setattr(identity, "KEY_VERSION", "rt-next")
    runner, counts = batch()
    assert keyed[0] == len(batch.corpus)
    assert counts["done"] == 4 and batch.executions() == executions + 4
    assert_index_tells_the_truth(batch, task_keyer({}))
    runner, counts = batch()  # (the second route is keyed: the ledger holds the old items)
    assert keyed[0] == 0 and runner.reused == 4 and batch.executions() == executions + 4


def test_fingerprint_changes_with_version_options_and_the_spelling_of_the_material(
        monkeypatch):
    """Fault: a keyer that would give other keys (another version, other options, or the same
    two with the key material spelled otherwise by a changed toolkit). Property: its
    fingerprint differs, so an index of the first keyer's keys is never read as its own;
    the same version and options give the same fingerprint."""
    plain = task_keyer({}).fingerprint
    assert task_keyer({}).fingerprint == plain
    assert task_keyer({}, "rt-next").fingerprint != plain
    assert task_keyer({"target": "fr"}).fingerprint != plain
    spelled = TaskKeyer.many

    def many(self, digests):  # the same version and options, the digest spelled otherwise
        return spelled(self, [digest.upper() for digest in digests])
    monkeypatch.setattr(TaskKeyer, "many", many)
    assert task_keyer({}).fingerprint != plain


def test_input_rewritten_in_place_keeping_size_and_mtime_is_keyed_alone_and_executed(
        batch, reads, keyed, inputs):
    """Fault: an input's bytes rewritten in place, same size, its mtime set back (only its
    ``ctime`` moves). Property: its recorded key is not taken: the rerun reads and keys that
    input alone, executes it once as new content and takes the others' keys unread."""
    batch()
    victim = pdfs(inputs)[0]
    info, data = os.stat(victim), bytearray(victim.read_bytes())
    data[-1:] = b" " if data[-1:] == b"\n" else b"\n"  # after %%EOF: still the same PDF
    with open(victim, "r+b") as handle:  # the same inode, the same size
        handle.write(data)
    os.utime(victim, ns=(info.st_atime_ns, info.st_mtime_ns))
    wait_until_settled([victim])
    executions = batch.executions()
    reads.clear()
    runner, counts = batch()
    assert set(reads) == {victim.name} and keyed[0] == 1
    assert counts["done"] == 4 and runner.reused == 3 and batch.executions() == executions + 1
    assert_index_tells_the_truth(batch, task_keyer({}))


def test_inputs_whose_names_are_swapped_by_rename_are_keyed_by_their_bytes(
        batch, reads, keyed, inputs):
    """Fault: two inputs' names swapped by three renames (each name now holds the other's
    bytes, under the other's inode). Property: neither name's recorded key is taken: the
    rerun reads and keys those two, finds each content's own done item (nothing executed),
    and the index records each name with the key of the bytes it now holds."""
    batch()
    first, second = pdfs(inputs)[:2]
    spare = first.with_suffix(".swap")
    os.rename(first, spare)
    os.rename(second, first)
    os.rename(spare, second)
    wait_until_settled([first, second])
    executions = batch.executions()
    reads.clear()
    runner, counts = batch()
    assert sorted(reads) == sorted([first.name, second.name]) and keyed[0] == 2
    assert counts["done"] == 4 and runner.reused == 4 and batch.executions() == executions
    assert_index_tells_the_truth(batch, task_keyer({}))


def test_lines_of_another_keyers_index_set_under_this_header_are_damage_never_their_keys(
        batch, reads):
    """Fault: the index's lines replaced by those another keyer's run wrote for the same
    inputs (options ``target: fr``, on the same ledger: a restore of the wrong copy, a
    splice), under the header of the plain options; each line intact as it was written.
    Property: a line vouches only under the header it was sealed with: the plain rerun
    reads every input and keys it under its own options, reuses the plain items (never
    the fr ones, which the ledger holds done too) and executes nothing; the index it
    leaves holds the plain keys."""
    batch()
    header = batch.index.read_text(encoding="utf-8").splitlines(keepends=True)[0]
    batch(options={"target": "fr"})  # the fr items, done; the index now the fr keyer's
    fr_lines = batch.index.read_text(encoding="utf-8").splitlines(keepends=True)[1:]
    batch.index.write_text(header + "".join(fr_lines), encoding="utf-8")
    executions = batch.executions()
    reads.clear()
    runner, counts = batch()
    assert sorted(set(reads)) == sorted(path.name for path in batch.corpus)
    assert counts["done"] == 4 and runner.reused == 4 and batch.executions() == executions
    assert_index_tells_the_truth(batch, task_keyer({}))
