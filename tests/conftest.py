import contextlib
import itertools
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from toolkit.ledger import open_ledger

BACKENDS = ("sqlite", "jsonl", "postgres")
# A PostgreSQL server to test against (CI starts one); each test gets its own schema in it.
PG_URL = os.environ.get("TOOLKIT_TEST_PG")
PG_MISSING = ("TOOLKIT_TEST_PG is not set: no PostgreSQL server to test against "
              "(export TOOLKIT_TEST_PG=postgresql://user@127.0.0.1:PORT/DB to run these)")


def require_pg():
    """Skip without a server; in CI (CI set) a missing server is a failure, never a skip."""
    if not PG_URL:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the PostgreSQL tests: {PG_MISSING}")
        pytest.skip(PG_MISSING)


@contextlib.contextmanager
def pg_schema():
    """A URL whose search_path is a new, empty schema; the schema is dropped afterwards."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    separator = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{separator}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


class Crash(BaseException):
    """Stands for the process dying: nothing after it runs, no handler catches it."""


def crash_once_at(point: str):
    """A runner hook that dies (raises ``Crash``) the first time the run reaches ``point``
    (``"after_intent"``: the intent is recorded, nothing was sent); ``hook.keys`` holds the
    key it died on."""
    keys = []

    def hook(reached, key, **context):
        if reached == point and not keys:
            keys.append(key)
            raise Crash()

    hook.keys = keys
    return hook


@contextlib.contextmanager
def tmpfs_mount(folder, options: str):
    """A real tmpfs (``mount -o options``, e.g. ``size=24k``) at the new folder ``folder``:
    a real full disk or inode table for the faults that need one. Unmounted (lazily) on
    the way out; the test is skipped where mount is refused (not root)."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill_disk(folder, room: int = 0) -> None:
    """Write into ``folder`` until the kernel answers ENOSPC, then give ``room`` bytes back:
    Python's ``tempfile`` takes a TMPDIR only if a 4-byte probe can be written there (a
    TMPDIR with no byte left is silently replaced by /tmp), so a full TMPDIR as it is met
    has a little room, never enough for a ledger."""
    fd = os.open(Path(folder) / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
        if room:
            os.ftruncate(fd, os.fstat(fd).st_size - room)
    finally:
        os.close(fd)


class FakeClock:
    """A deterministic clock: each call advances by ``step`` seconds."""

    def __init__(self, start=1000.0, step=0.001):
        self._ticks = itertools.count()
        self.start, self.step, self.offset = start, step, 0.0

    def __call__(self):
        return self.start + self.offset + next(self._ticks) * self.step

    def advance(self, seconds):
        self.offset += seconds


@pytest.fixture(autouse=True)
def own_batch_registry(tmp_path_factory, monkeypatch):
    """Each test its own ``$XDG_STATE_HOME`` (children inherit it): the CLI ``run``'s
    registry of batches (``runner/batches.py``) never carries one test's ledgers into
    another's, and never touches the user's own."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def pg_url():
    """A PostgreSQL ledger URL in a fresh schema (skips, outside CI, without a server)."""
    require_pg()
    with pg_schema() as url:
        yield url


@pytest.fixture(params=BACKENDS)
def ledger_path(request, tmp_path):
    if request.param == "postgres":
        return request.getfixturevalue("pg_url")
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


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The black-box drills' input folder: one healthy document, seed 5."""
    from toolkit.documents import make_corpus

    folder = tmp_path_factory.mktemp("inputs")
    make_corpus(folder, docs=1, poison=0, seed=5)
    return folder


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory):
    from toolkit.documents import make_corpus

    folder = tmp_path_factory.mktemp("small")
    return make_corpus(folder, docs=4, poison=1, seed=1)


def sigkill_at_executions(command, provider_db, points, after_each=None) -> int:
    """Start ``command`` once per point of ``points``; SIGKILL it once the provider at
    ``provider_db`` has executed that many jobs. ``after_each()`` runs after each
    child is gone. Returns how many children were really killed (not finished)."""
    import subprocess
    import time

    from toolkit.errors import ToolkitError
    from toolkit.provider import provider_stats

    def executions():
        try:
            return provider_stats(provider_db)["executions"]
        except ToolkitError:
            return 0  # not created yet
    kills = 0
    for kill_after in points:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while executions() < kill_after and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        if child.poll() is None:
            child.kill()  # SIGKILL: no handler, no finally, no flush
            kills += 1
        child.wait()
        if after_each is not None:
            after_each()
    return kills


def run_until_rest(command, tries: int = 3):
    """Run ``command`` again until it exits 0 (a resting batch), at most ``tries`` times."""
    import subprocess

    for _ in range(tries):
        final = subprocess.run(command, capture_output=True, text=True)
        if final.returncode == 0:
            break
    return final


BLOCKED_LIMIT = 180  # seconds; a run that blocks (on a FIFO, say) never finishes


def run_cli(*args):
    """``python -m toolkit ARGS`` in a real process; a run that blocks fails the test."""
    try:
        return subprocess.run([sys.executable, "-m", "toolkit", *map(str, args)],
                              capture_output=True, text=True, timeout=BLOCKED_LIMIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"toolkit {' '.join(map(str, args))} blocked for {BLOCKED_LIMIT} s")
