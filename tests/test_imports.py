"""The architecture, checked: imports go one way, and `import toolkit` stays light."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "toolkit"
# A module may import only from strictly lower ranks (STYLE.md, "Import ranks").
RANKS = {
    "errors": 0, "pool": 0,  # the one process pool (explore's crash points, parallel drills)
    "advice": 0,  # the command lines messages print (every rank's refusals build them)
    "identity": 1, "documents": 1, "storage": 1, "liveness": 1,
    "ledger": 2, "provider": 2, "roots": 2,
    "runner": 3, "faults": 3, "checker": 3, "forensics": 3,
    "drills": 4, "viz": 4, "blackbox": 4,  # black-box drills: the service, the oracle
    "explore": 5,                        # crash exploration drives drills in forked children
    "widgets": 6, "cli": 6, "__main__": 7, "__init__": 7,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def toolkit_imports(path: Path):
    """The top-level toolkit modules that ``path`` imports, absolute or relative."""
    tree = ast.parse(path.read_text())
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]  # ("toolkit", ...)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            names = [f"{node.module}"] if node.module else [alias.name for alias in node.names]
            for name in names:
                parts = (*base, *name.split("."))
                yield parts[1] if len(parts) > 1 else "__init__"
        elif isinstance(node, ast.ImportFrom) and node.module == "toolkit":
            yield from (alias.name for alias in node.names)  # from toolkit import documents
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("toolkit."):
            yield node.module.split(".")[1]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("toolkit."):
                    yield alias.name.split(".")[1]


def test_every_module_has_a_rank_and_imports_only_lower_ranks():
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        assert name in RANKS, f"{path.name}: give it a rank in tests/test_imports.py"
        for target in toolkit_imports(path):
            if target == name:
                continue  # inside one package (ledger/sqlite.py -> ledger)
            assert RANKS[target] < RANKS[name], f"{name} (rank {RANKS[name]}) imports {target}"


def test_import_toolkit_loads_no_heavy_library():
    code = ("import sys, toolkit, toolkit.cli, toolkit.ledger.sqlite, toolkit.ledger.jsonl\n"
            "print(' '.join(m for m in ('pandas', 'matplotlib', 'pymupdf', 'fitz', 'psutil')"
            " if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == ""


def test_modules_stay_small():
    for path in PACKAGE.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 450, f"{path} is over ~400 lines: split it"


def test_public_api_loads_lazily_without_heavy_libraries():
    """``from toolkit import Pipeline, Runner, check, audit, run_drill`` works and loads
    neither pandas, matplotlib nor PyMuPDF."""
    code = ("import sys\nfrom toolkit import Pipeline, Runner, check, audit, run_drill\n"
            "assert issubclass(Runner, Pipeline) and callable(check) and callable(audit)\n"
            "assert callable(run_drill)\n"
            "print(' '.join(m for m in ('pandas', 'matplotlib', 'pymupdf', 'fitz')"
            " if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == ""


def test_console_script_resume_toolkit_is_python_m_toolkit():
    """pyproject's ``resume-toolkit`` entry point is the same ``main`` as ``python -m toolkit``."""
    import tomllib

    from toolkit import cli

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    module, _, name = project["scripts"]["resume-toolkit"].partition(":")
    assert module == "toolkit.cli" and getattr(cli, name) is cli.main
    assert "from toolkit.cli import main" in (PACKAGE / "__main__.py").read_text()
