"""Missing seqs in a JSONL ledger's history: the one rule, applied by ``JsonlLedger._replay``.

Every event this toolkit writes takes the next seq (``JsonlLedger._write``, under the
ledger's lock: seq order is write order, group commit or not), so a whole history holds
``base + 1 .. last`` without a hole, where ``base`` is the seq of the snapshot lines a
compaction or a salvage wrote first (0 without them). What never leaves a hole:

- the header line (no seq) and snapshot lines (all at ``base``);
- a torn final line: never acknowledged, cut before the next append, its seq reused;
- a failed append (``ENOSPC``, a size limit): cut back, its seq not taken; the next
  run continues from the last whole line;
- a power cut: it loses a suffix of the file, never an interior line.

So a hole is lines deleted (or an interior line unreadable): the lost events may have been
any key's intent, and the ledger is refused like one with a corrupt interior line. A
deleted suffix leaves no trace here (it looks like a run that stopped earlier).
"""

SHOWN = 5  # ranges named in a message; the rest are counted


def missing_ranges(seqs, base: int = 0, unreadable: int = 0) -> list[tuple[int, int]]:
    """The ``(first, last)`` ranges of seqs absent between ``base`` and the largest of
    ``seqs`` (those at or below ``base`` are ignored). Bounded by the number of seqs given,
    however large the seqs: a jump from 1 to 10**12 is one range. None when no more seqs
    are absent than ``unreadable`` lines (corrupt, no seq readable) may hold: then no line
    need be missing, and the corrupt lines are the damage to name.

    >>> missing_ranges([1, 2, 5, 6, 9], base=0)
    [(3, 4), (7, 8)]
    >>> missing_ranges([8, 9], base=4)
    [(5, 7)]
    >>> missing_ranges([1, 3], unreadable=1)
    []
    """
    ranges, previous = [], base
    for seq in sorted({seq for seq in seqs if seq > base}):
        if seq > previous + 1:
            ranges.append((previous + 1, seq - 1))
        previous = seq
    return ranges if sum(last - first + 1 for first, last in ranges) > unreadable else []


def describe(ranges) -> str:
    """``'seq 3-4, 7 (3 events)'``: at most ``SHOWN`` ranges named, then counted.

    >>> describe([(3, 4), (7, 7)])
    'seq 3-4, 7 (3 events)'
    """
    text = ", ".join(f"{first}-{last}" if last > first else str(first)
                     for first, last in ranges[:SHOWN])
    if len(ranges) > SHOWN:
        text += f" and {len(ranges) - SHOWN} more ranges"
    count = sum(last - first + 1 for first, last in ranges)
    return f"seq {text} ({count} event{'s' if count > 1 else ''})"
