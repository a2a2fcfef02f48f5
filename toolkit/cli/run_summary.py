"""What ``run`` says when it ends: the counts (a line, or ``--json``'s document, on stdout)
and, on stderr, why it stopped and what is left to do (the command to run next).

Used by ``cli/batch.py`` only (one run, or ``--workers N``); it knows nothing of how a
run is set up.
"""

import sys

from toolkit.cli import emit
from toolkit.errors import LedgerError
from toolkit.liveness import HOSTNAME


def say_stopped(name: str) -> int:
    print(f"stopped by {name} at the end of a step, every lease released: run the same "
          "command again to go on", file=sys.stderr)
    return 1


def ledger_counts(ledger) -> dict | None:
    """A halted run's counts: the ledger's, read after the halt. The run's own tally stops
    where the halt did (a halt inside the first chunk's enqueue counts none of the items
    that chunk recorded), and a script reading ``"items": 0`` would see an empty batch
    that is not. None when the ledger cannot be read either: the counts are unknown."""
    try:
        return ledger.counts()
    except (LedgerError, OSError):
        return None


def emit_counts(counts, strays, as_json, refused: int = 0) -> None:
    """The run's summary line (or JSON document); unknown counts are said to be unknown.
    ``refused``: inputs refused for their options (``runner/other_options.py``)."""
    if counts is None:
        emit({"items": None, "by_state": None, "strays": None, "refused": refused,
              "counts": "unknown"}, as_json,
             "(items unknown: the ledger could not be read after the halt; `ledger` counts "
             "them once it can)")
        return
    items = sum(counts.values())
    more = f", strays={len(strays)}" if strays else ""
    more += f", refused={refused}" if refused else ""
    text = "  ".join(f"{state}={n}" for state, n in counts.items() if n) + \
        f"  (items={items}{more})"
    emit({"items": items, "by_state": counts, "strays": len(strays), "refused": refused},
         as_json, text)


def cancel_command(args, key) -> str:
    """``cancel`` for one item with this run's own --ledger and provider database. Cancel
    reads the provider's database: with --provider-url it is the file the service was
    started with (its --db), which this run never saw, so the line says so."""
    from toolkit.advice import absolute, toolkit_command

    command = toolkit_command("cancel", "--ledger", absolute(args.ledger), "--provider-db",
                              absolute(args.provider_db) if args.provider_db else "DB",
                              "--key", key)
    return command if args.provider_db else f"{command}   (DB: the service's --db file)"


def say_parked(ledger, parked: int) -> None:
    """Items at rest in ``needs_review`` (parked: a person decides), and how to decide."""
    from toolkit.advice import absolute, toolkit_command

    if parked:
        resolve = toolkit_command("resolve", "--ledger", absolute(ledger), "--key", "KEY",
                                  "--release", "--note", "TEXT")
        print(f"{parked} item(s) in needs_review wait for a person: "
              f"`{toolkit_command('review', '--ledger', absolute(ledger))}` lists each with why "
              f"and its evidence, and says what fits: `{resolve}` hands one back to the next "
              "run, which looks it up before it sends it (or `--all --reason PREFIX`); one "
              "parked because the provider has no job and keys are not idempotent needs "
              "`--resend` instead", file=sys.stderr)


def say_unsettled(unsettled: int, held) -> None:
    """Items not at rest when the run ended: those a live run holds (``held``: it settles
    them; the batch is not complete yet, but a rerun now would only wait on their leases),
    and the others ("run the same command again")."""
    if held:
        holders = ", ".join(dict.fromkeys(_holder(item) for item in held))
        print(f"{len(held)} item(s) not at rest are held by a live run ({holders}) that will "
              "settle them: wait for it to end (or check with `ledger` or `audit`)",
              file=sys.stderr)
    if unsettled > len(held):
        print(f"{unsettled - len(held)} item(s) not at rest: run the same command again",
              file=sys.stderr)


def say_strays(args, strays) -> None:
    """Items of the ledger not at rest whose content is not among this run's inputs: a file
    changed or removed, or another run's work on this ledger (``run --inputs B`` while a run
    of A is live: A's queued and in-flight items). Cancelling another live run's item would
    take its work away, so while a live run holds a lease on this ledger (as ``claim``
    judges it: ``lease_held``) no cancel is advised: the items it holds are its own, and the
    unleased ones may be its queue; wait for it to end. Otherwise each gets its cancel."""
    import time

    from toolkit.ledger import lease_held

    now = time.time()
    held = [item for item in strays if item.lease_owner is not None and lease_held(item, now)]
    from toolkit.roots import shown as one_line

    shown = ", ".join(f"{item.key[:12]} ({one_line(item.source)}, {item.state.value})"
                      for item in strays[:5])
    more = f" and {len(strays) - 5} more" if len(strays) > 5 else ""
    if held:
        holders = ", ".join(dict.fromkeys(_holder(item) for item in held))
        print(f"{len(strays)} item(s) not at rest are not among these inputs: {shown}{more}; "
              f"a live run on this ledger ({holders}) holds {len(held)} of them, and the others "
              "may be its queued work: wait for it to end and run again (one still listed "
              "then had its input changed or removed)", file=sys.stderr)
        return
    print(f"{len(strays)} item(s) not at rest whose content is no longer among the inputs "
          f"(changed or removed, or another run's inputs on this ledger): {shown}{more}; put "
          "the input back and run again, or cancel each:", file=sys.stderr)
    for item in strays:
        print(f"  {cancel_command(args, item.key)}", file=sys.stderr)


def _holder(item) -> str:
    """The live run holding ``item``'s lease, as the lease records it: its pid (and host)."""
    host = (item.lease_host or "").partition("/")[0]
    return f"pid {item.lease_pid}" + (f" on {host}" if host and host != HOSTNAME else "")


def say_refused(lines: list[str]) -> None:
    """The inputs refused for their options (``runner/other_options.py``): five, then a count."""
    for line in lines[:5]:
        print(f"refused: {line}", file=sys.stderr)
    if len(lines) > 5:
        print(f"refused: {len(lines) - 5} more input(s) so", file=sys.stderr)
