"""Snapshot mode's other saving: work that is the same at every crash point is done once.

Two computations cost most of a crash point once the prefix is no longer
replayed, and neither is what the exploration tests:

* the fake provider's work (``documents.process``: extract, translate, render
  and check a PDF). It is a pure function of the input's bytes and the options:
  the same bytes come out every time (PyMuPDF writes no timestamp). The first
  child to need a result computes it for real and files a copy in the
  exploration's cache folder, named by the SHA-256 of its input bytes and
  options; every later call writes the same bytes to the same destination with
  the same atomic write (temp file, fsync, rename, folder fsync). The
  provider's database, its call log and its steps are unchanged: only the CPU
  time of rendering goes. A call that fails (poison input) is never cached.
* the oracle's preflight of the (read-only) inputs, for ``collect_history``:
  done once in the exploring process, before any fork, and looked up by the
  judge of each point.

The client's own code (its preflight, hashing, ledger) runs in full at every
point. Both are installed only in forked children (the point's supervisor and
the runs it forks), never in the exploring process.
"""

import hashlib
import json
import os
from pathlib import Path

from toolkit import documents


def provider_work(cache: Path) -> None:
    """In this (forked) process, make ``documents.process`` compute each result once."""
    real = documents.process

    def process(input_path, output_path, options):
        key = hashlib.sha256(Path(input_path).read_bytes())
        key.update(json.dumps(options, sort_keys=True).encode())
        entry = Path(cache) / f"{key.hexdigest()}.pdf"
        try:
            data = entry.read_bytes()
        except FileNotFoundError:
            artifact = real(input_path, output_path, options)  # raises: nothing is cached
            _file(entry, Path(artifact.path).read_bytes())
            return artifact
        documents.write_atomic(data, output_path)
        return documents.Artifact(str(output_path), len(data), hashlib.sha256(data).hexdigest())
    documents.process = process


def _file(entry: Path, data: bytes) -> None:
    """File a result whole or not at all: two children may race to file the same one."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, entry)


def input_checks(inputs) -> dict:
    """What the oracle asks of each input: its preflight verdict and its OCR routing.

    Computed in the exploring process, before any fork.
    """
    return {Path(path): (documents.preflight(path), documents.ocr_routed(path, {}))
            for path in inputs}


def judge_with(checks: dict) -> None:
    """In this (forked) supervisor, before judging: answer for the inputs from ``checks``."""
    preflight, ocr_routed = documents.preflight, documents.ocr_routed

    def cached_preflight(path, *args, **kwargs):
        if not args and not kwargs and Path(path) in checks:
            return checks[Path(path)][0]
        return preflight(path, *args, **kwargs)

    def cached_ocr_routed(path, options):
        if not options and Path(path) in checks:
            return dict(checks[Path(path)][1])
        return ocr_routed(path, options)
    documents.preflight, documents.ocr_routed = cached_preflight, cached_ocr_routed
