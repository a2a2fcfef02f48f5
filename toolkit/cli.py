"""``python -m toolkit …``: argparse subcommands, tables for people, ``--json`` for programs.

Bad input is one line on stderr and exit status 2, never a traceback. With
``--json`` stdout holds exactly one JSON document; progress goes to stderr.
"""

import argparse
import json
import sys

from toolkit.errors import ToolkitError

COMMANDS = {}


def command(name, help):
    """Register ``func(parser)`` that adds arguments and returns the handler."""
    def register(func):
        COMMANDS[name] = (help, func)
        return func
    return register


def emit(document, as_json, text):
    print(json.dumps(document, indent=2, sort_keys=True) if as_json else text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m toolkit",
        description="Interruption-safe batch document processing: drills, runs and audits.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help, add_arguments) in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help, description=help)
        sub_parser.set_defaults(handler=add_arguments(sub_parser))
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args) or 0
    except ToolkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


# -- subcommands ---------------------------------------------------------------

@command("ledger", "Show a ledger's items and state counts (read through the ledger API).")
def _ledger(parser):
    parser.add_argument("path", help="ledger file (.sqlite, .db or .jsonl)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")

    def run(args):
        from pathlib import Path

        from toolkit.ledger import open_ledger

        if not Path(args.path).is_file():
            raise ToolkitError(f"no ledger at {args.path!r}")
        with open_ledger(args.path) as ledger:
            items, counts = ledger.items(), ledger.counts()
        rows = [{"key": item.key[:12], "state": item.state.value, "attempt": item.attempt,
                 "source": item.source or "", "failure": item.failure or ""} for item in items]
        text = table(rows, ["key", "state", "attempt", "source", "failure"]) + "\n" + \
            "  ".join(f"{state}={count}" for state, count in counts.items() if count)
        emit({"items": len(items), "by_state": counts}, args.json, text)
    return run


def table(rows: list[dict], columns: list[str]) -> str:
    """A plain fixed-width text table (no pandas needed for a few rows)."""
    widths = {c: max([len(c)] + [len(str(row[c])) for row in rows]) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns),
             "  ".join("-" * widths[c] for c in columns)]
    lines += ["  ".join(str(row[c]).ljust(widths[c]) for c in columns) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


@command("fixtures", "Write a seeded corpus of healthy and poison PDFs (byte-identical per seed).")
def _fixtures(parser):
    parser.add_argument("dir", help="folder to write into (created if missing)")
    parser.add_argument("--docs", type=int, default=30, help="healthy documents (default 30)")
    parser.add_argument("--poison", type=int, default=3, help="poison files (default 3)")
    parser.add_argument("--seed", type=int, default=0)

    def run(args):
        from toolkit.documents import make_corpus

        if args.docs < 0 or args.poison < 0:
            raise ToolkitError("--docs and --poison must be >= 0")
        paths = make_corpus(args.dir, docs=args.docs, poison=args.poison, seed=args.seed)
        print(f"wrote {len(paths)} files ({args.docs} healthy, {args.poison} poison) to {args.dir}")
    return run


@command("provider-stats", "Counters of a fake provider's database: submits, executions, successes.")
def _provider_stats(parser):
    parser.add_argument("--provider-db", required=True, help="the provider's SQLite file")
    parser.add_argument("--json", action="store_true", help="print one JSON document")

    def run(args):
        from toolkit.provider import provider_stats

        stats = provider_stats(args.provider_db)
        twice = sorted(key for key, row in stats["per_task"].items() if row["succeeded"] > 1)
        text = "\n".join([f"submit calls  {stats['submit_calls']}",
                          f"executions    {stats['executions']}",
                          f"succeeded     {stats['succeeded']}",
                          f"failed        {stats['failed']}",
                          f"tasks         {len(stats['per_task'])}",
                          f"tasks executed successfully twice or more: {len(twice)}"])
        emit(stats, args.json, text)
    return run


STRATEGY_NAMES = ("safe", "blind-retry", "output-exists", "batch-commit", "rewrite-state",
                  "no-lease")


@command("run", "Run a batch: preflight, intent, submit, reconcile, fetch and verify. Safe to rerun "
                "after any crash.")
def _run(parser):
    parser.add_argument("--inputs", required=True, help="folder of input PDFs")
    parser.add_argument("--ledger", required=True, help="client ledger (.sqlite, .db, .jsonl)")
    parser.add_argument("--provider-db", required=True, help="the fake provider's SQLite file")
    parser.add_argument("--out", required=True, help="folder for verified artifacts")
    parser.add_argument("--strategy", default="safe", choices=STRATEGY_NAMES)
    parser.add_argument("--contract", default="idempotent",
                        help="provider contract, e.g. idempotent, non-idempotent, idempotent,lag=2")
    parser.add_argument("--transient-rate", type=float, default=None,
                        help="share of submits the provider rejects with a transient error")
    parser.add_argument("--seed", type=int, default=0, help="seeds the provider and the backoff")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    def run(args):
        import dataclasses
        from pathlib import Path

        from toolkit.ledger import open_ledger
        from toolkit.provider import FakeProvider, parse_contract
        from toolkit.runner import RetryPolicy
        from toolkit.runner.naive import open_strategy

        inputs = sorted(Path(args.inputs).glob("*.pdf")) if Path(args.inputs).is_dir() else None
        if not inputs:
            raise ToolkitError(f"no PDF files in {args.inputs!r}")
        contract = parse_contract(args.contract)
        changes = {"seed": args.seed}
        if args.transient_rate is not None:
            if not 0.0 <= args.transient_rate <= 1.0:
                raise ToolkitError("--transient-rate must be within [0, 1]")
            changes["transient_rate"] = args.transient_rate
        contract = dataclasses.replace(contract, **changes)
        provider_db = Path(args.provider_db)
        provider = FakeProvider(provider_db, provider_db.with_name(provider_db.stem + "-jobs"),
                                contract)
        runner = open_strategy(args.strategy, args.ledger, provider, args.out,
                               policy=RetryPolicy(seed=args.seed),
                               progress=not (args.json or args.no_progress))
        try:
            counts = runner.run(inputs)
        finally:
            runner.close()
        provider.close()
        items = sum(counts.values())
        text = "  ".join(f"{state}={n}" for state, n in counts.items() if n) + f"  (items={items})"
        emit({"items": items, "by_state": counts}, args.json, text)
        if runner.halted:
            print(f"halted, no new work taken: {runner.halted}", file=sys.stderr)
            return 1
        if runner.unsettled:
            print(f"{runner.unsettled} item(s) not at rest: run the same command again",
                  file=sys.stderr)
            return 1
        return 0
    return run


@command("drill", "Run fault drills (safe and naive strategies) and print their verdicts.")
def _drill(parser):
    parser.add_argument("name", help="'all', or one drill's name (see 'drill list')")
    parser.add_argument("--json", action="store_true", help="print one JSON list")

    def run(args):
        from toolkit.drills import DRILLS, run_catalogue

        if args.name == "list":
            print("\n".join(f"{name:48s} {drill.summary}" for name, drill in DRILLS.items()))
            return 0
        if args.name != "all" and args.name not in DRILLS:
            raise ToolkitError(f"unknown drill {args.name!r}: 'all', 'list' or one of "
                               f"{', '.join(DRILLS)}")
        names = None if args.name == "all" else [args.name]
        results = run_catalogue(names, progress=lambda r: print(
            f"  {r.drill.name}: {'as expected' if r.passed else 'UNEXPECTED'}", file=sys.stderr))
        rows = [result.row() for result in results]
        if args.json:
            print(json.dumps([{k: row[k] for k in (
                "drill", "strategy", "contract", "submit_calls", "executions", "valid",
                "expected_valid", "anomalies")} for row in rows], indent=2))
        else:
            shown = [{**row, "verdict": _verdict(row["valid"]), "expected": _verdict(
                row["expected_valid"]), "anomalies": ",".join(row["anomalies"]) or "-",
                "submits": row["submit_calls"], "execs": row["executions"]} for row in rows]
            print(table(shown, ["drill", "strategy", "contract", "submits", "execs", "outcome",
                                "verdict", "expected", "anomalies"]))
            failed = sum(not row["passed"] for row in rows)
            print(f"\n{len(rows)} drills, {len(rows) - failed} as expected, {failed} unexpected")
        return 1 if any(not row["passed"] for row in rows) else 0
    return run


def _verdict(valid):
    return {True: "valid", False: "INVALID", None: "undecided"}[valid]
