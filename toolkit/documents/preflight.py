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

import functools
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from toolkit.documents.fonts import uncovered

_TAIL = 1024  # bytes searched for %%EOF / startxref, as PDF readers do
_COVER = 0.5  # an image over at least half the page area makes an image page
# A page with such an image whose text blocks cover less than this share of the page is a
# scan with a stamp (Bates number, header) or a partial OCR layer on it: it goes to OCR.
_TEXT_COVER = 0.15
# Warnings that mean the bytes are not what was written (the rest are advice).
_DAMAGE = re.compile(r"zlib|flate|lzw|ccitt|jbig2|dct|jpeg|syntax error|unknown keyword|"
                     r"invalid|read error|repair|corrupt|cannot|error", re.IGNORECASE)
# The one table of MuPDF warnings that match ``_DAMAGE`` but are not damage: (pattern, why).
BENIGN = (
    (re.compile(r"ICC profile \(N=\d+\) is not|ignoring broken ICC profile"),
     "an image's embedded colour profile disagrees with its colour space (ImageMagick writes "
     "such files): MuPDF drops the profile and draws the pixels in the declared space"),
)
# Open-time warnings of an xref that is not where ``startxref`` points: MuPDF rebuilds it
# from the objects themselves. Only these, and nothing else wrong on any page, is accepted.
_XREF_MOVED = re.compile(r"^(format error: cannot recognize xref format|trying to repair broken "
                         r"xref|repairing PDF document|syntax error: cannot find startxref|"
                         r"format error: cannot find xref)$")
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


# MuPDF's warning buffer is one per process, and PyMuPDF is not thread-safe: a check
# that resets the buffer, reads a page and reads the buffer back must not see the
# warnings of a document another thread (a second worker, the in-process provider)
# is reading meanwhile, or a truncated file's "cannot find startxref" lands on a
# healthy one. Every entry point that drives MuPDF holds this lock (reentrant: they
# call each other).
MUPDF_LOCK = threading.RLock()


def one_at_a_time(function):
    """Run ``function`` holding ``MUPDF_LOCK``."""
    @functools.wraps(function)
    def locked(*args, **kwargs):
        with MUPDF_LOCK:
            return function(*args, **kwargs)
    return locked


def mupdf():
    """Import PyMuPDF on first use; keep its warnings in its buffer, not on stderr."""
    import pymupdf

    pymupdf.TOOLS.mupdf_display_errors(False)
    pymupdf.TOOLS.mupdf_display_warnings(False)
    return pymupdf


def damage(warnings: str) -> str | None:
    """The first line of MuPDF's ``warnings`` that reports damaged bytes, or None."""
    for line in warnings.splitlines():
        if _DAMAGE.search(line) and not any(pattern.search(line) for pattern, _ in BENIGN):
            return line.strip()
    return None


def classify(page, textpage=None) -> str:
    """``text``, ``image`` or ``blank`` for ``page`` (its ``textpage``, made if not given).

    ``image``: an image covers at least ``_COVER`` of the page and the text layer
    covers less than ``_TEXT_COVER`` of it (none at all, or a stamp, a header or a
    partial OCR layer over a scan): the page is read by OCR, whole. Images are
    looked for only on pages that list image resources (cheap: no content parsed).
    """
    textpage = textpage or page.get_textpage()
    area = abs(page.rect)
    blocks = [block for block in textpage.extractBLOCKS() if block[6] == 0 and block[4].strip()]
    fallback = "text" if blocks else "blank"
    covered = sum(abs(page.rect & tuple(block[:4])) for block in blocks)
    if covered >= _TEXT_COVER * area or not page.parent.get_page_images(page.number):
        return fallback
    for info in page.get_image_info():
        box = page.rect & info["bbox"]
        if area and not box.is_empty and abs(box) >= _COVER * area:
            return "image"
    return fallback


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


@one_at_a_time
def read_page(doc, number: int):
    """``(text, kind, damage)`` of page ``number`` (0-based) of ``doc``: its text, class,
    and the first damage found.

    The warning buffer is global to MuPDF: flushed (MuPDF folds a repeated
    warning into "... repeated N times", so a page repeating the last page's
    warning would show only that) and reset *before the page is loaded*, read
    after, with no other MuPDF call in between. Loading the page parses its
    dictionary and its annotations (form fields): an object broken there warns
    at load, not at extraction, and its text (a field's value) is simply absent.
    Widgets and annotations are walked too (PyMuPDF binds them lazily), and an
    image page is rendered small, so a damaged image stream speaks now and not
    only when OCR renders it.
    """
    pymupdf = mupdf()
    pymupdf.mupdf.fz_flush_warnings()
    pymupdf.TOOLS.reset_mupdf_warnings()
    page = doc[number]
    for _ in page.annots():
        pass
    for _ in page.widgets():
        pass
    textpage = page.get_textpage()
    text = textpage.extractText()
    kind = classify(page, textpage)
    if kind == "image":
        page.get_pixmap(dpi=24, colorspace=pymupdf.csGRAY)
    pymupdf.mupdf.fz_flush_warnings()
    warned = damage(pymupdf.TOOLS.mupdf_warnings())
    return text, kind, warned or (_silent_damage(page) if kind == "blank" else None)


@one_at_a_time
def preflight(path, page: int | None = None) -> Preflight:
    """Tell a healthy PDF from poison, before the item is enqueued.

    With ``page`` (1-based), only that page is checked: the check of one page
    request, which must not cost a read of the whole document.

    Checks, in order: missing, empty, not-pdf (no ``%PDF-`` head), truncated
    (no ``%%EOF``/``startxref`` in the tail), unreadable, repaired (MuPDF had
    to rebuild the xref on open: it repairs silently, so we ask it),
    encrypted, zero-pages, then per page: unreadable, damaged (MuPDF warned of
    a stream error while reading it), unrenderable (a character of its text that
    no installed font draws, ``fonts.uncovered``: refused before the request is
    sent and billed, not after), and at the end no-content (every page blank). A blank page in a document with content is fine. Never raises
    for a bad file.
    """
    failure, doc, repaired = open_sound(path, accept_moved_xref=True)
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
                text, kind, damaged = read_page(doc, number - 1)
            except Exception as exc:  # a page MuPDF cannot interpret: poison, not a crash
                return Preflight(False, f"unreadable: page {number}: {exc}", pages)
            if repaired and (damaged or kind == "blank"):  # a lost page looks blank here
                return Preflight(False, f"repaired: MuPDF rebuilt the file on open ({repaired}) "
                                 f"and page {number} came out {damaged or 'blank'}", pages)
            if damaged:
                return Preflight(False, f"damaged: page {number}: {damaged}", pages)
            missing = uncovered(text) if kind == "text" else None
            if missing:  # refused here, before the request is sent (and billed)
                shown = ", ".join(f"{c!r} (U+{ord(c):04X}) x{n}" for c, n in sorted(missing.items()))
                return Preflight(False, f"unrenderable: page {number}: no installed font covers "
                                 f"{shown}", pages)
            kinds.append(kind)
    if page is None and set(kinds) == {"blank"}:
        return Preflight(False, f"no-content: all {pages} pages are blank", pages, tuple(kinds))
    return Preflight(True, None, pages, tuple(kinds))


@one_at_a_time
def page_count(path) -> int:
    """The page count ``preflight`` reports (0 for a file that is not a sound PDF),
    without reading any page's text: cheap enough to route every input of a rerun."""
    failure, doc, _ = open_sound(path, accept_moved_xref=True)
    if failure is not None:
        return failure.pages
    with doc:
        return doc.page_count


def open_sound(path, accept_moved_xref: bool = False):
    """``(failure, None, None)`` for a file that is not a sound PDF, else ``(None, open
    document, repaired)``: the byte checks, then MuPDF's open, refused when it had to
    repair the file, except (with ``accept_moved_xref``) when the only fault it reports is
    an xref that is not where ``startxref`` points: then ``repaired`` names that warning,
    and the caller must still read every page without damage (``preflight`` does)."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            head = handle.read(_TAIL)
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - _TAIL))
            tail = handle.read()
    except FileNotFoundError:
        return Preflight(False, f"missing: {path.name} does not exist", 0), None, None
    except OSError as exc:
        return Preflight(False, f"unreadable: {exc}", 0), None, None
    if size == 0:
        return Preflight(False, "empty: zero bytes", 0), None, None
    if b"%PDF-" not in head:
        return Preflight(False, "not-pdf: no %PDF- header", 0), None, None
    # The end-of-file marker is spelled with two percent signs (the line "%%EOF"): the
    # reason names it in words too, so the spelling does not read as a doubled escape.
    for marker, named in ((b"%%EOF", "end-of-file marker (the line %%EOF)"),
                          (b"startxref", "startxref (the xref's offset)")):
        if marker not in tail:
            return Preflight(False, f"truncated: no {named} in the last {_TAIL} bytes",
                             0), None, None
    pymupdf = mupdf()
    pymupdf.TOOLS.reset_mupdf_warnings()  # the buffer is global: clear it before open
    try:
        doc = pymupdf.open(path, filetype="pdf")
    except Exception as exc:  # FileDataError and friends: MuPDF gave up
        return Preflight(False, f"unreadable: {exc}", 0), None, None
    warnings = pymupdf.TOOLS.mupdf_warnings()
    if not (doc.is_repaired or "repair" in warnings):
        return None, doc, None
    first = warnings.splitlines()[0] if warnings else "is_repaired"
    lines = [line.strip() for line in warnings.splitlines() if line.strip()]
    if accept_moved_xref and lines and all(_XREF_MOVED.match(line) for line in lines):
        return None, doc, first
    doc.close()
    return Preflight(False, f"repaired: MuPDF rebuilt the file on open ({first})", 0), None, None
