"""Kill -9 for real, in a notebook: a crash map from ``explore``, then one crash replayed.

``sweep(plan)`` runs ``toolkit.explore.explore`` on a small batch: a forked
child per crash point, really killed with SIGKILL at that durable step (or
with the download cut first), rerun in fresh processes until it rests and
judged by the checker. ``map_rows`` turns its rows into ``viz.crash_map``
rows. ``replay(plan, point)`` runs one crash point again, the same way,
recording every durable step of the killed run and of the first rerun, so a
student can step through them: ``replay_frames`` lists them, the kill and
the restart included.

``KillChoice``/``kill_step`` hold the panel's state as plain data (tests
drive them without a browser); ``KillNine`` wires them to widgets.
"""

import dataclasses
import tempfile
from pathlib import Path

STRATEGIES = ("safe", "blind-retry", "batch-commit", "output-exists")


@dataclasses.dataclass(frozen=True)
class Replay:
    """One crash point run again: the steps up to the kill, the rerun's steps, the row."""

    point: int
    how: str
    killed: bool  # the child really died of SIGKILL at that step
    first: tuple  # durable steps of the killed run: {"n", "kind", "label"}
    rerun: tuple  # durable steps of the first rerun
    row: dict  # the checker's judgment, as in the crash map


def plan_for(strategy="safe", every=1, docs=2):
    """The explore plan of the panel: ``docs`` documents, non-idempotent provider."""
    from toolkit.explore import Plan

    return Plan(strategy=strategy, docs=docs, every=every, jobs=2, runs=3).validate()


def sweep(plan):
    """Kill a real batch at each durable step of ``plan`` (``explore``); the Exploration."""
    from toolkit.explore import explore

    return explore(plan)


def map_rows(exploration) -> list[dict]:
    """``viz.crash_map`` rows: x = the durable step killed, one lane per kill kind."""
    labels = {step["n"]: step["label"] for step in exploration.steps}
    lane = exploration.plan.strategy
    return [{"step": row["point"], "point": f"{row['point']} {_short(labels[row['point']])}",
             "verdict": row["verdict"], "lane": f"{lane} \u00b7 {row['how']}"}
            for row in exploration.rows if row["point"] in labels]


def _short(label: str, width: int = 22) -> str:
    """The whole step label on lines of ``width``: never cut, the state change is at its end."""
    import textwrap

    return "\n".join(textwrap.wrap(label, width)) or label


def replay(plan, point: int, how: str = "kill") -> Replay:
    """Run crash point ``point`` of ``plan`` again (forked, real SIGKILL), recording steps."""
    from toolkit.explore import Point, _explore_point, batch_inputs
    from toolkit.explore.child import fork

    with tempfile.TemporaryDirectory(prefix="kill9-") as tmp:
        root = Path(tmp)
        inputs, names = batch_inputs(plan, root / "in")
        messages, status = fork(_explore_point, plan, root / "point", inputs, names,
                                Point(point, how), record_first=True, record_recovery=True)
    end = next((m for m in messages if m["t"] == "end"), None)
    if end is None:
        raise RuntimeError(f"the crash point's supervisor failed (status {status})")
    row = end["row"]
    return Replay(point, how, row["step"] is not None and row["verdict"] != "not-reached",
                  tuple(end["first_steps"]), tuple(end["recovery_steps"]), row)


def replay_frames(replayed: Replay) -> tuple[str, ...]:
    """The replay as frames: each durable step of the killed run, the SIGKILL, the restart,
    each step of the rerun, the verdict."""
    frames = [f"run 1 · step {s['n']} · {s['label']}" for s in replayed.first]
    cut = " (the download cut to half first)" if replayed.how != "kill" else ""
    frames.append(f"run 1 · SIGKILL at step {replayed.point}{cut}: the process is gone, "
                  "no handler, no flush")
    frames.append("restart: a new process opens the ledger and the provider's records "
                  "as the kill left them")
    frames += [f"run 2 · step {s['n']} · {s['label']}" for s in replayed.rerun]
    row = replayed.row
    found = f": {', '.join(row['anomalies'])}" if row["anomalies"] else ""
    frames.append(f"judged: {row['verdict']}{found} · {row['outcome']} · submits "
                  f"{row['submits']}, executions {row['executions']}")
    return tuple(frames)


@dataclasses.dataclass(frozen=True)
class KillChoice:
    strategy: str = "safe"
    every: int = 1
    exploration: object = None
    replayed: Replay | None = None
    index: int = 0  # the frame of the replay shown


def kill_step(state: KillChoice, action, sweep=sweep, replay=replay) -> KillChoice:
    """``("strategy", name)``, ``("every", n)``, ``("run",)``, ``("pick", (point, how))``
    or ``("frame", i)``; a new strategy or spacing drops the map and the replay.

    Raises:
        ValueError: an unknown strategy, a point the map does not have, or an unknown action.
    """
    verb, *args = action
    if verb == "strategy":
        if args[0] not in STRATEGIES:
            raise ValueError(f"unknown strategy {args[0]!r}; one of {STRATEGIES}")
        return KillChoice(args[0], state.every)
    if verb == "every":
        return KillChoice(state.strategy, max(1, int(args[0])))
    if verb == "run":
        return KillChoice(state.strategy, state.every, sweep(plan_for(state.strategy,
                                                                      state.every)))
    if verb == "pick":
        point, how = args[0]
        rows = () if state.exploration is None else state.exploration.rows
        if not any((row["point"], row["how"]) == (point, how) for row in rows):
            raise ValueError(f"no crash point {point} ({how}) on the map")
        return dataclasses.replace(state, replayed=replay(state.exploration.plan, point, how),
                                   index=0)
    if verb == "frame":
        count = len(replay_frames(state.replayed)) if state.replayed else 0
        return dataclasses.replace(state, index=min(max(int(args[0]), 0), max(count - 1, 0)))
    raise ValueError(f"unknown kill -9 panel action {action!r}")
