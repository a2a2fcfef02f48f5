"""Faults found on real PDFs (py-pdf sample-files and the like) by an outside tester.

Each test reproduces one fault: a damaged form field whose warning fired at page load,
healthy ImageMagick scans quarantined for a colour-profile warning, a wrong startxref,
a scan with a Bates stamp or a partial OCR layer taken for a text page.
"""

import random
import re
from pathlib import Path

import pytest

from toolkit.documents import ocr_routed, page_texts, pdf_bytes, preflight, process, translate
from toolkit.documents.corpus import _healthy_texts
from toolkit.documents.preflight import damage, mupdf
from toolkit.documents.render import check
from toolkit.documents.scans import add_scan_page, scan_image
from toolkit.errors import PermanentError

SAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "sample-files"


def _form_with_damaged_widget() -> tuple[bytes, bytes]:
    """(healthy, damaged): a one-page form whose text field holds "Alice"; in the damaged
    copy 4 bytes inside the widget's dictionary are overwritten (as in the tester's
    libreoffice-form.pdf at offset 27767, with the same bytes)."""
    pymupdf = mupdf()
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), "Application form", fontsize=12)
    widget = pymupdf.Widget()
    widget.field_type, widget.field_name = pymupdf.PDF_WIDGET_TYPE_TEXT, "First Name"
    widget.field_value, widget.rect = "Alice", pymupdf.Rect(72, 100, 300, 120)
    page.add_widget(widget)
    data = doc.tobytes(garbage=4, no_new_id=True)
    at = re.search(rb"/Subtype/Widget/P \d+ 0 R/Parent \d+ 0 R/NM\(fitz-W0\)", data).end()
    damaged = bytearray(data)
    damaged[at:at + 4] = b"\x48\xe8\x56\xe8"  # inside the /Rect key
    return data, bytes(damaged)


def test_damaged_form_field_warning_at_page_load_is_caught_not_done_without_its_value(tmp_path):
    """The widget object is broken: MuPDF warns `invalid key in dict` while *loading the
    page* (annotations load with it) and the field value "Alice" is simply absent from the
    text. Preflight used to reset the warning buffer after the load and before extraction,
    so the document ended `done` without "Alice". Now it is quarantined as damaged."""
    healthy, damaged = _form_with_damaged_widget()
    (tmp_path / "healthy.pdf").write_bytes(healthy)
    (tmp_path / "form.pdf").write_bytes(damaged)
    assert "Alice" in page_texts(tmp_path / "healthy.pdf")[0]
    assert preflight(tmp_path / "healthy.pdf").ok
    assert "Alice" not in page_texts(tmp_path / "form.pdf")[0]  # the loss the check must see
    verdict = preflight(tmp_path / "form.pdf")
    assert not verdict.ok and verdict.reason.startswith("damaged: page 1: ")
    assert "invalid key in dict" in verdict.reason
    with pytest.raises(PermanentError, match="poison input: damaged: page 1"):
        process(tmp_path / "form.pdf", tmp_path / "out.pdf", {})
    assert not (tmp_path / "out.pdf").exists()


@pytest.mark.parametrize("name", ["imagemagick-lzw.pdf", "imagemagick-ASCII85Decode.pdf",
                                  "imagemagick-CCITTFaxDecode.pdf", "pdflatex-4-pages.pdf"])
def test_healthy_real_pdf_with_icc_profile_mismatch_is_not_quarantined_as_damaged(name):
    """Real files from ImageMagick and pdflatex (py-pdf sample-files): two ImageMagick scans
    carry an RGB ICC profile on a gray image, MuPDF warns `syntax error: ICC profile (N=3)
    is not Gray` and draws the pixels anyway. That is not damaged bytes: every one passes."""
    verdict = preflight(SAMPLES / name)
    assert verdict.ok, verdict.reason
    assert set(verdict.kinds) == ({"text"} if name.startswith("pdflatex") else {"image"})


def test_icc_profile_warning_is_benign_and_a_zlib_error_beside_it_is_still_damage():
    """The benign table excuses the colour-profile lines only, not a stream error next to them."""
    from toolkit.documents.preflight import BENIGN

    icc = "syntax error: ICC profile (N=3) is not Gray\nignoring broken ICC profile"
    assert damage(icc) is None and BENIGN
    assert damage(icc + "\nzlib error: invalid distance too far back") == \
        "zlib error: invalid distance too far back"


def test_wrong_startxref_offset_is_accepted_when_every_page_reads_clean(tmp_path):
    """Only the startxref number is wrong: MuPDF rebuilds the xref from the objects and
    every page's text is recovered, with no stream warning. Accepted (it used to be a
    permanent `poison: repaired`), with exactly the healthy file's text. A file whose
    middle is gone is still refused as repaired (the spliced poison of the corpus)."""
    data = (SAMPLES / "pdflatex-4-pages.pdf").read_bytes()
    number = list(re.finditer(rb"startxref\s+(\d+)", data))[-1]
    wrong = str(int(number.group(1)) - 7).encode().rjust(len(number.group(1)))
    moved = tmp_path / "moved.pdf"
    moved.write_bytes(data[:number.start(1)] + wrong + data[number.end(1):])
    with mupdf().open(moved) as doc:
        assert doc.is_repaired  # the fault is real: MuPDF had to rebuild the xref
    verdict = preflight(moved)
    assert verdict.ok and verdict.kinds == ("text",) * 4
    assert page_texts(moved) == page_texts(SAMPLES / "pdflatex-4-pages.pdf")
    third = len(data) // 3
    spliced = tmp_path / "spliced.pdf"
    spliced.write_bytes(data[:third] + data[2 * third:])
    assert preflight(spliced).reason.startswith("repaired:")


def _scan_with_text(tmp_path, body: str, stamp: str, point, fontsize: float, render_mode: int):
    """A one-page grayscale scan of ``body`` with ``stamp`` written over it as text."""
    pymupdf = mupdf()
    doc = pymupdf.open()
    add_scan_page(doc, scan_image(body, random.Random(7), 6.0), "gray")
    doc[0].insert_text(point, stamp, fontsize=fontsize, fontname="helv", render_mode=render_mode)
    path = tmp_path / "scan.pdf"
    doc.save(path)
    return path


def test_scan_with_a_partial_invisible_ocr_layer_is_routed_to_ocr_not_taken_for_text(tmp_path):
    """A full-page scan whose invisible OCR layer covers one line (the rest never
    recognised) used to be a `text` page: done with the rest of the scan lost. The
    image covers the page and the text covers little of it: an image page, OCR route."""
    body = _healthy_texts(random.Random(5))[0]
    path = _scan_with_text(tmp_path, body, "Invoice", (56, 72), 10, 3)
    assert page_texts(path)[0].strip() == "Invoice"
    assert preflight(path).kinds == ("image",)
    assert ocr_routed(path, {"target": "de"})["route"] == "ocr"


@pytest.mark.slow
def test_scan_with_a_bates_stamp_goes_to_ocr_and_keeps_the_scanned_body_and_the_stamp(tmp_path):
    """A 7 pt Bates stamp over a full-page scan used to make the page `text`: the scan was
    never OCR'd and the item ended `done` with only "Bates ABC-000123". Now the page is
    OCR'd whole: the output holds the scanned body's codes and amounts and the stamp."""
    body = _healthy_texts(random.Random(5))[0]
    path = _scan_with_text(tmp_path, body, "Bates ABC-000123", (40, 830), 7, 0)
    assert page_texts(path)[0].strip() == "Bates ABC-000123"
    assert preflight(path).kinds == ("image",)
    options = ocr_routed(path, {"target": "de"})
    assert options["route"] == "ocr"
    out = "".join(page_texts(process(path, tmp_path / "out.pdf", options).path))
    tokens = re.findall(r"\b[A-Z]{2,4}-\d{3,5}\b|\b\d+[.,]\d{2}\b", body)
    assert tokens and all(token in out for token in tokens)
    assert len(out) > 0.8 * len(body) and "ABC-000123" in out


@pytest.mark.parametrize("script, text, font", [
    ("Thai", "ใบแจ้งหนี้ INV-00231 ยอดรวม 12.50", "Noto Sans Thai"),
    ("Devanagari", "चालान INV-00231 कुल 12.50", "Noto Sans Devanagari"),
    ("Armenian", "Հաշիվ INV-00231 ընդամենը 12.50", "Noto Sans Armenian"),
    ("Ethiopic", "ደረሰኝ INV-00231 ጠቅላላ 12.50", "Noto Sans Ethiopic"),
])
def test_thai_devanagari_armenian_ethiopic_are_drawn_by_installed_noto_fonts_not_refused(
        script, text, font):
    """fonts-noto-core has a font for each script, but the fixed chain did not list them:
    "no installed font covers" was raised. The chain now falls back to every installed
    Noto font by coverage; the output embeds that font and carries every character."""
    data = pdf_bytes([text])
    check(data, [text])  # raises if a character is lost
    with mupdf().open(stream=data, filetype="pdf") as doc:
        fonts = [entry[3] for entry in doc.get_page_fonts(0)]
    assert any(font in name for name in fonts), (script, fonts)


def test_text_no_installed_font_draws_is_refused_at_preflight_before_it_is_sent(tmp_path):
    """A character no installed font draws (an emoji: no emoji font is installed) used to
    be found only when the provider rendered the output, after it had executed (billed)
    the document. Preflight, which the pipeline runs before enqueueing, refuses it now,
    naming the character. A variation selector after it (invisible) is not named."""
    pymupdf = mupdf()
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), "Moon X INV-00231", fontname="helv")
    # The font's ToUnicode maps the code of "X" to U+1F311 U+FE0F, as a PDF with an emoji
    # (drawn by some font the writer had) carries it; nothing here draws it.
    cmap = xref = doc.get_new_xref()
    doc.update_object(xref, "<<>>")
    doc.update_stream(xref, b"/CIDInit /ProcSet findresource begin 12 dict begin begincmap "
                            b"/CMapName /Emoji def 1 begincodespacerange <00> <FF> "
                            b"endcodespacerange 1 beginbfchar <58> <D83CDF11FE0F> endbfchar "
                            b"endcmap CMapName currentdict /CMap defineresource pop end end")
    doc.xref_set_key(page.get_fonts()[0][0], "ToUnicode", f"{cmap} 0 R")
    doc.save(tmp_path / "emoji.pdf")
    assert "\U0001F311" in page_texts(tmp_path / "emoji.pdf")[0]
    verdict = preflight(tmp_path / "emoji.pdf")
    assert not verdict.ok
    assert verdict.reason == "unrenderable: page 1: no installed font covers '🌑' (U+1F311) x1"


def test_dense_page_is_set_smaller_on_one_output_page_not_reflowed_onto_three(tmp_path):
    """A dense real page (pdflatex: ~120 lines of 90 characters) used to overflow the 52
    output lines per page: a 117-page input became 163 pages, a 4-page one 7, and page
    requests no longer lined up with input pages. One output page per input page now (the
    type is set smaller), for Latin-1 text (helv) and for text with other scripts (Noto)."""
    pymupdf = mupdf()
    for extra in ("", " Ωμέγα"):
        texts = [f"Line {n} of a dense page, model XR-{2000 + n}{extra}" for n in range(3)]
        texts[1] = "\n".join(f"Line {n} of a dense page, model XR-{2000 + n}{extra}" for n in range(130))
        data = pdf_bytes(texts)
        check(data, texts)  # every line where it belongs, every character kept
        with pymupdf.open(stream=data, filetype="pdf") as doc:
            assert doc.page_count == 3
            assert len(doc[1].get_text().splitlines()) == 130


def _scan(tmp_path, name: str, text: str, rotate: int = 0) -> Path:
    pymupdf = mupdf()
    doc = pymupdf.open()
    add_scan_page(doc, scan_image(text, random.Random(7), 6.0), "gray")
    doc[0].set_rotation(rotate)
    doc.save(tmp_path / name)
    return tmp_path / name


@pytest.mark.slow
def test_greek_scan_read_with_english_data_is_refused_ocr_unreadable_not_done_with_garbage(tmp_path):
    """Only `eng` language data is installed: a Greek scan read as English came out as
    Latin-looking garbage ("Etatpeia AA~a") and ended `done`. Tesseract's own mean word
    confidence (~45 here, ~96 on clean English scans) is under the threshold: a permanent
    failure `ocr-unreadable`, and no output is written."""
    text = "Τιμολόγιο αριθμός 231 για την εταιρεία Άλφα\nΠοσότητα τρία, τιμή μονάδας δώδεκα ευρώ\n" * 6
    path = _scan(tmp_path, "greek.pdf", text)
    options = ocr_routed(path, {"target": "de"})
    with pytest.raises(PermanentError, match=r"ocr-unreadable: page 1: mean word confidence \d+ < 70"):
        process(path, tmp_path / "out.pdf", options)
    assert not (tmp_path / "out.pdf").exists()


@pytest.mark.slow
def test_sideways_scan_is_read_upright_into_one_page_not_three_pages_of_gibberish(tmp_path):
    """A scan with /Rotate 90 was read sideways: gibberish, reflowed onto 3 output pages
    from 1 input page, `done`. Orientation detection turns it upright: one output page
    carrying the scan's codes and amounts, within 2 % CER of the translated text."""
    import Levenshtein

    body = _healthy_texts(random.Random(5))[0]
    path = _scan(tmp_path, "sideways.pdf", body, rotate=90)
    out = process(path, tmp_path / "out.pdf", ocr_routed(path, {"target": "de"}))
    layer = page_texts(out.path)
    assert len(layer) == 1
    want = " ".join(translate(body, {"target": "de"}).split())
    got = " ".join(layer[0].split())
    assert Levenshtein.distance(got, want) / len(want) <= 0.02
