"""Read-only views: a ledger's items, a provider's counters."""

import os
import sys

from toolkit.advice import absolute, toolkit_command
from toolkit.cli import command, emit, table
from toolkit.errors import LedgerError, ToolkitError
from toolkit.forensics.model import ACTIONS


@command("ledger", "Show a ledger's items and state counts (read through the ledger API).")
def _ledger(parser):
    parser.add_argument("path", help="ledger file (.sqlite, .db or .jsonl)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--salvage", metavar="NEW",
                        help="write a new ledger NEW (.jsonl, .sqlite: by its suffix) from what "
                             "is readable, marked with what was lost; every item a lost line "
                             "or event may hold goes to needs_review (PATH is left as it is; "
                             "a deleted ledger --out's witness knows: from nothing)")
    parser.add_argument("--out", metavar="OUT", default=None,
                        help="with --salvage: the outputs folder of the runs whose witness "
                             "says what PATH lost (default: PATH's recorded outputs root)")

    def run(args):
        from pathlib import Path

        from toolkit.forensics.private import opened_view
        from toolkit.ledger import open_ledger
        from toolkit.ledger.postgres import postgres_url

        if postgres_url(args.path):
            with open_ledger(args.path) as ledger:
                items, counts = ledger.items(), ledger.counts()
        else:
            if args.salvage:  # a missing ledger too: the witness in --out may know it
                return _salvage(args)
            if not Path(args.path).is_file():  # a FIFO or a device is never opened
                raise ToolkitError(f"no ledger at {args.path!r}")
            if args.out is not None:
                raise ToolkitError("--out goes with --salvage")
            with opened_view(args.path) as ledger:
                # a copy: no migration, schema, journal mode or lock file beside the original
                refuse_damaged(ledger, args.path)
                try:
                    items, counts = readable(lambda: (ledger.items(), ledger.counts()),
                                             ledger, args.path)
                except ValueError as exc:  # a row the ledger cannot hold (a state not ours)
                    raise ToolkitError(f"ledger {args.path!r} holds a record that is not "
                                       f"ours ({exc}); `audit` reports what is wrong") from None
        rows = [{"key": item.key[:12], "state": item.state.value, "attempt": item.attempt,
                 "source": _one_line(item.source or ""), "failure": item.failure or ""}
                for item in items]
        text = table(rows, ["key", "state", "attempt", "source", "failure"]) + "\n" + \
            "  ".join(f"{state}={count}" for state, count in counts.items() if count)
        emit({"items": len(items), "by_state": counts, "per_item": [_item(i) for i in items]},
             args.json, text)
    return run


def _salvage(args) -> int:
    """``ledger PATH --salvage NEW [--out OUT]``: a JSONL ledger (``ledger.salvage``), an
    SQLite one (``ledger.salvage_sqlite``, read through a private copy: never modified), or
    a ledger deleted that the witness of OUT knows (from nothing; the witness says what was
    lost). Bad input is refused before anything is read or written."""
    from pathlib import Path

    from toolkit.ledger.salvage import check_new, salvage
    from toolkit.ledger.salvage_sqlite import salvage_sqlite
    from toolkit.runner import witness

    path, new = args.path, args.salvage
    check_new(Path(new))
    _outside_batch(new, path, args.out)
    if not os.path.lexists(path) or (Path(path).is_file() and os.path.getsize(path) == 0 and
                                     Path(path).suffix.lower() != ".jsonl"):
        out = _witness_out(path, args.out)
        found = witness.missing(out, path) if out is not None else None
        if found is None:
            raise ToolkitError(f"no ledger at {path!r}" + (
                f", and the witness in {str(out)!r} saw none hold history there"
                if out is not None else
                "; a deleted one is salvaged from what the witness in its run's --out says: "
                "give --out OUT"))
        words = witness.lost_words(found[0], Path(path), found[1])
        result = salvage_sqlite(None, path, new, loss=lambda _: words)
    elif not Path(path).is_file():  # a FIFO or a device is never opened
        raise ToolkitError(f"no ledger at {path!r}")
    elif Path(path).suffix.lower() == ".jsonl":
        result = salvage(path, new, loss=lambda old: witness.loss_of(old, args.out))
    else:
        from toolkit.errors import LedgerBusyError
        from toolkit.forensics.private import live_wal_connection, opened_view
        from toolkit.ledger import canonical_path
        from toolkit.storage import live_process, sqlite_holder

        real = canonical_path(Path(path))  # run's rule: a second hard link is refused
        # Its history is not finished: as JSONL's lock refuses. Asked of the database's own
        # lock bytes first: a connection's lock on its -shm is gone with a deleted -shm.
        holder = sqlite_holder(real)
        if holder is not None or live_wal_connection(real):
            raise LedgerBusyError(f"SQLite ledger {path!r} is busy: open in "
                                  f"{live_process(holder)}; salvage it when that run ends")
        from toolkit.ledger.sqlite_damage import DamagedLedgerError, busy_or_damaged, damage_of

        try:
            with opened_view(path) as old:  # a private copy: the original is never written
                # JSONL's rule; the witness's entry and the roots file are the original's
                result = salvage_sqlite(old, path, new, loss=lambda view: witness.loss_of(
                    view, args.out, path=os.path.realpath(path)))
        except DamagedLedgerError as exc:  # unreadable: salvaged from nothing once moved aside
            raise busy_or_damaged(path, damage_of(exc), new, args.out) from None
    # worded by what was lost (the mark's words: lines, seqs, their order, snapshot lines,
    # the witness's), never "corrupt lines none" for a loss of another kind
    emit(result, args.json, f"wrote {new}: {result['items']} items, "
         f"{len(result['needs_review'])} in needs_review (lost: {result['lost'] or 'nothing'})")
    from toolkit.cli.run_summary import say_parked

    say_parked(new, len(result["needs_review"]))
    return 0


def _witness_out(path, out):
    """The --out whose witness speaks of ``path``: the one given, else its recorded one."""
    from toolkit import roots

    return out if out is not None else roots.recorded(os.path.realpath(path)).get("out")


def _outside_batch(new, ledger, out=None) -> None:
    """Refuse (one line, exit 2) a salvaged ledger ``new`` in a folder of the ledger's batch
    (the outputs and inputs roots recorded beside its real path), as ``audit --csv``
    refuses its file there: ``run`` refuses a ledger inside its ``--inputs`` (outputs would be the next
    run's inputs), and the run's companions of the new ledger would land among the inputs
    or artifacts. Compared as real paths (``forensics.checks.inside``, the rule
    ``audit --csv`` asks)."""
    from toolkit.forensics.checks import inside
    from toolkit.forensics.csvout import batch_folders

    real = os.path.realpath(os.path.abspath(new))  # a name not there yet: its folder's real path
    # The roots are recorded beside the ledger's real path (``canonical_path``): a symlink
    # alias of the ledger has no roots file of its own, and would be found outside the batch.
    given = [("the --out folder", out)] if out is not None else []
    for what, folder in given + batch_folders(os.path.realpath(ledger)):
        if inside(real, os.path.realpath(folder)):
            raise ToolkitError(f"--salvage {new!r} is in {what} {folder!r}: refusing to write "
                               "a ledger there (an input or an artifact may be the only copy, "
                               "and run refuses a ledger inside its --inputs); name a file "
                               "outside the batch's folders")


def refuse_damaged(ledger, path) -> None:
    """A view of a JSONL ledger with corrupt interior lines or missing seqs (lines deleted)
    would list the items of the lines it could read and silently drop the ones whose
    history was lost (an add line gone hides its item): a confident wrong answer. Refused
    with one line, exit 2, as a SQLite ledger holding a record not ours is; ``audit`` and
    ``--salvage`` read past it. What counts as damage, and its wording, is the ledger's
    (``JsonlLedger.corruption``; SQLite's ``quick_check``, as ``run`` and ``health`` read
    it), naming the user's ``path``, never a private name."""
    corruption = getattr(ledger, "corruption", None)
    text = corruption and corruption(
        refusing="to list its items, which may be missing or stale",
        shown=os.path.abspath(path))  # its commands paste from any folder (o37)
    if text:
        raise ToolkitError(text)
    from toolkit.runner.ops import sqlite_pages

    sqlite_pages(ledger, path)  # an SQLite page that does not read: as run refuses it


def readable(read, ledger, path):
    """``read()``; an SQLite text cell that is not UTF-8 (SQLite keeps whatever bytes it is
    given) fails the read as a whole, and sqlite3 names neither the row nor the table: then
    refused with one line naming the first such cell, exit 2 (``audit`` reads past it, each
    cell a ``corrupt_record``). Only the private copy is read again, never the original."""
    try:
        return read()
    except LedgerError as exc:
        if "Could not decode to UTF-8" not in str(exc):
            raise
        cell = _first_undecodable(ledger.path)
    raise ToolkitError(f"ledger {str(path)!r}: {cell or 'a text cell'} is not UTF-8 text, so "
                       f"its items cannot be listed: `{toolkit_command('audit', absolute(path))}` reports every such cell "
                       "(nothing was changed)")


def _first_undecodable(copy) -> str | None:
    """``'items row key=…: column source'`` for the first text cell of ``copy`` (a private
    copy) that is not UTF-8, its key's odd bytes escaped; None if none is found."""
    import sqlite3

    db = sqlite3.connect(copy)
    db.text_factory = bytes  # every text as its bytes: nothing fails to decode here
    try:
        names = [row[0].decode() for row in db.execute(
            "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        for table in sorted(names, key=lambda name: name != "items"):  # the items first
            columns = [row[1].decode() for row in db.execute(f'PRAGMA table_info("{table}")')]
            key = "key" if "key" in columns else "rowid"
            for column in columns:
                for row_key, value in db.execute(
                        f'SELECT {key}, "{column}" FROM "{table}" '
                        f'WHERE typeof("{column}") = \'text\''):
                    try:
                        value.decode()
                    except UnicodeDecodeError:
                        if type(row_key) is bytes:
                            row_key = row_key.decode("utf-8", "backslashreplace")
                        return f"{table} row {key}={row_key!r}: column {column}"
    finally:
        db.close()
    return None


ITEM_FIELDS = ("key", "source", "attempt", "failure", "reason", "job_id", "artifact_path",
               "artifact_size", "artifact_sha256", "pages_done", "lease_owner", "lease_expires",
               "updated")


def _item(item) -> dict:
    """One ledger item for ``ledger --json``: its state, attempt, reason (a quarantined
    input's ``poison: ...`` included) and artifact, as recorded."""
    return {"state": item.state.value, **{name: getattr(item, name) for name in ITEM_FIELDS}}


def _one_line(text: str) -> str:
    """A file name as one table cell: a newline (or any control character) escaped, the
    stored name's backslashes as they are (``roots.shown``)."""
    from toolkit.roots import shown

    return shown(text)


@command("provider-stats", "Counters of a fake provider's database: submits, executions, successes.")
def _provider_stats(parser):
    parser.add_argument("--provider-db", required=True, help="the provider's SQLite file")
    parser.add_argument("--json", action="store_true", help="print one JSON document")

    def run(args):
        from toolkit.errors import StorageError
        from toolkit.forensics.private import copy_failed, private_copy
        from toolkit.provider import provider_stats
        from toolkit.runner.inputs import require_regular

        path = args.provider_db
        require_regular(path, "--provider-db")  # a FIFO or a device is never opened
        if not os.path.exists(path):
            raise ToolkitError(f"no provider database at {path!r}")
        # A private copy, as ledger and audit read: a database left by a killed writer
        # has a -wal whose -shm index SQLite would rebuild beside the original.
        with private_copy(path) as copy:
            try:
                stats = provider_stats(copy)
            except StorageError as exc:  # the copy's -shm, in TMPDIR: that space's
                raise copy_failed(exc, copy, path) from None
            except ToolkitError as exc:
                raise ToolkitError(str(exc).replace(str(copy), str(path))) from None
        twice = sorted(key for key, row in stats["per_task"].items() if row["succeeded"] > 1)
        text = "\n".join([f"submit calls  {stats['submit_calls']}",
                          f"executions    {stats['executions']}",
                          f"succeeded     {stats['succeeded']}",
                          f"failed        {stats['failed']}",
                          f"tasks         {len(stats['per_task'])}",
                          f"tasks executed successfully twice or more: {len(twice)}"])
        emit(stats, args.json, text)
    return run


@command("audit", "Audit an existing batch ledger (ours or a foreign format): anomalies and the "
                  "safe next action per item. Never modifies what it reads.")
def _audit(parser):
    parser.add_argument("path", help="ledger or state file to audit, or a postgresql:// URL")
    parser.add_argument("--artifacts", help="folder the artifacts should be in (checks size, SHA-256)")
    parser.add_argument("--inputs", help="folder of the inputs (checks they still match their keys)")
    parser.add_argument("--output-name", metavar="RULE",
                        help="where a done item's output is when the ledger records none, e.g. "
                             "'{stem}.pdf' ({key}, {name}, {stem}, {relstem} of its source); "
                             "needs --artifacts: each is then checked as a whole PDF")
    parser.add_argument("--action", choices=ACTIONS,
                        help="list (and put in --json per_item / --csv) only items planned so")
    parser.add_argument("--csv", metavar="FILE", help="also write the per-item table as CSV")
    parser.add_argument("--json", action="store_true", help="print one JSON document")

    def run(args):
        from toolkit.forensics import audit, render_text
        from toolkit.forensics.report import stream_json, write_csv

        rule = _output_rule(args.output_name, args.artifacts)
        if args.csv is not None:
            from toolkit.forensics.csvout import check_target

            # before anything is read or written
            check_target(args.csv, args.path, args.inputs, args.artifacts)
        report = audit(args.path, artifacts=args.artifacts, inputs=args.inputs, output_name=rule)
        if args.csv is not None:
            write_csv(report, args.csv, args.action)
        if args.json:
            stream_json(report, sys.stdout, args.action)
        else:
            print(render_text(report, action=args.action))
        return 0
    return run


def _output_rule(rule, artifacts):
    """``--output-name`` checked before anything is read: one line and exit 2 if bad."""
    if rule is None:
        return None
    if artifacts is None:
        raise ToolkitError("--output-name needs --artifacts DIR: the folder the outputs are in")
    from toolkit.forensics.checks import OUTPUT_FIELDS

    import string

    fields = dict.fromkeys(OUTPUT_FIELDS, "x")
    try:
        # a field only as it is named: no conversion (!r), attribute, index or format spec
        for _, name, spec, conversion in string.Formatter().parse(rule):
            if name is not None and (name not in OUTPUT_FIELDS or spec or conversion):
                raise KeyError(name + (f"!{conversion}" if conversion else "") +
                               (f":{spec}" if spec else ""))
        named = rule.format(**fields)
    except (KeyError, IndexError, ValueError, AttributeError) as exc:
        raise ToolkitError(f"--output-name {rule!r}: use only the fields "
                           f"{', '.join('{' + f + '}' for f in OUTPUT_FIELDS)} ({exc!r})") from None
    if named == rule or not named or "\0" in named:
        raise ToolkitError(f"--output-name {rule!r} names one file for every item: include "
                           "{stem}, {name}, {relstem} or {key}")
    return rule
