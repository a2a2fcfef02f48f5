import itertools

import pytest

from toolkit.ledger import open_ledger

BACKENDS = ("sqlite", "jsonl")


class FakeClock:
    """A deterministic clock: each call advances by ``step`` seconds."""

    def __init__(self, start=1000.0, step=0.001):
        self._ticks = itertools.count()
        self.start, self.step, self.offset = start, step, 0.0

    def __call__(self):
        return self.start + self.offset + next(self._ticks) * self.step

    def advance(self, seconds):
        self.offset += seconds


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture(params=BACKENDS)
def ledger_path(request, tmp_path):
    return tmp_path / f"ledger.{request.param}"


@pytest.fixture
def ledger(ledger_path, clock):
    with open_ledger(ledger_path, clock=clock) as opened:
        yield opened


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """The issue's batch: 27 healthy documents and 3 poison files, seed 0."""
    from toolkit.documents import make_corpus

    folder = tmp_path_factory.mktemp("corpus")
    return make_corpus(folder, docs=27, poison=3, seed=0)


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory):
    from toolkit.documents import make_corpus

    folder = tmp_path_factory.mktemp("small")
    return make_corpus(folder, docs=4, poison=1, seed=1)
