"""Random external kills: ``python -m toolkit run`` as a real process, SIGKILLed at random moments.

Seeded, argparse, not collected by pytest (its name does not start with
``test_``). It writes a corpus, starts the real command and sends it SIGKILL
after a seeded random delay, again and again until a run gets through; then
it reruns the same command until the batch rests and checks, with the
checker as the oracle (a new batch starts until ``--kills`` kills landed):

* the checker finds no anomaly in the whole history (both ledgers, the call
  logs, the artifacts on disk); ``undecided`` counts as a failure;
* ``provider-stats --json``: no task succeeded twice; under a contract
  without idempotent keys, no task was submitted twice (no blind resubmit);
* the ledger: every item rests (done, needs_review, or failed for poison),
  the poison files failed, nothing is lost.

    python tests/stress_kill9.py --kills 20 --docs 30 --poison 3 --seed 7
    python tests/stress_kill9.py --contract idempotent --ledger jsonl --kills 50
    python tests/stress_kill9.py --strategy blind-retry   # must FAIL: exit 1

Exit 0 when every invariant holds, 1 when one breaks (each printed), 2 on bad use.
"""

import argparse
import dataclasses
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def toolkit(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "toolkit", *map(str, args)], text=True,
                          capture_output=True, check=kwargs.pop("check", False), **kwargs)


def kill_until_finished(command, budget: int, rng: random.Random, max_delay: float,
                        log) -> list[dict]:
    """Start ``command`` again and again, SIGKILL each after a seeded random delay.

    Stops when a run finishes on its own (the batch got through) or after
    ``budget`` real kills.
    """
    shots = []
    while sum(shot["killed"] for shot in shots) < budget:
        delay = rng.uniform(0.0, max_delay)
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        killed = child.poll() is None
        if killed:
            child.kill()  # SIGKILL: no handler, no finally, no flush
        shots.append({"delay": round(delay, 3), "killed": killed, "returncode": child.wait()})
        log(f"  {'SIGKILL' if killed else 'finished'} after {delay:.3f} s")
        if not killed:
            break
    return shots


def rerun_until_rest(command, limit: int) -> dict:
    for attempt in range(1, limit + 1):
        final = subprocess.run(command, capture_output=True, text=True, check=False)
        if final.returncode == 0:
            return {"reruns": attempt, **json.loads(final.stdout)}
    raise SystemExit(f"the batch did not rest after {limit} reruns: {final.stderr.strip()}")


def check_invariants(args, work: Path, inputs, final: dict) -> list[str]:
    from toolkit.checker import check, explain
    from toolkit.drills import collect_history
    from toolkit.provider import FakeProvider, parse_contract

    failures = []
    contract = dataclasses.replace(parse_contract(args.contract), seed=args.seed)
    db = work / "provider.db"
    with FakeProvider(db, db.with_name(db.stem + "-jobs"), contract) as provider:
        verdict = check(collect_history(args.ledger_path, provider, inputs, contract))
    if verdict.valid is not True:
        failures += [explain(a) for found in verdict.anomalies.values() for a in found]
        failures += [f"checker undecided: {note}" for note in verdict.notes]

    stats = toolkit("provider-stats", "--provider-db", db, "--json", check=True)
    per_task = json.loads(stats.stdout)["per_task"]
    failures += [f"task {task[:12]} succeeded {row['succeeded']} times"
                 for task, row in sorted(per_task.items()) if row["succeeded"] > 1]
    if not contract.idempotent_keys:
        failures += [f"task {task[:12]} submitted {row['submit_calls']} times (no idempotent keys)"
                     for task, row in sorted(per_task.items()) if row["submit_calls"] > 1]

    by_state = final["by_state"]
    if by_state["failed"] != args.poison:
        failures.append(f"{by_state['failed']} failed items, {args.poison} poison files")
    resting = by_state["done"] + by_state["needs_review"] + by_state["failed"]
    if resting != final["items"] or final["items"] != args.docs + args.poison:
        failures.append(f"{final['items']} items for {args.docs + args.poison} inputs, "
                        f"{resting} resting: {by_state}")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10, help="real SIGKILLs in all (10)")
    parser.add_argument("--docs", type=int, default=20, help="healthy documents (20)")
    parser.add_argument("--poison", type=int, default=2, help="poison files (2)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the corpus and the kill delays")
    parser.add_argument("--contract", default="non-idempotent")
    parser.add_argument("--strategy", default="safe")
    parser.add_argument("--ledger", default="sqlite", choices=("sqlite", "jsonl"))
    parser.add_argument("--max-delay", type=float, default=2.5,
                        help="kill delays are uniform in [0, MAX_DELAY] seconds (2.5)")
    parser.add_argument("--reruns", type=int, default=5, help="reruns allowed to rest (5)")
    parser.add_argument("--workdir", help="keep the batch here (default: a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print one JSON summary")
    args = parser.parse_args(argv)
    if min(args.kills - 1, args.docs, args.poison, args.reruns - 1) < 0 or args.max_delay <= 0:
        parser.error("--kills and --reruns must be >= 1, --docs/--poison >= 0, --max-delay > 0")
    if args.workdir and Path(args.workdir).exists() and any(Path(args.workdir).iterdir()):
        parser.error(f"--workdir {args.workdir} is not empty")

    with tempfile.TemporaryDirectory(prefix="stress-kill9-") as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        from toolkit.documents import make_corpus

        inputs = make_corpus(work / "in", docs=args.docs, poison=args.poison, seed=args.seed)
        log = (lambda line: print(line, file=sys.stderr)) if not args.json else (lambda line: None)
        rng, rounds, failures = random.Random(args.seed), [], []
        # A round is one batch (fresh ledger, provider and output folder, the same inputs),
        # killed until a run gets through, then rerun to rest and checked.
        while sum(r["kills"] for r in rounds) < args.kills:
            here = work / f"round-{len(rounds) + 1}"
            suffix = ".json" if args.strategy == "rewrite-state" else f".{args.ledger}"
            args.ledger_path = here / f"ledger{suffix}"
            here.mkdir()
            command = [sys.executable, "-m", "toolkit", "run", "--inputs", str(work / "in"),
                       "--ledger", str(args.ledger_path), "--provider-db",
                       str(here / "provider.db"), "--out", str(here / "out"), "--contract",
                       args.contract, "--strategy", args.strategy, "--seed", str(args.seed),
                       "--json", "--no-progress"]
            log(f"round {len(rounds) + 1}")
            shots = kill_until_finished(command, args.kills - sum(r["kills"] for r in rounds),
                                        rng, args.max_delay, log)
            final = rerun_until_rest(command, args.reruns)
            found = check_invariants(args, here, inputs, final)
            failures += [f"round {len(rounds) + 1}: {failure}" for failure in found]
            rounds.append({"kills": sum(shot["killed"] for shot in shots), "shots": shots,
                           "reruns": final["reruns"], "by_state": final["by_state"],
                           "failures": found})

    summary = {"kills": sum(r["kills"] for r in rounds), "rounds": rounds, "failures": failures}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{summary['kills']} SIGKILLs over {len(rounds)} batch(es), each then rerun to rest")
        print("\n".join(f"FAIL {failure}" for failure in failures) or "all invariants hold")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
