"""``acceptance init``: a notebook for the user's CI that passes for a careful program and
fails, naming the failing drill, for a naive one (run by pytest with nbval, as CI would)."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from toolkit.documents import make_corpus

ROOT = Path(__file__).resolve().parents[1]
NAIVE = f"{sys.executable} {ROOT / 'examples/blackbox/naive_batch.py'}"
CAREFUL = f"{sys.executable} {ROOT / 'examples/blackbox/careful_batch.py'}"

pytestmark = pytest.mark.slow


def init_and_run(tmp_path, command):
    inputs = tmp_path / "in"
    make_corpus(inputs, docs=1, poison=0, seed=2)
    made = subprocess.run([sys.executable, "-m", "toolkit", "acceptance", "init",
                           str(tmp_path / "ci"), "--command", command, "--inputs", str(inputs),
                           "--scenarios", "lost-reply", "--max-points", "0"],
                          capture_output=True, text=True, cwd=ROOT)
    assert made.returncode == 0, made.stderr
    notebook = tmp_path / "ci" / "acceptance.ipynb"
    cells = nbformat.read(notebook, as_version=4).cells
    assert [c for c in cells if "parameters" in c.metadata.get("tags", [])]
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--nbval-lax", "--nbval-current-env", str(notebook)],
                          capture_output=True, text=True, cwd=tmp_path)


def test_acceptance_notebook_passes_for_the_careful_batch(tmp_path):
    """The careful batch under a dropped reply (crash points: tests/test_blackbox_explore.py):
    every drill passes, so the notebook (and the team's CI) passes."""
    result = init_and_run(tmp_path, CAREFUL)
    assert result.returncode == 0, result.stdout[-3000:]


def test_acceptance_notebook_fails_for_the_naive_batch_naming_the_drill(tmp_path):
    """The naive batch executes twice after a dropped reply: the notebook's assertion
    fails CI and names the failing drill."""
    result = init_and_run(tmp_path, NAIVE)
    assert result.returncode != 0
    assert "failing drills: ['lost-reply'" in result.stdout
