"""An acceptance-drill notebook for the user's CI: ``acceptance init DIR``.

The notebook has a papermill ``parameters`` cell (command or strategy,
contract, inputs, scenarios, crash points), runs the drills on the user's
program, charts the verdicts and asserts them, so that ``pytest --nbval-lax
DIR/acceptance.ipynb`` (or a papermill run) fails the team's CI when the
pipeline regresses; the executed copy is the report. The notebook imports
its machinery from here (``verdicts``, ``chart``); it defines nothing.
"""

import json
from pathlib import Path

from toolkit.cli import command
from toolkit.errors import ToolkitError

PASSING = {"as expected", "valid", "parked", "n/a"}


def verdicts(command=None, strategy=None, contract="non-idempotent", inputs=None,
             scenarios=None, max_points=None) -> list[dict]:
    """One row per drill (and per crash point with ``command``): name, status, findings."""
    rows = []
    if strategy is not None:
        from toolkit.drills import run_catalogue

        for result in run_catalogue(scenarios, strategy=strategy):
            rows.append({"drill": result.drill.name, "status": result.status,
                         "findings": sorted({*result.verdict.anomalies, *result.verdict.costly}),
                         "reason": result.reason})
        return rows
    from toolkit.blackbox import run_all
    from toolkit.blackbox.crash import explore_command

    for result in run_all(command, inputs, contract, scenarios):
        rows.append({"drill": result.scenario.name, "status": result.status,
                     "findings": sorted({f.kind for f in result.findings}), "reason": ""})
    if max_points != 0:
        for point in explore_command(command, inputs, "idempotent", max_points)[1:]:
            rows.append({"drill": f"kill after {point.point.label}",
                         "status": point.result.status,
                         "findings": sorted({f.kind for f in point.result.findings}),
                         "reason": f"hit {point.hit}"})
    return rows


def failing(rows) -> list[str]:
    """The drills whose status fails acceptance (unexpected, invalid, inconclusive, no rest)."""
    return [row["drill"] for row in rows if row["status"] not in PASSING]


def chart(rows, ax=None):
    """Verdicts per status as a bar chart: ``f(data, ax=None) -> ax``."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 2.5))
    statuses = sorted({row["status"] for row in rows})
    counts = [sum(row["status"] == status for row in rows) for status in statuses]
    colors = ["tab:green" if status in PASSING else "tab:red" for status in statuses]
    ax.barh(statuses, counts, color=colors)
    ax.set_xlabel("drills")
    ax.set_title("acceptance drills by verdict")
    return ax


def notebook(parameters: dict):
    """The acceptance notebook, with ``parameters`` in its papermill parameters cell."""
    import nbformat

    v4 = nbformat.v4
    params = "\n".join(f"{name} = {value!r}" for name, value in parameters.items())
    cells = [
        v4.new_markdown_cell("# Acceptance drills\n\nThe toolkit's fault drills on this "
                             "pipeline. Every drill must pass; the executed copy is the "
                             "report. Rerun with papermill to change the parameters."),
        v4.new_code_cell(params, metadata={"tags": ["parameters"]}),
        v4.new_code_cell("from toolkit.cli.acceptance import chart, failing, verdicts\n\n"
                         "rows = verdicts(command, strategy, contract, inputs, scenarios, "
                         "max_points)\n"
                         "for row in rows:\n"
                         "    print(f\"{row['drill']:60s} {row['status']:12s} "
                         "{','.join(row['findings']) or '-'} {row['reason']}\")"),
        v4.new_code_cell("ax = chart(rows)"),
        v4.new_code_cell("bad = failing(rows)\nassert not bad, f\"failing drills: {bad}\""),
    ]
    return v4.new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})


@command("acceptance", "Write an acceptance-drill notebook for your CI (pytest --nbval-lax or "
                       "papermill): it runs the drills on your pipeline and asserts them.")
def _acceptance(parser):
    parser.add_argument("action", choices=["init"], help="init: write DIR/acceptance.ipynb")
    parser.add_argument("dir", help="folder to write the notebook into (created if missing)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--command", default=None, help="an unmodified program (drill --command)")
    what.add_argument("--strategy", default=None, help="a module:Class pipeline")
    parser.add_argument("--contract", default="non-idempotent", help="the service's contract")
    parser.add_argument("--inputs", default=None, help="with --command: folder of input PDFs")
    parser.add_argument("--scenarios", default=None,
                        help="comma-separated drills or scenarios (default: all)")
    parser.add_argument("--max-points", type=int, default=None,
                        help="with --command: crash points to explore (default all; 0: none)")

    def run(args):
        if args.command is not None and args.inputs is None:
            raise ToolkitError("--command needs --inputs DIR")
        if args.strategy is not None:
            from toolkit.runner.registry import resolve_strategy

            resolve_strategy(args.strategy)
        inputs = str(Path(args.inputs).resolve()) if args.inputs else None
        scenarios = args.scenarios.split(",") if args.scenarios else None
        parameters = {"command": args.command, "strategy": args.strategy,
                      "contract": args.contract, "inputs": inputs, "scenarios": scenarios,
                      "max_points": args.max_points}
        folder = Path(args.dir)
        folder.mkdir(parents=True, exist_ok=True)
        import nbformat

        path = folder / "acceptance.ipynb"
        nbformat.write(notebook(parameters), path)
        print(f"wrote {path}: run it with pytest --nbval-lax {path} (or papermill); "
              f"parameters {json.dumps(parameters)}")
    return run
