"""The JSONL history format of ``fixtures/histories``: one object per line with a ``kind``."""

import collections
import dataclasses
import json
from pathlib import Path

from toolkit.checker import ArtifactOnDisk, Call, Execution, History
from toolkit.errors import ToolkitError
from toolkit.ledger import Event, Item, State, apply_event


def _item(obj: dict) -> Item:
    names = {f.name for f in dataclasses.fields(Item)} - {"state"}
    return Item(**{k: v for k, v in obj.items() if k in names}, state=State(obj["state"]))


# keyed kinds pop their key first (left to right), then build from the rest
_READ = {"event": Event.from_json, "call": lambda o: Call(**o), "item": _item,
         "execution": lambda o: Execution(**o),
         "artifact": lambda o: (str(o.pop("key")), ArtifactOnDisk(**o)),
         "input": lambda o: (str(o.pop("key")), {"source": o.get("source"),
                                                 "poison": bool(o.get("poison")),
                                                 **({"pages": int(o["pages"])} if "pages" in o
                                                    else {})})}


def load_history(path) -> History:
    """Read a JSONL history: one object per line with a ``kind``.

    Kinds: contract (``idempotent_keys``, ``key_retention``, ``calls`` or
    ``executions`` = "unavailable"), input, event (``Event.to_json()`` keys),
    call, execution, artifact, item, note (ignored; so is a ``note`` field).
    Without item lines the items are the fold of the events.

    Raises:
        ToolkitError: unreadable file, or a malformed line (naming its number).
    """
    parts, contract = collections.defaultdict(list), {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ToolkitError(f"cannot read history {path}: {exc}") from exc
    for number, line in enumerate(lines, 1):
        try:
            obj = json.loads(line) if line.strip() else {"kind": "note"}
            kind = obj.pop("kind")
            obj.pop("note", None)
            if kind == "contract":
                contract.update(obj)
            elif kind != "note":
                parts[kind].append(_READ[kind](obj))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ToolkitError(f"{path}:{number}: bad history line: {exc!r}") from exc
    events = tuple(parts["event"])
    items = {i.key: i for i in parts["item"]}
    for e in () if items else sorted(events, key=lambda e: e.seq):
        if e.op == "add" or e.key in items:
            items[e.key] = apply_event(items.get(e.key), e)
    unavailable = {name for name in ("calls", "executions") if contract.get(name) == "unavailable"}
    return History(events, items,
                   None if "calls" in unavailable else tuple(parts["call"]),
                   None if "executions" in unavailable else tuple(parts["execution"]),
                   dict(parts["artifact"]), dict(parts["input"]),
                   bool(contract.get("idempotent_keys", True)), contract.get("key_retention"))


def dump_history(history: History, path) -> None:
    """Write ``history`` as JSONL that ``load_history`` reads back equal."""
    unavailable = {name: "unavailable" for name in ("calls", "executions")
                   if getattr(history, name) is None}
    rows = [{"kind": "contract", "idempotent_keys": history.idempotent_keys,
             "key_retention": history.key_retention, **unavailable}]
    rows += [{"kind": "input", "key": k, **v} for k, v in history.inputs.items()]
    rows += [{"kind": "event", **e.to_json()} for e in history.events]
    rows += [{"kind": kind, **dataclasses.asdict(r)} for kind, records in (
        ("call", history.calls or ()), ("execution", history.executions or ()),
        ("item", history.items.values())) for r in records]
    rows += [{"kind": "artifact", "key": k, **dataclasses.asdict(a)}
             for k, a in history.artifacts.items()]
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows))
