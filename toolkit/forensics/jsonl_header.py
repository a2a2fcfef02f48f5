"""The audit's reading of a toolkit JSONL ledger's line 1, of its header's marks and
counts, and of its torn final line, by the ledger's own rules (``ledger.header``: one
validator; ``ledger.torn``: the keys a torn tail names, a cut's mark; ``ledger.gaps``)."""

import itertools
import operator
from array import array

from toolkit.ledger.gaps import describe_disorder, out_of_order, snapshot_base, snapshot_damage
from toolkit.ledger.header import CUT_HEADER, VERSION, cut_header, header_problem, read_header
from toolkit.ledger.torn import pending_marks, tail_keys


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
        raw.notes.append(f"torn: a final line naming key {key} was cut after seq {after}; "
                         "a run looks up that key's next request before sending it")


def torn_findings(raw, torn=None) -> None:
    """The torn final line ``torn`` ((number, size, bytes); bytes None when over-long) as
    the run reads it (``torn.tail_keys``): a ``torn_line`` finding per key it may name
    (the run cuts it, marks the key and looks its next request up before sending it: the
    plan is ``reconcile``), or one naming none (cut as a crash's). An unusable line, not
    damage: the run cuts it and writes on, so it parks no other item (``forensics._damage``
    leaves the last unusable line out when a ``torn_line`` is found)."""
    if torn is None:
        return
    number, size, tail = torn
    items = raw.items
    keys = [] if tail is None else tail_keys(
        tail, items, lambda key: (items[key].state, items[key].failure, items[key].lease_owner))
    where = f"line {number}: {size} bytes without a final newline"
    raw.corrupt_lines.append(number)  # once, however many keys it names
    for key in keys:
        raw.finding(key, "torn_line", f"{where}, naming this key (maybe its intent, sent): a "
                    "run cuts it, marks the key and looks its next request up before sending it")
    if not keys:
        raw.finding(None, "torn_line", f"{where} (write cut; not used; a run cuts it)")


def order_findings(raw, header, history, events) -> None:
    """``seq_disorder`` (an event seq not above the one before: lines copied or moved),
    ``missing_header`` and ``snapshot_mismatch`` (snapshot lines the header does not
    count): the ledger's own rules (``gaps.out_of_order``, ``gaps.snapshot_damage``)."""
    snapshots = history.snapshot_lines
    lines = events["line"]
    first = min(filter(None, [next(iter(lines), None), *history.apart_lines]), default=None)
    moved = next((line for line, _ in snapshots if first is not None and line > first), None)
    damage = snapshot_damage(header, snapshots, moved)
    if damage is not None:
        raw.finding(None, damage[0], f"the ledger {damage[1]}; a salvage marks the new ledger")
    recorded = snapshots or (header or {}).get("snapshots") is not None
    found = _disorder(events["seq"], lines, snapshot_base(header, snapshots) if recorded else None)
    if found:
        raw.finding(None, "seq_disorder", f"event lines out of seq order: "
                    f"{describe_disorder(found)}: lines copied (a duplicate) or moved; the "
                    "items are folded from a history no writer wrote")


def _disorder(seqs, lines, previous) -> list:
    """``gaps.out_of_order`` over the event table; a packed column (every seq an int64)
    is first checked in one C loop, the usual answer being none (not numpy: its import
    alone costs more CPU than the loop over a million seqs, and 12 MB)."""
    if isinstance(seqs, array):
        if not seqs or (all(map(operator.lt, seqs, itertools.islice(seqs, 1, None)))
                        and (previous is None or seqs[0] > previous)):
            return []
    return out_of_order(((line, seq) for line, seq in zip(lines, seqs) if type(seq) is int),
                        previous)
