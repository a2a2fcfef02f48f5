"""A deterministic test corpus: healthy invoices and contracts, long documents, poison,
scans (image-only pages), mixed documents (text, scanned and blank pages) and
multi-script documents (Greek, Cyrillic, Arabic, Hebrew, CJK, maths, currency).

Same arguments, same bytes (for the same MuPDF version): every value comes
from a seeded ``random.Random`` and ``pdf_bytes`` writes no dates or ids.
"""

import random
import re
from pathlib import Path

from toolkit.documents import pdf_bytes
from toolkit.documents.scans import SCAN_KINDS, document_bytes

POISON_KINDS = ("truncated", "damaged", "not-pdf", "spliced")
"""Poison file ``poison-NNN.pdf`` has kind ``POISON_KINDS[NNN % 4]``."""

_CUSTOMERS = ("Acme Industrial GmbH", "Borealis Trading Ltd", "Nordlicht Werke AG",
              "Harbor Logistics Inc", "Castell Medical SE", "Vireo Systems BV")
_PARTS = ("pump housing", "control board", "drive belt", "sensor array", "valve kit",
          "cooling fan", "power supply", "service hours")
_CLAUSES = ("Delivery within {d} days of the order date.",
            "Payment terms net {d} days, amount due in EUR.",
            "Warranty for model {code} is {m} months from delivery.",
            "The supplier provides spare parts for model {code} for {y} years.",
            "Service rate {p} EUR per hour, invoice monthly.")


def _code(rng):
    return f"{rng.choice('ABKMRSTX')}{rng.choice('BCKLRTX')}-{rng.randint(100, 9999)}"


def _money(rng):
    cents = rng.randint(100, 4_800_000)
    return f"{cents // 100:,}.{cents % 100:02d}"


def _invoice_pages(rng, pages):
    number, customer = f"INV-{rng.randint(1, 99999):05d}", rng.choice(_CUSTOMERS)
    date = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    out = []
    for page in range(1, pages + 1):
        lines = [f"Invoice {number}  page {page} of {pages}", f"Customer: {customer}", f"Date: {date}", ""]
        for item in range(rng.randint(3, 9)):
            lines.append(f"Item {item + 1}: model {_code(rng)} {rng.choice(_PARTS)}, "
                         f"quantity {rng.randint(1, 40)}, unit price {_money(rng)} EUR")
        lines += ["", f"Total amount due: {_money(rng)} EUR"]
        out.append("\n".join(lines))
    return out


def _contract_pages(rng, pages):
    number = f"CTR-{rng.randint(1, 9999):04d}"
    a, b = rng.sample(_CUSTOMERS, 2)
    out = []
    for page in range(1, pages + 1):
        lines = [f"Contract {number}  page {page} of {pages}", f"Between {a} and {b}", ""]
        for clause in range(rng.randint(3, 7)):
            text = rng.choice(_CLAUSES).format(d=rng.choice((14, 30, 45, 60)), code=_code(rng),
                                               m=rng.choice((12, 24, 36)), y=rng.randint(2, 10),
                                               p=_money(rng))
            lines.append(f"{page}.{clause + 1} {text}")
        out.append("\n".join(lines))
    return out


_SCRIPT_LINES = (
    "Τιμολόγιο {inv}: σύνολο {money} EUR, παράδοση σε {d} ημέρες για το μοντέλο {code}.",
    "Счёт-фактура {inv}: итого {money} EUR, поставка в течение {d} дней, модель {code}.",
    "فاتورة رقم {inv}: المبلغ الإجمالي {money} يورو، التسليم خلال {d} يوما.",
    "חשבונית {inv}: הסכום הכולל {money} אירו, אספקה תוך {d} ימים.",
    "发票 {inv}：总金额 {money} 欧元，{d} 天内交货，型号 {code}。",
    "請求書 {inv}：合計 {money} ユーロ、納期 {d} 日。",
    "Σ qty × price = {money} € ≈ {d} £ ¥ ₹ ₽ ₩; ∫ f(x) dx ≤ ∞, √2 ≠ π, ± {d} %, ∀x ∈ ℝ.",
    "“Quoted” terms – en dash — em dash … ‰ • № {inv} ½ ¾ fiﬁ ligature.",
)


def script_texts(rng, pages: int = 2) -> list[str]:
    """Pages of multi-script text: every line of ``_SCRIPT_LINES`` with seeded codes and numbers."""
    out = []
    for page in range(1, pages + 1):
        lines = [f"Page {page} of {pages}"]
        for line in _SCRIPT_LINES:
            lines.append(line.format(inv=f"INV-{rng.randint(1, 99999):05d}", money=_money(rng),
                                     d=rng.choice((14, 30, 45, 60)), code=_code(rng)))
        out.append("\n".join(lines))
    return out


def scan_pages(seed: int, index: int, mixed: bool = False) -> list[tuple[str, str]]:
    """The pages of scan (or mixed) document ``index``: ``(ground-truth text, kind)`` each.

    A scan has 1-2 image pages, bilevel (CCITT G4) for even ``index``, grayscale
    JPEG for odd. A mixed document has a text page, a bilevel scanned page and,
    for even ``index``, a blank page (a blank page is content, not poison).
    """
    rng = random.Random(f"{'mixed' if mixed else 'scan'}-{seed}-{index}")
    texts = _healthy_texts(rng)
    if mixed:
        pages = [(texts[0], "text"), (_invoice_pages(rng, 1)[0], "bilevel")]
        return pages + [("", "text")] if index % 2 == 0 else pages
    kind = SCAN_KINDS[index % len(SCAN_KINDS)]
    return [(text, kind) for text in texts[:2]]


def _healthy_texts(rng):
    pages = rng.randint(1, 4)
    return (_invoice_pages if rng.random() < 0.5 else _contract_pages)(rng, pages)


def _poison_bytes(kind, rng):
    data = pdf_bytes(_healthy_texts(rng))
    if kind == "truncated":  # cut in half: MuPDF would silently repair it
        return data[: len(data) // 2]
    if kind == "spliced":  # middle third gone, head and tail intact: passes the tail check
        third = len(data) // 3
        return data[:third] + data[2 * third:]
    if kind == "damaged":  # 8 bytes overwritten inside a compressed content stream
        return damage_stream(data, rng)
    return b"<html><body><h1>502 Bad Gateway</h1></body></html>\n"  # not-pdf


def streams(data: bytes) -> list[tuple[int, int]]:
    """``(start, end)`` byte ranges of the stream bodies of a PDF written by ``pdf_bytes``."""
    return [(m.end(), data.index(b"endstream", m.end()))
            for m in re.finditer(rb"(?<!end)stream\r?\n", data)]


def damage_stream(data: bytes, rng, length: int = 8) -> bytes:
    """``data`` with ``length`` seeded bytes overwritten at a seeded offset inside a stream.

    MuPDF opens such a file without complaint (the xref is intact) and reads
    what it can of the stream: the damage shows only as warnings on the page.
    """
    start, end = rng.choice([span for span in streams(data) if span[1] - span[0] > 2 * length])
    offset = rng.randrange(start + length, end - length)
    return data[:offset] + bytes(rng.randrange(256) for _ in range(length)) + data[offset + length:]


def make_corpus(out_dir, docs: int = 30, poison: int = 3, seed: int = 0, *,
                long_docs: int = 0, long_pages: int = 6, scans: int = 0, mixed: int = 0,
                scripts: int = 0) -> list[Path]:
    """Write ``doc-NNN.pdf`` (healthy, 1-4 pages), ``long-NNN.pdf``, ``poison-NNN.pdf``,
    and ``scan-NNN.pdf``, ``mixed-NNN.pdf`` (``scan_pages``), ``script-NNN.pdf`` (``script_texts``).

    Same arguments, same bytes (and the same MuPDF version). Long documents
    are healthy, with ``long_pages`` pages each, drawn from their own seeded
    stream so that adding them changes no other file; so are scans, mixed and
    multi-script documents. Poison kinds cycle
    through ``POISON_KINDS``. Only these names are written; other files in
    ``out_dir`` are left alone. Returns healthy paths, then long, poison, scans,
    mixed, multi-script.
    """
    if min(docs, poison, long_docs, scans, mixed, scripts) < 0 or long_pages < 1:
        raise ValueError("document counts must be >= 0, long_pages >= 1")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng, paths = random.Random(seed), []
    for index in range(docs):
        path = out_dir / f"doc-{index:03d}.pdf"
        path.write_bytes(pdf_bytes(_healthy_texts(rng)))
        paths.append(path)
    long_rng = random.Random(f"long-{seed}")
    for index in range(long_docs):
        path = out_dir / f"long-{index:03d}.pdf"
        make = _invoice_pages if index % 2 == 0 else _contract_pages
        path.write_bytes(pdf_bytes(make(long_rng, long_pages)))
        paths.append(path)
    for index in range(poison):
        path = out_dir / f"poison-{index:03d}.pdf"
        path.write_bytes(_poison_bytes(POISON_KINDS[index % len(POISON_KINDS)], rng))
        paths.append(path)
    for prefix, count in (("scan", scans), ("mixed", mixed)):
        for index in range(count):
            path = out_dir / f"{prefix}-{index:03d}.pdf"
            path.write_bytes(document_bytes(scan_pages(seed, index, prefix == "mixed"), seed))
            paths.append(path)
    for index in range(scripts):
        path = out_dir / f"script-{index:03d}.pdf"
        path.write_bytes(pdf_bytes(script_texts(random.Random(f"script-{seed}-{index}"))))
        paths.append(path)
    return paths
