"""Crash exploration on the command line: a real SIGKILL at every durable step of a batch."""

import sys

from toolkit.cli import command, emit, table


@command("explore", "Kill a batch with SIGKILL at every durable step (and pairs of steps), rerun "
                    "it until it rests, judge every history with the checker. Exit 1 if any "
                    "crash point is a violation.")
def _explore(parser):
    parser.add_argument("--strategy", default="safe",
                        help="safe (default) or a naive strategy, e.g. blind-retry, batch-commit")
    parser.add_argument("--contract", default=None,
                        help="provider contract (default non-idempotent; with --command "
                             "idempotent), e.g. idempotent")
    parser.add_argument("--command", default=None, metavar="CMD",
                        help="explore an unmodified program instead: a real SIGKILL of its whole "
                             "process group right after each durable syscall (strace), rerun "
                             "to rest, judged from the provider's log and the outputs")
    parser.add_argument("--inputs", default=None, help="with --command: a folder of input PDFs")
    parser.add_argument("--max-points", type=int, default=None,
                        help="with --command: explore at most N crash points")
    parser.add_argument("--docs", type=int, default=10, help="documents in the batch (default 10)")
    parser.add_argument("--long-docs", type=int, default=0,
                        help="add N long documents, sent page by page with a checkpoint per page")
    parser.add_argument("--long-pages", type=int, default=5,
                        help="pages of each long document (default 5, at least 5)")
    parser.add_argument("--ledger", default="sqlite",
                        help="sqlite (default), jsonl, or jsonl-no-fsync (appends, never fsyncs)")
    parser.add_argument("--power-loss", action="store_true",
                        help="after each kill, drop the ledger bytes not yet fsynced (JSONL file, SQLite WAL)")
    parser.add_argument("--pairs", action="store_true",
                        help="also kill the first rerun at each of its steps (bounded)")
    parser.add_argument("--max-pairs", type=int, default=200, help="cap on pairs (default 200)")
    parser.add_argument("--every", type=int, default=1,
                        help="explore every k-th durable step only (default 1: all)")
    parser.add_argument("--mode", default="real", choices=("real", "snapshot"),
                        help="real (default): replay the batch and SIGKILL it at step k; "
                             "snapshot: record one run, copy its folder at every step, rerun "
                             "from the copies (faster; no --pairs, no --power-loss)")
    parser.add_argument("--jobs", type=int, default=0,
                        help="crash points explored side by side (default: one per CPU)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the corpus and the provider")
    parser.add_argument("--json", action="store_true",
                        help='print {"rows": [...], "total": {...}} and nothing else')

    def run(args):
        from toolkit.explore import Plan, explore

        if args.command is not None:
            return _command(args)
        plan = Plan(strategy=args.strategy, contract=args.contract or "non-idempotent",
                    docs=args.docs,
                    long_docs=args.long_docs, long_pages=args.long_pages,
                    ledger=args.ledger, power_loss=args.power_loss, every=args.every,
                    pairs=args.pairs, max_pairs=args.max_pairs, seed=args.seed,
                    jobs=args.jobs, mode=args.mode).validate()
        interactive = sys.stderr.isatty()
        result = explore(plan, progress=_progress if interactive else None)
        if interactive:
            print(file=sys.stderr)
        emit(result.to_json(), args.json, "" if args.json else _text(result))
        return 1 if result.total()["violations"] else 0
    return run


def _progress(done, total):
    print(f"\r  crash points explored: {done}/{total}", end="", file=sys.stderr, flush=True)


def _text(result) -> str:
    base = result.baseline
    long = f" + {result.plan.long_docs} long" if result.plan.long_docs else ""
    lines = [f"{result.plan.strategy} / {result.plan.contract} / {result.plan.docs} docs{long} / "
             f"{result.plan.ledger}{' + power loss' if result.plan.power_loss else ''}: "
             f"the uncrashed run has {len(result.steps)} durable steps and is {base['verdict']}"
             + (f" ({', '.join(base['anomalies'])})" if base["anomalies"] else "")
             + f", {base['outcome']}", ""]
    if result.plan.mode != result.mode:
        lines[-1:-1] = [f"snapshot mode fell back to real kills: {result.note}"]
    pairs = result.plan.pairs
    rows = [{**row, "then": f"{row['recovery_point']} {row['recovery_step'] or ''}".strip()
             if row["recovery_point"] else "-",
             "anomalies": ",".join(a if a in row["new"] else f"({a})" for a in row["anomalies"])
             or "-", "execs": row["executions"]} for row in result.rows]
    columns = ["point", "how", "step"] + ["then"] * pairs + [
        "outcome", "submits", "execs", "verdict", "anomalies"]
    lines.append(table(rows, columns))
    total = result.total()
    lines += ["", f"{total['points']} crash points: {total['violations']} violations "
              f"({total['caused_by_crash']} caused by the crash), {total['parked']} parked"
              + (f", {total['lost_acknowledged']} acknowledged transitions lost"
                 if "lost_acknowledged" in total else "")
              + f"; {total['points_per_s']} points/s ({result.seconds:.1f} s)"]
    if base["anomalies"]:
        lines.append("(anomaly) in parentheses: the design has it even uncrashed")
    return "\n".join(lines)


def _command(args):
    """``explore --command CMD --inputs DIR``: every durable syscall of the program, killed."""
    from toolkit.blackbox.crash import explore_command
    from toolkit.errors import ToolkitError

    if args.inputs is None:
        raise ToolkitError("--command needs --inputs DIR (the input PDFs)")
    import time

    started, counts = time.monotonic(), {}
    results = explore_command(args.command, args.inputs, args.contract or "idempotent",
                              args.max_points, progress=lambda r: print(
                                  f"  {r.row()['point']}: {r.result.status}", file=sys.stderr),
                              counts=counts)
    seconds = time.monotonic() - started
    rows = [r.row() for r in results]
    points = rows[1:]
    total = {"points": len(points), "points_recorded": counts.get("selected", len(points)),
             "seconds": round(seconds, 1),
             "points_per_s": round(len(points) / seconds, 2) if seconds else None,
             **{status: sum(row["status"] == status for row in points)
                for status in ("valid", "parked", "INVALID", "never rests")}}
    text = ""
    if not args.json:
        shown = [{**row, "exits": ",".join(str(c) for c in row["exit_codes"]),
                  "found": ",".join(dict.fromkeys(f["kind"] for f in row["findings"])) or "-"}
                 for row in rows]
        shown = [{**row, "hit": row["hit"] or "-"} for row in shown]
        text = table(shown, ["point", "outcome", "hit", "exits", "executions", "status",
                             "found"])
        text += "\n\n" + "; ".join(f"{n} {k}" for k, n in total.items()) + "\n"
        if total["points_recorded"] > len(points):
            text += (f"cut short by --max-points: {len(points)} of "
                     f"{total['points_recorded']} crash points explored\n")
        for row in rows:
            for finding in row["findings"]:
                text += f"\n{row['point']}: {finding['kind']} {finding['file'] or '?'}: " \
                        f"{finding['detail']}"
    emit({"rows": rows, "total": total}, args.json, text)
    return 1 if total["INVALID"] or total["never rests"] or rows[0]["status"] != "valid" else 0
