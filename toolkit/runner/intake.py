"""Intake: inputs into items, the half of a pipeline before ``process``.

``enqueue`` keys each input (content + options, the OCR route, page-by-page routing),
records the new ones ``pending``, quarantines poison (``failed(permanent)``) and odd
entries (a FIFO, a dangling link) before anything is sent, and says aliases (the same
content twice in a batch is one item). An input whose bytes the ledger already keyed into
an item at rest is taken by its digest alone (``keying``). What is sent is a private
snapshot of the hashed bytes in TMPDIR, never the input file; the run drops them chunk by
chunk, and a killed run's folder is swept by the next one (``sweep_snapshots``).

Mixed into ``Pipeline``: it uses the pipeline's ledger, options, worker and the state of
the chunk in hand (``_paths``, ``_pages``, ``_known``, ``_ahead``, ``_seen``, ``_index``).
"""

import tempfile
from pathlib import Path

from toolkit import documents, liveness
from toolkit.errors import LeaseHeldError, StorageError
from toolkit.identity import content_digest, task_key
from toolkit.ledger import PERMANENT, Item, State
from toolkit.runner import keying, other_options
from toolkit.runner.inputindex import order
from toolkit.runner.inputs import Odd, entry_name, read_input

S = State
PAGE_BY_PAGE = "page_by_page"  # the routing option: part of a long document's identity


def routed_options(options: dict, pages: int, page_by_page_from: int | None) -> dict:
    """The request options of a document: a long one is routed page by page.

    The routing changes how the result is made, so it is part of the identity:
    the same file under another routing is another request, never a reuse.
    """
    if page_by_page_from is not None and pages >= page_by_page_from:
        return {**options, PAGE_BY_PAGE: True}
    return options


def odd_key(name: str, options: dict) -> str:
    """The key of an input entry that has no content to key (a FIFO, a dangling link)."""
    return task_key(content_digest(f"odd input entry\n{name}".encode()), options)


_SWEPT = False  # inherited by forks: explore sweeps once, not once per crash point


def sweep_snapshots() -> None:
    """Remove the input snapshot folders of dead runs from TMPDIR, once per process tree
    (a scan of a crowded /tmp costs ~5 ms of CPU)."""
    global _SWEPT
    if not _SWEPT:
        liveness.sweep_dead(tempfile.gettempdir(), "toolkit-inputs")
        _SWEPT = True


class InOrder(list):
    """Inputs already ``Path``s in ``order``: ``Pipeline.run`` hands ``enqueue`` its chunks
    so, and ``enqueue`` takes them as they are (a sort of a sorted chunk still calls
    ``order``, Python code, once per input)."""

    __slots__ = ()


class Intake:
    """Mixed into ``Pipeline``: ``enqueue`` and what it needs (keying, snapshots, quarantine)."""

    def enqueue(self, inputs) -> list[str]:
        """Key inputs, record new ones ``pending``, quarantine poison at once; return the keys
        new to this run (a key met earlier in the run is an alias, said and skipped).

        Poison becomes ``failed(permanent, reason)`` before anything is
        submitted, and never blocks the rest of the queue. An input whose bytes the
        ledger already keyed into an item at rest (done, parked, poison) is taken by that
        key from its digest alone (``keying``): no MuPDF, no snapshot, no write.
        """
        paths = inputs if type(inputs) is InOrder else \
            sorted((p if isinstance(p, Path) else Path(p) for p in inputs), key=order)
        keys, seen, where, known, failed = [], self._seen, self._paths, self._known, S.FAILED
        for path, item in zip(paths, self._vouched(paths)):
            if item is None:
                self._enqueue_one(path, keys)  # reads it again: the bytes keyed are the bytes sent
                continue
            key = item.key
            if key in seen:  # an alias: ``_admit`` says it (most of a rerun: no call per item)
                self._admit(path, key, keys)
                continue
            seen[key] = where[key] = path  # never sent
            known[key] = item
            keys.append(key)
            if item.state is failed:  # poison an earlier run found (``_note_quarantined``)
                self._note_quarantined(key, item)
        return keys

    def _vouched(self, paths) -> list:
        """For each input, the item at rest the ledger already keyed it into, else None
        (``keying``); none with page-by-page routing, which needs each page count."""
        if self._ahead is not None:  # the run's ordered pass found them already
            ahead, self._ahead = self._ahead, None
            return ahead
        if self.page_by_page_from is not None:
            return [None] * len(paths)
        return keying.vouched(self.ledger, paths, self._keyers(), self._index)

    def _vouched_ahead(self, paths) -> list | None:
        """The whole batch's ``_vouched``, from one ordered pass over the ledger merged with
        the batch's sorted candidate keys (``keying.merged``), when the batch is a large
        share of the ledger (``keying.use_scan``); else None: each chunk looks its keys up."""
        if self.page_by_page_from is not None or not keying.use_scan(self.ledger, len(paths)):
            return None
        return keying.vouched(self.ledger, paths, self._keyers(), self._index, scan=True)

    def _keyers(self) -> list:
        """``digest -> key`` per option set an input can have (``keying.keyers``), made once."""
        if self._routes is None:
            self._routes = keying.keyers(self.options)
        return self._routes

    def _admit(self, path, key: str, keys: list) -> bool:
        """Note ``key`` as this run's item for ``path``; False for an alias (said, not silent)."""
        if key in self._seen:  # same content twice in one batch is one unit of work
            self.aliases.append((entry_name(path), entry_name(self._seen[key])))
            return False
        self._seen[key] = path  # its name is made only for an alias: a resume's cost is per item
        keys.append(key)
        return True

    def _enqueue_one(self, path: Path, keys: list) -> None:
        try:
            data = read_input(path)  # read once: the bytes hashed are the bytes sent
        except Odd as odd:  # a FIFO, a directory, a dangling link: its own item, parked
            self._odd(odd, keys)
            return
        digest = content_digest(data)
        options = documents.ocr_routed(data, self.options)  # scans: the OCR route is identity
        if self.page_by_page_from is not None:  # the routing needs the page count first
            pages = documents.page_count(self._snapshot(digest, data))
            options = routed_options(options, pages, self.page_by_page_from)
        key = task_key(digest, options)
        if other_options.refused(self, path, digest, options, key, PAGE_BY_PAGE):
            return  # o36 6: the ledger holds this content routed otherwise; nothing recorded
        if PAGE_BY_PAGE in options:
            self._pages[key] = pages
        if not self._admit(path, key, keys):
            return
        # Deferred sync: an add has no side effect; the intent's fsync covers it.
        self.ledger.add(key, source=entry_name(path), digest=digest, sync=False)
        item = self.ledger.get(key)
        # What is sent is a private snapshot of the hashed bytes, never the input file
        # itself: a file replaced after this read is new content for a later run.
        self._paths[key] = path if item.state is S.DONE else self._snapshot(digest, data)
        if item.state is S.PENDING:
            check = documents.preflight(self._paths[key])
            if not check.ok:
                self._quarantine(item, check.reason)
        self._note_quarantined(key)

    def _note_quarantined(self, key: str, item: Item | None = None) -> None:
        """Remember poison (found now or by an earlier run): run() never hands it to process()."""
        item = item or self.ledger.get(key)
        if item.state is S.FAILED and item.failure == PERMANENT and \
                (item.reason or "").startswith("poison:"):
            self.quarantined.add(key)

    def _odd(self, odd: Odd, keys: list) -> None:
        """Quarantine an input entry that cannot be read as a file: keyed by its name (it
        has no content), ``failed(permanent)`` with the reason; the batch goes on."""
        name = entry_name(odd.path)
        key = odd_key(name, self.options)
        if key in self._seen:
            return
        self._seen[key] = odd.path
        keys.append(key)
        self.ledger.add(key, source=name, digest=None)
        item = self.ledger.get(key)
        if item.state is S.PENDING:
            self._quarantine(item, f"unreadable input entry ({odd.reason})")
        self._note_quarantined(key)

    def _snapshot(self, digest: str, data: bytes) -> Path:
        """This run's private copy of an input's hashed bytes, named by their digest.

        In a private temp folder, not under --out: an --out that fails midway must not
        turn a document into an unreadable one. Removed at the end of the run (a crash
        leaves it to the next run's sweep); the next run reads the inputs again.
        """
        if self._snapshots is None:
            # Named by this process (pid, start time): the first snapshot removes the
            # folders of runs that were killed (``sweep_snapshots``), never a live one's.
            sweep_snapshots()
            self._snapshots = liveness.owned_folder("toolkit-inputs")
        path = Path(self._snapshots.name) / f"{digest}.pdf"
        if not path.exists():
            try:
                path.write_bytes(data)
            except OSError as exc:  # TMPDIR full or failing: a halt that names it
                path.unlink(missing_ok=True)  # never a cut copy taken for the input later
                raise StorageError(
                    f"TMPDIR {tempfile.gettempdir()!r}: cannot write this run's copy of an "
                    f"input there ({exc.strerror or exc}): free space there or set TMPDIR to "
                    "a folder with room, then clear the ledger's health and run again") from exc
        return path

    def _drop_snapshots(self) -> None:
        if self._snapshots is not None:
            self._snapshots.cleanup()
            self._snapshots = None

    def _quarantine(self, item: Item, reason: str):
        try:
            token = self.ledger.claim(item.key, self.worker, self.lease_ttl)
        except LeaseHeldError:
            return  # another worker has it; it will see the same poison
        if self.ledger.get(item.key).state is S.PENDING:  # re-read: it may have moved meanwhile
            self.ledger.move(item.key, S.PENDING, S.FAILED, token=token, worker=self.worker,
                             failure=PERMANENT, reason=f"poison: {reason}")
        self.ledger.release(item.key, token, self.worker)
