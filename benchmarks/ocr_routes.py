"""Section 9: real documents -- pages/s on the text route and the OCR route, OCR accuracy.

The same generated invoice and contract pages, processed by ``documents.process``
(preflight, extraction, translation, rendering, the whole-text check):

* text route: a document of ``cfg.long_pages`` text pages;
* OCR route: the same pages as a scan (``cfg.ocr_pages`` pages, 200 dpi,
  seeded noise and skew, half CCITT G4 bilevel and half grayscale JPEG),
  read by Tesseract;
* the character error rate of the OCR text against the ground truth, on the
  clean scans (noise sigma 6) and on noisy ones (sigma 25), untimed.
"""

import random
import time
from pathlib import Path

from measure import Figure, Row, interleave
from sections import log

CLEAN, NOISY = 6.0, 25.0


def _pages(count: int) -> list[str]:
    from toolkit.documents.corpus import _healthy_texts

    rng, pages = random.Random(9), []
    while len(pages) < count:
        pages += _healthy_texts(rng)
    return pages[:count]


def _cer_per_page(recognised, truth) -> list[float]:
    """Character error rate of each page, in %: Levenshtein distance / truth length."""
    import Levenshtein

    pairs = [(" ".join(a.split()), " ".join(b.split())) for a, b in zip(recognised, truth, strict=True)]
    return [100 * Levenshtein.distance(a, b) / len(b) for a, b in pairs]


def document_routes(cfg, folder: Path) -> list[Row]:
    from toolkit.documents import ocr_routed, pdf_bytes, process, source_texts
    from toolkit.documents.scans import document_bytes

    work = folder / "routes"
    work.mkdir(parents=True, exist_ok=True)
    text_pages, scan_pages = _pages(cfg.long_pages), _pages(cfg.ocr_pages)
    kinds = ["bilevel" if n % 2 == 0 else "gray" for n in range(len(scan_pages))]
    (work / "text.pdf").write_bytes(pdf_bytes(text_pages))
    for name, noise in (("clean", CLEAN), ("noisy", NOISY)):
        (work / f"{name}.pdf").write_bytes(document_bytes(list(zip(scan_pages, kinds)), 9, noise))

    def route(name, pages):
        def go():
            path = work / f"{name}.pdf"
            started = time.perf_counter()
            process(path, work / f"out-{name}.pdf", ocr_routed(path, {"target": "de"}))
            return pages / (time.perf_counter() - started)
        return go

    def accuracy(name):  # deterministic: measured once, one sample per page
        path = work / f"{name}.pdf"
        options = ocr_routed(path, {"target": "de"})
        return _cer_per_page(source_texts(path, ("image",) * len(scan_pages), options), scan_pages)

    log(f"9 pages/s: {len(text_pages)} text pages vs {len(scan_pages)} scanned pages (Tesseract)")
    r = interleave(cfg.heavy_reps, {"text": route("text", len(text_pages)),
                                    "ocr": route("clean", len(scan_pages))})
    cer = {name: accuracy(name) for name in ("clean", "noisy")}
    for path in work.iterdir():
        path.unlink()
    work.rmdir()
    return [Row("9", f"text route: pages/s ({len(text_pages)} text pages, real PDF work)",
                Figure(r["text"], "/s")),
            Row("9", f"OCR route: pages/s ({len(scan_pages)} scanned pages, Tesseract, 200 dpi)",
                Figure(r["ocr"], "/s")),
            Row("9", "  OCR character error rate per page (%), clean scans (noise sigma 6)",
                Figure(cer["clean"], "")),
            Row("9", "  OCR character error rate per page (%), noisy scans (noise sigma 25)",
                Figure(cer["noisy"], ""))]
