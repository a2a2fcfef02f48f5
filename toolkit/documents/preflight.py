"""Preflight: tell a sound PDF from poison by what MuPDF itself reports, page by page.

MuPDF repairs what it can and keeps going: a truncated file is rebuilt on open,
a content stream with overwritten bytes yields part of its text. It never
raises for either; it *warns*, into a global buffer. So preflight opens the
file, then reads each page with the buffer reset before and read after, and a
warning naming a stream error makes the document ``damaged`` with the page
and the warning in the reason. Each page is classified on the way:

``text``   the page has a text layer;
``image``  no text, but an image covers most of the page (a scan: OCR route);
``blank``  neither (kept as a blank page; only a document with no content at
           all is poison).

PyMuPDF is imported on first use (``import toolkit`` stays light).
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path

_TAIL = 1024  # bytes searched for %%EOF / startxref, as PDF readers do
_COVER = 0.5  # an image over at least half the page area makes an image page
# Warnings that mean the bytes are not what was written (the rest are advice).
_DAMAGE = re.compile(r"zlib|flate|lzw|ccitt|jbig2|dct|jpeg|syntax error|unknown keyword|"
                     r"invalid|read error|repair|corrupt|cannot|error", re.IGNORECASE)
PAGE_KINDS = ("text", "image", "blank")
_GARBLED_KEY = re.compile(r"/[^\s/<>\[\]()]*#(?:[0-1][0-9A-F]|[7-9A-F][0-9A-F])[^\s/<>\[\]()]*")
_SHOWS_TEXT = re.compile(rb"(?:\bTj|\bTJ|[\s\])]['\"])\s")  # Tj, TJ, ' and " show text


@dataclass(frozen=True, slots=True)
class Preflight:
    """Verdict of ``preflight``; ``reason`` is ``"<kind>: <detail>"`` when not ok.

    ``kinds`` holds the class of each page checked (``PAGE_KINDS``), in order.
    """

    ok: bool
    reason: str | None
    pages: int
    kinds: tuple = ()


def mupdf():
    """Import PyMuPDF on first use; keep its warnings in its buffer, not on stderr."""
    import pymupdf

    pymupdf.TOOLS.mupdf_display_errors(False)
    pymupdf.TOOLS.mupdf_display_warnings(False)
    return pymupdf


def damage(warnings: str) -> str | None:
    """The first line of MuPDF's ``warnings`` that reports damaged bytes, or None."""
    for line in warnings.splitlines():
        if _DAMAGE.search(line):
            return line.strip()
    return None


def classify(page, text: str) -> str:
    """``text``, ``image`` or ``blank`` for a page whose extracted text is ``text``."""
    if text.strip():
        return "text"
    area = abs(page.rect)
    for info in page.get_image_info():
        box = page.rect & info["bbox"]
        if area and not box.is_empty and abs(box) >= _COVER * area:
            return "image"
    return "blank"


def _silent_damage(page) -> str | None:
    """Damage MuPDF does not warn about, on a page that came out blank: a page object
    that is not a page (MuPDF shows it as an empty page), a page dictionary with a key of
    control or non-ASCII bytes (an overwritten /Contents), a /Contents reference to
    something that is not a stream, or text operators that drew no text (the font
    resource they name is gone)."""
    doc = page.parent
    if doc.xref_get_key(page.xref, "Type") != ("name", "/Page"):  # MuPDF shows an empty page
        return f"page object {page.xref} is not a /Page: {doc.xref_object(page.xref)[:60]!r}"
    garbled = _GARBLED_KEY.search(doc.xref_object(page.xref, compressed=True))
    if garbled:  # e.g. /Contents overwritten: the page simply loses its content
        return f"page dictionary has a garbled key {garbled.group(0)!r}"
    kind, value = doc.xref_get_key(page.xref, "Contents")
    if kind in ("xref", "array"):
        refs = [int(number) for number in re.findall(r"(\d+) 0 R", value)]
        if not refs or not all(0 < ref < doc.xref_length() and doc.xref_is_stream(ref)
                               for ref in refs):
            return f"/Contents {value} is not a content stream"
    elif kind != "null":
        return f"/Contents is {kind} {value}"
    drew = any(block.get("lines") for block in page.get_text("rawdict")["blocks"])  # even spaces
    if _SHOWS_TEXT.search(page.read_contents()) and not drew:
        return "text operators drew no text (a font or resource they need is missing)"
    return None


def read_page(page):
    """``(text, kind, damage)`` of one page: its text, class, and the first damage found.

    An image page is also rendered small, so a damaged image stream speaks now
    and not only when OCR renders it. The warning buffer is global to MuPDF:
    flushed (MuPDF folds a repeated warning into "... repeated N times", so a
    page repeating the last page's warning would show only that) and reset
    before, read after, with no other MuPDF call in between.
    """
    pymupdf = mupdf()
    pymupdf.mupdf.fz_flush_warnings()
    pymupdf.TOOLS.reset_mupdf_warnings()
    text = page.get_text()
    kind = classify(page, text)
    if kind == "image":
        page.get_pixmap(dpi=24, colorspace=pymupdf.csGRAY)
    warned = damage(pymupdf.TOOLS.mupdf_warnings())
    return text, kind, warned or (_silent_damage(page) if kind == "blank" else None)


def preflight(path, page: int | None = None) -> Preflight:
    """Tell a healthy PDF from poison, before the item is enqueued.

    With ``page`` (1-based), only that page is checked: the check of one page
    request, which must not cost a read of the whole document.

    Checks, in order: missing, empty, not-pdf (no ``%PDF-`` head), truncated
    (no ``%%EOF``/``startxref`` in the tail), unreadable, repaired (MuPDF had
    to rebuild the xref on open: it repairs silently, so we ask it),
    encrypted, zero-pages, then per page: unreadable, damaged (MuPDF warned of
    a stream error while reading it), and at the end no-content (every page
    blank). A blank page in a document with content is fine. Never raises
    for a bad file.
    """
    failure, doc = open_sound(path)
    if failure is not None:
        return failure
    with doc:
        if doc.needs_pass or doc.is_encrypted:
            return Preflight(False, "encrypted: password protected", doc.page_count)
        pages = doc.page_count
        if pages == 0:
            return Preflight(False, "zero-pages: the document has no pages", 0)
        kinds = []
        for number in range(1, pages + 1) if page is None else (page,):
            if not 1 <= number <= pages:
                return Preflight(False, f"no-page: no page {number} in {pages} pages", pages)
            try:
                _, kind, damaged = read_page(doc[number - 1])
            except Exception as exc:  # a page MuPDF cannot interpret: poison, not a crash
                return Preflight(False, f"unreadable: page {number}: {exc}", pages)
            if damaged:
                return Preflight(False, f"damaged: page {number}: {damaged}", pages)
            kinds.append(kind)
    if page is None and set(kinds) == {"blank"}:
        return Preflight(False, f"no-content: all {pages} pages are blank", pages, tuple(kinds))
    return Preflight(True, None, pages, tuple(kinds))


def page_count(path) -> int:
    """The page count ``preflight`` reports (0 for a file that is not a sound PDF),
    without reading any page's text: cheap enough to route every input of a rerun."""
    failure, doc = open_sound(path)
    if failure is not None:
        return failure.pages
    with doc:
        return doc.page_count


def open_sound(path):
    """``(failure, None)`` for a file that is not a sound PDF, else ``(None, open document)``:
    the byte checks, then MuPDF's open, refused when it had to repair the file."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            head = handle.read(_TAIL)
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - _TAIL))
            tail = handle.read()
    except FileNotFoundError:
        return Preflight(False, f"missing: {path.name} does not exist", 0), None
    except OSError as exc:
        return Preflight(False, f"unreadable: {exc}", 0), None
    if size == 0:
        return Preflight(False, "empty: zero bytes", 0), None
    if b"%PDF-" not in head:
        return Preflight(False, "not-pdf: no %PDF- header", 0), None
    for marker in (b"%%EOF", b"startxref"):
        if marker not in tail:
            return Preflight(False, f"truncated: no {marker.decode()} in the last {_TAIL} bytes",
                             0), None
    pymupdf = mupdf()
    pymupdf.TOOLS.reset_mupdf_warnings()  # the buffer is global: clear it before open
    try:
        doc = pymupdf.open(path, filetype="pdf")
    except Exception as exc:  # FileDataError and friends: MuPDF gave up
        return Preflight(False, f"unreadable: {exc}", 0), None
    warnings = pymupdf.TOOLS.mupdf_warnings()
    if doc.is_repaired or "repair" in warnings:
        doc.close()
        first = warnings.splitlines()[0] if warnings else "is_repaired"
        return Preflight(False, f"repaired: MuPDF rebuilt the file on open ({first})", 0), None
    return None, doc
