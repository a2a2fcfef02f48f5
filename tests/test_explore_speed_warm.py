"""Snapshot mode checks each input once in the exploring process, not twice.

``_warm`` loaded PyMuPDF by checking the first input, and snapshot mode then
checked every input again (``memo.input_checks``, before any fork): the first
one twice, ~8 ms of CPU per exploration. Snapshot mode now leaves the loading to
``input_checks``; the real mode, which has no such table, still warms. What must
hold: every input is checked (the table is whole: the children answer from it),
the first one once (the later ones are rendered here too, which checks them again), and the rows are those of the real mode (the comparison of
the two modes in ``test_explore_snapshot`` covers every point). No timer: the
calls are counted.
"""

from toolkit import documents
from toolkit.explore import Plan, explore


def test_snapshot_mode_checks_each_input_once_in_the_exploring_process(monkeypatch):
    checked = []
    real = documents.preflight

    def counted(path, page=None):
        checked.append((str(path), page))
        return real(path, page)
    monkeypatch.setattr(documents, "preflight", counted)
    result = explore(Plan(docs=2, mode="snapshot", jobs=1))
    assert result.mode == "snapshot"
    whole = [path for path, page in checked if page is None]
    assert len(set(whole)) == 2  # every input checked (the table is whole)
    # the first input once (the later ones are also rendered here while the recording
    # runs, ``memo.prefile``: the provider's work checks its upload, as it must)
    assert sum(path.endswith("doc-000.pdf") for path in whole) == 1
    assert result.total()["recovered"] == len(result.rows)


def test_real_mode_still_warms_with_a_check_of_the_first_input(monkeypatch):
    """The real mode forks its children from a parent that has loaded PyMuPDF."""
    checked = []
    real = documents.preflight

    def counted(path, page=None):
        checked.append(str(path))
        return real(path, page)
    monkeypatch.setattr(documents, "preflight", counted)
    explore(Plan(docs=1, mode="real", jobs=1, every=8))
    assert len(checked) == 1 and checked[0].endswith(".pdf")
