"""Fixtures shared by the tests of the inputs' stat index (test_input_index, test_input_index_keys,
test_outsider_o23, test_resume_paths) and of a rerun's chunks (test_resume_chunk): a private
copy of the small batch, a count of the runner's input reads and of the digests it keys, and
the safe runner over that batch. Imported by
name into those modules (pytest collects fixtures there)."""

import os
import shutil
import time

import pytest

from toolkit.ledger import open_ledger
from toolkit.provider import FakeProvider, provider_stats
from toolkit.runner import RetryPolicy, Runner, inputindex, intake, keying


def wait_until_settled(paths):
    """Precondition, not a timer: the coarse clock has passed every input's ctime by more
    than the racy margin (a few ms), so a read that starts now may record their stat."""
    while not all(inputindex.settled(os.stat(path), inputindex.now_ns()) for path in paths):
        time.sleep(0.005)


@pytest.fixture
def inputs(tmp_path, small_corpus):
    """A private copy of the 4+1 document batch (the tests rewrite its files)."""
    folder = tmp_path / "inputs"
    folder.mkdir()
    for path in small_corpus:
        shutil.copy2(path, folder / path.name)
    return sorted(folder.iterdir())


@pytest.fixture
def reads(monkeypatch):
    """The names of the inputs the runner reads (keying, full keying), in order."""
    seen = []
    real_stat, real_input = keying.read_stat, intake.read_input

    def read_stat(path, limit=None):
        seen.append(os.path.basename(path))
        return real_stat(path, limit)

    def read_input(path, limit=None):
        seen.append(os.path.basename(path))
        return real_input(path, limit)
    monkeypatch.setattr(keying, "read_stat", read_stat)
    monkeypatch.setattr(intake, "read_input", read_input)
    return seen


@pytest.fixture
def batch(tmp_path, inputs):
    """run(inputs=None, **options) -> (runner, counts): the safe runner over ``inputs`` (the
    private copy, ``run.corpus``, unless other inputs are given); ``run.ledger``,
    ``run.index``, ``run.provider_db`` name its files, ``run.executions()`` counts."""
    provider = FakeProvider(tmp_path / "provider.db", tmp_path / "jobs")

    def run(inputs=inputs, **options):
        runner = Runner(open_ledger(tmp_path / "ledger.sqlite"), provider, tmp_path / "out",
                        worker="w1", policy=RetryPolicy(base_delay=0.0), sleep=lambda s: None,
                        **options)
        try:
            return runner, runner.run(inputs)
        finally:
            runner.close()
    run.ledger, run.index = tmp_path / "ledger.sqlite", tmp_path / "ledger.sqlite.inputs"
    run.provider_db, run.corpus = tmp_path / "provider.db", inputs
    run.executions = lambda: provider_stats(run.provider_db)["executions"]
    wait_until_settled(inputs)
    yield run
    provider.close()


@pytest.fixture
def keyed(monkeypatch):
    """How many digests the run keys, per route: ``keying.keyers`` made to count."""
    counts = []
    real = keying.keyers

    class Counting:
        def __init__(self, keyer, at):
            self.keyer, self.at = keyer, at

        def __call__(self, digest):
            counts[self.at] += 1
            return self.keyer(digest)

        def many(self, digests):
            counts[self.at] += len(digests)
            return self.keyer.many(digests)

        @property
        def fingerprint(self):
            return self.keyer.fingerprint

    def keyers(options):
        made = real(options)
        counts[:] = [0] * len(made)
        return [Counting(keyer, at) for at, keyer in enumerate(made)]
    monkeypatch.setattr(keying, "keyers", keyers)
    return counts
