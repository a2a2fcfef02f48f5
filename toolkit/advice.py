"""The command lines the toolkit's messages tell a person to run: one place for the
program's name and for quoting, so that every advice pastes into bash as is.

The program is ``python -m toolkit``: every example in the README is written so, it runs
wherever the package imports (a ``pip install``, or ``pip install -e .`` from a checkout),
and it names no console script a person may not have on PATH (``resume-toolkit``, from
pyproject's ``[project.scripts]``, is the same program; a bare ``toolkit`` does not exist).

Every other word -- a path, a key, a URL -- goes through ``shlex.quote``: a path with a
space, a quote, a backslash or a ``$`` reaches the program as the same bytes (``repr``
would double a backslash, and its double quotes let bash expand ``$HOME``). A word that
names a file is given absolute (``absolute``; a ``Path`` word is made so here): the command
then works from any folder, and a name starting with ``-`` (``-bad.sqlite``) starts with
``/``, never read as an option by ``mv`` or argparse. Option names, keys, URLs and the
placeholders a person fills in (``OUT``, ``KEY``) are plain ``str`` and stay as given. This module
sits at the package's top so that ledger, runner and cli modules all build advice here
without importing one another (imports stay one-way).
"""

import os
import shlex

PROGRAM = "python -m toolkit"


def shell_words(*words) -> str:
    """``words`` as one bash command line, each quoted as needed; a path-like word (a file)
    absolute."""
    return " ".join(shlex.quote(absolute(word) if isinstance(word, os.PathLike) else str(word))
                    for word in words)


def toolkit_command(*words) -> str:
    """The toolkit's own command line: ``python -m toolkit`` and ``words``, quoted."""
    return f"{PROGRAM} {shell_words(*words)}"


def absolute(path) -> str:
    """A path as a command pasted from any folder needs it: absolute (a relative one names
    another file elsewhere); a URL (``postgresql://``) as it is."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    return text if "://" in text else os.path.abspath(text)


def salvaged_name(ledger_path, suffix: str = "") -> str:
    """A new ledger's path for ``ledger L --salvage NEW`` beside ``ledger_path``:
    ``<folder>/<stem>.salvaged<suffix>`` (``suffix`` the ledger's own when not given), so
    the advice names a real file a person can paste, not a placeholder; absolute, as every
    file an advice names."""
    stem, own = os.path.splitext(absolute(ledger_path))
    return f"{stem}.salvaged{suffix or own or '.jsonl'}"
