"""A batch on a read-only file system: ``run`` and ``resolve`` cannot take the ledger's lock
(JSONL) or open it for writing (SQLite). That is a storage state: exit 1, one line, with
what to do (README, "exit status"), never exit 2 as if the command were wrong."""

import shutil
import subprocess

import pytest

from conftest import run_cli, tmpfs_mount
from toolkit.documents import make_corpus
from toolkit.ledger import open_ledger

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("mount") is None, reason="needs mount")]


@pytest.mark.parametrize("name", ["L.jsonl", "L.sqlite"])
def test_read_only_mount_run_and_resolve_exit_1_one_line_with_advice(tmp_path, name):
    """Fault: the batch folder (ledger, inputs, outputs) on a real tmpfs remounted
    read-only (every write: EROFS). Property: ``run`` and ``resolve`` each exit 1 with one
    line saying the file system is read-only and what to do; the ledger is unchanged."""
    with tmpfs_mount(tmp_path / "b", "size=16m") as batch:
        make_corpus(batch / "in", docs=2, poison=0, seed=0)
        args = ["run", "--inputs", batch / "in", "--ledger", batch / name, "--provider-db",
                batch / "p.db", "--out", batch / "out", "--contract", "non-idempotent",
                "--no-progress"]
        assert run_cli(*args).returncode == 0
        with open_ledger(batch / name) as ledger:
            key = ledger.items()[0].key
        before = (batch / name).read_bytes()
        subprocess.run(["mount", "-o", "remount,ro", str(batch)], check=True)
        for result in (run_cli(*args), run_cli("resolve", "--ledger", batch / name, "--key",
                                                 key[:12], "--release", "--note", "x")):
            assert result.returncode == 1, result.stderr
            line = result.stderr.strip()
            assert len(line.splitlines()) == 1 and "read-only" in line and \
                "copy the batch folder" in line, line
        assert (batch / name).read_bytes() == before
