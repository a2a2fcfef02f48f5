"""The notebooks as committed: executed, thin, portable, and covering the catalogue.

Running them is nbval's job (strict mode, see README); these checks read the
files only and take milliseconds, so a notebook committed unexecuted, with a
function defined in it, or with a temporary path in an output fails here
first, with a clear message.
"""

import ast
import json
import re
from pathlib import Path

import pytest

from toolkit.drills import DRILLS

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
SANITIZER = NOTEBOOKS / "nbval-sanitize.cfg"
EXPECTED = ["00-Index", "01-Done-Failed-Unknown", "02-Intent-Before-Side-Effect",
            "03-Identity-And-Keys", "04-Retries-And-Poison", "05-Torn-JSONL-And-Power-Loss",
            "06-Leases-Two-Workers", "07-Job-Registry", "08-Long-Documents-Partial",
            "09-Provider-Over-HTTP", "10-Kill-9", "11-Audit-A-Ledger", "12-Drill-Your-Pipeline"]


def load(path):
    return json.loads(path.read_text())


def code_cells(path):
    return [cell for cell in load(path)["cells"] if cell["cell_type"] == "code"]


def text_outputs(cell):
    for output in cell.get("outputs", ()):
        if output["output_type"] == "stream":
            yield "".join(output["text"])
        for mime, value in output.get("data", {}).items():
            if mime.startswith("text/"):
                yield "".join(value)
        if output["output_type"] == "error":
            yield output["evalue"]


def sanitized(text):
    patterns = re.findall(r"^regex: (.*)$\n^replace: (.*)$", SANITIZER.read_text(), re.MULTILINE)
    for regex, replace in patterns:
        text = re.sub(regex, replace, text)
    return text


def test_the_thirteen_notebooks_of_the_course_are_there():
    assert [path.stem for path in PATHS] == EXPECTED


def nav(name: str) -> str:
    """The navigation every notebook ends with: the next one in the course, and the map."""
    following = EXPECTED[(EXPECTED.index(name) + 1) % len(EXPECTED)]
    if following == EXPECTED[0]:  # the last leads back to the map: one link, not the same twice
        return "**Next:** back to the [Course map](00-Index.ipynb)"
    return f"**Next:** [{following}]({following}.ipynb) · [Course map](00-Index.ipynb)"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_last_markdown_cell_links_to_the_next_notebook_and_the_map(path):
    """A reader at the end of a notebook finds the next one (12 leads back to 00); an old
    list of every notebook, which went stale at each renumbering, is gone."""
    cells = [cell for cell in load(path)["cells"] if cell["cell_type"] == "markdown"]
    assert "".join(cells[-1]["source"]).strip() == nav(path.stem), path.name
    stale = [cell for cell in cells[:-1] if "](00-Index.ipynb) · [01" in "".join(cell["source"])]
    assert not stale, f"{path.name}: remove the old all-notebook navigation line"


def test_the_map_links_every_notebook_once_each():
    """00-Index lists the twelve others, one line each, each a working link."""
    text = "\n".join("".join(cell["source"]) for cell in load(NOTEBOOKS / "00-Index.ipynb")["cells"]
                     if cell["cell_type"] == "markdown")
    for name in EXPECTED[1:]:
        lines = [line for line in text.splitlines() if line.startswith(f"- [{name}]({name}.ipynb)")]
        assert len(lines) == 1, name
        assert (NOTEBOOKS / f"{name}.ipynb").exists()


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_notebook_is_committed_executed_top_to_bottom_without_errors(path):
    cells = code_cells(path)
    assert [cell["execution_count"] for cell in cells] == list(range(1, len(cells) + 1)), \
        f"{path.name}: execute it top to bottom (jupyter nbconvert --execute --inplace)"
    for cell in cells:
        errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
        expected = "raises-exception" in cell["metadata"].get("tags", ())
        assert bool(errors) == expected, f"{path.name}: {cell['source']!r}"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_notebook_imports_and_calls_but_defines_nothing(path):
    # Exception: cells tagged "exercise" hold the learner's own pipeline, to read and edit.
    for cell in code_cells(path):
        if "exercise" in cell["metadata"].get("tags", ()):
            continue
        tree = ast.parse("".join(cell["source"]))
        defined = [type(node).__name__ for node in ast.walk(tree)
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                        ast.Lambda))]
        assert not defined, f"{path.name}: move {defined} into the package: {cell['source']!r}"


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_notebook_outputs_hold_nothing_machine_specific_after_sanitizing(path):
    repo = str(NOTEBOOKS.parent)
    for cell in code_cells(path):
        for text in map(sanitized, text_outputs(cell)):
            assert "/tmp/" not in text and repo not in text, f"{path.name}: {text[:200]!r}"
            assert "dtype" not in text, f"{path.name}: pandas dtypes print differently in 2 and 3"


def test_every_drill_of_the_catalogue_is_shown_in_a_notebook():
    shown = "\n".join(text for path in PATHS for cell in code_cells(path)
                      for text in text_outputs(cell))
    missing = [name for name in DRILLS if name not in shown]
    assert not missing, f"re-run notebooks/00-Index.ipynb: {missing}"


def test_every_sanitizer_pattern_compiles_and_replaces_something_real():
    patterns = re.findall(r"^regex: (.*)$\n^replace: (.*)$", SANITIZER.read_text(), re.MULTILINE)
    samples = ["'escape.out.pdf' resolves to '/home/ci/clone/fixtures/ledgers/inputs/a.pd…",
               "/tmp/drill-x8k2_q/out/doc-000.pdf", "submit of ab:1 at t=1.79604e+09 after"]
    assert len(patterns) == len(samples)
    for (regex, replace), sample in zip(patterns, samples):
        assert re.sub(regex, replace, sample) != sample, regex
