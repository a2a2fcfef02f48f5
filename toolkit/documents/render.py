"""Output PDFs that keep every script, and the check that they did.

Text that is all Latin-1 is written as before, in the base-14 Helvetica
(``helv``): the same bytes as ever for the same texts. Anything else is cut
into runs of characters, each run set in the font ``fonts.font_for`` picks
(``FONT_CHAIN`` first: Noto for Latin, Greek, Cyrillic, Arabic, Hebrew, maths
and symbols, MuPDF's built-in Droid Sans Fallback for CJK; then any installed
Noto font whose cmap has it: Thai, Devanagari, Armenian, Ethiopic, ...),
embedded and subsetted. Glyphs are placed one after another, without
shaping: Indic vowel signs are not reordered, but every character is kept.
One output page per input page (a long page is set smaller). A character no font covers is a loss, and losses are caught by
``check``: the output's text, extracted again, must equal what was meant to
be written, after NFKC, line by line (exactly for left-to-right lines; as a
multiset of characters for lines with right-to-left script, whose extraction
order is not reliable). Whitespace and control characters take no part.
"""

import textwrap
import unicodedata
from collections import Counter

from toolkit.documents.fonts import FONT_CHAIN, FONT_SIZE as _FONT_SIZE, advance  # noqa: F401
from toolkit.documents.fonts import font as _font, font_for as _font_for, shown as _shown
from toolkit.documents.preflight import mupdf, one_at_a_time
from toolkit.errors import PermanentError

_LINE_WIDTH, _LINES_PER_PAGE, _LEADING = 90, 52, 13
_LEFT, _TOP, _WIDTH = 56, 72, 483  # A4 (595 x 842 pt) with 56 pt margins
# One output page per input page: a page with more than 52 lines is set smaller (font and
# leading scaled by 52 / lines), down to this scale (2 pt type on 2.6 pt leading, 260
# lines); only a page longer than that overflows onto a further page.
_MIN_SCALE = 0.2


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


def _measure(text: str, entry) -> tuple[float, tuple]:
    """``(width, last entry)`` of ``text`` at ``_FONT_SIZE`` after a run in ``entry`` (None at
    the start of a line): the fonts ``runs`` would choose, added up from cached advances.

    Raises:
        PermanentError: as ``runs``, for a character no installed font covers.
    """
    width = 0.0
    for char in text:
        if char.isspace():
            chosen = entry if entry is not None else _font_for(char)
        elif not _shown(char):
            continue
        else:
            chosen = _font_for(char)
        if chosen is None:
            runs(text)  # raises, naming every character of ``text`` no font covers
        width, entry = width + advance(chosen, char), chosen
    return width, entry


def _wrap(raw: str) -> list[str]:
    """Greedy wrap by measured width; a token wider than a line (CJK) breaks between characters.

    Each token is measured once and added to the width of the line so far (measuring
    the whole candidate line again per token was quadratic: 1 min of a 117-page run).
    """
    lines, current, width, entry = [], "", 0.0, None
    for token in raw.split(" "):
        candidate = f"{current} {token}" if current else token
        more, last = _measure(f" {token}" if current else token, entry)
        if width + more <= _WIDTH:
            current, width, entry = candidate, width + more, last
            continue
        if current:
            lines.append(current)
        current, width, entry = "", 0.0, None
        for char in token:  # only a token wider than the line reaches past its first char
            more, last = _measure(char, entry)
            if current and width + more > _WIDTH:
                lines.append(current)
                current, width, entry = "", 0.0, None
                more, last = _measure(char, None)
            current, width, entry = current + char, width + more, last
    return lines + [current]


def _latin1(texts) -> bool:
    return all(ord(char) < 0x80 or 0xA0 <= ord(char) < 0x100 for text in texts for char in text)


def page_lines(texts: list[str]) -> list[list[str]]:
    """The lines each output page carries: wrapped to the width, one page per text (set
    smaller when it has more than 52 lines, see ``_scale``; beyond 260 lines, split)."""
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
        most = int(_LINES_PER_PAGE / _MIN_SCALE)
        for start in range(0, max(len(lines), 1), most):
            pages.append(lines[start:start + most])
    return pages


def _scale(lines: list[str]) -> float:
    """1 for a page of at most 52 lines, else what fits them all on the page."""
    return min(1.0, _LINES_PER_PAGE / max(len(lines), 1))


@one_at_a_time
def pdf_bytes(texts: list[str]) -> bytes:
    """Render one page per text (more only past 260 lines); same input, same bytes.

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
            size = _FONT_SIZE * _scale(lines)
            if plain:
                page.insert_text((_LEFT, _TOP), "\n".join(lines), fontsize=size,
                                 lineheight=_LEADING / _FONT_SIZE, fontname="helv")
                continue
            writer = pymupdf.TextWriter(page.rect)
            for row, line in enumerate(lines):
                point = pymupdf.Point(_LEFT, _TOP + row * _LEADING * size / _FONT_SIZE)
                for (_, source, rtl), text in runs(line):
                    _, point = writer.append(point, text, font=_font(source), fontsize=size,
                                             right_to_left=rtl)
            writer.write_text(page)
        if not plain:
            doc.subset_fonts()  # embed only the glyphs used
        doc.set_metadata({})
        return doc.tobytes(garbage=4, deflate=True, no_new_id=True)
    finally:
        doc.close()


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


@one_at_a_time
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
