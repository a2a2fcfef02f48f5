"""Output PDFs that keep every script, and the check that they did.

Text that is all Latin-1 is written as before, in the base-14 Helvetica
(``helv``): the same bytes as ever for the same texts. Anything else is cut
into runs of characters, each run set in the first font of ``FONT_CHAIN`` that
has a glyph for it (Noto for Latin, Greek, Cyrillic, Arabic, Hebrew, maths and
symbols; MuPDF's built-in Droid Sans Fallback for CJK), embedded and
subsetted. A character no font covers is a loss, and losses are caught by
``check``: the output's text, extracted again, must equal what was meant to
be written, after NFKC, line by line (exactly for left-to-right lines; as a
multiset of characters for lines with right-to-left script, whose extraction
order is not reliable). Whitespace and control characters take no part.
"""

import re
import textwrap
import unicodedata
from collections import Counter
from functools import cache
from pathlib import Path

from toolkit.documents.preflight import mupdf
from toolkit.errors import PermanentError

_NOTO = Path("/usr/share/fonts/truetype/noto")
# (name, font file or MuPDF built-in name, right-to-left), tried in order for each character.
FONT_CHAIN = (("NotoSans", _NOTO / "NotoSans-Regular.ttf", False),
              ("NotoSansArabic", _NOTO / "NotoSansArabic-Regular.ttf", True),
              ("NotoSansHebrew", _NOTO / "NotoSansHebrew-Regular.ttf", True),
              ("NotoSansMath", _NOTO / "NotoSansMath-Regular.ttf", False),
              ("NotoSansSymbols", _NOTO / "NotoSansSymbols-Regular.ttf", False),
              ("NotoSansSymbols2", _NOTO / "NotoSansSymbols2-Regular.ttf", False),
              ("cjk", "cjk", False))
_LINE_WIDTH, _LINES_PER_PAGE, _FONT_SIZE, _LEADING = 90, 52, 10, 13
_LEFT, _TOP, _WIDTH = 56, 72, 483  # A4 (595 x 842 pt) with 56 pt margins


@cache
def _font(source):
    """A loaded font, or None when its file is not installed (the chain skips it)."""
    pymupdf = mupdf()
    if isinstance(source, str):
        return pymupdf.Font(source)
    return pymupdf.Font(fontfile=str(source)) if source.is_file() else None


def _font_for(char: str):
    """The first entry of ``FONT_CHAIN`` with a glyph for ``char``, or None."""
    for entry in FONT_CHAIN:
        font = _font(entry[1])
        if font is not None and font.has_glyph(ord(char)):
            return entry
    return None


def runs(line: str) -> list[tuple[tuple, str]]:
    """Cut ``line`` into ``(font entry, text)`` runs; spaces stay with the run they are in.

    Raises:
        PermanentError: a character that no installed font can show (named).
    """
    out, missing = [], []
    for char in line:
        if not char.isspace() and not _shown(char):
            continue  # control, format, private-use: nothing a reader sees, nothing to keep
        entry = out[-1][0] if out and char.isspace() else _font_for(char)
        if entry is None:
            missing.append(char)
        elif out and out[-1][0] == entry:
            out[-1] = (entry, out[-1][1] + char)
        else:
            out.append((entry, char))
    if missing:
        raise PermanentError(f"no installed font covers {_named(Counter(missing))}")
    return out


def _width(line: str) -> float:
    return sum(_font(entry[1]).text_length(text, fontsize=_FONT_SIZE) for entry, text in runs(line))


def _wrap(raw: str) -> list[str]:
    """Greedy wrap by measured width; a token wider than a line (CJK) breaks between characters."""
    lines, current = [], ""
    for token in raw.split(" "):
        candidate = f"{current} {token}" if current else token
        if _width(candidate) <= _WIDTH:
            current = candidate
            continue
        if current:
            lines.append(current)
        current = ""
        for char in token:  # only a token wider than the line reaches past its first char
            if current and _width(current + char) > _WIDTH:
                lines.append(current)
                current = ""
            current += char
    return lines + [current]


def _latin1(texts) -> bool:
    return all(ord(char) < 0x80 or 0xA0 <= ord(char) < 0x100 for text in texts for char in text)


def page_lines(texts: list[str]) -> list[list[str]]:
    """The lines each output page carries: wrapped to the width, 52 per page."""
    plain = _latin1(texts)
    pages = []
    for text in texts:
        lines = []
        for raw in text.splitlines() or [""]:
            if plain:  # the historical layout: 90 characters, never inside a code
                lines.extend(textwrap.wrap(raw, _LINE_WIDTH, break_long_words=False,
                                           break_on_hyphens=False) or [""])
            else:
                lines.extend(_wrap(raw))
        for start in range(0, max(len(lines), 1), _LINES_PER_PAGE):
            pages.append(lines[start:start + _LINES_PER_PAGE])
    return pages


def pdf_bytes(texts: list[str]) -> bytes:
    """Render one page per text (more if a text overflows); same input, same bytes.

    No dates, no producer, no random ``/ID``: empty metadata and
    ``no_new_id=True``, so the bytes depend on the texts and the MuPDF version only.
    """
    pymupdf = mupdf()
    plain = _latin1(texts)
    doc = pymupdf.open()
    try:
        for lines in page_lines(texts):
            page = doc.new_page(width=595, height=842)
            if not any(line.strip() for line in lines):
                continue
            if plain:
                page.insert_text((_LEFT, _TOP), "\n".join(lines), fontsize=_FONT_SIZE,
                                 lineheight=_LEADING / _FONT_SIZE, fontname="helv")
                continue
            writer = pymupdf.TextWriter(page.rect)
            for row, line in enumerate(lines):
                point = pymupdf.Point(_LEFT, _TOP + row * _LEADING)
                for (_, source, rtl), text in runs(line):
                    _, point = writer.append(point, text, font=_font(source), fontsize=_FONT_SIZE,
                                             right_to_left=rtl)
            writer.write_text(page)
        if not plain:
            doc.subset_fonts()  # embed only the glyphs used
        doc.set_metadata({})
        return doc.tobytes(garbage=4, deflate=True, no_new_id=True)
    finally:
        doc.close()


def _shown(char: str) -> bool:
    """Not a control, format, surrogate, private-use or unassigned character."""
    return unicodedata.category(char)[0] != "C"


def _visible(text: str) -> str:
    """NFKC, without whitespace and the characters ``_shown`` leaves out: what a reader sees."""
    return "".join(char for char in unicodedata.normalize("NFKC", text)
                   if not char.isspace() and _shown(char))


def _rtl(text: str) -> bool:
    return any(unicodedata.bidirectional(char) in ("R", "AL") for char in text)


def _named(counter: Counter) -> str:
    return ", ".join(f"{char!r} (U+{ord(char):04X}) x{count}" for char, count in sorted(counter.items()))


def extracted_lines(page) -> list[str]:
    """The page's text as lines: spans grouped by baseline, left to right."""
    rows = {}
    for block in page.get_text("dict")["blocks"]:
        for line in block.get("lines", ()):
            for span in line["spans"]:
                rows.setdefault(round(span["origin"][1]), []).append((span["origin"][0], span["text"]))
    return ["".join(text for _, text in sorted(spans)) for _, spans in sorted(rows.items())]


def check(data: bytes, texts: list[str]) -> None:
    """Extract ``data`` again and compare it with ``texts``, as the module docstring says.

    Raises:
        PermanentError: characters lost (named, with counts), or text changed.
    """
    pymupdf = mupdf()
    expected_pages = page_lines(texts)
    with pymupdf.open(stream=data, filetype="pdf") as doc:
        got_pages = [extracted_lines(page) for page in doc]
    want_all, got_all, first = Counter(), Counter(), None
    for number, (want, got) in enumerate(zip(expected_pages, got_pages, strict=False), start=1):
        want = [v for v in map(_visible, want) if v]
        got = [v for v in map(_visible, got) if v]
        want_all.update("".join(want))
        got_all.update("".join(got))
        for row, (a, b) in enumerate(zip(want, got), start=1):
            same = Counter(a) == Counter(b) if _rtl(a) else a == b
            if not same and first is None:
                first = f"page {number} line {row}: expected {a!r}, got {b!r}"
        if len(want) != len(got) and first is None:
            first = f"page {number}: expected {len(want)} lines, got {len(got)}"
    if len(expected_pages) != len(got_pages):
        first = first or f"expected {len(expected_pages)} pages, got {len(got_pages)}"
    lost = want_all - got_all
    if lost:
        raise PermanentError(f"rendered output lost characters: {_named(lost)}")
    if first:
        raise PermanentError(f"rendered output differs from the translation: {first}")
