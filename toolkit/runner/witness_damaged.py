"""The witness's damage: its file, a moved-aside one, a ledger's roots file -- what each
refusal says to do, and what doing it must not lose.

A witness file that does not read is refused, naming it; the way on is to move it aside.
But it may have held the only record of a ledger's highest seq, and the only link to a
peer folder that saw further (its entries' ``peers``): once it is moved aside, nothing
shows what such a ledger may have lost. So:

  * the advice names a new file each time (``.witness.json.damaged-<UTC time>``, a
    counter after it if taken): a second damage never overwrites the first one's file;
  * a run refuses (``check``) a ledger with history, not salvaged, of which a folder of
    its circle has no entry while a moved-aside witness lies there (``.witness.json.
    damaged*``): salvage it (``ledger L --salvage NEW --out OUT``: a marked ledger looks
    every request up before it sends it), then run NEW; NEW is recorded, and runs on.
  * a ledger's roots file (``<ledger>.roots.json``) names its batch's ``--out``, whose
    witness may be the only one that saw it: one that is there and does not read is
    refused the same way, never read as "no roots".
"""

import datetime
import os
from pathlib import Path

from toolkit import roots
from toolkit.advice import absolute, salvaged_name, shell_words, toolkit_command
from toolkit.errors import LedgerError

NAME = ".witness.json"
ASIDE = NAME + ".damaged"  # a moved-aside witness: the advice's names, and the older one's


def salvage_advice(ledger_path, kind: str, out) -> str:
    """The one way on for a ledger whose history the witnesses cannot vouch for."""
    new = salvaged_name(ledger_path, ".jsonl" if kind == "jsonl" else ".sqlite")
    command = toolkit_command('ledger', absolute(ledger_path), '--salvage', new, '--out',
                              absolute(out))
    return (f"salvage it: {command}"
            " (the new ledger is marked: every request it never recorded is looked up before "
            f"it is sent), then run with --ledger {shell_words(new)}")


def aside_name(where: Path) -> Path:
    """A name to move the damaged witness ``where`` to that no earlier one has."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    name, count = Path(f"{where}.damaged-{stamp}"), 1
    while os.path.lexists(name):
        count += 1
        name = Path(f"{where}.damaged-{stamp}-{count}")
    return name


class WitnessDamagedError(LedgerError):
    """A witness file that does not read as one (``damaged``). The ledger itself records
    well: a run halted by it (its progress could not be recorded) leaves the ledger's
    health as it is (no ``health --clear`` to do), since every later run reads this file
    first and is refused until it is moved aside, and then until its ledger is salvaged."""


def damaged(where: Path, what: str) -> WitnessDamagedError:
    """The one refusal of a witness file that does not read as one: what to do, and what
    doing it loses."""
    aside = aside_name(where)
    return WitnessDamagedError(
        f"the witness {str(where)!r} is damaged ({what}); move it aside, keeping it in this "
        f"folder ({shell_words('mv', '-n', where, aside)}), and run again: a ledger it "
        "recorded is then refused until it is salvaged "
        f"({toolkit_command('ledger', 'L', '--salvage', 'NEW', '--out', where.parent)}, L "
        "the ledger it names), since the damaged file may have held the only record of how "
        "far it went")


def moved_aside(folder) -> list[str]:
    """The moved-aside witnesses in ``folder`` (none if it cannot be listed)."""
    try:
        return sorted(name for name in os.listdir(folder) if name.startswith(ASIDE))
    except OSError:
        return []


def unseen_after_damage(folders, seen: dict, read) -> tuple[str, list[str]] | None:
    """``(folder, moved-aside names)``: a folder of the circle of a ledger with history, not
    salvaged (``seen``: ``witness.facts``), that has no entry for it (by path or identity;
    ``read``: a folder's witness entries) while a damaged witness moved aside lies there,
    which may have held the only record of how far it went; None if there is none."""
    if seen["salvaged"] or seen["id"] is None or not seen["seq"]:
        return None  # it looks every request up, or has no history to have lost
    for folder in folders:
        names = moved_aside(folder)
        if names and not any(path == seen["real"] or entry["id"] == seen["id"]
                             for path, entry in read(folder).items()):
            return folder, names
    return None


def aside_refusal(ledger_path, kind: str, folder, names) -> LedgerError:
    return LedgerError(
        f"ledger {str(ledger_path)!r} is not in the witness of {str(folder)!r}, whose earlier "
        f"witness was moved aside damaged ({names[-1]}): it may have held the only record of "
        f"how far this ledger went; {salvage_advice(ledger_path, kind, folder)}")


def roots_refusal(ledger_path, kind: str, why: str, out) -> LedgerError:
    marker = roots.roots_file(ledger_path)
    return LedgerError(
        f"the roots file {str(marker)!r} of ledger {str(ledger_path)!r} is damaged ({why}): "
        "it names the --out folder whose witness saw this ledger, so what the ledger may "
        "have lost cannot be seen; put back a copy of it, or "
        f"{salvage_advice(ledger_path, kind, out)}")
