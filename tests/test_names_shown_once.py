"""Outsider o40, LOW 2: a stored name's escape shown escaped again.

An input ``back\\slash.pdf`` is stored ``back\\\\slash.pdf`` (``roots.escaped_name``: one to
one, a backslash doubled, a byte that is not UTF-8 as ``\\xNN``) and its output is named
from that stem (``back\\\\slash.<key8>.pdf`` on disk). ``ledger`` and ``audit`` showed the
stored name with each backslash doubled again (4 for 1), a non-UTF-8 byte as ``bad\\\\xff``,
and the audit's detail of a missing output 8 for 1 (``repr`` of it, then escaped again).
Now every display shows the stored text, escaping only what does not print (``\\n``).
"""

import shutil

from conftest import run_cli
from toolkit.documents import make_corpus

# real names (bytes) -> as shown: the stored name, once
NAMES = {b"back\\slash.pdf": "back\\\\slash.pdf", b"bad\xff.pdf": "bad\\xff.pdf",
         b"new\nline.pdf": "new\\nline.pdf", b"lit\\nname.pdf": "lit\\\\nname.pdf"}


def test_odd_names_ledger_and_audit_show_the_stored_name_once_not_escaped_twice(tmp_path):
    """Fault: four real input files named with a backslash, a non-UTF-8 byte, a newline,
    and a literal backslash-n, run to done; then the backslash one's output file deleted.
    Property: ``ledger`` and ``audit`` show each stored name exactly once escaped (a
    newline as ``\\n``, every stored backslash as it is: ``back\\\\slash.pdf``, never
    ``back\\\\\\\\slash.pdf``); the newline and the literal backslash-n stay two names; the
    audit's missing-output detail names the file as it is on disk."""
    make_corpus(tmp_path / "seed", docs=len(NAMES), poison=0, seed=3)
    inputs = tmp_path / "in"
    inputs.mkdir()
    for source, name in zip(sorted((tmp_path / "seed").iterdir()), NAMES):
        shutil.copyfile(source, bytes(inputs) + b"/" + name)
    ledger = tmp_path / "L.sqlite"
    done = run_cli("run", "--inputs", inputs, "--ledger", ledger, "--provider-db",
                   tmp_path / "p.db", "--out", tmp_path / "out", "--no-progress")
    assert done.returncode == 0, done.stderr

    listed = run_cli("ledger", ledger)
    assert listed.returncode == 0, listed.stderr
    sources = sorted(line.split()[3] for line in listed.stdout.splitlines()[2:]
                     if line.split()[1:2] == ["done"])
    assert sources == sorted(NAMES.values()), listed.stdout

    [output] = [path for path in (tmp_path / "out").iterdir() if path.name.startswith("back")]
    assert output.name.startswith("back\\\\slash.")  # the stored stem: two backslashes
    output.unlink()
    audited = run_cli("audit", ledger, "--artifacts", tmp_path / "out")
    assert audited.returncode == 0, audited.stderr
    assert f"'{output.name}': No such file or directory" in audited.stdout, audited.stdout
    assert "back\\\\\\\\" not in audited.stdout and "bad\\\\xff" not in audited.stdout
