"""Scanned documents for fixtures: text rendered to an image, degraded, stored image-only.

A scan page is the page ``pdf_bytes`` would write for its text, rendered at
``SCAN_DPI`` in grayscale, turned by a slight seeded skew, with seeded
Gaussian noise, then stored as the only content of a page, in one of two
forms real scanners produce:

``bilevel``  1 bit per pixel, CCITT Group 4 (``/CCITTFaxDecode``), as fax and
             office scanners write it (thresholded after the noise);
``gray``     8-bit grayscale JPEG (``/DCTDecode``).

The text is the ground truth OCR is measured against. Same texts and seed,
same bytes (for the same PyMuPDF, Pillow and libjpeg). Pillow and NumPy are
imported here only, on first use.
"""

import io
import random

from toolkit.documents.preflight import mupdf
from toolkit.documents.render import pdf_bytes

SCAN_DPI = 200
SCAN_KINDS = ("bilevel", "gray")
_THRESHOLD, _JPEG_QUALITY, _MAX_SKEW = 160, 50, 1.0  # skew in degrees, either way


def scan_image(text: str, rng: random.Random, noise: float):
    """The grayscale Pillow image of ``text``'s page: 200 dpi, skewed, with noise (sigma)."""
    import numpy
    from PIL import Image

    pymupdf = mupdf()
    with pymupdf.open(stream=pdf_bytes([text]), filetype="pdf") as doc:
        pix = doc[0].get_pixmap(dpi=SCAN_DPI, colorspace=pymupdf.csGRAY)
        image = Image.frombytes("L", (pix.width, pix.height), pix.samples)
    image = image.rotate(rng.uniform(-_MAX_SKEW, _MAX_SKEW), resample=Image.Resampling.BICUBIC,
                         fillcolor=255)
    pixels = numpy.asarray(image, dtype=numpy.float32)
    pixels += numpy.random.default_rng(rng.getrandbits(32)).normal(0.0, noise, pixels.shape)
    return Image.fromarray(numpy.clip(pixels, 0, 255).astype(numpy.uint8), "L")


def _g4(image) -> tuple[bytes, int, int]:
    """CCITT Group 4 data of ``image`` thresholded to 1 bit: one TIFF strip, cut out."""
    from PIL import Image

    bilevel = image.point(lambda v: 255 if v > _THRESHOLD else 0).convert("1")
    buffer = io.BytesIO()
    bilevel.save(buffer, "TIFF", compression="group4", tiffinfo={278: bilevel.height})
    with Image.open(io.BytesIO(buffer.getvalue())) as tiff:
        offset, count = tiff.tag_v2[273][0], tiff.tag_v2[279][0]
    return buffer.getvalue()[offset:offset + count], bilevel.width, bilevel.height


def add_scan_page(doc, image, kind: str) -> None:
    """Append a page (A4) whose only content is ``image``, stored as ``kind``."""
    page = doc.new_page(width=595, height=842)
    if kind == "gray":
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=_JPEG_QUALITY)
        page.insert_image(page.rect, stream=buffer.getvalue())
        return
    if kind != "bilevel":
        raise ValueError(f"scan kind {kind!r}; known: {SCAN_KINDS}")
    data, width, height = _g4(image)
    xref = doc.get_new_xref()
    doc.update_object(xref, f"<</Type/XObject/Subtype/Image/Width {width}/Height {height}"
                            "/BitsPerComponent 1/ColorSpace/DeviceGray>>")
    doc.update_stream(xref, data, compress=False)
    # After update_stream, which resets the filter: the bytes are already G4.
    doc.xref_set_key(xref, "Filter", "/CCITTFaxDecode")
    doc.xref_set_key(xref, "DecodeParms", f"<</K -1/Columns {width}/Rows {height}>>")
    page.insert_image(page.rect, xref=xref)


def document_bytes(pages, seed: int, noise: float = 6.0) -> bytes:
    """A PDF from ``pages``, each ``(text, kind)``: ``kind`` is ``"text"`` (a text layer,
    as ``pdf_bytes`` writes it) or a scan kind. Same arguments, same bytes."""
    pymupdf = mupdf()
    rng = random.Random(f"scan-{seed}")
    doc = pymupdf.open()
    try:
        for text, kind in pages:
            if kind == "text":
                with pymupdf.open(stream=pdf_bytes([text]), filetype="pdf") as single:
                    doc.insert_pdf(single)
            else:
                add_scan_page(doc, scan_image(text, rng, noise), kind)
        doc.set_metadata({})
        return doc.tobytes(garbage=4, deflate=True, no_new_id=True)
    finally:
        doc.close()
