"""OCR of image pages: Tesseract, for real, with its confidence.

A scanned page has no text layer; MuPDF renders it at ``OCR_DPI`` (grayscale)
and the ``tesseract`` program (Debian ``tesseract-ocr`` and its language data)
reads the image in one pass that writes both the text and the words' confidence
(``txt`` and ``tsv``). The command line is used rather than PyMuPDF's
``page.get_textpage_ocr``, which gives the text but no confidence. Page
segmentation runs with orientation detection (``--psm 1``, ``osd.traineddata``),
so a sideways scan is turned upright before it is read. A page whose words'
mean confidence is under ``MIN_CONFIDENCE`` (a script the language data does
not cover, reads as Latin-looking garbage at ~45; clean scans read at ~96) is
refused, ``ocr-unreadable``, never ``done`` with garbage. The engine and its version change the recognised text without
changing the input's bytes, so they are part of the request: ``ocr_options``
names them, and a request that names another engine than the installed one is
refused rather than silently served by a different engine.
"""

import csv
import os
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from toolkit.documents.preflight import classify, damage, mupdf, one_at_a_time
from toolkit.errors import PermanentError

OCR_DPI = 200
MIN_CONFIDENCE = 70  # mean word confidence (0-100) under which a reading is refused
DEFAULT_LANGUAGE = "eng"
_TESSDATA = ("/usr/share/tesseract-ocr/5/tessdata", "/usr/share/tesseract-ocr/4.00/tessdata")


@cache
def tessdata() -> str | None:
    """The folder holding Tesseract's ``*.traineddata`` (``TESSDATA_PREFIX`` first), or None."""
    for folder in (os.environ.get("TESSDATA_PREFIX"), *_TESSDATA):
        if folder and any(Path(folder).glob("*.traineddata")):
            return folder
    return None


@cache
def engine() -> str | None:
    """``"tesseract 5.3.0"``: the installed engine and version, or None without Tesseract."""
    try:
        out = subprocess.run(["tesseract", "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (out.stdout or out.stderr).splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def ocr_options(language: str = DEFAULT_LANGUAGE) -> dict:
    """The request options of the OCR route: route, language, engine and version."""
    return {"route": "ocr", "ocr_language": language, "ocr_engine": engine()}


@one_at_a_time
def page_text(page, options: dict) -> str:
    """Recognise the text of an image page.

    Raises:
        PermanentError: the request names an engine or language that is not
            installed, MuPDF reports a damaged image while rendering it, or the
            reading's mean word confidence is under ``MIN_CONFIDENCE`` (``ocr-unreadable``).
        RuntimeError: no Tesseract at all (the service is broken, not the input).
    """
    language = options.get("ocr_language", DEFAULT_LANGUAGE)
    wanted, installed, folder = options.get("ocr_engine"), engine(), tessdata()
    if installed is None or folder is None:
        raise RuntimeError("OCR engine unavailable: Tesseract or its tessdata is not installed")
    if wanted is not None and wanted != installed:
        raise PermanentError(f"OCR engine {wanted!r} requested, {installed!r} installed")
    if not all((Path(folder) / f"{lang}.traineddata").is_file() for lang in language.split("+")):
        raise PermanentError(f"OCR language {language!r} is not installed in {folder}")
    pymupdf = mupdf()
    pymupdf.TOOLS.reset_mupdf_warnings()
    pix = page.get_pixmap(dpi=OCR_DPI, colorspace=pymupdf.csGRAY)
    damaged = damage(pymupdf.TOOLS.mupdf_warnings())
    if damaged:
        raise PermanentError(f"damaged: page {page.number + 1}: {damaged}")
    text, confidence = _tesseract(pix, language, folder)
    if confidence is not None and confidence < MIN_CONFIDENCE:
        raise PermanentError(f"ocr-unreadable: page {page.number + 1}: mean word confidence "
                             f"{confidence:.0f} < {MIN_CONFIDENCE} reading it as {language!r} "
                             "(another script, or not text)")
    return text


def _tesseract(pix, language: str, folder: str) -> tuple[str, float | None]:
    """``(text, mean word confidence or None without words)`` of the image ``pix``."""
    with tempfile.TemporaryDirectory(prefix="toolkit-ocr-") as tmp:
        image, base = Path(tmp) / "page.png", Path(tmp) / "page"
        pix.save(image)
        run = subprocess.run(["tesseract", str(image), str(base), "-l", language, "--psm", "1",
                              "--dpi", str(OCR_DPI), "txt", "tsv"], capture_output=True, text=True,
                             env={**os.environ, "TESSDATA_PREFIX": folder}, timeout=600)
        if run.returncode != 0:
            raise RuntimeError(f"tesseract failed ({run.returncode}): {run.stderr.strip()[-200:]}")
        text = base.with_suffix(".txt").read_text(encoding="utf-8")
        with open(base.with_suffix(".tsv"), encoding="utf-8", newline="") as handle:
            rows = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
            confidences = [float(row["conf"]) for row in rows
                           if (row.get("text") or "").strip() and float(row["conf"]) >= 0]
    return text, (sum(confidences) / len(confidences) if confidences else None)


@one_at_a_time
def needs_ocr(path) -> bool:
    """True when some page of ``path`` (a path, or the input's bytes) is a scanned page.

    Read from the page resources first (no content stream is parsed): a page
    with images and no fonts is a scan; only a page with both (a scan with a
    stamp or a partial OCR layer, or a text page with a figure) is classified,
    by the same rule preflight uses. Cheap enough to key every input of every
    rerun. False for a file MuPDF cannot open (preflight will say why).
    """
    pymupdf = mupdf()

    def scanned(doc, n):
        if not doc.get_page_images(n):
            return False
        return not doc.get_page_fonts(n) or classify(doc[n]) == "image"

    try:
        opened = (pymupdf.open(stream=path, filetype="pdf") if isinstance(path, bytes)
                  else pymupdf.open(path, filetype="pdf"))
        with opened as doc:
            return any(scanned(doc, n) for n in range(doc.page_count))
    except Exception:  # poison: keyed as it is, quarantined by preflight
        return False


def routed(path, options: dict) -> dict:
    """``options`` plus the OCR route (``ocr_options``) when ``path`` (or bytes) has scans.

    The route changes how the result is made, so it is part of the request
    identity: the same file read by another engine or language is other work.
    """
    plain, scanned = routes(options)
    return scanned if needs_ocr(path) else plain


def routes(options: dict) -> tuple[dict, dict]:
    """The two option sets a document can be keyed with: as it is, and OCR-routed."""
    return options, {**ocr_options(options.get("ocr_language", DEFAULT_LANGUAGE)), **options}
