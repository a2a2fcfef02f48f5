"""Damaged content streams: MuPDF reads around them and only warns; preflight must listen."""

import random
from collections import Counter

import pytest

from toolkit.documents import make_corpus, page_texts, pdf_bytes, preflight, process
from toolkit.documents.corpus import damage_stream, streams
from toolkit.errors import PermanentError

SCRIPTS = ["Invoice INV-00231 Ωμέγα Жук “quoted” – 12.50 €", "Total ∑ 3 ≤ 4 — 中文字 مرحبا"]


def _documents(tmp_path):
    """Three corpus documents (helv) and one multi-script document (embedded Noto subsets)."""
    paths = make_corpus(tmp_path / "in", docs=3, poison=0, seed=11)
    scripts = tmp_path / "in" / "scripts.pdf"
    scripts.write_bytes(pdf_bytes(SCRIPTS))
    return [*paths, scripts]


def test_damaged_stream_from_the_corpus_is_quarantined_with_the_page_and_mupdfs_warning(tmp_path):
    """8 overwritten bytes in a compressed stream: MuPDF opens the file and repairs nothing,
    but warns while reading the page; preflight names the page and the warning."""
    path = make_corpus(tmp_path, docs=0, poison=2, seed=0)[1]
    verdict = preflight(path)
    assert not verdict.ok and verdict.reason.startswith("damaged: page 1: ") and "zlib" in verdict.reason
    with pytest.raises(PermanentError, match="poison input: damaged: page 1"):
        process(path, tmp_path / "out.pdf", {})
    assert not (tmp_path / "out.pdf").exists()


def test_byte_sweep_over_streams_never_ends_done_with_lost_text(tmp_path):
    """Seeded 8-byte overwrites at 64 offsets inside the streams of 4 documents (content
    and embedded font streams): every variant is either refused by preflight as damaged,
    or processed into an output carrying exactly the undamaged document's text.
    The undamaged documents themselves all pass."""
    rng, outcomes = random.Random(19), {"damaged": 0, "same text": 0}
    for number, path in enumerate(_documents(tmp_path)):
        assert preflight(path).ok, path.name  # 0 of the undamaged quarantined
        good = tmp_path / f"good-{number}.pdf"
        process(path, good, {"target": "de"})
        expected = page_texts(good)
        data = path.read_bytes()
        assert len(streams(data)) >= 1
        for variant in range(16):
            broken = tmp_path / f"broken-{number}-{variant}.pdf"
            broken.write_bytes(damage_stream(data, rng))
            verdict = preflight(broken)
            if not verdict.ok:
                assert verdict.reason.startswith("damaged: page "), verdict.reason
                outcomes["damaged"] += 1
                continue
            out = tmp_path / f"out-{number}-{variant}.pdf"
            process(broken, out, {"target": "de"})
            assert page_texts(out) == expected, (broken.name, verdict)
            outcomes["same text"] += 1
    assert sum(outcomes.values()) == 64 and outcomes["damaged"] > 0


def test_byte_sweep_anywhere_in_the_file_never_ends_done_with_lost_text(tmp_path):
    """Seeded 8-byte overwrites at 64 offsets anywhere in the same 4 documents: in the xref,
    the page tree, a page dictionary, a resource dictionary (damage MuPDF often does not
    warn about: an overwritten page object or /Contents key reads as an empty page).
    Every variant is refused by preflight, or its output has exactly the undamaged text."""
    rng, refused, same = random.Random(23), Counter(), 0
    for number, path in enumerate(_documents(tmp_path)):
        good = tmp_path / f"good-{number}.pdf"
        process(path, good, {"target": "de"})
        expected, data = page_texts(good), path.read_bytes()
        for variant in range(16):
            offset = rng.randrange(len(data) - 8)
            broken = tmp_path / f"broken-{number}-{variant}.pdf"
            broken.write_bytes(data[:offset] + rng.randbytes(8) + data[offset + 8:])
            verdict = preflight(broken)
            if not verdict.ok:
                refused[verdict.reason.split(":")[0]] += 1
                continue
            out = tmp_path / f"out-{number}-{variant}.pdf"
            process(broken, out, {"target": "de"})
            assert page_texts(out) == expected, (broken.name, offset)
            same += 1
    assert sum(refused.values()) + same == 64 and refused["damaged"] > 0 and same > 0


def test_damaged_file_checked_in_another_thread_never_marks_a_healthy_one_damaged(tmp_path):
    """MuPDF's warning buffer is one per process: while one thread (a second worker, the
    in-process provider) reads a damaged file, a preflight of a healthy file in another
    thread must not pick up its warnings. Before the MuPDF lock, two workers quarantined
    a healthy corpus document as 'damaged: ... cannot find startxref'."""
    import threading

    from toolkit.documents import make_corpus, preflight

    make_corpus(tmp_path, docs=3, poison=4, seed=1)
    damaged = [p for p in sorted(tmp_path.glob("poison-*.pdf"))  # those MuPDF opens and warns on
               if preflight(p).reason.startswith(("damaged", "repaired"))]
    healthy = sorted(tmp_path.glob("doc-*.pdf"))
    assert len(damaged) == 2 and all(preflight(p).ok for p in healthy)
    stop, verdicts = threading.Event(), []

    def read_damaged():
        while not stop.is_set():
            for path in damaged:
                preflight(path)

    noisy = threading.Thread(target=read_damaged)
    noisy.start()
    try:
        for _ in range(40):
            verdicts.extend(preflight(path) for path in healthy)
    finally:
        stop.set()
        noisy.join()
    assert [v.reason for v in verdicts if not v.ok] == []
