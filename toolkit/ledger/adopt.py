"""What opening a JSONL ledger does with its line 1 (``JsonlLedger.__init__``, after the
replay): refuse a version not ours or a file not ours, call a header cut inside line 1
damage, give a new file or an older headerless toolkit ledger its header, and record the
cut of a torn tail that names a key (``torn.py``). ``self`` is the ``JsonlLedger``.
"""

from toolkit.errors import LedgerError
from toolkit.ledger.header import CUT_HEADER, HEADER_LINE, cut_header, header_problem
from toolkit.ledger.torn import record_cut


def adopt(self) -> None:
    """Refuse a file this toolkit did not write; give an older toolkit ledger its header.

    Order: the checks read only; the upgrade rewrites the file whole (temp file, fsync,
    rename, fsync of the folder), so a crash leaves the old file or the new one. Last, a
    writer records the cut of a torn tail that names a key (``torn.record_cut``: one more
    rewrite, only for a headerless ledger whose tail names one).
    """
    where = str(self.path)
    problem = header_problem(where, self._header)  # a version not ours: refused
    if problem is not None:
        raise LedgerError(problem)
    if self.version is not None:
        return record_cut(self)  # a torn tail naming a key: cut now, marked (torn.py)
    if self.torn_tail and self.torn_tail["line"] == 1 and cut_header(self._read_all()):
        self.snapshot_damage = ("cut_header", CUT_HEADER)  # damage: writes refused
        return
    # Toolkit lines read: events and snapshots folded, and events of keys whose add was
    # lost (``orphans``: what ``: > l`` mid-run leaves, no header, seqs not from 1): a
    # damaged ledger of ours, which salvage reads, not a foreign file.
    ours = self._events_read or self.orphans
    if self.view:
        if self._size and not ours:
            raise LedgerError(f"{where!r} is not a resume-toolkit JSONL ledger")
        return
    if self._size == 0:
        self._rewrite(HEADER_LINE)  # a new ledger
        self.torn_tail, self._valid_end = None, None
        return
    if not ours:
        raise LedgerError(f"{where!r} is not a resume-toolkit JSONL ledger (no line is a "
                          "toolkit event): refusing to write into it")
    if not self.damaged:  # pre-header: upgrade in place, then record a cut (below)
        body = self._read_all()[:self._valid_end]
        if self.unterminated:  # its owed newline, in the rewrite (no append cuts here)
            body, self.unterminated = body + b"\n", None
        self._rewrite(HEADER_LINE + body)
        self._valid_end = None  # the torn tail was left out of the rewrite
        end, count = self._history_read  # the file's events, one header line lower
        self._history_start, self._history_read = len(HEADER_LINE), \
            (end + len(HEADER_LINE), count)
        if self.torn_tail:
            self.torn_tail = {**self.torn_tail, "line": self.torn_tail["line"] + 1}
    record_cut(self)  # a torn tail naming a key: cut now, marked in line 1 (torn.py)
