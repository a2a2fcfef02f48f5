"""docs/design.md stays current with the code: its tables are checked against their sources.

What breaks: an edge added to the transition table, a module moved to another
rank, a subcommand added, without the design document following. What must
hold: the document holds ``transitions.describe()`` verbatim, the rank table
of ``tests/test_imports.py`` row by row, every subcommand, and README links it.
"""

import re
from pathlib import Path

from test_imports import RANKS

from toolkit.cli import COMMANDS
from toolkit.ledger.transitions import describe

ROOT = Path(__file__).resolve().parents[1]
DESIGN = (ROOT / "docs" / "design.md").read_text()


def test_design_doc_holds_the_transition_table_as_the_code_describes_it():
    """The fenced table is exactly ``describe()``: one source for the policy."""
    assert f"```\n{describe()}\n```" in DESIGN


def test_design_doc_rank_table_is_the_one_the_import_test_enforces():
    section = DESIGN.split("## Modules and their one-way imports")[1].split("\n## ")[0]
    rows = dict(re.findall(r"^\| (\d) \| (.+) \|$", section, re.MULTILINE))
    documented = {name: int(rank) for rank, names in rows.items()
                  for name in re.findall(r"`([^`]+)`", names)}
    assert documented == RANKS


def test_design_doc_names_every_subcommand_and_the_three_exit_codes():
    assert [name for name in COMMANDS if f"`{name}`" not in DESIGN] == []
    for code in ("| 0 |", "| 1 |", "| 2 |"):
        assert code in DESIGN.split("## The command line contract")[1]


def test_readme_links_the_design_doc_instead_of_a_file_users_do_not_have():
    readme = (ROOT / "README.md").read_text()
    assert "(docs/design.md)" in readme
