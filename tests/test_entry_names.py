"""Input names as file systems allow them: bytes that are not UTF-8, names near NAME_MAX.

Every run is a real ``python -m toolkit`` process on a real folder: the names are
created with ``os`` calls on bytes, exactly as a user's tool would leave them.
"""

import os
import shutil

import pytest
from conftest import run_cli

from toolkit.ledger import State, open_ledger



def _args(tmp_path, out="out", ledger="l.sqlite"):
    return ["--inputs", tmp_path / "in", "--ledger", tmp_path / ledger,
            "--provider-db", tmp_path / "p.sqlite", "--out", tmp_path / out, "--no-progress"]


@pytest.fixture(scope="module")
def five_docs(tmp_path_factory):
    from toolkit.documents import make_corpus

    return make_corpus(tmp_path_factory.mktemp("five"), docs=5, poison=0, seed=5)


def _long_name(size: int, index: int) -> bytes:
    """A ``.pdf`` name of exactly ``size`` bytes with two-byte characters in it, so a cut
    by bytes can fall inside a character."""
    head = f"{index}-".encode() + "é".encode() * 40
    return head + b"x" * (size - len(head) - 4) + b".pdf"


@pytest.mark.slow
def test_non_utf8_input_name_is_recorded_escaped_and_the_batch_goes_on(tmp_path, five_docs):
    """Fault: an input named ``b'bad\\xff.pdf'`` (not UTF-8) beside ``ok.pdf``. Property:
    no traceback; both are recorded (the odd name escaped, readable), both are done, the
    run exits 0; a rerun reuses both."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copyfile(five_docs[0], folder / "ok.pdf")
    shutil.copyfile(five_docs[1], os.path.join(os.fsencode(folder), b"bad\xff.pdf"))
    first = run_cli("run", *_args(tmp_path))
    assert first.returncode == 0, first.stderr
    assert "Traceback" not in first.stderr
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        items = {item.source: item for item in ledger.items()}
    assert set(items) == {"ok.pdf", "bad\\xff.pdf"}
    assert {item.state for item in items.values()} == {State.DONE}
    assert (tmp_path / "out" / items["bad\\xff.pdf"].artifact_path).is_file()
    again = run_cli("run", *_args(tmp_path))
    assert again.returncode == 0, again.stderr


@pytest.mark.slow
@pytest.mark.parametrize("paged", [False, True], ids=["whole", "page-by-page"])
def test_input_names_near_name_max_get_outputs_that_fit_and_another_out_copies_them(
        tmp_path, five_docs, paged):
    """Fault: input names of 230, 236, 240, 250 and 255 bytes (the longest a name can
    be), whole and page by page. Property: no "File name too long": every item is
    ``done`` in one run (exit 0), every output name fits in 255 bytes and keeps the key
    suffix; a rerun with another ``--out`` copies every artifact there (exit 0)."""
    folder = tmp_path / "in"
    folder.mkdir()
    sizes = (230, 236, 240, 250, 255)
    for index, (size, doc) in enumerate(zip(sizes, five_docs)):
        shutil.copyfile(doc, os.path.join(os.fsencode(folder), _long_name(size, index)))
    extra = ["--page-by-page-from", "1"] if paged else []
    first = run_cli("run", *_args(tmp_path), *extra)
    assert first.returncode == 0, first.stderr
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        items = ledger.items()
    assert len(items) == 5 and {item.state for item in items} == {State.DONE}
    for item in items:
        name = os.path.basename(item.artifact_path)
        assert len(name.encode()) <= 255 and name.endswith(f".{item.key[:8]}.pdf")
        assert (tmp_path / "out" / item.artifact_path).is_file()
    other = run_cli("run", *_args(tmp_path, out="o2"), *extra)
    assert other.returncode == 0, other.stderr
    for item in items:
        assert (tmp_path / "o2" / item.artifact_path).read_bytes() == \
            (tmp_path / "out" / item.artifact_path).read_bytes()


@pytest.mark.slow
def test_directory_in_the_way_in_another_out_stops_only_its_item_and_is_named(
        tmp_path, five_docs):
    """Fault: a rerun with another ``--out`` finds a directory where one artifact's copy
    goes. Property: only that item is left without its copy (one line naming the place,
    exit 1 "run again"); every other artifact is copied; nothing in the ledger changes;
    once the directory is gone, the same command copies it and exits 0."""
    folder = tmp_path / "in"
    folder.mkdir()
    for doc in five_docs[:3]:
        shutil.copyfile(doc, folder / doc.name)
    assert run_cli("run", *_args(tmp_path)).returncode == 0
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        before = {item.key: item for item in ledger.items()}
    first = sorted(item.artifact_path for item in before.values())[0]
    (tmp_path / "o2" / first).mkdir(parents=True)
    blocked = run_cli("run", *_args(tmp_path, out="o2"))
    assert blocked.returncode == 1 and "Traceback" not in blocked.stderr
    assert f"cannot write {tmp_path / 'o2' / first}" in blocked.stderr
    for item in before.values():
        if item.artifact_path != first:
            assert (tmp_path / "o2" / item.artifact_path).is_file()
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        assert {item.key: item for item in ledger.items()} == before
    (tmp_path / "o2" / first).rmdir()
    assert run_cli("run", *_args(tmp_path, out="o2")).returncode == 0
    assert (tmp_path / "o2" / first).is_file()


@pytest.mark.slow
def test_items_left_behind_by_changed_inputs_are_reported_and_the_run_never_claims_rest(
        tmp_path, five_docs):
    """Fault: a run leaves its items ``failed(transient)`` (the provider refuses every
    submit), then every input is changed (bytes appended) and the batch is rerun. Property:
    the new items are done, but the run does not exit 0 ("at rest"): it names the older
    items not at rest whose content is gone from the inputs and exits 1; once an operator
    cancels them (``toolkit cancel``), the same run exits 0."""
    folder = tmp_path / "in"
    folder.mkdir()
    for doc in five_docs[:2]:
        shutil.copyfile(doc, folder / doc.name)
    refused = run_cli("run", *_args(tmp_path), "--transient-rate", "1")
    assert refused.returncode == 1
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        old = [item.key for item in ledger.items()]
    assert len(old) == 2
    for doc in five_docs[:2]:
        with open(folder / doc.name, "ab") as handle:
            handle.write(b"\n% appended\n")
    again = run_cli("run", *_args(tmp_path))
    assert again.returncode == 1, again.stderr
    assert "2 item(s) not at rest whose content is no longer among the inputs" in again.stderr
    assert all(key[:12] in again.stderr for key in old)
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        states = {item.key: item.state for item in ledger.items()}
    assert [states[key] for key in old] == [State.FAILED, State.FAILED]
    assert sorted(state.value for key, state in states.items() if key not in old) == \
        ["done", "done"]
    for key in old:
        assert run_cli("cancel", "--ledger", tmp_path / "l.sqlite", "--key", key,
                       "--provider-db", tmp_path / "p.sqlite").returncode == 0
    assert run_cli("run", *_args(tmp_path)).returncode == 0


@pytest.mark.slow
def test_two_input_names_with_the_same_content_are_one_item_and_the_alias_is_reported(
        tmp_path, five_docs):
    """Fault: ``a.pdf`` and ``copy-of-a.pdf`` hold the same bytes. Property: one item (one
    execution, never two), and the second name is not silently dropped: stderr says it
    is the same content as the first; the run is at rest (exit 0)."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copyfile(five_docs[0], folder / "a.pdf")
    shutil.copyfile(five_docs[0], folder / "copy-of-a.pdf")
    done = run_cli("run", *_args(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "copy-of-a.pdf: same content as a.pdf" in done.stderr
    with open_ledger(tmp_path / "l.sqlite") as ledger:
        assert [item.source for item in ledger.items()] == ["a.pdf"]


def test_a_newline_in_an_input_name_stays_on_its_one_line_in_run_messages(tmp_path, five_docs):
    """Fault (outsider o41 F4): input names holding a newline (``a<LF>b.pdf`` with the same
    bytes as ``x.pdf``; then ``new<LF>line.pdf`` left behind as a stray after its content
    changed). Property: the alias line and the stray list name each file on one line, the
    newline shown ``\\n`` as ``ledger`` shows it; before, one message ran over three lines
    and read as two about a file ``b.pdf``."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copyfile(five_docs[0], folder / "a\nb.pdf")
    shutil.copyfile(five_docs[0], folder / "x.pdf")
    shutil.copyfile(five_docs[1], folder / "new\nline.pdf")
    stopped = run_cli("run", *_args(tmp_path), "--transient-rate", "1")  # none at rest
    aliased = [line for line in stopped.stderr.splitlines() if "same content as" in line]
    assert aliased == ["x.pdf: same content as a\\nb.pdf: one item, recorded under a\\nb.pdf"], \
        stopped.stderr
    with open(folder / "new\nline.pdf", "ab") as handle:
        handle.write(b"\n% appended\n")
    again = run_cli("run", *_args(tmp_path))
    strays = [line for line in again.stderr.splitlines() if "no longer among the inputs" in line]
    assert len(strays) == 1 and "new\\nline.pdf, " in strays[0], again.stderr
