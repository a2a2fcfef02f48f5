"""Real documents: scans go through real OCR, blank pages are content, every script survives."""

import random
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

from toolkit.documents import (lost_tokens, make_corpus, ocr_routed, page_texts, pdf_bytes, preflight, process,
                               source_texts, translate)
from toolkit.documents.corpus import _healthy_texts, scan_pages, script_texts
from toolkit.documents.render import check
from toolkit.documents.scans import document_bytes
from toolkit.errors import PermanentError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "corpus"
OCR = {"target": "de", "route": "ocr", "ocr_language": "eng"}


def _visible(text):
    return "".join(c for c in unicodedata.normalize("NFKC", text)
                   if not c.isspace() and unicodedata.category(c)[0] != "C")


def _cer(recognised: list[str], truth: list[str]) -> float:
    """Character error rate: Levenshtein distance over ground-truth length, whitespace collapsed."""
    import Levenshtein

    norm = [(" ".join(a.split()), " ".join(b.split())) for a, b in zip(recognised, truth, strict=True)]
    return sum(Levenshtein.distance(a, b) for a, b in norm) / sum(len(b) for _, b in norm)


def test_preflight_classifies_text_scanned_and_blank_pages_of_a_mixed_document():
    """The committed mixed document: a text page, a CCITT G4 scan, a blank page; all sound."""
    verdict = preflight(FIXTURES / "mixed-000.pdf")
    assert verdict.ok and verdict.kinds == ("text", "image", "blank")
    assert preflight(FIXTURES / "scan-000.pdf").kinds == ("image", "image")


def test_blank_page_is_kept_and_only_a_document_without_content_is_poison(tmp_path):
    """A blank page used to quarantine the whole document; now it is a blank output page.
    A document whose every page is blank has no content: that stays poison."""
    texts = ["Invoice INV-00231 total 12.50 EUR", "", "Page 3: model XR-2040"]
    source = tmp_path / "with-blank.pdf"
    source.write_bytes(pdf_bytes(texts))
    assert preflight(source).kinds == ("text", "blank", "text")
    out = process(source, tmp_path / "out.pdf", {"target": "de"})
    assert page_texts(out.path) == page_texts(tmp_path / "out.pdf")
    assert [t.strip() == "" for t in page_texts(out.path)] == [False, True, False]
    empty = tmp_path / "empty.pdf"
    empty.write_bytes(pdf_bytes(["", ""]))
    assert preflight(empty).reason == "no-content: all 2 pages are blank"
    with pytest.raises(PermanentError, match="poison input: no-content"):
        process(empty, tmp_path / "none.pdf", {})


def test_scans_are_keyed_with_the_ocr_route_engine_and_language_and_text_documents_are_not():
    routed = ocr_routed(FIXTURES / "scan-000.pdf", {"target": "de"})
    assert routed["route"] == "ocr" and routed["ocr_language"] == "eng"
    assert routed["ocr_engine"].startswith("tesseract ")
    assert ocr_routed(FIXTURES / "doc-000.pdf", {"target": "de"}) == {"target": "de"}


@pytest.mark.slow
def test_scanned_document_ends_done_with_a_text_layer_from_tesseract(tmp_path):
    """scan-000 has no text at all; processed, the output carries the recognised,
    translated text as a text layer: every model code and amount of the ground truth, and
    within 2 % CER of the translated ground truth (Tesseract misreads a letter here and there)."""
    assert "".join(page_texts(FIXTURES / "scan-000.pdf")).strip() == ""
    truth = [text for text, _ in scan_pages(0, 0)]
    artifact = process(FIXTURES / "scan-000.pdf", tmp_path / "out.pdf",
                       ocr_routed(FIXTURES / "scan-000.pdf", {"target": "de"}))
    layer = page_texts(artifact.path)
    assert not lost_tokens("\n".join(truth), "\n".join(layer))  # every code and amount read
    assert _cer(layer, [translate(t, {"target": "de"}) for t in truth]) <= 0.02


def test_a_request_naming_another_ocr_engine_is_refused_not_served_by_this_one(tmp_path):
    with pytest.raises(PermanentError, match="OCR engine 'tesseract 0.1' requested"):
        process(FIXTURES / "scan-000.pdf", tmp_path / "out.pdf", {**OCR, "ocr_engine": "tesseract 0.1"})
    assert not (tmp_path / "out.pdf").exists()


@pytest.mark.slow
def test_ocr_character_error_rate_on_ten_clean_scanned_pages_is_at_most_two_percent(tmp_path):
    """Ten pages (five CCITT G4 bilevel, five grayscale JPEG; 200 dpi, seeded noise and
    skew), read back by Tesseract: CER against the generated ground truth <= 2 %."""
    texts = [page for seed in range(5) for page in _healthy_texts(random.Random(seed))][:10]
    assert len(texts) == 10
    recognised = []
    for number, kind in enumerate(("bilevel", "gray")):
        path = tmp_path / f"{kind}.pdf"
        path.write_bytes(document_bytes([(t, kind) for t in texts[number::2]], seed=number))
        assert preflight(path).kinds == ("image",) * 5
        recognised += source_texts(path, ("image",) * 5, OCR)
    assert _cer(recognised, texts[0::2] + texts[1::2]) <= 0.02


def test_multi_script_document_keeps_every_character_of_its_translation(tmp_path):
    """Greek, Cyrillic, Arabic, Hebrew, Chinese, Japanese, maths and currency symbols, curly
    quotes and dashes: extracted from the output, nothing of the expected translation is missing."""
    source = FIXTURES / "script-000.pdf"
    texts = script_texts(random.Random("script-0-0"))
    assert Counter(_visible("".join(page_texts(source)))) == Counter(_visible("".join(texts)))
    artifact = process(source, tmp_path / "out.pdf", {"target": "de"})
    expected = _visible("".join(translate(t, {"target": "de"}) for t in texts))
    got = _visible("".join(page_texts(artifact.path)))
    assert Counter(expected) == Counter(got)
    for script_char in "ΣЧبש发ユ∫€₹“—":
        assert script_char in got


def test_output_written_in_base14_helvetica_loses_greek_and_the_check_names_the_letters():
    """The old renderer's failure, reproduced with MuPDF: helv turns Greek into dots.
    The whole-text check refuses it, naming each lost character."""
    import pymupdf

    doc = pymupdf.open()
    doc.new_page().insert_text((56, 72), "Total Ωμ 12.50", fontname="helv")
    data = doc.tobytes()
    with pytest.raises(PermanentError, match=r"lost characters: 'Ω' \(U\+03A9\) x1, 'μ' \(U\+03BC\) x1"):
        check(data, ["Total Ωμ 12.50"])


def test_right_to_left_lines_compare_as_multisets_and_a_lost_letter_is_named():
    """Extraction order of Arabic is not reliable: the same letters in another order pass;
    one letter missing fails, named."""
    data = pdf_bytes(["فاتورة 12.50"])
    check(data, ["ةروتاف 12.50"])  # reversed: same multiset on the line
    with pytest.raises(PermanentError, match="U\\+0628"):
        check(data, ["فاتورة ب 12.50"])


def test_a_character_no_installed_font_covers_is_a_permanent_failure_naming_it():
    """Linear B (U+10000) is in no font of the chain: refused by name, never drawn as a dot."""
    with pytest.raises(PermanentError, match=r"no installed font covers '𐀀' \(U\+10000\)"):
        pdf_bytes(["Invoice \U00010000 INV-00231"])


def test_fixtures_command_writes_scans_mixed_and_multi_script_documents(tmp_path):
    paths = make_corpus(tmp_path, docs=0, poison=0, scans=2, mixed=1, scripts=1)
    assert [p.name for p in paths] == ["scan-000.pdf", "scan-001.pdf", "mixed-000.pdf", "script-000.pdf"]
    import pymupdf

    with pymupdf.open(paths[0]) as bilevel, pymupdf.open(paths[1]) as gray:
        filters = [doc.xref_get_key(doc[0].get_images()[0][0], "Filter")[1] for doc in (bilevel, gray)]
    assert filters == ["/CCITTFaxDecode", "/DCTDecode"]


def test_a_page_drawing_only_spaces_is_blank_not_damaged(tmp_path):
    """Text operators that drew only spaces are a blank page, not a lost font (no false alarm)."""
    import pymupdf

    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "Invoice INV-00231")
    doc.new_page().insert_text((72, 72), "   ", fontname="helv")
    doc.save(tmp_path / "spaces.pdf")
    assert preflight(tmp_path / "spaces.pdf").kinds == ("text", "blank")
