"""The real document work: poison preflight, page text, "translation", PDF output.

Preflight (``preflight.py``) reads MuPDF's own warnings page by page; image
pages are read by Tesseract (``ocr.py``); outputs keep every script and are
checked by extracting them again (``render.py``); scans for fixtures are made
by ``scans.py`` and the corpus by ``corpus.py``.

PyMuPDF is imported lazily, inside the functions that need it, so importing
this module stays cheap for the CLI, the ledger and the checker.

The "translation" is simple and deterministic: model codes (``XR-2040``,
``INV-00231``) and numbers (``1,234.50``, ``2024-03-15``) are *protected* and
copied verbatim; words in the target glossary are translated (capitalisation
kept); every other word is upper-cased ("not in the glossary"). ``process``
counts protected tokens before and after and refuses to call a result done
when they differ; the option ``{"drop_codes": true}`` drops model codes on
purpose so tests exercise that check honestly. Option keys other than
``target``, ``drop_codes``, ``page`` and the OCR route's ``ocr_language`` and
``ocr_engine`` are part of the request identity only.
"""

import errno
import hashlib
import os
import re
import stat
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from toolkit.documents.preflight import PAGE_KINDS, Preflight, page_count, preflight  # noqa: F401
from toolkit.documents.preflight import mupdf as _mupdf, one_at_a_time
from toolkit.documents.ocr import routed as ocr_routed
from toolkit.documents.ocr import routes as ocr_routes
from toolkit.documents.render import check as check_rendered, pdf_bytes
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


@dataclass(frozen=True, slots=True)
class Artifact:
    """A written output file, identified by its size and SHA-256."""

    path: str
    size: int
    sha256: str


PDF_MAGIC = b"%PDF-"  # how every PDF file begins


def is_input_entry(path, name: str) -> bool:
    """The one rule for which entries of an inputs folder are inputs (``run``'s scan and
    ``audit --inputs`` both ask it): a name ending ``.pdf`` in any case, of any file type
    (an odd one is then quarantined with its reason, never silently skipped), or a regular
    file (a symlink followed) whose content begins ``%PDF-``. Opened ``O_NONBLOCK`` and
    judged by ``fstat`` of that descriptor: a FIFO or a device never blocks the open, and
    what is read is what was checked."""
    if name.lower().endswith(".pdf"):
        return True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(PDF_MAGIC)) == PDF_MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


@one_at_a_time
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


def temp_prefix(target) -> str:
    """The prefix of a temp file beside ``target``: short whatever ``target``'s name is
    (``.tmp-<12 hex of the name>-``), so a long output name never makes its temp name
    too long; the hex tells which target a leftover temp file was for."""
    name = os.fsencode(Path(target).name)
    return f".tmp-{hashlib.sha256(name).hexdigest()[:12]}-"


def write_atomic(data: bytes, out_path, prefix: str | None = None) -> Path:
    """Write ``data`` to a temp file beside ``out_path``, fsync, rename over it.
    ``prefix``: the temp's name (default ``temp_prefix``), e.g. one that names its owner."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix or temp_prefix(out_path), suffix=".tmp",
                               dir=out_path.parent)
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


def source_texts(path, kinds, options: dict) -> list[str]:
    """The text of each page (with ``options["page"]``, of that page only): the text
    layer of text and blank pages, Tesseract's reading of image pages (``kinds`` from preflight).

    Raises:
        PermanentError: MuPDF cannot read a page, or OCR refuses (see ``ocr.page_text``).
    """
    from toolkit.documents import ocr

    pymupdf = _mupdf()
    page = options.get("page")
    try:
        with pymupdf.open(path, filetype="pdf") as doc:
            numbers = [page] if page is not None else range(1, doc.page_count + 1)
            return [ocr.page_text(doc[n - 1], options) if kind == "image" else doc[n - 1].get_text()
                    for n, kind in zip(numbers, kinds, strict=True)]
    except (PermanentError, RuntimeError):
        raise
    except Exception as exc:  # FileDataError, a page MuPDF cannot interpret, ...
        raise PermanentError(f"cannot read {Path(path).name}: {exc}") from exc


@one_at_a_time
def process(input_path, output_path, options: dict) -> Artifact:
    """Preflight, extract (OCR for image pages), translate, check, render atomically.

    With ``options["page"] = n`` only page n (1-based) is processed: one unit
    of a document processed page by page. Two checks guard ``done``: the
    translation keeps every protected token, and the rendered output, read
    back, carries the whole translation (``render.check``). Nothing is written
    unless every check passed; a failed call leaves ``output_path`` as it was.

    Raises:
        PermanentError: poison input (with the preflight reason), a page the
            document does not have, unsupported target, OCR refused, or a
            translation or rendering that lost tokens or characters.
    """
    page = options.get("page")
    if page is not None and (not isinstance(page, int) or isinstance(page, bool) or page < 1):
        raise PermanentError(f"no page {page!r}: pages are numbered from 1")
    verdict = preflight(input_path, page)
    if not verdict.ok:  # a page the document lacks is a bad request, not poison
        raise PermanentError(verdict.reason if verdict.reason.startswith("no-page")
                             else f"poison input: {verdict.reason}")
    source = source_texts(input_path, verdict.kinds, options)
    translated = [translate(text, options) for text in source]
    lost = lost_tokens("\n".join(source), "\n".join(translated))
    if lost:
        raise PermanentError(f"translation lost protected tokens: {_show(lost)}")
    data = pdf_bytes(translated)
    check_rendered(data, translated)
    write_atomic(data, output_path)
    return Artifact(str(output_path), len(data), hashlib.sha256(data).hexdigest())


@one_at_a_time
def joined(parts) -> bytes:
    """PDFs (paths, or bytes already in memory) joined in order: the bytes ``concat`` writes.

    Raises:
        FileNotFoundError: a part's file is gone (an ``OSError``, not MuPDF's RuntimeError:
            a file deleted under a run is a storage fault its callers already answer).
    """
    pymupdf = _mupdf()
    doc = pymupdf.open()
    try:
        for part in parts:
            source = {"stream": part} if isinstance(part, bytes) else {"filename": part}
            try:
                src = pymupdf.open(filetype="pdf", **source)
            except pymupdf.FileNotFoundError as exc:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT),
                                        str(part)) from exc
            with src:
                doc.insert_pdf(src)
        doc.set_metadata({})
        return doc.tobytes(garbage=4, deflate=True, no_new_id=True)
    finally:
        doc.close()


def concat(parts, out_path) -> Artifact:
    """Join PDFs in order into ``out_path`` (atomically); same parts, same bytes.

    Raises:
        FileNotFoundError: a part's file is gone (``joined``).
    """
    data = joined(parts)
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
