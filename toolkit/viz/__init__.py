"""Charts of histories, drill counts, crash sweeps and audits (matplotlib).

Every chart is ``f(data, ax=None, ...) -> ax``: it takes plain results (an
event list or a ``History``, rows of dicts, ``Report.to_json()``), draws on
``ax`` (a new pyplot figure when None) and returns the axes. Nothing here
runs a drill or reads a ledger; ``toolkit.widgets`` turns drill results into
the rows these charts take.

matplotlib is imported inside the functions, never at import time, so
``import toolkit.viz`` stays cheap (checked by tests/test_viz_widgets.py).
"""

from toolkit.viz.charts import audit_summary, crash_map, submit_counts, timeline
from toolkit.viz.graph import POSITIONS, state_graph, transition_counts
from toolkit.viz.harm import HARMS, harm_counts, page_progress
from toolkit.viz.style import STATE_COLOURS, VERDICT_COLOURS, to_png

__all__ = ["state_graph", "transition_counts", "submit_counts", "timeline", "crash_map",
           "audit_summary", "harm_counts", "page_progress", "HARMS", "to_png", "POSITIONS",
           "STATE_COLOURS", "VERDICT_COLOURS"]
