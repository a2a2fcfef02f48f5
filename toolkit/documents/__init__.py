"""The real document work: poison preflight, page text, "translation", PDF output.

PyMuPDF is imported lazily, inside the functions that need it, so importing
this module stays cheap for the CLI, the ledger and the checker.

The "translation" is simple and deterministic: model codes (``XR-2040``,
``INV-00231``) and numbers (``1,234.50``, ``2024-03-15``) are *protected* and
copied verbatim; words in the target glossary are translated (capitalisation
kept); every other word is upper-cased ("not in the glossary"). ``process``
counts protected tokens before and after and refuses to call a result done
when they differ; the option ``{"drop_codes": true}`` drops model codes on
purpose so tests exercise that check honestly. Option keys other than
``target`` and ``drop_codes`` are part of the request identity only.
"""

import hashlib
import os
import re
import tempfile
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import PermanentError

GLOSSARIES = {
    "de": {"invoice": "Rechnung", "contract": "Vertrag", "customer": "Kunde", "supplier": "Lieferant",
           "quantity": "Menge", "unit": "Einheit", "price": "Preis", "total": "Summe",
           "amount": "Betrag", "date": "Datum", "due": "fällig", "page": "Seite", "of": "von",
           "model": "Modell", "item": "Position", "delivery": "Lieferung", "payment": "Zahlung",
           "terms": "Bedingungen", "net": "netto", "days": "Tage", "within": "innerhalb",
           "warranty": "Garantie", "months": "Monate", "between": "zwischen", "and": "und",
           "for": "für", "order": "Bestellung", "tax": "Steuer", "the": "die", "parts": "Teile"},
    "fr": {"invoice": "facture", "contract": "contrat", "customer": "client", "price": "prix",
           "supplier": "fournisseur", "quantity": "quantité", "total": "total", "date": "date",
           "amount": "montant", "page": "page", "of": "de", "model": "modèle", "and": "et",
           "delivery": "livraison", "payment": "paiement", "days": "jours", "for": "pour"},
}

# A model code: 1-6 capitals, a hyphen, a digit, then more code characters.
# A number: digits with inner separators (1,234.50  2024-03-15  12/2024).
_PROTECTED = re.compile(r"\b[A-Z]{1,6}-\d[0-9A-Z]*(?:-[0-9A-Z]+)*\b|\d+(?:[.,/:-]\d+)*")
_CODE = re.compile(r"[A-Z]{1,6}-\d")
_WORD = re.compile(r"[^\W\d_]+")


_TAIL = 1024  # bytes searched for %%EOF / startxref, as PDF readers do
_LINE_WIDTH, _LINES_PER_PAGE, _FONT_SIZE, _LEADING = 90, 52, 10, 13


@dataclass(frozen=True, slots=True)
class Preflight:
    """Verdict of ``preflight``; ``reason`` is ``"<kind>: <detail>"`` when not ok."""

    ok: bool
    reason: str | None
    pages: int


@dataclass(frozen=True, slots=True)
class Artifact:
    """A written output file, identified by its size and SHA-256."""

    path: str
    size: int
    sha256: str


def _mupdf():
    """Import PyMuPDF on first use; keep its warnings in its buffer, not on stderr."""
    import pymupdf

    pymupdf.TOOLS.mupdf_display_errors(False)
    pymupdf.TOOLS.mupdf_display_warnings(False)
    return pymupdf


def preflight(path, page: int | None = None) -> Preflight:
    """Tell a healthy PDF from poison, cheaply, before the item is enqueued.

    With ``page`` (1-based), only that page's text is checked: the check of
    one page request, which must not cost a read of the whole document.

    Checks, in order: missing, empty, not-pdf (no ``%PDF-`` head), truncated
    (no ``%%EOF``/``startxref`` in the tail), unreadable, repaired (MuPDF had
    to rebuild the xref on open: it repairs silently, so we ask it),
    encrypted, zero-pages, blank-page (a page without text). Never raises for
    a bad file.
    """
    failure, doc = _open_sound(path)
    if failure is not None:
        return failure
    with doc:
        if doc.needs_pass or doc.is_encrypted:
            return Preflight(False, "encrypted: password protected", doc.page_count)
        pages = doc.page_count
        if pages == 0:
            return Preflight(False, "zero-pages: the document has no pages", 0)
        for number in range(1, pages + 1) if page is None else (page,):
            if not 1 <= number <= pages:
                return Preflight(False, f"no-page: no page {number} in {pages} pages", pages)
            try:
                text = doc[number - 1].get_text()
            except Exception as exc:  # a page MuPDF cannot interpret: poison, not a crash
                return Preflight(False, f"unreadable: page {number}: {exc}", pages)
            if not text.strip():
                return Preflight(False, f"blank-page: page {number} has no text", pages)
    return Preflight(True, None, pages)


def page_count(path) -> int:
    """The page count ``preflight`` reports (0 for a file that is not a sound PDF),
    without reading any page's text: cheap enough to route every input of a rerun."""
    failure, doc = _open_sound(path)
    if failure is not None:
        return failure.pages
    with doc:
        return doc.page_count


def _open_sound(path):
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
    pymupdf = _mupdf()
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


def page_texts(path, page: int | None = None) -> list[str]:
    """The text of each page, in order (with ``page``, of that 1-based page only).

    Raises:
        PermanentError: MuPDF cannot open the file or read a page.
    """
    pymupdf = _mupdf()
    try:
        with pymupdf.open(path, filetype="pdf") as doc:
            if page is not None:
                return [doc[page - 1].get_text()]
            return [each.get_text() for each in doc]
    except Exception as exc:  # FileDataError, a page MuPDF cannot interpret, ...
        raise PermanentError(f"cannot read {Path(path).name}: {exc}") from exc


def protected_tokens(text: str) -> Counter:
    """Count the model codes and numbers a translation must keep verbatim.

    >>> sorted(protected_tokens("Model XR-2040, qty 3, total 1,234.50").items())
    [('1,234.50', 1), ('3', 1), ('XR-2040', 1)]
    """
    return Counter(_PROTECTED.findall(text))


def lost_tokens(source: str, result: str) -> Counter:
    """Protected tokens of ``source`` missing (or fewer) in ``result``."""
    return protected_tokens(source) - protected_tokens(result)


def _translate_word(match, glossary):
    word = match.group(0)
    found = glossary.get(word.lower())
    if found is None:
        return word.upper()
    return found[:1].upper() + found[1:] if word[:1].isupper() else found


def translate(text: str, options: dict) -> str:
    """Deterministic glossary "translation" that keeps codes and numbers.

    Options: ``target`` (``"de"`` default, or ``"fr"``); ``drop_codes``
    (test hook: deletes model codes, a deliberately lossy translation).

    Raises:
        PermanentError: unsupported target language (a business rejection).

    >>> translate("Invoice INV-00231 total 12.50 EUR", {"target": "de"})
    'Rechnung INV-00231 Summe 12.50 EUR'
    """
    target = options.get("target", "de")
    glossary = GLOSSARIES.get(target)
    if glossary is None:
        raise PermanentError(f"unsupported target language {target!r}; known: {sorted(GLOSSARIES)}")
    drop = bool(options.get("drop_codes", False))
    out, last = [], 0
    for match in _PROTECTED.finditer(text):
        out.append(_WORD.sub(lambda m: _translate_word(m, glossary), text[last:match.start()]))
        token = match.group(0)
        out.append("" if drop and _CODE.match(token) else token)
        last = match.end()
    out.append(_WORD.sub(lambda m: _translate_word(m, glossary), text[last:]))
    return "".join(out)


def _page_lines(texts):
    """Wrap each text to the page width and split overlong pages (never inside a code)."""
    pages = []
    for text in texts:
        lines = []
        for raw in text.splitlines() or [""]:
            lines.extend(textwrap.wrap(raw, _LINE_WIDTH, break_long_words=False,
                                       break_on_hyphens=False) or [""])
        for start in range(0, max(len(lines), 1), _LINES_PER_PAGE):
            pages.append(lines[start:start + _LINES_PER_PAGE])
    return pages


def pdf_bytes(texts: list[str]) -> bytes:
    """Render one page per text (more if a text overflows); same input, same bytes.

    No dates, no producer, no random ``/ID``: empty metadata and
    ``no_new_id=True``, so the bytes depend on the texts and the MuPDF version only.
    """
    pymupdf = _mupdf()
    doc = pymupdf.open()
    try:
        for lines in _page_lines(texts):
            page = doc.new_page(width=595, height=842)
            if any(line.strip() for line in lines):
                page.insert_text((56, 72), "\n".join(lines), fontsize=_FONT_SIZE,
                                 lineheight=_LEADING / _FONT_SIZE, fontname="helv")
        doc.set_metadata({})
        return doc.tobytes(garbage=4, deflate=True, no_new_id=True)
    finally:
        doc.close()


def temp_prefix(target) -> str:
    """The prefix of a temp file beside ``target``: short whatever ``target``'s name is
    (``.tmp-<12 hex of the name>-``), so a long output name never makes its temp name
    too long; the hex tells which target a leftover temp file was for."""
    name = os.fsencode(Path(target).name)
    return f".tmp-{hashlib.sha256(name).hexdigest()[:12]}-"


def write_atomic(data: bytes, out_path) -> Path:
    """Write ``data`` to a temp file beside ``out_path``, fsync, rename over it."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(out_path), suffix=".tmp", dir=out_path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, out_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(out_path.parent)  # make the rename itself durable
    return out_path


def fsync_dir(path) -> None:
    """fsync a folder: a file created or renamed in it keeps its name after a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def render(texts: list[str], out_path) -> Artifact:
    """Write the output PDF for ``texts`` atomically; return its artifact."""
    data = pdf_bytes(texts)
    write_atomic(data, out_path)
    return Artifact(str(out_path), len(data), hashlib.sha256(data).hexdigest())


def process(input_path, output_path, options: dict) -> Artifact:
    """Preflight, extract, translate, check protected tokens, render atomically.

    With ``options["page"] = n`` only page n (1-based) is processed: one unit
    of a document processed page by page. Nothing is written unless every
    check passed; a failed call leaves ``output_path`` as it was.

    Raises:
        PermanentError: poison input (with the preflight reason), a page the
            document does not have, unsupported target, or a translation or
            rendering that lost protected tokens.
    """
    page = options.get("page")
    if page is not None and (not isinstance(page, int) or isinstance(page, bool) or page < 1):
        raise PermanentError(f"no page {page!r}: pages are numbered from 1")
    verdict = preflight(input_path, page)
    if not verdict.ok:  # a page the document lacks is a bad request, not poison
        raise PermanentError(verdict.reason if verdict.reason.startswith("no-page")
                             else f"poison input: {verdict.reason}")
    source = page_texts(input_path, page)
    translated = [translate(text, options) for text in source]
    lost = lost_tokens("\n".join(source), "\n".join(translated))
    if lost:
        raise PermanentError(f"translation lost protected tokens: {_show(lost)}")
    data = pdf_bytes(translated)
    pymupdf = _mupdf()
    with pymupdf.open(stream=data, filetype="pdf") as rendered:
        lost = lost_tokens("\n".join(source), "\n".join(page.get_text() for page in rendered))
    if lost:
        raise PermanentError(f"rendered output lost protected tokens: {_show(lost)}")
    write_atomic(data, output_path)
    return Artifact(str(output_path), len(data), hashlib.sha256(data).hexdigest())


def concat(parts, out_path) -> Artifact:
    """Join PDFs in order into ``out_path`` (atomically); same parts, same bytes."""
    pymupdf = _mupdf()
    doc = pymupdf.open()
    try:
        for part in parts:
            with pymupdf.open(part, filetype="pdf") as src:
                doc.insert_pdf(src)
        doc.set_metadata({})
        data = doc.tobytes(garbage=4, deflate=True, no_new_id=True)
    finally:
        doc.close()
    write_atomic(data, out_path)
    return Artifact(str(out_path), len(data), hashlib.sha256(data).hexdigest())


def _show(counter: Counter) -> str:
    return ", ".join(f"{token} x{count}" for token, count in sorted(counter.items()))


def artifact_of(path) -> Artifact:
    """Size and SHA-256 of an existing file.

    Raises:
        FileNotFoundError: no such file.
    """
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return Artifact(str(path), size, digest.hexdigest())


def verify(path, size: int, sha256: str) -> bool:
    """True only if ``path`` exists with exactly this size and SHA-256; never raises for missing."""
    try:
        if os.stat(path).st_size != size:
            return False
        return artifact_of(path).sha256 == sha256
    except OSError:
        return False


# The corpus generator needs pdf_bytes above; it is re-exported here for callers.
from toolkit.documents.corpus import POISON_KINDS, make_corpus  # noqa: E402
