"""Snapshot mode's caches answer what the real calls answer.

Each shortcut of ``toolkit.explore.memo`` is checked against the computation
it replaces, on real PDFs written by ``make_corpus``, in real forked children
(the memo is installed only there): the provider's whole-document check is
answered from the inputs' checks, the results filed while the recording runs
are the bytes the provider renders, and a filed result is read once per
process. ``child.fork_meanwhile`` is checked with a real child and a real
SIGKILL. No timer.
"""

import os
import shutil

import pytest

from toolkit import documents
from toolkit.documents import make_corpus
from toolkit.documents.preflight import Preflight
from toolkit.explore.child import fork, fork_meanwhile
from toolkit.explore.memo import _digest, input_checks, install, prefile, work_entry


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("in"), docs=3, poison=0, seed=0)


def test_provider_check_with_page_none_is_answered_from_the_inputs_checks(tmp_path, inputs):
    """The provider's ``process`` asks ``preflight(upload, None)``: the whole document, the
    question the client asks with ``preflight(path)``. Both are answered from the table (a
    marked verdict proves it); a one-page check is still made for real."""
    upload = tmp_path / "upload.pdf"
    shutil.copyfile(inputs[0], upload)  # another name, the same bytes (the provider's copy)
    marked = Preflight(False, "from the table", 99)
    memo = (tmp_path / "work", {_digest(upload.read_bytes()): marked})

    def body(fd):
        install(memo)
        return {"none": documents.preflight(upload, None).reason,
                "keyword": documents.preflight(upload, page=None).reason,
                "whole": documents.preflight(upload).reason,
                "page": documents.preflight(upload, 1).ok}

    messages, status = fork(body)
    assert status == 0
    end = next(m for m in messages if m["t"] == "end")
    assert (end["none"], end["keyword"], end["whole"]) == ("from the table",) * 3
    assert end["page"] is True  # page 1, really read: a healthy page


def test_results_filed_while_recording_are_the_bytes_the_provider_renders(tmp_path, inputs):
    """``prefile`` renders every input but the first (the recording's), into entries whose
    bytes equal a real ``documents.process`` of the same input; a rerun files nothing new."""
    cache = tmp_path / "work"
    table = input_checks(inputs)
    prefile(cache, inputs, table)
    entries = {path: work_entry(cache, path.read_bytes(), {}) for path in inputs}
    assert not entries[inputs[0]].exists()
    assert sorted(p.name for p in cache.iterdir()) == sorted(entries[p].name for p in inputs[1:])
    for path in inputs[1:]:
        real = documents.process(path, tmp_path / f"{path.stem}.out.pdf", {})
        assert entries[path].read_bytes() == (tmp_path / f"{path.stem}.out.pdf").read_bytes()
        assert real.size == entries[path].stat().st_size
    stamps = {p: p.stat().st_mtime_ns for p in cache.iterdir()}
    prefile(cache, inputs, table)  # filed already: left as they are
    assert {p: p.stat().st_mtime_ns for p in cache.iterdir()} == stamps


def test_prefiled_result_is_served_to_the_provider_as_its_own_rendering(tmp_path, inputs):
    """The memo's ``process`` finds a prefiled entry: the same artifact (size, SHA-256) and
    the same output bytes as rendering it."""
    cache = tmp_path / "work"
    prefile(cache, inputs, input_checks(inputs))
    real = documents.process(inputs[1], tmp_path / "real.pdf", {})

    def body(fd):
        install((cache, {}))
        served = documents.process(inputs[1], tmp_path / "served.pdf", {})
        return {"size": served.size, "sha256": served.sha256}

    messages, status = fork(body)
    assert status == 0
    end = next(m for m in messages if m["t"] == "end")
    assert (end["size"], end["sha256"]) == (real.size, real.sha256)
    assert (tmp_path / "served.pdf").read_bytes() == (tmp_path / "real.pdf").read_bytes()


def test_filed_result_replaced_on_disk_is_read_once_per_process(tmp_path, inputs):
    """A supervisor serves a filed result from memory after its first read: an entry
    changed on disk afterwards (entries never change) is not read again."""
    cache = tmp_path / "work"
    prefile(cache, inputs, input_checks(inputs))
    entry = work_entry(cache, inputs[1].read_bytes(), {})
    filed = entry.read_bytes()

    def body(fd):
        install((cache, {}))
        first = documents.process(inputs[1], tmp_path / "first.pdf", {})
        entry.write_bytes(b"%PDF-changed")
        second = documents.process(inputs[1], tmp_path / "second.pdf", {})
        return {"same": (first.size, first.sha256) == (second.size, second.sha256)}

    messages, status = fork(body)
    assert status == 0
    assert next(m for m in messages if m["t"] == "end")["same"] is True
    assert (tmp_path / "second.pdf").read_bytes() == filed


def test_parent_work_raising_while_the_child_runs_kills_and_reaps_the_child(tmp_path):
    """``fork_meanwhile``: the parent's work raises while the child blocks forever; the
    child is SIGKILLed and reaped (no process, no zombie) before the exception arrives."""
    pid_file = tmp_path / "pid"
    read_end, write_end = os.pipe()

    def body(fd):
        pid_file.write_text(str(os.getpid()))
        os.read(read_end, 1)  # never written: blocks until killed
        return {}

    def meanwhile():
        while not pid_file.exists() or not pid_file.read_text():
            os.sched_yield()
        raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            fork_meanwhile(meanwhile, body)
    finally:
        os.close(read_end)
        os.close(write_end)
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_parent_work_done_while_the_child_runs_keeps_the_child_messages():
    """``fork_meanwhile`` returns the child's messages and status, as ``fork`` does."""
    seen = []
    messages, status = fork_meanwhile(lambda: seen.append("parent"), lambda fd, n: {"n": n}, 7)
    assert status == 0 and seen == ["parent"]
    assert [m["n"] for m in messages if m["t"] == "end"] == [7]


def test_sigkilled_runs_leave_their_input_copies_inside_the_exploration_folder(monkeypatch,
                                                                               tmp_path):
    """Real mode SIGKILLs runs after they copied their inputs: those copies are in the
    exploration's own ``tmp`` folder (RAM, removed with it), never in the system's temporary
    folder, and nothing is left anywhere once explore returns."""
    import glob
    import tempfile

    from toolkit.explore import Plan, explore

    system = tmp_path / "system"
    system.mkdir()
    monkeypatch.setenv("TMPDIR", str(system))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    seen = {"system": set(), "inside": set()}

    def progress(done, total):
        seen["system"] |= set(glob.glob(str(system / "toolkit-inputs-*")))
        seen["inside"] |= set(glob.glob(str(system / "explore-*" / "tmp" / "toolkit-inputs-*")))

    result = explore(Plan(docs=1, every=3), progress=progress)
    assert result.mode == "real" and result.total()["recovered"] == len(result.rows)
    assert seen["inside"] and not seen["system"]
    assert os.listdir(system) == []
