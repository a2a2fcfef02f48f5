"""Read a JSONL file as lines, in bounded memory, without trusting it.

The file is read in large chunks and decoded once per chunk (the fast path);
lines that are not UTF-8 or longer than ``MAX_LINE`` come back as ``Bad``
markers so the caller reports them instead of parsing them. A final line
without its newline is never handed out: it is recorded in ``torn`` (the
toolkit's own JSONL ledger ignores it the same way and cuts it off before its
next append).
"""

from toolkit.ledger.gaps import LINE_LIMIT, describe, missing_ranges, too_long

CHUNK = 1 << 21  # 2 MiB: big enough to amortize, small enough not to weigh
MAX_LINE = LINE_LIMIT  # bytes; the ledger's own limit (gaps.py): a line both read or neither
# A line with more brackets than this goes the reference way (json): the nesting depth
# at which json gives up depends on the caller's stack, so only shallow text is read fast.
SHALLOW = 64
# False: every record is read the reference way (json), never by the fast decoders; the
# tests that compare the two set it, nothing else does.
FAST = True


class Bad:
    """A line that could not be read as text (not a str: ``json.loads`` rejects it)."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why


def _too_long(size: int) -> Bad:
    return Bad(too_long(size, MAX_LINE))


def decode_one(raw: bytes):
    if len(raw) > MAX_LINE:
        return _too_long(len(raw))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Bad(f"invalid UTF-8 at byte {exc.start}")


def _decode(block: bytes) -> list:
    # Fast path: one decode and one split per chunk; per line only on trouble.
    try:
        lines = block.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        return [decode_one(raw) for raw in block.split(b"\n")]
    if len(block) > MAX_LINE and max(map(len, lines)) > MAX_LINE // 4:
        return [decode_one(raw) for raw in block.split(b"\n")]  # limit in bytes
    return lines


class LineReader:
    """Iterate ``batches()`` of (first line number, [str | Bad, ...]).

    After iteration, ``torn`` is (line number, byte count) of a final line
    without its newline, or None; ``lines`` is the number of complete lines.
    """

    def __init__(self, path, chunk: int | None = None):
        self.path = path
        self.chunk = chunk or CHUNK
        self.torn: tuple[int, int] | None = None
        self.tail: bytes | None = None  # the torn line's bytes (None: over-long, or none)
        self.lines = 0

    def batches(self, decode: bool = True):
        """``decode=False``: the lines as bytes (over-long ones still ``Bad``), for a
        parser that reads UTF-8 bytes itself."""
        number, carry, skipping = 1, b"", 0  # skipping: bytes of an over-long line so far
        with open(self.path, "rb") as handle:
            while chunk := handle.read(self.chunk):
                if skipping:
                    newline = chunk.find(b"\n")
                    if newline < 0:
                        skipping += len(chunk)
                        continue
                    skipping += newline
                    yield number, [_too_long(skipping)]
                    number, skipping, chunk = number + 1, 0, chunk[newline + 1:]
                buffer = carry + chunk if carry else chunk
                if not decode:  # split once; the last piece is the unfinished line
                    lines = buffer.split(b"\n")
                    carry = lines.pop()
                    if lines:
                        if len(buffer) > MAX_LINE and max(map(len, lines)) > MAX_LINE:
                            lines = [_too_long(len(raw)) if len(raw) > MAX_LINE else raw
                                     for raw in lines]
                        yield number, lines
                        number += len(lines)
                    del buffer, lines  # drop the chunk before reading the next one
                    if len(carry) > MAX_LINE:
                        skipping, carry = len(carry), b""
                    continue
                cut = buffer.rfind(b"\n")
                if cut < 0:
                    carry = buffer
                else:
                    carry = buffer[cut + 1:]
                    lines = _decode(buffer[:cut])
                    yield number, lines
                    number += len(lines)
                if len(carry) > MAX_LINE:  # keep memory bounded: drop it, count it
                    skipping, carry = len(carry), b""
        self.lines = number - 1
        if skipping or carry:
            self.torn = (number, skipping or len(carry))
            self.tail = None if skipping else carry


def seq_gaps(seqs, apart=()) -> list[tuple[int, int]]:
    """The ranges (first, last) of seqs missing between the lowest and the highest seq of
    the file's lines (``seqs`` of the event table in file order, ``apart`` those of lines
    folded apart: snapshots, orphaned events). The ledger numbers every line it writes
    one more than the last, so a missing seq is a line deleted or lost; a gap before the
    first seq cannot be told from a ledger compacted while empty, and is not one."""
    values = iter(seqs)  # the usual ledger: 1, 2, 3, ... in file order (no list, no sort)
    first = previous = next(values, None)
    ordered = type(first) is int
    if ordered:
        for seq in values:
            if type(seq) is not int or seq != previous + 1:
                ordered = False
                break
            previous = seq
    if ordered and (not apart or (first - 1 <= min(apart) and max(apart) <= previous)):
        return []  # snapshots at first - 1, orphans among the events: no seq unaccounted
    if first is None and (not apart or min(apart) == max(apart)):
        return []  # snapshots only (one seq), or nothing
    # any other order: the ledger's own rule (an integer beyond 64 bits, a bool, are no seq
    # here), counted from the lowest seq present
    present = [seq for seq in (*seqs, *apart) if type(seq) is int]
    return missing_ranges(present, base=min(present) - 1) if present else []


def gap_detail(gaps, unusable: int) -> str:
    """The ``seq_gap`` detail: the ranges as the ledger names them (``gaps.describe``);
    ``unusable``: the unusable lines that may hold a missing seq."""
    where = (f"{unusable} unusable line{'s' if unusable > 1 else ''} may hold some of them"
             if unusable > 0 else "no line that could hold them is unusable: lines were "
             "deleted")
    return (f"no line holds {describe(gaps)}; {where}, and any key's events (its add, its "
            "intent) may have been on them: an item may be missing from this report, or "
            "behind its real state")
