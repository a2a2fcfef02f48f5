"""Widgets and tables for the notebooks: thin views over pure step functions.

- ``Stepper(result)``: Play / slider / Prev / Next through a drill, showing
  the event, the counters, the client ledger, the provider's jobs, the graph;
- ``Comparer``: one fault, several strategies, counts and verdicts;
- ``ContractExplorer``: the provider's promise as knobs;
- ``RetryExperiment``: the 30-document experiment with a failure-rate slider;
- ``AuditExplorer(report)``: an audit's findings filtered by kind;
- ``KillNine``: a batch killed with SIGKILL at every durable step (``explore``),
  its crash map, one crash point replayed step by step.

The logic lives in plain functions a test drives without a browser
(``scenario.step``/``frame``, ``choices.*_step``); tables (``Table``) print
as text and render as HTML; ``results`` turns drill results into chart rows.
"""

from toolkit.widgets.choices import (
    SCENARIOS,
    AuditView,
    Comparison,
    ContractChoice,
    RetryChoice,
    audit_step,
    audit_view,
    compare_step,
    comparison,
    contract_step,
    findings_table,
    outcome_table,
    promise,
    retry_drill,
    retry_step,
    scenario_drill,
    todo_table,
)
from toolkit.widgets.panels import (AuditExplorer, Comparer, ContractExplorer, KillNine,
                                    RetryExperiment)
from toolkit.widgets.results import (
    CHECKLIST,
    catalogue_table,
    checklist,
    count_rows,
    crash_rows,
    doubles,
    explain_table,
    harm_row,
    harm_rows,
    harm_table,
    items_table,
    run_marks,
    verdict_table,
)
from toolkit.widgets.moments import moments
from toolkit.widgets.scenario import (Cursor, describe, frame, frames, jobs_table, ledger_table,
                                      step)
from toolkit.widgets.stepper import Stepper
from toolkit.widgets.tables import Table

__all__ = [
    "Stepper", "Comparer", "ContractExplorer", "RetryExperiment", "AuditExplorer", "KillNine",
    "Table",
    "Cursor", "step", "frame", "frames", "moments", "describe", "ledger_table", "jobs_table",
    "SCENARIOS", "Comparison", "comparison", "compare_step", "scenario_drill",
    "ContractChoice", "contract_step", "promise", "RetryChoice", "retry_drill", "retry_step",
    "AuditView", "audit_view", "audit_step", "findings_table", "todo_table", "outcome_table",
    "CHECKLIST", "catalogue_table", "checklist", "count_rows", "crash_rows", "doubles",
    "explain_table", "items_table", "verdict_table", "harm_row", "harm_rows", "harm_table",
    "run_marks",
]
