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
  While the serial recording runs, the exploring process files the later
  inputs' results (``prefile``), so the recording renders about half of them.
* the preflight and OCR routing of the inputs (``same_checks``): MuPDF reading
  a document, asked by the client at enqueue, by the provider and by the
  oracle's ``collect_history``. A pure function of the bytes: done once per
  input in the exploring process, before any fork, looked up by content.

The client's own protocol (hashing, private copies, ledger, provider calls,
recovery) runs in full at every point. Both are installed only in forked
children (the point's supervisor and the runs it forks), never in the
exploring process (``prefile`` calls the real ``documents.process`` there);
the real mode uses neither, and the test that compares the two modes'
verdicts at every point covers them.
"""

import hashlib
import json
import os
import signal
from pathlib import Path

from toolkit import documents


_INSTALLED = []  # the memo this process answers from: a supervisor runs several points


def install(memo) -> None:
    """``provider_work(memo[0])`` and ``same_checks(memo[1])`` in this (forked) process,
    once: a second install would wrap the wrappers."""
    if any(installed is memo for installed in _INSTALLED):
        return
    provider_work(memo[0])
    same_checks(memo[1])
    _INSTALLED.append(memo)


def provider_work(cache: Path) -> None:
    """In this (forked) process, make ``documents.process`` compute each result once."""
    real = documents.process
    filed = {}  # entry -> (bytes, SHA-256): a filed entry never changes, read it once here

    def process(input_path, output_path, options):
        entry = work_entry(cache, Path(input_path).read_bytes(), options)
        if entry not in filed:
            try:
                data = entry.read_bytes()
            except FileNotFoundError:
                artifact = real(input_path, output_path, options)  # raises: nothing is cached
                _file(entry, Path(artifact.path).read_bytes())
                return artifact
            filed[entry] = (data, hashlib.sha256(data).hexdigest())
        data, digest = filed[entry]
        documents.write_atomic(data, output_path)
        return documents.Artifact(str(output_path), len(data), digest)
    documents.process = process


def work_entry(cache, data: bytes, options: dict) -> Path:
    """Where the result of ``documents.process`` for input bytes ``data`` and ``options``
    is filed in the cache folder ``cache``."""
    key = hashlib.sha256(data)
    key.update(json.dumps(options, sort_keys=True).encode())
    return Path(cache) / f"{key.hexdigest()}.pdf"


def prefile(cache, inputs, table: dict, page_by_page_from=None) -> None:
    """In the exploring process while the recording runs: file the provider's work for
    the inputs after the first, the last first.

    The recording is serial and rendering was most of it. It takes the inputs
    first to last and finds filed what this did meanwhile, last to first (a
    race on one input costs a second rendering of the same bytes, never a
    wrong one: ``_file`` and this both rename a whole file into place). The
    options are the ones the client sends a whole document with (its OCR
    route, ``table``); a document sent page by page, or an input that fails its
    checks, is left to the recording (a wrong guess would only miss).
    """
    from toolkit.runner.intake import PAGE_BY_PAGE, routed_options

    for path in reversed(list(inputs)[1:]):
        data = Path(path).read_bytes()
        check, routed = table.get(_digest(data)), table.get((_digest(data), _options({})))
        if check is None or not check.ok or routed is None:
            continue
        options = routed_options(routed, check.pages, page_by_page_from)
        entry = work_entry(cache, data, options)
        if PAGE_BY_PAGE in options or entry.exists():  # the recording got there first
            continue
        entry.parent.mkdir(parents=True, exist_ok=True)
        made = entry.with_name(f"{entry.name}.{os.getpid()}.out")
        # SIGINT and SIGTERM held while MuPDF works: a handler that raised inside its calls
        # came back as another exception (or none), and the interrupt was lost. Held, it
        # raises just after, here, and ``fork_meanwhile`` kills the recording.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            documents.process(path, made, options)  # written whole (``write_atomic``)
        except Exception:  # the recording meets the same failure and says so
            continue
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        os.replace(made, entry)


def _file(entry: Path, data: bytes) -> None:
    """File a result whole or not at all: two children may race to file the same one."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, entry)


def input_checks(inputs) -> dict:
    """The checks of each input by content: its preflight verdict and its OCR routing.

    Computed in the exploring process, before any fork; ``same_checks`` looks
    them up in the children (the client's private copies of an input have its
    bytes, hence its key).
    """
    table = {}
    for path in inputs:
        digest = _digest(Path(path).read_bytes())
        table[digest] = documents.preflight(path)
        table[(digest, _options({}))] = documents.ocr_routed(path, {})
    return table


def same_checks(table: dict) -> None:
    """In this (forked) supervisor and the runs it forks: answer ``documents.preflight``
    (whole document: ``page`` None, as the client asks it and as the provider's
    ``process`` passes it on) and ``documents.ocr_routed`` from ``table`` by the
    bytes' SHA-256.

    Both are pure functions of the bytes (and the options): MuPDF's reading of
    the document, nothing of the ledger, the provider or the crash. Bytes never
    seen (a file the crash tore, another input) are checked for real and filed;
    a path that cannot be read is checked for real (``missing`` is the verdict).
    The client, the provider's work and the judge all call them: each point
    read each input with MuPDF three to six times.
    """
    preflight, ocr_routed = documents.preflight, documents.ocr_routed

    def cached_preflight(path, page=None):
        if page is not None:  # one page of a document: the provider's check, rarely repeated
            return preflight(path, page)
        try:
            key = _digest(Path(path).read_bytes())
        except OSError:
            return preflight(path)
        if key not in table:
            table[key] = preflight(path)
        return table[key]

    def cached_ocr_routed(path, options):
        try:
            data = path if isinstance(path, bytes) else Path(path).read_bytes()
            key = (_digest(data), _options(options))
        except (OSError, TypeError, ValueError):  # unreadable, or options not JSON
            return ocr_routed(path, options)
        if key not in table:
            table[key] = ocr_routed(path, options)
        return dict(table[key])  # a fresh dict per caller: callers may add to it
    documents.preflight, documents.ocr_routed = cached_preflight, cached_ocr_routed


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _options(options: dict) -> str:
    return json.dumps(options, sort_keys=True)
