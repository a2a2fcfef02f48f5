"""Poison preflight, the protected-token check, byte-identical output and corpus."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit import documents
from toolkit.documents import (POISON_KINDS, artifact_of, make_corpus, page_texts, pdf_bytes,
                               preflight, process, protected_tokens, render, translate, verify)
from toolkit.errors import PermanentError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "corpus"
TEXTS = ["Invoice INV-00231  page 1 of 2\nCustomer: Acme GmbH\n"
         "Item 1: model XR-2040 pump housing, quantity 3, unit price 1,234.50 EUR",
         "Total amount due: 3,703.50 EUR\nDate: 2024-03-15"]
# Preflight reason kind expected for each poison kind the corpus makes.
EXPECTED_REASON = {"truncated": "truncated", "damaged": "damaged",
                   "not-pdf": "not-pdf", "spliced": "repaired"}


def _digests(paths):
    return {Path(p).name: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}


def _minimal_pdf(objects):
    """A hand-built PDF with a correct xref, so MuPDF needs no repair."""
    out, offsets = bytearray(b"%PDF-1.7\n"), []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<</Size %d/Root 1 0 R>>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


@pytest.fixture
def healthy(tmp_path):
    path = tmp_path / "healthy.pdf"
    path.write_bytes(pdf_bytes(TEXTS))
    return path


def test_healthy_pdf_passes_preflight_with_its_page_count(healthy):
    assert preflight(healthy) == documents.Preflight(True, None, 2, ("text", "text"))


def test_truncated_pdf_is_caught_by_preflight_although_mupdf_repairs_it(healthy, tmp_path):
    """Cut in half, the file still opens in MuPDF (silently repaired) with pages; preflight says no."""
    import pymupdf

    data = healthy.read_bytes()
    cut = tmp_path / "cut.pdf"
    cut.write_bytes(data[: len(data) // 2])
    with pymupdf.open(cut) as doc:  # the trap: no exception, a plausible page count
        assert doc.page_count >= 1 and doc.is_repaired
    verdict = preflight(cut)
    assert not verdict.ok and verdict.reason.startswith("truncated:")


def test_spliced_pdf_with_intact_tail_is_caught_because_mupdf_had_to_repair_it(healthy, tmp_path):
    """The middle third is gone but %%EOF/startxref survive: only MuPDF's repair flag tells."""
    data = healthy.read_bytes()
    third = len(data) // 3
    spliced = tmp_path / "spliced.pdf"
    spliced.write_bytes(data[:third] + data[2 * third:])
    assert b"%%EOF" in spliced.read_bytes()[-64:]
    verdict = preflight(spliced)
    assert not verdict.ok and verdict.reason.startswith("repaired:")


@pytest.mark.parametrize("content, kind", [
    (b"", "empty"),
    (b"<html>502 Bad Gateway</html>", "not-pdf"),
    (_minimal_pdf([b"<</Type/Catalog/Pages 2 0 R>>", b"<</Type/Pages/Count 0/Kids[]>>"]), "zero-pages"),
])
def test_bad_files_are_reported_by_kind_never_raised(tmp_path, content, kind):
    path = tmp_path / "bad.pdf"
    path.write_bytes(content)
    verdict = preflight(path)
    assert (verdict.ok, verdict.reason.split(":")[0]) == (False, kind)


def test_missing_file_is_reported_not_raised(tmp_path):
    assert preflight(tmp_path / "nope.pdf").reason.startswith("missing:")


def test_password_protected_pdf_is_poison(tmp_path):
    import pymupdf

    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "secret XR-2040")
    path = tmp_path / "locked.pdf"
    doc.save(path, encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="user", owner_pw="owner")
    doc.close()
    assert preflight(path).reason.startswith("encrypted:")


def test_every_poison_kind_the_corpus_makes_is_caught_and_every_healthy_file_passes(tmp_path):
    paths = make_corpus(tmp_path, docs=8, poison=2 * len(POISON_KINDS), seed=3)
    healthy = [p for p in paths if p.name.startswith("doc-")]
    poison = [p for p in paths if p.name.startswith("poison-")]
    assert [preflight(p).ok for p in healthy] == [True] * 8
    for index, path in enumerate(poison):
        expected = EXPECTED_REASON[POISON_KINDS[index % len(POISON_KINDS)]]
        assert preflight(path).reason.split(":")[0] == expected, path.name


_word = st.sampled_from(["invoice", "Total", "model", "pump", "due", "Delivery", "ACME", "days"])
_code = st.from_regex(r"[A-Z]{1,4}-[0-9]{2,5}", fullmatch=True)
_number = st.from_regex(r"[0-9]{1,4}([.,][0-9]{2})?", fullmatch=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(_word, _code, _number), min_size=1, max_size=25),
       st.sampled_from(["de", "fr"]))
def test_translation_keeps_every_model_code_and_number(tokens, target):
    text = " ".join(tokens)
    assert protected_tokens(translate(text, {"target": target})) == protected_tokens(text)


def test_translation_uses_the_glossary_and_marks_unknown_words():
    assert translate("Invoice total for ACME pumps", {"target": "de"}) == "Rechnung Summe für ACME PUMPS"


def test_lossy_translation_that_drops_model_codes_fails_permanently_and_writes_nothing(healthy, tmp_path):
    """The drop_codes hook loses XR-2040 and INV-00231: that must be failed, not done."""
    out = tmp_path / "out.pdf"
    out.write_bytes(b"previous deliverable")
    with pytest.raises(PermanentError, match="INV-00231 x1, XR-2040 x1"):
        process(healthy, out, {"target": "de", "drop_codes": True})
    assert out.read_bytes() == b"previous deliverable"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["healthy.pdf", "out.pdf"]  # no temp left


def test_unsupported_target_language_is_a_permanent_error(healthy, tmp_path):
    with pytest.raises(PermanentError, match="unsupported target"):
        process(healthy, tmp_path / "out.pdf", {"target": "xx"})


def test_poison_input_is_a_permanent_error_carrying_the_preflight_reason(tmp_path):
    bad = tmp_path / "bad.pdf"
    bad.write_bytes(b"%PDF-1.7\n garbage")
    with pytest.raises(PermanentError, match="poison input: truncated"):
        process(bad, tmp_path / "out.pdf", {})
    assert not (tmp_path / "out.pdf").exists()


def test_process_writes_a_verified_translated_artifact(healthy, tmp_path):
    out = tmp_path / "out" / "result.pdf"
    artifact = process(healthy, out, {"target": "de"})
    assert artifact == artifact_of(out) and verify(out, artifact.size, artifact.sha256)
    text = "\n".join(page_texts(out))
    assert "Rechnung INV-00231" in text and "XR-2040" in text and "1,234.50" in text


def test_render_is_byte_identical_for_the_same_texts_and_differs_for_others(tmp_path):
    first = render(TEXTS, tmp_path / "a.pdf")
    second = render(TEXTS, tmp_path / "b.pdf")
    other = render(TEXTS[:1], tmp_path / "c.pdf")
    assert first.sha256 == second.sha256 and first.sha256 != other.sha256
    assert b"/ID" not in (tmp_path / "a.pdf").read_bytes()


def test_long_lines_wrap_without_splitting_a_model_code(tmp_path):
    texts = ["word " * 17 + "XR-2040-B7 " + "filler " * 800]
    render(texts, tmp_path / "long.pdf")
    pages = page_texts(tmp_path / "long.pdf")
    assert len(pages) == 1 and "XR-2040-B7" in pages[0]  # one output page per input page


def test_verify_rejects_missing_wrong_size_and_one_flipped_byte(healthy, tmp_path):
    art = artifact_of(healthy)
    assert verify(healthy, art.size, art.sha256)
    assert not verify(tmp_path / "missing.pdf", art.size, art.sha256)
    assert not verify(healthy, art.size + 1, art.sha256)
    data = bytearray(healthy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    healthy.write_bytes(bytes(data))
    assert not verify(healthy, art.size, art.sha256)


def test_corpus_is_byte_identical_across_two_runs_into_two_folders(tmp_path):
    first = make_corpus(tmp_path / "one", docs=30, poison=3, seed=0)
    second = make_corpus(tmp_path / "two", docs=30, poison=3, seed=0)
    assert len(first) == 33 and _digests(first) == _digests(second)
    assert _digests(make_corpus(tmp_path / "three", docs=30, poison=3, seed=1)) != _digests(first)


def test_corpus_documents_vary_in_length_and_carry_codes_and_numbers(tmp_path):
    paths = make_corpus(tmp_path, docs=30, poison=0, seed=0)
    assert {preflight(p).pages for p in paths} == {1, 2, 3, 4}
    for path in paths:
        tokens = protected_tokens("\n".join(page_texts(path)))
        assert any("-" in t and t[0].isalpha() for t in tokens), path.name
        assert any(t[0].isdigit() for t in tokens), path.name


def test_committed_fixture_corpus_is_what_the_fixture_command_regenerates(tmp_path):
    """fixtures/corpus = make_corpus(docs=6, poison=2, seed=0, scans=1, mixed=1, scripts=1);
    a PyMuPDF (or Pillow/libtiff, for the G4 scans) upgrade may change bytes."""
    committed = sorted(FIXTURES.glob("*.pdf"))
    regenerated = make_corpus(tmp_path, docs=6, poison=2, seed=0, scans=1, mixed=1, scripts=1)
    assert _digests(committed) == _digests(regenerated)


def test_importing_documents_does_not_import_pymupdf():
    code = "import sys, toolkit.documents; print('pymupdf' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
