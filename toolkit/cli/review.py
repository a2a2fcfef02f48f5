"""An operator's decisions on parked items: ``review`` lists them, ``resolve`` records them
(one item, or every one parked for a reason: one decision, one event, per item)."""

import contextlib
import sys
from pathlib import Path

from toolkit.cli import command, emit
from toolkit.errors import ToolkitError


def _existing(path, *, writes: bool = True) -> None:
    """A file ledger must exist (opening would create one): one line and exit 2 if not.

    An empty file (0 bytes) is refused only to a command that ``writes``: opening it would
    write a header or a schema into it. A view never writes (``forensics.private``), so to
    ``review`` it is an empty ledger with nothing parked, as ``ledger`` and ``audit`` read it."""
    from toolkit.ledger.postgres import postgres_url

    if postgres_url(path):
        return
    from toolkit.runner.inputs import require_regular

    require_regular(path, "--ledger")  # a FIFO or a device is never opened
    if not Path(path).is_file():
        raise ToolkitError(f"no ledger at {str(path)!r}")
    from toolkit.forensics.sqlite import blank_file

    if writes and (Path(path).stat().st_size == 0 or blank_file(path)):
        raise ToolkitError(f"{str(path)!r} is empty: not a ledger (nothing was written)")
    if Path(path).suffix.lower() not in (".sqlite", ".db", ".sqlite3", ".jsonl"):
        raise ToolkitError(f"{str(path)!r} is not a ledger: use .sqlite, .db, .jsonl or a "
                           "postgresql:// URL")


def _one_line(value) -> str:
    """A value as one line (``roots.shown``); ``-`` for none."""
    from toolkit.roots import shown

    return shown("-" if value is None else str(value))


@command("review", "List every needs_review item with its reason and evidence (job, lookups, "
                   "artifact, history). Never modifies the ledger.")
def _review(parser):
    parser.add_argument("--ledger", required=True, help="client ledger (.sqlite, .db, .jsonl or "
                                                        "a postgresql:// URL)")
    parser.add_argument("--out", help="the outputs root, searched for files named for each "
                                      "item's key (default: the one recorded beside the ledger)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")

    def run(args):
        from toolkit.cli.inspect import readable, refuse_damaged
        from toolkit.forensics.private import opened_view
        from toolkit.ledger import open_ledger
        from toolkit.ledger.postgres import postgres_url
        from toolkit.roots import recorded
        from toolkit.runner.review import NO_JOB_NO_RESEND, failed_for_good, parked

        _existing(args.ledger, writes=False)
        out = args.out if args.out is not None else recorded(args.ledger).get("out")

        def both(ledger):
            return parked(ledger, out), failed_for_good(ledger)
        if postgres_url(args.ledger):
            with open_ledger(args.ledger) as ledger:
                items, failed = both(ledger)
        else:  # a copy: no lock taken, nothing written beside the original, a live run goes on
            with opened_view(args.ledger) as ledger:
                refuse_damaged(ledger, args.ledger)  # an item whose lines were lost is hidden
                items, failed = readable(lambda: both(ledger), ledger, args.ledger)
        lines = [f"needs_review ({len(items)})"]
        for item in items:
            lines += [f"key       {_one_line(item['key'])}",
                      f"  source    {_one_line(item['source'])}",
                      f"  reason    {_one_line(item['reason'])}",
                      f"  job       {_one_line(item['job_id'])}   attempt {item['attempt']}   "
                      f"lookups {item['lookups']}",
                      f"  artifact  {_one_line(item['artifact_path'])}"]
            lines += [f"  output    {_one_line(path)}   (named for its key)"
                      for path in item["outputs"]]
            lines += [f"  history   {_one_line(step)}" for step in item["history"]]
        if items:
            lines += _decide_commands(args.ledger, items)
            lines += ["  its output exists (an 'output' above, or one you fetched into the "
                      "outputs root): --accept-artifact FILE records it as done; a release is "
                      "looked up again, and where keys are not idempotent an item the "
                      "provider has no job for is parked again",
                      f"  parked as '{NO_JOB_NO_RESEND}': once you have checked at the "
                      "provider that it was never executed, --resend lets the next run look it "
                      "up once more and, still not found, send it once",
                      "  every item parked for one reason: --all --reason PREFIX (--release "
                      "| --cancel) instead of --key; --dry-run lists what it would do"]
        if failed:  # listed when there are some: an empty ledger's review says what ledger says
            from toolkit.advice import absolute, toolkit_command

            lines += [f"failed(permanent) ({len(failed)})"]
            for item in failed:
                lines += [f"key       {_one_line(item['key'])}",
                          f"  source    {_one_line(item['source'])}",
                          f"  reason    {_one_line(item['reason'])}"]
            key = failed[0]["key"] if len(failed) == 1 else "KEY"
            lines += ["no run retries these (a fixed input is new work, its own item); close "
                      "one with (WHY: your reason, recorded):",
                      "  " + toolkit_command("resolve", "--ledger", absolute(args.ledger), "--key", key,
                                             "--cancel", "--note", "WHY")]
        emit({"needs_review": items, "failed_permanent": failed}, args.json, "\n".join(lines))
        return 0
    return run


def _decide_commands(ledger, items) -> list[str]:
    """The decisions as command lines with this ledger (and the key, for one item):
    what is left to fill in is named in capitals."""
    from toolkit.advice import absolute, toolkit_command

    key = items[0]["key"] if len(items) == 1 else "KEY"
    fill = "" if len(items) == 1 else "; KEY: a key above"
    return [f"decide with one of (WHY: your reason, recorded{fill}):"] + [
        "  " + toolkit_command("resolve", "--ledger", absolute(ledger), "--key", key, *what,
                               "--note", "WHY")
        for what in (["--release"], ["--cancel"], ["--accept-artifact", "FILE"], ["--resend"])]


@command("resolve", "Record an operator's decision on a needs_review item (--key) or on every "
                    "one parked for a reason (--all --reason): release it (back to unknown, "
                    "reconciled by the next run), cancel it, or accept a verified PDF as its "
                    "artifact (done; one --key only); send again one parked because the "
                    "provider has no job and keys are not idempotent (--resend; one --key "
                    "only); close a failed(permanent) item (--key K --cancel).")
def _resolve(parser):
    parser.add_argument("--ledger", required=True, help="client ledger (.sqlite, .db, .jsonl or "
                                                        "a postgresql:// URL)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", help="the item's task key, or a unique prefix of it (as "
                                     "ledger and review print them)")
    which.add_argument("--all", action="store_true",
                       help="every needs_review item whose reason starts with --reason, one "
                            "decision (one event) per item; the others are skipped and listed")
    parser.add_argument("--reason", metavar="PREFIX",
                        help="with --all: the start of the reasons to decide, as review shows "
                             "them (e.g. 'salvaged' for the items a salvage parked)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--release", action="store_true", help="back to unknown: looked up next run")
    what.add_argument("--cancel", action="store_true", help="cancelled: never processed")
    what.add_argument("--accept-artifact", metavar="FILE",
                      help="a whole PDF inside the outputs root: recorded as the item's artifact")
    what.add_argument("--resend", action="store_true",
                      help="only an item parked as 'intent recorded, provider has no job, "
                           "contract forbids a resubmit': the next run looks it up once more "
                           "and, not found, sends it once (you checked it was never executed)")
    parser.add_argument("--note", required=True, help="why: recorded in the event")
    parser.add_argument("--dry-run", action="store_true",
                        help="list what would be decided and what skipped; write nothing")
    parser.add_argument("--out", help="the outputs root, when the ledger records none "
                                      "(PostgreSQL, or a ledger written by the API)")
    parser.add_argument("--worker", default="operator", help="name recorded in the event")

    def run(args):
        from toolkit.runner.ops import require_healthy
        from toolkit.runner.review import (DECISIONS, accepted_artifact, check_bulk, resolve,
                                           unique_key)

        if not args.note.strip():
            raise ToolkitError("--note must say why (it is recorded with the decision)")
        decision = "release" if args.release else "cancel" if args.cancel else \
            "resend" if args.resend else "accept"
        if args.all:  # before the ledger is opened: bad input opens nothing
            check_bulk(args.reason, decision)
        if args.key is not None and args.reason is not None:
            raise ToolkitError("--reason selects the items of --all; --key names one item")
        _existing(args.ledger, writes=not args.dry_run)
        require_healthy(args.ledger)  # a batch that failed closed: fix it first (exit 1)
        artifact = None
        if decision == "accept":  # checked before the ledger is opened: bad input writes nothing
            artifact = accepted_artifact(args.accept_artifact, args.ledger, args.out)
        with _opened(args.ledger, args.dry_run) as ledger:
            if args.all:
                return _resolve_all(ledger, args, decision)
            before = ledger.get(unique_key(ledger, args.key))  # a prefix names one item
            item = resolve(ledger, before.key, decision, args.note, artifact, args.worker,
                           dry_run=args.dry_run)
        if args.dry_run:
            print(f"dry run, nothing written: {_one_line(item.key)}: would go "
                  f"{_state(item)} -> {DECISIONS[decision].value}")
            return 0
        if decision == "accept" and args.out is not None:
            from toolkit import roots

            # the path is relative to --out: a file ledger that recorded no root records it
            roots.record(args.ledger, out=args.out)
        print(f"{_one_line(item.key)}: {_state(before)} -> {item.state.value}", file=sys.stderr)
        return 0
    return run


def _state(item) -> str:
    return f"failed({item.failure})" if item.state.value == "failed" else item.state.value


def _opened(path, dry_run):
    """The ledger to decide on: in place (a live run holding a JSONL ledger: LedgerBusyError,
    exit 1, "run again when it ends"), or for a dry run read as ``review`` reads it."""
    from toolkit.ledger import open_ledger
    from toolkit.ledger.postgres import postgres_url

    if not dry_run or postgres_url(path):
        return open_ledger(path)
    from toolkit.cli.inspect import refuse_damaged
    from toolkit.forensics.private import opened_view

    @contextlib.contextmanager
    def view():
        with opened_view(path) as ledger:
            refuse_damaged(ledger, path)  # an item whose lines were lost is hidden
            yield ledger
    return view()


def _resolve_all(ledger, args, decision) -> int:
    """Each item's outcome as it is recorded (so a kill shows how far it got), then a count;
    exit 1 when a live worker held some ("run again later"), else 0."""
    from toolkit.runner.review import resolve_all

    counts = dict.fromkeys(("decided", "would", "skipped", "later"), 0)
    out = sys.stdout if args.dry_run else sys.stderr
    words = {"decided": "needs_review -> {}", "would": "would go needs_review -> {}",
             "skipped": "skipped, unchanged ({})", "later": "not decided ({})"}
    for key, outcome, why in resolve_all(ledger, args.reason, decision, args.note,
                                         args.worker, dry_run=args.dry_run):
        counts[outcome] += 1
        print(f"{_one_line(key)}: {words[outcome].format(_one_line(why))}", file=out,
              flush=True)
    done = counts["would"] if args.dry_run else counts["decided"]
    verb = {"release": "released", "cancel": "cancelled"}[decision]
    print(f"{'dry run, nothing written: would have ' if args.dry_run else ''}{verb} {done}, "
          f"skipped {counts['skipped']}" + (f", {counts['later']} held by a live worker: run "
                                            "again later" if counts["later"] else ""), file=out)
    return 1 if counts["later"] else 0
