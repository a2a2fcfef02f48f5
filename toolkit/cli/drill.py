"""The drill catalogue on the command line."""

import json
import sys

from toolkit.cli import command, table
from toolkit.errors import ToolkitError


@command("drill", "Run fault drills (safe and naive strategies) and print their verdicts.")
def _drill(parser):
    parser.add_argument("name", help="'all', or one drill's name (see 'drill list')")
    parser.add_argument("--json", action="store_true", help="print one JSON list")
    parser.add_argument("--strategy", default=None,
                        help="run every scenario with this strategy instead: a name, or "
                             "module:Class for your own pipeline (a toolkit.runner.Pipeline)")

    def run(args):
        from toolkit.drills import DRILLS, run_catalogue

        if args.name == "list":
            if args.json:
                print(json.dumps([{"drill": name, "summary": drill.summary}
                                  for name, drill in DRILLS.items()], indent=2))
            else:
                print("\n".join(f"{name:48s} {drill.summary}" for name, drill in DRILLS.items()))
            return 0
        if args.name != "all" and args.name not in DRILLS:
            raise ToolkitError(f"unknown drill {args.name!r}: 'all', 'list' or one of "
                               f"{', '.join(DRILLS)}")
        names = None if args.name == "all" else [args.name]
        if args.strategy is not None:
            from toolkit.runner.naive import resolve_strategy

            resolve_strategy(args.strategy)  # a bad reference is one line, before any work
        results = run_catalogue(names, strategy=args.strategy, progress=lambda r: print(
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
