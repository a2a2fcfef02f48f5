"""The bytes on disk of a JSONL ledger, before and after a torn write and a power cut.

Two stories, each with the package's own fault machinery, nothing simulated
in the view:

- ``torn_write(workdir)``: a JSONL ledger (seeded clock, so its bytes are the
  same on every run) has ``faults.tear_jsonl_writes`` cut its next append
  halfway (half the line really written with ``os.write``, then the crash);
  the next open reports the torn tail (``torn_tail``) and the next append cuts
  it off before writing.
- ``power_cut(ledger, workdir)``: a two-document batch runs in a forked child
  (``explore.child.run_batch``) that really SIGKILLs itself right after the
  first ``done`` is acknowledged; then ``explore.powerloss.drop_unsynced`` cuts
  the file back to its last fsync, as the disk would be after a power cut;
  then a rerun in a fresh child and the checker's verdict.

``bytes_table(snapshot)`` shows a snapshot line by line: its bytes, whether
it ends with a newline, and its text (keys cut to 8 hex digits).
"""

import dataclasses
import itertools
from pathlib import Path

from toolkit.widgets.tables import Table, short

CLOCK_START = 1_700_000_000.0  # the torn-write story's clock: its bytes never vary


@dataclasses.dataclass(frozen=True)
class Snapshot:
    label: str
    data: bytes

    def lines(self) -> list[bytes]:
        """Every line with its newline; a last piece without one is the torn tail."""
        return self.data.splitlines(keepends=True)

    @property
    def whole(self) -> int:
        return sum(line.endswith(b"\n") for line in self.lines())

    @property
    def torn(self) -> int:
        """Bytes after the last newline: half a line, unusable."""
        return len(self.data) - len(self.data.rsplit(b"\n", 1)[0]) - 1 if b"\n" in self.data \
            else len(self.data)


def snapshot(path, label: str) -> Snapshot:
    path = Path(path)
    return Snapshot(label, path.read_bytes() if path.exists() else b"")


def bytes_table(snap: Snapshot, sizes: bool = True, width: int = 72) -> Table:
    """One row per line of the file; the torn tail marked. ``sizes=False`` leaves out byte
    counts (for files whose lines carry wall-clock stamps of varying length)."""
    rows = []
    for n, line in enumerate(snap.lines(), 1):
        # Keys are cut before the width is, so the cut never eats the move a line records.
        text = short(line.rstrip(b"\n").decode("utf-8", "replace") if sizes else _event_text(line))
        row = {"line": n, "ends": "\\n" if line.endswith(b"\n") else "TORN (no newline)",
               "content": text if len(text) <= width else text[:width - 1] + "…"}
        if sizes:
            row["bytes"] = len(line)
        rows.append(row)
    columns = ["line", "bytes", "ends", "content"] if sizes else ["line", "ends", "content"]
    return Table(rows, columns, marked=[i for i, row in enumerate(rows) if row["ends"] != "\\n"],
                 title=f"{snap.label}: {len(snap.data) if sizes else '…'} bytes, "
                       f"{snap.whole} whole line(s), " + (
                           f"torn tail of {snap.torn} byte(s)" if sizes else
                           "a torn tail (part of a line)" if snap.torn else "no torn tail"))


def _event_text(line: bytes) -> str:
    """A whole event line without its wall-clock fields: seq, op, key, from -> to."""
    import json

    try:
        obj = json.loads(line)
        return f"#{obj['seq']} {obj['op']} {obj['key']} {obj['from'] or '-'} -> {obj['to']}"
    except (ValueError, KeyError, TypeError):
        return line.rstrip(b"\n").decode("utf-8", "replace")


@dataclasses.dataclass(frozen=True)
class TornStory:
    before: Snapshot
    torn: Snapshot
    repaired: Snapshot
    torn_tail: dict  # what the reopened ledger reported
    states_after_open: dict  # key -> state the reopened ledger believes


def torn_write(workdir, keys=("doc-000", "doc-001", "doc-002")) -> TornStory:
    """Tear the fourth-and-later append of a small JSONL ledger; reopen; append again."""
    from toolkit.faults import Crash, tear_jsonl_writes
    from toolkit.ledger import State
    from toolkit.ledger.jsonl import JsonlLedger

    path = Path(workdir) / "ledger.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    clock = itertools.count(CLOCK_START).__next__
    ledger = JsonlLedger(path, clock=clock)
    for key in keys:
        ledger.add(key, source=f"{key}.pdf")
    ledger.move(keys[0], State.PENDING, State.UNKNOWN)
    before = snapshot(path, "before: the intent of " + keys[0])
    tear_jsonl_writes(ledger, nth=1)  # the very next append is torn
    try:
        ledger.move(keys[0], State.UNKNOWN, State.SUBMITTED, job_id="job-1")
    except Crash:
        pass  # the process is gone: what is on disk is all the next one gets
    ledger.close()
    torn = snapshot(path, "after the torn write")
    reopened = JsonlLedger(path, clock=clock)  # a new process opens the same file
    tail = dict(reopened.torn_tail or {})
    states = {item.key: item.state.value for item in reopened.items()}
    reopened.move(keys[0], State.UNKNOWN, State.SUBMITTED, job_id="job-1")
    reopened.close()
    return TornStory(before, torn, snapshot(path, "after the next append"), tail, states)


@dataclasses.dataclass(frozen=True)
class PowerCut:
    ledger: str  # a key of explore.powerloss.LEDGERS
    killed_at: str  # the durable step the child died at
    before: Snapshot  # after the SIGKILL: the page cache still holds every write
    after: Snapshot  # after the power cut: only fsynced bytes remain
    acknowledged: int  # commits that returned to the runner before the kill
    lost: list  # acknowledged transitions gone from the file
    rerun: dict  # the checker's judgement after a rerun (explore's row fields)
    rerun_submits: int = 0  # submits the rerun alone sent (rerun["submits"] counts both runs)


def power_cut(ledger: str, workdir, docs: int = 2, contract: str = "non-idempotent") -> PowerCut:
    """Kill a batch right after its first ``done`` commit, cut the ledger to its last fsync,
    rerun it, judge it."""
    from toolkit.documents import make_corpus
    from toolkit.explore import Plan, _judge
    from toolkit.explore.child import Paths, fork, run_batch
    from toolkit.explore.powerloss import drop_unsynced, lost_acknowledged, synced_size
    from toolkit.identity import file_task_key

    plan = Plan(contract=contract, docs=docs, ledger=ledger, power_loss=True, jobs=1).validate()
    root = Path(workdir)
    inputs = make_corpus(root / "in", docs=docs, poison=0, seed=plan.seed)
    names = {file_task_key(path, {}): path.stem for path in inputs}
    paths = Paths(root / ledger, root / ledger / plan.ledger_file())
    paths.root.mkdir(parents=True)
    # The uncrashed run, once, to learn the numbers of its durable steps (deterministic).
    probe = Paths(root / "probe", root / "probe" / plan.ledger_file())
    probe.root.mkdir()
    messages, _ = fork(run_batch, plan, probe, inputs, names, run=0, record=True)
    steps = [m for m in messages if m["t"] == "step"]
    first_done = next(s for s in steps if s["label"].startswith("commit move")
                      and s["label"].endswith("->done"))
    messages, _ = fork(run_batch, plan, paths, inputs, names, run=0, kill_at=first_done["n"])
    killed = next(m["label"] for m in messages if m["t"] == "kill")
    before = snapshot(paths.ledger, "after kill -9 (the page cache kept every write)")
    drop_unsynced(paths.ledger, synced_size(messages) or 0)
    after = snapshot(paths.ledger, "after the power cut (only fsynced bytes)")
    lost = lost_acknowledged(paths.ledger, messages)
    acked = sum(m["t"] == "ack" for m in messages)
    # The provider's counters span both runs: read them before the rerun, so the
    # table can show what the rerun alone sent.
    submits_before = _submit_calls(plan, paths)
    rerun, _ = fork(run_batch, plan, paths, inputs, names, run=1)
    end = next((m for m in rerun if m["t"] == "end"), None)
    rested = end is not None and not end["unsettled"] and not end["halted"]
    judged = _judge(plan, paths, inputs, rested, lost, True)
    return PowerCut(ledger, killed, before, after, acked, lost, judged,
                    judged["submits"] - submits_before)


def _submit_calls(plan, paths) -> int:
    from toolkit.provider import FakeProvider

    provider = FakeProvider(paths.provider_db, paths.provider_out, plan.contract_object())
    try:
        return provider.stats()["submit_calls"]
    finally:
        provider.close()


def power_table(cuts) -> Table:
    """One row per ledger variant: what survived the cut and what the rerun did."""
    rows = [{"ledger": cut.ledger, "killed after": cut.killed_at,
             "lines before cut": cut.before.whole, "lines after cut": cut.after.whole,
             "acked": cut.acknowledged, "acked but lost": len(cut.lost),
             "rerun submits": cut.rerun_submits, "executions (both runs)": cut.rerun["executions"],
             "verdict": cut.rerun["verdict"], "anomalies": ", ".join(cut.rerun["anomalies"]) or "-"}
            for cut in cuts]
    return Table(rows, marked=[i for i, row in enumerate(rows) if row["acked but lost"]])
