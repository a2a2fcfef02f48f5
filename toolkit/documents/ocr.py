"""OCR of image pages: Tesseract, for real, through PyMuPDF's OCR text page.

A scanned page has no text layer; ``page.get_textpage_ocr`` renders it at
``OCR_DPI`` and hands the image to Tesseract (Debian ``tesseract-ocr`` and its
language data). The engine and its version change the recognised text without
changing the input's bytes, so they are part of the request: ``ocr_options``
names them, and a request that names another engine than the installed one is
refused rather than silently served by a different engine.
"""

import os
import subprocess
from functools import cache
from pathlib import Path

from toolkit.documents.preflight import classify, damage, mupdf
from toolkit.errors import PermanentError

OCR_DPI = 200
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


def page_text(page, options: dict) -> str:
    """Recognise the text of an image page.

    Raises:
        PermanentError: the request names an engine or language that is not
            installed, or MuPDF reports a damaged image while rendering it.
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
    textpage = page.get_textpage_ocr(tessdata=folder, language=language, dpi=OCR_DPI, full=True)
    text = page.get_text(textpage=textpage)
    damaged = damage(pymupdf.TOOLS.mupdf_warnings())
    if damaged:
        raise PermanentError(f"damaged: page {page.number + 1}: {damaged}")
    return text


def needs_ocr(path) -> bool:
    """True when some page of ``path`` is a scanned page (``preflight.classify``).

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
        with pymupdf.open(path, filetype="pdf") as doc:
            return any(scanned(doc, n) for n in range(doc.page_count))
    except Exception:  # poison: keyed as it is, quarantined by preflight
        return False


def routed(path, options: dict) -> dict:
    """``options`` plus the OCR route (``ocr_options``) when ``path`` has scanned pages.

    The route changes how the result is made, so it is part of the request
    identity: the same file read by another engine or language is other work.
    """
    if not needs_ocr(path):
        return options
    return {**ocr_options(options.get("ocr_language", DEFAULT_LANGUAGE)), **options}
