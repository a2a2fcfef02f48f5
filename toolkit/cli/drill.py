"""The drill catalogue on the command line."""

import json
import sys

from toolkit.cli import command, table
from toolkit.errors import ToolkitError


@command("drill", "Run fault drills (safe and naive strategies) and print their verdicts.")
def _drill(parser):
    parser.add_argument("name", nargs="?", default=None,
                        help="'all', or one drill's name (see 'drill list'); with --command: "
                             "'all' (default) or one black-box scenario")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON list; each row with its findings (file, witness "
                             "calls, remedy)")
    parser.add_argument("--explain", action="store_true",
                        help="after the table, explain every row: faults fired, each finding "
                             "with its document, witness calls and a remedy")
    parser.add_argument("--strategy", default=None,
                        help="run every scenario with this strategy instead: a name, or "
                             "module:Class for your own pipeline (a toolkit.runner.Pipeline)")
    parser.add_argument("--jobs", type=int, default=0, metavar="N",
                        help="drills run side by side in forked processes (default: one per "
                             "CPU; 1: one after the other); the table keeps catalogue order")

    parser.add_argument("--command", default=None, metavar="CMD",
                        help="drill an unmodified program (any language) run through the shell "
                             "against serve-provider, with TOOLKIT_PROVIDER_URL, TOOLKIT_INPUTS "
                             "and TOOLKIT_OUT set; rerun until it rests")
    parser.add_argument("--inputs", default=None, help="with --command: a folder of input PDFs")
    parser.add_argument("--run-timeout", type=float, default=None, metavar="S",
                        help="with --command: seconds one run may take before its process "
                             "group is killed (default 60); a cut run is the finding "
                             "never_finishes and is not rerun")
    parser.add_argument("--contract", default="non-idempotent",
                        help="with --command: the service's base contract (default "
                             "non-idempotent)")

    def run(args):
        from toolkit.cli.signals import release_early

        if args.command is not None:
            from toolkit.blackbox.procs import guarded

            with guarded():  # SIGTERM held since the start is an interrupt too, never a 143
                release_early()
                return _blackbox(args)
        release_early()
        return _catalogue(args)
    run.takes_signals = True  # cli.main leaves them held: --command lets them in guarded
    return run


def _catalogue(args):
    """``drill all|NAME``: the catalogue's drills, side by side in forked processes."""
    from toolkit.drills import DRILLS
    from toolkit.drills.parallel import run_parallel

    if args.name is None:
        raise ToolkitError("give 'all', 'list' or a drill's name (or --command CMD)")
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
        from toolkit.runner.registry import resolve_strategy

        resolve_strategy(args.strategy)  # a bad reference is one line, before any work
    if args.jobs < 0:
        raise ToolkitError(f"--jobs must be 0 (one per CPU) or more, got {args.jobs}")
    results = run_parallel(names, strategy=args.strategy, jobs=args.jobs,
                           progress=lambda r: print(f"  {r.drill.name}: {r.status}",
                                                    file=sys.stderr))
    rows = [result.row() for result in results]
    if args.json:
        from toolkit.drills.explain import findings_json

        print(json.dumps([{**{k: row[k] for k in (
            "drill", "strategy", "contract", "submit_calls", "executions", "valid",
            "expected_valid", "anomalies", "status", "reason", "headline", "costly")},
            "findings": findings_json(result)} for row, result in zip(rows, results)],
            indent=2))
    else:
        shown = [{**row, "headline": row["headline"] or "-", "verdict": "-" if row["status"] == "n/a" else _verdict(row["valid"]),
                  "expected": _verdict(row["expected_valid"]),
                  "anomalies": ",".join(row["anomalies"]) or "-",
                  "submits": row["submit_calls"], "execs": row["executions"]} for row in rows]
        print(table(shown, ["drill", "strategy", "contract", "submits", "execs", "outcome",
                            "verdict", "expected", "status", "headline", "anomalies"]))
        for row in rows:
            if row["reason"]:
                print(f"  {row['drill']}: {row['status']}: {row['reason']}")
        tally = {status: sum(row["status"] == status for row in rows) for status in
                 ("as expected", "UNEXPECTED", "inconclusive", "n/a")}
        print(f"\n{len(rows)} drills: " + ", ".join(f"{n} {status}" for status, n in
                                                 tally.items() if n))
        if args.explain:
            from toolkit.drills.explain import explain_result

            print("\n" + "\n\n".join(explain_result(result) for result in results))
    return 1 if any(result.failing for result in results) else 0


def _verdict(valid):
    return {True: "valid", False: "INVALID", None: "undecided"}[valid]


def _blackbox(args):
    """``drill --command CMD --inputs DIR``: every service scenario, judged by the oracle."""
    from toolkit.blackbox import run_all

    if args.inputs is None:
        raise ToolkitError("--command needs --inputs DIR (the input PDFs)")
    if args.strategy is not None:
        raise ToolkitError("give --command or --strategy, not both")
    from toolkit.blackbox import RUN_TIMEOUT
    from toolkit.cli import finite

    timeout = finite("--run-timeout", args.run_timeout)
    if timeout is not None and timeout <= 0:
        raise ToolkitError(f"--run-timeout must be positive, got {timeout:g}")
    names = None if args.name in (None, "all") else [args.name]
    results = run_all(args.command, args.inputs, args.contract, names, progress=lambda r: print(
        f"  {r.scenario.name}: {r.status}", file=sys.stderr), run_timeout=timeout or RUN_TIMEOUT)
    rows = [result.row() for result in results]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        shown = [{**row, "runs": f"{row['runs']} ({'rests' if row['rested'] else 'no rest'})",
                  "exits": ",".join(str(code) for code in row["exit_codes"]),
                  "found": ",".join(dict.fromkeys(f["kind"] for f in row["findings"])) or "-"}
                 for row in rows]
        print(table(shown, ["scenario", "contract", "runs", "exits", "executions", "status",
                            "found"]))
        for result in results:
            failed = [run for run in result.runs if run.exit_code != 0 and run.stderr_tail]
            if failed and result.status not in ("valid", "parked"):
                print(f"\n{result.scenario.name}: run {failed[-1].run} exited "
                      f"{failed[-1].exit_code}; its last lines: {failed[-1].stderr_tail}")
            for finding in result.findings:
                print(f"\n{result.scenario.name}: {finding.kind} {finding.file or '?'}: "
                      f"{finding.detail}")
                for w in finding.witnesses:
                    print(f"    witness: run {w['run']}, {w['what']}, key {w['idem_key']} "
                          f"at {w['seconds']:.2f} s")
                print(f"    remedy: {finding.remedy}")
    return 1 if any(result.status not in ("valid", "parked") for result in results) else 0
