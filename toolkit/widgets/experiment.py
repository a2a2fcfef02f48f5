"""The 30-file retry experiment: what a retry strategy costs and breaks at each transient rate.

``experiment(rates, strategies)`` runs the experiment (27 healthy files, 3
poison) at each transient rate with each strategy, seeded, and returns the
results with their harm rows (``toolkit.widgets.results.harm_rows``); the
chart is ``toolkit.viz.harm.harm_counts``.
"""

from toolkit.drills import run_drill
from toolkit.widgets.choices import retry_drill
from toolkit.widgets.results import harm_rows


def experiment(rates=(0.15, 0.6), strategies=("safe", "rewrite-state"), docs=27, poison=3,
               run=run_drill) -> tuple[list, list[dict]]:
    """The retry experiment: each strategy at each transient rate; (results, harm rows)."""
    results, labels = [], []
    for rate in rates:
        for strategy in strategies:
            results.append(run(retry_drill(rate, strategy, docs=docs, poison=poison)))
            labels.append(f"{strategy} at {rate:.0%}")
    return results, harm_rows(results, labels)
