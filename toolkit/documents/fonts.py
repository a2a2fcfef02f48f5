"""Which installed font draws a character: a preferred chain, then every Noto font by coverage.

``FONT_CHAIN`` is tried first, in order (Noto Sans for Latin, Greek and
Cyrillic; Arabic, Hebrew, maths and symbols; MuPDF's built-in Droid Sans
Fallback for CJK). A character none of them has goes to the other installed
Noto fonts (``fonts-noto-core``: Thai, Devanagari, Armenian, Ethiopic, ...;
then ``fonts-noto-cjk``'s Noto Sans CJK), Sans before Serif, each asked once for its whole cmap (``Font.valid_codepoints``)
and only when a character needs it: a Latin text never loads them. Answers
are cached per character, and so are advance widths (measuring a line is then
a sum of cached numbers, not a MuPDF call per character).

Characters nobody sees (control, format, surrogate, private-use, unassigned:
Unicode category C; and variation selectors) are neither drawn nor compared (``shown``).
Nothing beyond U+FFFF is drawn (see ``font_for``). No installed font has emoji (no ``fonts-noto-color-emoji``; its colour bitmaps
could not be embedded as a text font anyway): they are "not covered", so a
document with emoji is refused by preflight before it is sent (``uncovered``).
PyMuPDF is imported on first use.
"""

import unicodedata
from collections import Counter
from functools import cache
from pathlib import Path

NOTO = Path("/usr/share/fonts/truetype/noto")
NOTO_CJK = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")  # fonts-noto-cjk
# (name, font file or MuPDF built-in name, right-to-left), tried in order for each character.
FONT_CHAIN = (("NotoSans", NOTO / "NotoSans-Regular.ttf", False),
              ("NotoSansArabic", NOTO / "NotoSansArabic-Regular.ttf", True),
              ("NotoSansHebrew", NOTO / "NotoSansHebrew-Regular.ttf", True),
              ("NotoSansMath", NOTO / "NotoSansMath-Regular.ttf", False),
              ("NotoSansSymbols", NOTO / "NotoSansSymbols-Regular.ttf", False),
              ("NotoSansSymbols2", NOTO / "NotoSansSymbols2-Regular.ttf", False),
              ("cjk", "cjk", False))
FONT_SIZE = 10


@cache
def font(source):
    """A loaded font, or None when its file is not installed (the chain skips it)."""
    import pymupdf

    if isinstance(source, str):
        return pymupdf.Font(source)
    return pymupdf.Font(fontfile=str(source)) if source.is_file() else None


@cache
def _coverage(source) -> frozenset:
    """Every code point ``source`` has a glyph for: its cmap, read once."""
    loaded = font(source)
    return frozenset(loaded.valid_codepoints()) if loaded is not None else frozenset()


def _right_to_left(points: frozenset) -> bool:
    """A font for a right-to-left script: most of its non-Latin letters are R or AL."""
    letters = [p for p in points if p >= 0x370 and unicodedata.category(chr(p))[0] == "L"]
    rtl = sum(unicodedata.bidirectional(chr(p)) in ("R", "AL") for p in letters)
    return bool(letters) and rtl > len(letters) / 2


@cache
def _installed() -> tuple:
    """The other installed Noto Regular fonts, Sans, then Serif, then the rest, by name,
    then Noto Sans CJK: ``(name, path)`` pairs; nothing is loaded here."""
    chain = {entry[1] for entry in FONT_CHAIN}
    paths = [p for p in NOTO.glob("Noto*-Regular.ttf") if p not in chain]
    order = {"NotoSans": 0, "NotoSerif": 1}
    paths.sort(key=lambda p: (next((v for k, v in order.items() if p.name.startswith(k)), 2), p.name))
    # Last: Noto Sans CJK (its first face), for what MuPDF's built-in CJK font lacks (Hangul
    # Jamo, CJK extensions).
    return tuple((p.name.removesuffix("-Regular.ttf"), p) for p in paths) + (("NotoSansCJK", NOTO_CJK),)


@cache
def font_for(char: str):
    """The font entry ``(name, source, right-to-left)`` that draws ``char``, or None.

    None also beyond the Basic Multilingual Plane (U+10000 and up: Linear B, maths
    alphanumerics, emoji): MuPDF writes a font's ToUnicode with 16 bits per character,
    so the output would carry U+0000 for U+10000 even with Noto Sans Linear B installed
    (measured with PyMuPDF 1.28.5); such text is refused at preflight, not lost at ``check``.
    """
    if ord(char) > 0xFFFF:
        return None
    for entry in FONT_CHAIN:
        loaded = font(entry[1])
        if loaded is not None and loaded.has_glyph(ord(char)):
            return entry
    for name, path in _installed():
        points = _coverage(path)
        if ord(char) in points:
            return (name, path, _right_to_left(points))
    return None


@cache
def advance(entry, char: str) -> float:
    """Advance width of ``char`` in ``entry``'s font at ``FONT_SIZE``."""
    return font(entry[1]).text_length(char, fontsize=FONT_SIZE)


def shown(char: str) -> bool:
    """Not a control, format, surrogate, private-use or unassigned character, nor a
    variation selector (it picks a glyph style, e.g. U+FE0F after an emoji; no glyph of its own)."""
    point = ord(char)
    if 0xFE00 <= point <= 0xFE0F or 0xE0100 <= point <= 0xE01EF:
        return False
    return unicodedata.category(char)[0] != "C"


def uncovered(text: str) -> Counter:
    """The characters of ``text`` a reader sees that no installed font draws, with counts."""
    counts = Counter(text)
    return Counter({char: n for char, n in counts.items()
                    if not char.isspace() and shown(char) and font_for(char) is None})
