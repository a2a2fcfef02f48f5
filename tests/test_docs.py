"""The docs are tested: every drill and subcommand is documented, CI runs the README's command."""

import re
from pathlib import Path

from toolkit.cli import COMMANDS
from toolkit.drills import DRILLS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_every_drill_in_the_catalogue_is_named_in_the_readme():
    missing = [name for name in DRILLS if f"`{name}`" not in README and name not in README]
    assert missing == []


def test_every_subcommand_is_in_the_readme():
    assert [name for name in COMMANDS if f"python -m toolkit {name}" not in README] == []


def test_ci_runs_exactly_the_test_command_the_readme_gives():
    ci = (ROOT / ".ci" / "run").read_text()
    readme_test = re.search(r'pip install -e "\.\[test\]" && (python -m pytest[^\n`]*)', README)
    assert readme_test, "README names no test command"
    assert readme_test.group(1).strip() in ci
