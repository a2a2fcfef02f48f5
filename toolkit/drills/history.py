"""What a drill leaves behind, read back: the ledger (or the naive state file), both
call logs, the artifacts on disk, the inputs keyed as the runner keys them."""

from pathlib import Path

from toolkit import documents, roots
from toolkit.checker import ArtifactOnDisk, Call, Execution, History
from toolkit.identity import file_task_key
from toolkit.ledger import Item, State, open_ledger
from toolkit.runner.pipeline import PAGE_BY_PAGE, routed_options


def _items(ledger_path) -> tuple[Item, ...]:
    if ledger_path.suffix == ".json":
        return tuple(_state_file_items(ledger_path).values())
    with open_ledger(ledger_path) as ledger:
        return tuple(ledger.items())


def _state_file_items(path) -> dict[str, Item]:
    """The naive JSON state file, read as items (empty when it is torn)."""
    import json

    try:
        state = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {key: Item(key=key, state=State(entry["state"]), job_id=entry.get("job_id"),
                      artifact_path=entry.get("artifact_path"),
                      artifact_size=entry.get("artifact_size"),
                      artifact_sha256=entry.get("artifact_sha256"), reason=entry.get("reason"))
            for key, entry in state.items()}


def collect_history(ledger_path, provider, inputs, contract, options_sets=({},),
                    page_by_page_from=None, out=None, records=None) -> History:
    """Everything the checker judges: both ledgers, the call logs, what is on disk.

    ``records``: the ledger's ``(events, items by key)`` if the caller read them already
    (the crash exploration's judge reads an SQLite ledger read-only); else read here.

    The inputs are keyed as the runner keys them: with ``page_by_page_from``,
    a long document's identity includes its page-by-page routing. Artifacts are
    looked for under ``out``, else under the ledger's recorded root (a PostgreSQL
    ledger records none: each machine names its own ``out``).
    """
    ledger_path = Path(ledger_path)
    if records is not None:
        events, items = records
    elif ledger_path.suffix == ".json":
        events, items = (), _state_file_items(ledger_path)
    else:
        with open_ledger(ledger_path) as ledger:
            events, items = tuple(ledger.events()), {item.key: item for item in ledger.items()}
    artifacts = {}
    for key, item in items.items():
        if item.state is State.DONE and item.artifact_path:
            path = (roots.resolve(out, item.artifact_path) if out is not None
                    else roots.artifact_file(ledger_path, item.artifact_path))
            found = documents.artifact_of(path) if path.is_file() else None
            artifacts[key] = ArtifactOnDisk(str(path), found is not None, found and found.size,
                                            found and found.sha256)
    checks = {path: documents.preflight(path) for path in inputs}
    keyed = {}  # task key -> (path, page count when the document goes page by page)
    for path in inputs:
        for options in options_sets:
            routed = routed_options(documents.ocr_routed(path, options), checks[path].pages,
                                    page_by_page_from)
            keyed[file_task_key(path, routed)] = (path, checks[path].pages
                                                  if PAGE_BY_PAGE in routed else None)
    return History(
        events=events, items=items,
        calls=tuple(Call(**row) for row in provider.calls()),
        executions=tuple(Execution(**row) for row in provider.executions()),
        artifacts=artifacts,
        inputs={key: {"source": path.name, "poison": not checks[path].ok,
                      **({"pages": pages} if pages else {})}
                for key, (path, pages) in keyed.items()},
        idempotent_keys=contract.idempotent_keys, key_retention=contract.key_retention)
