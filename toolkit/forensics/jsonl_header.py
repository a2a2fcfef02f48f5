"""The audit's reading of a toolkit JSONL ledger's line 1 and of its header's marks, by the
ledger's own rules (``ledger.header``: one validator; ``ledger.torn``: a cut's mark)."""

from toolkit.ledger.header import CUT_HEADER, VERSION, cut_header, header_problem, read_header
from toolkit.ledger.torn import pending_marks


def line_one(raw, path, first: bytes) -> tuple[dict | None, bool]:
    """(the header, or None; whether the file holds nothing more to read). A version not
    ours is what ``run`` refuses: a newer one is noted (a newer toolkit's file, not damage),
    one below 1 is a ``corrupt_line``; a file cut inside line 1 (``cut_header``) too."""
    header = read_header(first)
    problem = header_problem(str(path), header)
    if problem is not None and header["version"] > VERSION:
        raw.notes.append(problem)
    elif problem is not None:
        raw.finding(None, "corrupt_line", f"line 1: {problem}", line=1)
    if cut_header(first):  # ``first`` is the whole file: it has no newline
        raw.finding(None, "corrupt_line", f"line 1: the file {CUT_HEADER}", line=1)
        return header, True
    return header, False


def torn_notes(raw, header, events) -> None:
    """A note per cut mark the events read have not spent (``torn.pending_marks``)."""
    rows = zip(events["seq"], events["key"], events["frm"], events["to"])
    for key, after in pending_marks(header, rows).items():
        raw.notes.append(f"torn: a final line naming key {key[:12]} was cut after seq {after}; "
                         "a run looks up that key's next request before sending it")
