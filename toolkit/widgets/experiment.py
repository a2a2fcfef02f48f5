"""The harm of a drill, counted: what a run cost and what it broke, not only its submits.

``harm_row(result)`` reads a ``DrillResult`` and counts, from the checker's
findings and the provider's executions, each kind of harm a batch can do:

- ``doubles``: executions beyond one success per task (paid twice);
- ``poison_sent``: poison inputs that reached the provider (``poison_submitted``);
- ``lost``: inputs that never reached the ledger (``lost_item``);
- ``fake_done``: ``done`` items whose artifact is not the verified one;
- ``parked_paid``: items parked for a person although their job succeeded
  (the costly ``parked_after_success``);
- ``blind``: items submitted again without learning what the last submit did
  (``blind_resubmit``): the risk, even where this provider did not bill it.

``experiment(rates, strategies)`` runs the 30-file retry experiment (27
healthy files, 3 poison) at each transient rate with each strategy, seeded.
The chart is ``toolkit.viz.harm.harm_bars``.
"""

from toolkit.drills import run_drill
from toolkit.widgets.choices import retry_drill
from toolkit.widgets.results import doubles, verdict
from toolkit.widgets.tables import Table

# Harm kinds, in the order the chart draws them; each counts the checker's findings of a kind.
FINDINGS = {"poison_sent": "poison_submitted", "lost": "lost_item", "fake_done": "fake_done",
            "blind": "blind_resubmit"}
HARMS = ("doubles", "poison_sent", "lost", "fake_done", "parked_paid", "blind")


def harm_row(result, label=None) -> dict:
    """Counts per harm kind for one drill result (0 where the checker found nothing)."""
    anomalies, costly = result.verdict.anomalies, result.verdict.costly or {}
    row = {"label": label or result.drill.name, "docs": result.drill.docs,
           "poison": result.drill.poison, "submit_calls": result.submit_calls,
           "executions": result.executions,
           "doubles": doubles(result.history.executions or ())}
    for harm, kind in FINDINGS.items():
        row[harm] = len({a.key for a in anomalies.get(kind, ())})
    row["parked_paid"] = len({a.key for a in costly.get("parked_after_success", ())})
    row["verdict"] = verdict(result)
    return row


def harm_rows(results, labels=None) -> list[dict]:
    labels = labels or [None] * len(results)
    return [harm_row(result, label) for result, label in zip(results, labels)]


def harm_table(rows) -> Table:
    """The harm rows as a table: calls, executions, then one column per harm kind."""
    columns = ["label", "submit_calls", "executions", *HARMS, "verdict"]
    return Table(rows, columns, marked=[i for i, row in enumerate(rows)
                                        if any(row[h] for h in HARMS)])


def experiment(rates=(0.15, 0.6), strategies=("safe", "rewrite-state"), docs=27, poison=3,
               run=run_drill) -> tuple[list, list[dict]]:
    """The retry experiment: each strategy at each transient rate; (results, harm rows)."""
    results, labels = [], []
    for rate in rates:
        for strategy in strategies:
            results.append(run(retry_drill(rate, strategy, docs=docs, poison=poison)))
            labels.append(f"{strategy} at {rate:.0%}")
    return results, harm_rows(results, labels)
