"""The audit notebook as a tool: papermill runs it on a ledger named on the command line.

``papermill notebooks/11-Audit-A-Ledger.ipynb out.ipynb -p ledger my.sqlite``
from the repository root: the injected ``ledger`` replaces the parameters
cell's default, the notebook audits that ledger (not the course's fixture),
and every cell runs without an error. A real kernel process: marked slow.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "11-Audit-A-Ledger.ipynb"
pytest.importorskip("papermill", reason="pip install papermill (the test extra)")


def test_audit_notebook_has_a_papermill_parameters_cell_naming_ledger_and_artifacts():
    """Without the tag papermill would append its values after the defaults are used."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    tagged = [c for c in cells if "parameters" in c["metadata"].get("tags", ())]
    assert len(tagged) == 1
    names = {line.split("=")[0].strip() for line in "".join(tagged[0]["source"]).splitlines()}
    assert {"ledger", "artifacts"} <= names


@pytest.mark.slow
def test_papermill_audits_the_ledger_given_with_p_ledger_instead_of_the_fixture(tmp_path):
    """Fault: none; property: ``-p ledger`` is honoured from the repository root, the run has
    no error output, and the audit printed is of that SQLite ledger."""
    out = tmp_path / "out.ipynb"
    done = subprocess.run(
        [sys.executable, "-m", "papermill", str(NOTEBOOK.relative_to(ROOT)), str(out),
         "-p", "ledger", "fixtures/ledgers/toolkit.sqlite", "-k", "python3", "--no-progress-bar"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = json.loads(out.read_text())["cells"]
    injected = [c for c in cells if "injected-parameters" in c["metadata"].get("tags", ())]
    assert injected and "toolkit.sqlite" in "".join(injected[0]["source"])
    outputs = [o for c in cells if c["cell_type"] == "code" for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    printed = "".join("".join(o.get("text", "")) for o in outputs if o["output_type"] == "stream")
    first_audit = printed.split("\n\n")[0]
    assert "toolkit.sqlite" in first_audit and "toolkit.jsonl" not in first_audit
