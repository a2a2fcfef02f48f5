"""How fast and how lean is ``audit`` on a big ledger, next to the practical parse limits?

Seeded and self-contained: writes a toolkit JSONL ledger of ``lines`` events
(1,000,000 in the full run: about 280 MB) and the same history as a toolkit
SQLite ledger, then measures, each sample in a fresh process, on the same files:

- ``python -m toolkit audit PATH --json > /dev/null`` (the command as a user
  runs it: interpreter start and imports included) and its peak RSS;
- ``audit(PATH)`` in-process, then its ``audit --json`` document (``per_item``
  included) streamed to /dev/null, and the peak RSS;
- ``pyarrow.json.read_json`` and ``pandas.read_json(lines=True)`` of the file;
- ``audit`` of the SQLite ledger against a bare ``SELECT`` of its events.

``section(cfg, folder)`` gives benchmarks/run.py its rows (sections 4 and 7);
``python benchmarks/audit_jsonl.py --lines 100000`` prints the figures alone.
"""

import argparse
import hashlib
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

T0 = 1_700_000_000.0


def lifecycles(rng: random.Random):
    """Endless (steps, fields) stories: mostly done, some retried, failed or stuck."""
    while True:
        roll = rng.random()
        if roll < 0.80:
            yield ["unknown", "submitted", "done"]
        elif roll < 0.90:
            yield ["unknown", "failed", "unknown", "submitted", "done"]
        elif roll < 0.95:
            yield ["unknown", "failed"]
        elif roll < 0.98:
            yield ["unknown"]
        else:
            yield []


def write_ledger(path: Path, lines: int, seed: int) -> int:
    """Write about ``lines`` event lines; return the number of items."""
    rng = random.Random(seed)
    stories = lifecycles(rng)
    seq, items = 0, 0
    with open(path, "w", encoding="utf-8") as handle:
        while seq < lines:
            items += 1
            source = f"doc-{items:07d}.pdf"
            key = hashlib.sha256(f"{seed}:{source}".encode()).hexdigest()
            digest = hashlib.sha256(source.encode()).hexdigest()
            state, attempt = None, 0
            steps = next(stories)
            for to in [None, *steps]:
                if seq >= lines:
                    break
                seq += 1
                op, detail = "move", {}
                if to is None:
                    op, to, detail = "add", "pending", {"source": source, "digest": digest}
                elif to == "unknown" and state in ("pending", "failed"):
                    attempt += 1
                    if state == "failed":
                        detail = {"failure": None, "reason": None}
                elif to == "failed":  # only a transient failure is followed by a retry
                    last = steps.index("failed") == len(steps) - 1
                    failure = rng.choice(("transient", "permanent")) if last else "transient"
                    detail = {"failure": failure, "reason": "HTTP 503"}
                elif to == "done":
                    detail = {"artifact_path": f"out/{source}", "artifact_size": rng.randrange(1 << 20),
                              "artifact_sha256": hashlib.sha256(key.encode()).hexdigest()}
                event = {"seq": seq, "ts": T0 + seq * 0.01, "op": op, "key": key,
                         "from": state, "to": to, "attempt": attempt, "worker": None,
                         "token": 0, "detail": detail}
                handle.write(json.dumps(event, sort_keys=True) + "\n")
                state = to
    return items


def write_sqlite(path: Path, jsonl: Path) -> int:
    """The same history as the JSONL ledger at ``jsonl``, as a toolkit SQLite ledger
    (its own schema; items are the events folded by hand, not by the audit)."""
    from toolkit.ledger.sqlite import SCHEMA

    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("BEGIN")
    for statement in SCHEMA.strip().split(";"):
        if statement.strip():
            db.execute(statement)
    items: dict[str, dict] = {}

    def events():
        with open(jsonl, encoding="utf-8") as handle:
            for line in handle:
                e = json.loads(line)
                item = items.setdefault(e["key"], {"source": None, "failure": None,
                                                   "reason": None, "artifact_path": None,
                                                   "artifact_size": None,
                                                   "artifact_sha256": None})
                item.update({name: value for name, value in e["detail"].items()
                             if name in item})
                item.update(state=e["to"], attempt=e["attempt"], updated=e["ts"])
                yield (e["seq"], e["ts"], e["op"], e["key"], e["from"], e["to"], e["attempt"],
                       e["worker"], e["token"], json.dumps(e["detail"]))

    db.executemany('INSERT INTO events (seq, ts, op, key, frm, "to", attempt, worker, token, '
                   'detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)', events())
    db.executemany("INSERT INTO items (key, state, source, attempt, token, failure, reason, "
                   "artifact_path, artifact_size, artifact_sha256, updated) "
                   "VALUES (?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?)",
                   ((key, i["state"], i["source"], i["attempt"], i["failure"], i["reason"],
                     i["artifact_path"], i["artifact_size"], i["artifact_sha256"], i["updated"])
                    for key, i in items.items()))
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return len(items)


# -- one measured task per fresh process ------------------------------------------------

def _task(task: str, path: Path) -> dict:
    """Run ``task`` on ``path`` here; ``seconds`` excludes imports."""
    if task == "audit":
        import io

        import msgspec  # noqa: F401  (imports are not the audit's time)
        import orjson  # noqa: F401

        import toolkit.ledger.postgres  # noqa: F401
        from toolkit.forensics import audit
        from toolkit.forensics.report import stream_json

        start = time.perf_counter()
        report = audit(path)
        audited = time.perf_counter() - start
        with open(os.devnull, "wb") as sink:  # what audit --json writes, per_item included
            stream_json(report, io.TextIOWrapper(sink, encoding="utf-8"))
        return {"seconds": time.perf_counter() - start, "audit_seconds": audited,
                "items": len(report.rows)}
    if task == "pyarrow":
        import pyarrow.json

        start = time.perf_counter()
        rows = pyarrow.json.read_json(path).num_rows
    elif task == "pandas":
        import pandas as pd

        start = time.perf_counter()
        rows = len(pd.read_json(path, lines=True))
    elif task == "select":
        # opened as the audit opens a WAL ledger with no -wal beside it (immutable): a
        # mode=ro reader would leave -wal and -shm files behind, and every later audit
        # sample would then read a private copy of the file
        start, cpu = time.perf_counter(), time.process_time()
        db = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
        rows = len(db.execute("SELECT * FROM events").fetchall())
        db.close()
        return {"seconds": time.perf_counter() - start, "rows": rows,
                "cpu_seconds": time.process_time() - cpu}
    elif task == "audit_sqlite":
        import msgspec  # noqa: F401  (imports are not the audit's time; numpy: the
        import numpy  # noqa: F401  SQLite fold's, imported by the audit and its child)

        import toolkit.ledger.postgres  # noqa: F401
        from toolkit.forensics import audit

        import resource

        def cpu_time():  # this process and the ones it started and reaped (the audit's child)
            started = resource.getrusage(resource.RUSAGE_CHILDREN)
            return time.process_time() + started.ru_utime + started.ru_stime

        start, cpu = time.perf_counter(), cpu_time()
        rows = len(audit(path).rows)
        return {"seconds": time.perf_counter() - start, "rows": rows,
                "cpu_seconds": cpu_time() - cpu}
    else:
        raise SystemExit(f"unknown task {task!r}")
    return {"seconds": time.perf_counter() - start, "rows": rows}


# Run first in every child: its own peak resident set (``VmHWM``, which exec starts
# afresh) written last on its stderr. Not wait4's ``ru_maxrss``: Linux starts a child's at
# the peak of the process it was spawned from (vfork shares the parent's memory map until
# exec), so a child of a benchmark that had just written a million-line ledger read the
# benchmark's peak, whatever it did itself (benchmarks/child.py says the same).
# Then the largest ``ru_maxrss`` of the processes it started and reaped (RUSAGE_CHILDREN;
# 0 when it started none), added to its own: the figure covers every process the audit
# starts. An upper bound, never an undercount: a forked child's resident set counts the
# pages it still shares with its parent (a spawned one's starts at its parent's peak).
_PEAK = ("import atexit, sys\n"
         "def _peak():\n"
         "    import resource\n"
         "    for line in open('/proc/self/status'):\n"
         "        if line.startswith('VmHWM:'):\n"
         "            sys.stderr.write('\\nVmHWM ' + line.split()[1] + '\\n')\n"
         "    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
         "    sys.stderr.write('\\nChildrenMaxRSS %d\\n' % children)\n"
         "atexit.register(_peak)\n"
         "import runpy\n"
         "sys.argv = sys.argv[1:]\n")


def _run(argv: list, env=None, keep: bool = True) -> tuple[float, float, str, float]:
    """(wall seconds, peak RSS in MB: its own and what it started, stdout, CPU seconds) of
    one child process, alone (wait4); ``keep=False`` sends its stdout to /dev/null.
    ``argv``: a Python script and its arguments, or ``-m`` and a module and its
    arguments."""
    if argv[0] == "-m":
        launch = f"runpy.run_module({argv[1]!r}, run_name='__main__', alter_sys=True)"
        argv = argv[1:]
    else:
        launch = "runpy.run_path(sys.argv[0], run_name='__main__')"
    argv = [sys.executable, "-c", _PEAK + launch, *argv]
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, stdout=subprocess.PIPE if keep else subprocess.DEVNULL,
                                 stderr=err, env=env)
        out = child.stdout.read() if keep else b""
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        said = err.read().decode(errors="replace")
        if child.returncode != 0:
            raise RuntimeError(f"{argv[3:]} failed ({child.returncode}): {said[-2000:]}")
    peaks = [line.split()[1] for line in said.splitlines() if line.startswith("VmHWM ")]
    started = [line.split()[1] for line in said.splitlines()
               if line.startswith("ChildrenMaxRSS ")]
    peak = int(peaks[-1]) / 1024 if peaks else usage.ru_maxrss / 1024  # no /proc: ru_maxrss
    peak += int(started[-1]) / 1024 if started else 0  # what it started (see _PEAK)
    return seconds, peak, out.decode(), usage.ru_utime + usage.ru_stime


def measure(task: str, path: Path) -> dict:
    """One sample of ``task`` in a fresh interpreter: its JSON plus ``peak_mb`` (its own
    VmHWM) and ``cpu`` (user + system seconds of the whole process, imports included:
    what a loaded machine distorts least)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if task == "cli":  # the command itself, output thrown away
        seconds, peak, _, cpu = _run(["-m", "toolkit", "audit", str(path), "--json"], env,
                                     keep=False)
        return {"seconds": seconds, "peak_mb": peak, "cpu": cpu}
    _, peak, out, cpu = _run([str(Path(__file__).resolve()), "--child", task, str(path)], env)
    return {**json.loads(out), "peak_mb": peak, "cpu": cpu}


def section(cfg, folder: Path):
    """Rows of benchmarks/run.py: (section 4 rows, section 7 memory rows)."""
    from measure import Figure, Row, check, interleave, ratio
    from sections import log

    path, db = folder / "audit.jsonl", folder / "audit.sqlite"
    log(f"4 writing a {cfg.audit_lines:,}-line JSONL ledger and the same history in SQLite")
    items = write_ledger(path, cfg.audit_lines, seed=0)
    write_sqlite(db, path)
    size = f"{cfg.audit_lines:,} lines, {items:,} keys, {path.stat().st_size / 1e6:,.0f} MB"
    log("4 audit --json vs pyarrow and pandas readers, a fresh process per sample")
    r = interleave(cfg.huge_reps, {name: (lambda name=name: measure(name, path))
                                   for name in ("cli", "audit", "pyarrow", "pandas")})
    log("4 SQLite audit vs a bare SELECT of its events")
    q = interleave(cfg.huge_reps, {name: (lambda name=name: measure(name, db))
                                   for name in ("audit_sqlite", "select")})
    path.unlink()
    for name in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        name.unlink(missing_ok=True)
    s = {name: [x["seconds"] for x in samples] for name, samples in {**r, **q}.items()}
    cli_arrow, cli_pandas = ratio(s["cli"], s["pyarrow"]), ratio(s["cli"], s["pandas"])
    cpu = {name: [x["cpu"] for x in r[name]] for name in ("cli", "pyarrow", "pandas")}
    sql = ratio(s["audit_sqlite"], s["select"])
    sql_cpu = ratio(*([x["cpu_seconds"] for x in q[name]] for name in ("audit_sqlite", "select")))
    peak = Figure([x["peak_mb"] for x in r["cli"]], "MB")
    rows = [Row("4", f"audit --json > /dev/null, JSONL ledger ({size}), process wall",
                Figure(s["cli"], "s")),
            Row("4", "  audit() + streamed JSON (per_item), in-process",
                Figure(s["audit"], "s")),
            Row("4", "pyarrow.json.read_json of the same file", Figure(s["pyarrow"], "s")),
            Row("4", "pandas.read_json(lines=True) of the same file", Figure(s["pandas"], "s")),
            Row("4", "  ratio audit --json / pyarrow", cli_arrow, *check(cli_arrow, "<=", 1.5)),
            Row("4", "  ratio audit --json / pandas", cli_pandas, *check(cli_pandas, "<=", 0.25)),
            Row("4", "  CPU ratio audit --json / pyarrow (whole processes, user + system)",
                ratio(cpu["cli"], cpu["pyarrow"])),
            Row("4", "  CPU ratio audit --json / pandas (whole processes, user + system)",
                ratio(cpu["cli"], cpu["pandas"])),
            Row("4", "audit() of the same history as a SQLite ledger", Figure(s["audit_sqlite"], "s")),
            Row("4", "bare SELECT * FROM events of that ledger", Figure(s["select"], "s")),
            Row("4", "  ratio SQLite audit / bare SELECT", sql, *check(sql, "<=", 2.0)),
            Row("4", "  CPU ratio SQLite audit / bare SELECT (in-process and its child, "
                "imports excluded)",
                sql_cpu)]
    memory = [Row("7", "peak RSS, audit --json (the whole command)", peak, *check(peak, "<=", 300)),
              Row("7", "peak RSS, audit() + streamed JSON (fresh process)",
                  Figure([x["peak_mb"] for x in r["audit"]], "MB")),
              Row("7", "peak RSS, pyarrow.json.read_json (same file, for scale)",
                  Figure([x["peak_mb"] for x in r["pyarrow"]], "MB")),
              Row("7", "peak RSS, pandas.read_json (same file, for scale)",
                  Figure([x["peak_mb"] for x in r["pandas"]], "MB"))]
    return rows, memory


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000, help="events to write")
    parser.add_argument("--repeat", "--reps", type=int, default=2, dest="reps",
                        help="samples per figure (a fresh process each)")
    parser.add_argument("--child", nargs=2, metavar=("TASK", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_task(args.child[0], Path(args.child[1]))))
        return 0
    sys.path.insert(0, str(HERE))
    sys.path.insert(1, str(ROOT))
    import types

    from measure import render

    import compileall  # as benchmarks/run.py does: the toolkit byte-compiled, as installed

    compileall.compile_dir(ROOT / "toolkit", quiet=1)
    cfg = types.SimpleNamespace(audit_lines=args.lines, huge_reps=args.reps)
    with tempfile.TemporaryDirectory() as tmp:
        rows, memory = section(cfg, Path(tmp))
    print(render(rows + memory))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
