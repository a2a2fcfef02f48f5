"""A JSONL ledger's history whole and in order: the rules, applied by ``JsonlLedger._replay``
and by the audit (``forensics.jsonl``) alike.

Every event this toolkit writes takes the next seq (``JsonlLedger._write``, under the
ledger's lock: seq order is write order, group commit or not), so a whole history holds
``base + 1 .. last`` without a hole, where ``base`` is the seq of the snapshot lines a
compaction or a salvage wrote first (0 without them). What never leaves a hole:

- the header line (no seq) and snapshot lines (all at ``base``);
- a torn final line: never acknowledged, cut before the next append, its seq reused;
- a failed append (``ENOSPC``, a size limit): cut back, its seq not taken; the next
  run continues from the last whole line;
- a power cut: it loses a suffix of the file, never an interior line;
- a blank line (``blank``: what an editor's save or ``echo >> l.jsonl`` leaves): no event
  and no damage; it still counts as a line (line numbers), and an event line replaced by
  one is still a hole (its seq is on no line).

So a hole is lines deleted (or an interior line unreadable): the lost events may have been
any key's intent, and the ledger is refused like one with a corrupt interior line. A
deleted suffix leaves no trace here (it looks like a run that stopped earlier).

For the same reason event seqs strictly increase down the file (``out_of_order``): a seq
not above the one before is a line copied (a duplicate) or moved (lines swapped), never
something a writer does. And the snapshot lines a compaction or a salvage writes are
counted in the header above them (``snapshot_damage``): one deleted or copied, or the
header deleted (with it a salvage's mark, the only record that keys were lost), shows.
"""

from toolkit.advice import absolute, salvaged_name, toolkit_command

SHOWN = 5  # ranges named in a message; the rest are counted
# The longest line the ledger's replay and the audit read (bytes, newline excluded): both
# read every line up to it (a long note: a few MiB), both call a longer one corrupt in the
# same words (``too_long``) and read on from its newline, in bounded memory.
LINE_LIMIT = 1 << 26


def too_long(size: int, limit: int = LINE_LIMIT) -> str:
    """The words for a line over the limit, the ledger's and the audit's."""
    return f"{size} bytes, over the {limit}-byte line limit"


def blank(raw: bytes) -> bool:
    """A line (without its newline) that holds no event: empty, or only spaces, tabs and
    CRs. The ledger's replay and the audit both skip it; any other byte makes it a line
    to read (a BOM alone included: that is damage, as anywhere but before line 1's JSON)."""
    return not raw.strip(b" \t\r")


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


def out_of_order(numbered, previous: int | None = None) -> list[tuple[int, int, int]]:
    """``(line, seq, previous seq)`` of each event line whose seq is not above the one
    before it, from ``(line, seq)`` pairs in file order; ``previous``: the seq before
    the first (a snapshot's), None when the first is compared with nothing.

    >>> out_of_order([(2, 1), (3, 2), (4, 2), (5, 4), (6, 3)], previous=0)
    [(4, 2, 2), (6, 3, 4)]
    """
    found = []
    for line, seq in numbered:
        if previous is not None and seq <= previous:
            found.append((line, seq, previous))
        previous = seq
    return found


def describe_disorder(found) -> str:
    """``'line 4 (seq 2 after seq 2), line 6 (seq 3 after seq 4)'``: at most ``SHOWN``."""
    text = ", ".join(f"line {line} (seq {seq} after seq {before})"
                     for line, seq, before in found[:SHOWN])
    return text + (f" and {len(found) - SHOWN} more lines" if len(found) > SHOWN else "")


def snapshot_damage(header: dict | None, snapshots, moved: int | None = None):
    """``(kind, words)`` when the snapshot lines do not match the header, else None.

    ``header``: the header line's object (None: the file has none); ``snapshots``: the
    ``(line, seq)`` of every snapshot line; ``moved``: the first snapshot line below an
    event line, if any. Snapshot lines are written only right below a header that counts
    them (``header.py``), so lines with no header above them are ``missing_header``: the
    header was deleted, and with it, maybe, a salvage's mark (a ledger compacted by a
    toolkit older than the header reads the same, and is salvaged the same way). Snapshot
    lines under a header that does not count them are ``snapshot_mismatch`` (a plain header
    put over them; a compaction older than the count is salvaged once, the same way).
    """
    if header is None:
        if not snapshots:
            return None
        return "missing_header", (f"has {_lines(len(snapshots))} (from line "
                                  f"{snapshots[0][0]}) and no header line above them: a "
                                  "deleted header may have held a salvage's mark (keys lost)")
    if moved is not None:
        return "snapshot_mismatch", f"has snapshot line {moved} below event lines: lines moved"
    recorded = header.get("snapshots")
    if recorded is None:  # no count (a plain header, or "snapshots": null)
        if not snapshots:
            return None
        # Snapshot lines are only written below a header that counts them: a plain header
        # over them was put there (over a salvage's lines its mark is lost), or is a
        # compaction by a toolkit older than the count: salvaged once, like a headerless one.
        return "snapshot_mismatch", (f"has {_lines(len(snapshots))} (from line "
                                     f"{snapshots[0][0]}) under a header that does not count "
                                     "them: a replaced header may have held a salvage's mark "
                                     "(keys lost)")
    count, seq = (recorded.get("count"), recorded.get("seq")) if isinstance(recorded, dict) \
        else (None, None)
    if type(count) is not int or type(seq) is not int:
        return "snapshot_mismatch", ("has a header whose snapshot record is unreadable: "
                                     f"{recorded!r:.80}")
    if len(snapshots) != count:
        return "snapshot_mismatch", (f"has {_lines(len(snapshots))} where its header "
                                     f"records {count}: snapshot lines deleted or copied")
    for line, at in snapshots:
        if at != seq:
            return "snapshot_mismatch", (f"has snapshot line {line} at seq {at} where its "
                                         f"header records seq {seq}")
    return None


def snapshot_base(header: dict | None, snapshots) -> int:
    """The seq the events after the snapshots continue from: the header's record, else the
    highest snapshot line's seq, else 0."""
    recorded = (header or {}).get("snapshots")
    if isinstance(recorded, dict) and type(recorded.get("seq")) is int:
        return recorded["seq"]
    return max((seq for _, seq in snapshots), default=0)


def _lines(count: int) -> str:
    return f"{count} snapshot line{'' if count == 1 else 's'}"


def damage_words(ledger, refusing: str, shown=None) -> str | None:
    """The one line a damaged JSONL ledger (``JsonlLedger.corruption``) is refused with:
    its corrupt lines and the keys affected, its missing seqs (lines deleted), its lines
    out of seq order and its snapshot damage, then the way out; None when intact."""
    lines, damage = ledger.corrupt_lines, []
    if lines:
        keys = ", ".join(sorted(k[:12] for k in ledger.affected_keys)[:10]) or "not readable"
        more = f" and {len(lines) - 10} more" if len(lines) > 10 else ""
        damage.append(f"has corrupt lines {', '.join(map(str, lines[:10]))}{more} "
                      f"(keys affected: {keys})" + "".join(
                          f" (line {line}: {too_long(size)})"
                          for line, size in ledger.long_lines[:3]))
    if ledger.missing_seqs:  # lines deleted: any key's intent may be among them
        damage.append(f"is missing the events of {describe(ledger.missing_seqs)}, lines "
                      "deleted: any key's intent may be among them")
    if ledger.disorder:  # lines copied or moved: the fold is not the history written
        damage.append(f"has event lines out of seq order ({describe_disorder(ledger.disorder)}"
                      "): lines copied or moved")
    if ledger.snapshot_damage:
        damage.append(ledger.snapshot_damage[1])
    path = ledger.path if shown is None else shown
    return (f"JSONL ledger {str(path)!r} {' and '.join(damage)}; refusing {refusing}: "
            f"run {toolkit_command('audit', absolute(path))}, then "
            f"{toolkit_command('ledger', absolute(path), '--salvage', salvaged_name(path))}"
            ) if damage else None
