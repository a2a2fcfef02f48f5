"""An event line no Python float or parser depth holds, inside a JSONL ledger.

Found by engineer qviews while comparing the two line decoders: a ``ts`` of 10**400 (valid
JSON, no float holds it: ``OverflowError``) and a detail nested thousands of brackets deep
(``RecursionError`` in ``json.loads``) ended ``ledger L`` in a Python traceback. Each is a
corrupt interior line like any other: one line, exit 2, nothing written; the audit names it.
"""

import json
import subprocess
import sys

import pytest

from toolkit.forensics import audit
from toolkit.ledger import State, open_ledger

ODD = {
    "ts past any float": lambda line: line.replace(b'"ts": ', b'"ts": 1' + b"0" * 400 + b", "
                                                   b'"_ts": ', 1),
    "detail nested 100000 deep": lambda line: line.replace(
        b'"detail": {', b'"detail": {"deep": ' + b"[" * 100_000 + b"]" * 100_000 + b", ", 1),
}


def _ledger_with(path, odd) -> int:
    """A real ledger of three items; the second item's claim line made odd (interior)."""
    with open_ledger(path) as ledger:
        for n in range(3):
            key = f"key-{n}-" + "x" * 40
            ledger.add(key, source=f"d{n}.pdf")
            token = ledger.claim(key, "w", 60.0)
            ledger.move(key, State.PENDING, State.UNKNOWN, token=token, worker="w")
    lines = path.read_bytes().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if b'"key-1-' in line and b'"claim"' in line)
    lines[at] = odd(lines[at])
    if b"[[[" not in lines[at]:
        json.loads(lines[at])  # the ts line is valid JSON: only no float holds its number
    path.write_bytes(b"".join(lines))
    return at + 1


@pytest.mark.parametrize("odd", sorted(ODD))
def test_event_line_no_float_or_parser_depth_holds_is_a_corrupt_line_exit_2_not_a_traceback(
        tmp_path, odd):
    """Fault: one interior event line with a ``ts`` of 10**400 or a detail nested 100,000
    deep. Property: ``ledger`` and ``review`` exit 2 with one line naming the damage (no
    traceback), the file is unchanged; ``audit`` reports that line as ``corrupt_line``."""
    path = tmp_path / "l.jsonl"
    number = _ledger_with(path, ODD[odd])
    before = path.read_bytes()
    for command in (["ledger", str(path)], ["review", "--ledger", str(path)]):
        result = subprocess.run([sys.executable, "-m", "toolkit", *command], cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 2, (command, result)
        assert "Traceback" not in result.stderr and \
            len(result.stderr.strip().splitlines()) == 1, (command, result.stderr[-2000:])
    assert path.read_bytes() == before
    report = audit(path)
    assert any(a.kind == "corrupt_line" and a.detail.startswith(f"line {number}:")
               for a in report.anomalies), report.anomalies
