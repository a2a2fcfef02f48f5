"""Outsider findings on the course, fixed in the package: each test names the fault the
reader met and what must hold now."""

import json
import os
import types

import pytest

from toolkit.drills import DRILLS
from toolkit.widgets.disk import Snapshot, bytes_table, power_cut
from toolkit.widgets.killnine import map_rows
from toolkit.widgets.results import crash_rows

KEY = "6f059dd795c5cccb581913b54e17304045feff83e418f26b937dea086cb0dba1"


@pytest.mark.slow
def test_power_cut_rerun_submits_count_only_the_rerun_not_the_provider_total(tmp_path):
    """Fault: a real SIGKILL after the first ``done`` commit, the ledger cut to its last
    fsync. Must hold: the table's "rerun submits" counts the rerun's own submits: with fsync
    only doc-001 is left to send (1); without fsync both documents are sent again (2); the
    provider's total (both runs) is what ``rerun["submits"]`` keeps."""
    durable, loose = (power_cut(name, tmp_path / name) for name in ("jsonl", "jsonl-no-fsync"))
    assert durable.rerun_submits == 1 and loose.rerun_submits == 2
    for cut in (durable, loose):
        assert cut.rerun["submits"] - cut.rerun_submits == 1  # the first run sent doc-000
    from toolkit.widgets.disk import power_table

    assert [row["rerun submits"] for row in power_table([durable, loose]).rows] == [1, 2]


def test_event_lines_without_sizes_keep_the_move_after_the_cut_key_and_one_ellipsis():
    """Fault: event lines were cut to the column width before keys were shortened, so a
    ``move`` line lost its states and an ``add`` line showed two ellipses. Must hold: every
    line shows seq, op, the key cut to 8 digits (one ellipsis) and the whole move; the
    caption speaks of a torn tail, never of "0 line(s)"."""
    lines = [{"seq": 1, "op": "add", "key": KEY, "from": None, "to": "pending", "at": 1.5},
             {"seq": 4, "op": "move", "key": KEY, "from": "pending", "to": "unknown", "at": 2.5}]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    table = bytes_table(Snapshot("after", data), sizes=False)
    assert [row["content"] for row in table.rows] == [
        "#1 add 6f059dd7… - -> pending", "#4 move 6f059dd7… pending -> unknown"]
    assert table.title.endswith("no torn tail") and "line(s), torn" not in table.title
    torn = bytes_table(Snapshot("torn", data + b'{"seq": 5'), sizes=False)
    assert torn.title.endswith("a torn tail (part of a line)")
    assert bytes_table(Snapshot("torn", data + b'{"seq": 5')).title.endswith("9 byte(s)")


def test_crash_map_x_labels_keep_the_whole_step_label_with_its_state_change():
    """Fault: the kill -9 map cut step labels at 34 characters, exactly where the state
    change is ("commit move doc-000 pending->unkn…"). Must hold: each tick carries the
    whole label (wrapped over lines, never cut)."""
    labels = ["commit move doc-000 pending->unknown", "submit doc-000#1 returned job-000001",
              "provider job-000002 accepted, not yet recorded",
              "artifact renamed into place: doc-000.out.pdf"]
    exploration = types.SimpleNamespace(
        steps=[{"n": n, "label": label} for n, label in enumerate(labels, 1)],
        plan=types.SimpleNamespace(strategy="safe"),
        rows=[{"point": n, "verdict": "valid", "how": "kill"} for n in range(1, 5)])
    rows = map_rows(exploration)
    for row, label in zip(rows, labels):
        assert "\u2026" not in row["point"]
        assert row["point"].replace("\n", " ") == f"{row['step']} {label}"


def test_course_map_crash_rows_include_the_safe_half_download_next_to_its_naive_twin():
    """Fault: the course map's crash map showed only the red half-download/output-exists at
    during_fetch. Must hold: the safe ``half-download`` (a cut download, no crash) has its
    own green lane at the same point."""
    def result(name, valid):
        return types.SimpleNamespace(drill=DRILLS[name], by_state={},
                                     verdict=types.SimpleNamespace(valid=valid))

    rows = crash_rows([result("half-download", True), result("half-download/output-exists",
                                                             False)])
    assert [(row["lane"], row["point"], row["verdict"]) for row in rows] == [
        ("half-download", "during_fetch", "valid"),
        ("half-download/output-exists", "during_fetch", "violation")]


def test_artifact_symlink_out_of_the_folder_is_named_relative_never_by_absolute_path(
        tmp_path):
    """Fault: an artifact path that resolves outside the artifacts folder was reported with
    the auditing machine's absolute path (a committed notebook leaked a developer's
    directory). Must hold: the finding names where it resolves relative to the folder."""
    from toolkit.forensics.checks import locate

    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "a.pdf").write_bytes(b"%PDF")
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    os.symlink("../inputs/a.pdf", artifacts / "escape.out.pdf")
    real, why = locate(str(artifacts), "escape.out.pdf")
    assert real is None and "'../inputs/a.pdf'" in why
    assert str(tmp_path) not in why.replace(repr(str(artifacts)), "")


@pytest.mark.parametrize("ledger, artifacts, says", [
    ("nope/does-not-exist.sqlite", None, "-p ledger: cannot audit 'nope/does-not-exist.sqlite'"),
    ("README.md", None, "-p ledger: cannot audit 'README.md'"),
    ("fixtures/ledgers/toolkit.jsonl", "no such dir",
     "-p artifacts 'no such dir' is not a readable directory"),
])
def test_audit_tool_with_an_unusable_parameter_stops_with_one_line_naming_the_parameter(
        ledger, artifacts, says):
    """Fault: the audit notebook run as a papermill tool on a missing ledger, a text file,
    or a folder that is not one. Must hold: one short line naming the papermill parameter
    (not the CLI flag), formats by name only, and IPython shows that line alone."""
    from toolkit.widgets.course import ParameterError, audit_tool

    with pytest.raises(ParameterError) as caught:
        audit_tool(ledger, artifacts)
    message = str(caught.value)
    assert message.startswith(says) and "\n" not in message and len(message) < 240
    assert "--artifacts" not in message and "one event object per line" not in message
    assert caught.value._render_traceback_() == [f"ParameterError: {message}"]


@pytest.mark.slow
def test_papermill_with_a_missing_ledger_reports_one_clear_line_in_the_notebook(tmp_path):
    """Fault: ``papermill ... -p ledger nope/does-not-exist.sqlite``. Must hold: the run fails
    and the notebook's error output is one line naming ``-p ledger`` and the path (it was a
    60-line traceback ending in every supported format's description)."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("papermill")
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out.ipynb"
    done = subprocess.run(
        [sys.executable, "-m", "papermill", "notebooks/11-Audit-A-Ledger.ipynb", str(out),
         "-p", "ledger", "nope/does-not-exist.sqlite", "-k", "python3", "--no-progress-bar"],
        cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    errors = [o for c in json.loads(out.read_text())["cells"] if c["cell_type"] == "code"
              for o in c["outputs"] if o["output_type"] == "error"]
    assert len(errors) == 1 and errors[0]["traceback"] == [
        "ParameterError: -p ledger: cannot audit 'nope/does-not-exist.sqlite': "
        "No such file or directory (reads: toolkit-jsonl, jsonl-state, litequeue, "
        "persist-queue, celery-db, toolkit-sqlite, sqlite-task_items, sqlite-jobs)"]
    assert done.stderr.rstrip().endswith(errors[0]["traceback"][0])


@pytest.mark.slow
def test_a_reply_slower_than_the_lost_reply_timeout_is_awaited_in_a_drill_without_that_fault(
        tmp_path):
    """Fault: a real submit reply that takes 2.5 s (a loaded machine), in an HTTP drill whose
    own fault is a cut download. Must hold: the client waits for it (no timeout, so no
    load-made lookup in the printed call log); in a lost-reply drill the same slow reply
    still really times out."""
    from toolkit.documents import make_corpus
    from toolkit.drills.service import READ_TIMEOUT, read_timeout
    from toolkit.provider.client import HttpProvider, ServiceProcess
    from toolkit.provider.service import ServiceFaults

    doc = make_corpus(tmp_path / "in", docs=1, poison=0, seed=5)[0]
    service = ServiceProcess(tmp_path / "p.db", tmp_path / "jobs", "idempotent",
                             faults=ServiceFaults(slow_submits=2, slow_seconds=READ_TIMEOUT + 0.5))
    service.start()
    clients = [HttpProvider(service.url, read_timeout=read_timeout(faults))
               for faults in (("slow_submit",), ("cut_fetch",))]
    try:
        with pytest.raises(TimeoutError):
            clients[0].submit("k-lost:1", doc, {}, task_key="k-lost")
        job = clients[1].submit("k-calm:1", doc, {}, task_key="k-calm")
        assert job.job_id
    finally:
        for client in clients:
            client.close()
        service.stop()


def _drawn(draw, *args, figsize=(8, 4)):
    """Draw on a real Agg figure, laid out as shown; return the axes and its renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize, dpi=80, layout="constrained")
    canvas = FigureCanvasAgg(figure)
    ax = draw(*args, ax=figure.add_subplot())
    canvas.draw()
    return ax, canvas.get_renderer()


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_submit_counts_long_contract_labels_side_by_side_do_not_run_into_each_other():
    """Fault: two bars labelled "contract[non-idempotent]" and its "/blind-retry" twin ran
    into each other (notebook 01). Must hold: the drawn x tick labels do not overlap, and
    the legend covers no count annotation."""
    from toolkit.viz import submit_counts

    rows = [{"label": "contract[non-idempotent]", "submit_calls": 3, "executions": 3,
             "parked": 1, "docs": 4},
            {"label": "contract[non-idempotent]/blind-retry", "submit_calls": 5,
             "executions": 5, "doubles": 1, "docs": 4}]
    ax, renderer = _drawn(submit_counts, rows, figsize=(5, 4))
    ticks = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
    assert len(ticks) == 2 and not _overlap(*ticks)
    legend = ax.get_legend().get_window_extent(renderer)
    assert not [t for t in ax.texts if _overlap(legend, t.get_window_extent(renderer))]


def test_audit_summary_with_few_items_keeps_each_panel_title_clear_of_the_tick_labels_above():
    """Fault: an audit of a 1-item foreign state file drew "0findings by kind": the panel
    above's x tick labels ran into the next panel's title. Must hold: no panel title
    overlaps any panel's tick labels."""
    from toolkit.viz import audit_summary

    summary = {"format": "jsonl-state", "items": 1, "by_state": {"done": 1},
               "anomalies": [], "plan": {"verify": 1}}
    import matplotlib.pyplot as plt

    ax = audit_summary(summary)  # at the size it picks for itself, as the notebook shows it
    try:
        ax.figure.canvas.draw()
        renderer = ax.figure.canvas.get_renderer()
        _assert_titles_clear(ax.child_axes, renderer)
    finally:
        plt.close(ax.figure)


def _assert_titles_clear(panels, renderer):
    assert len(panels) == 3
    for panel in panels:
        title = panel._left_title.get_window_extent(renderer)  # loc="left": matplotlib's own
        for other in panels:
            labels = other.get_xticklabels() + other.get_yticklabels()
            assert not [t.get_text() for t in labels if t.get_text() and
                            _overlap(title, t.get_window_extent(renderer))]
