"""Normalizing foreign records: where other pipelines keep the same facts.

Field names are looked up in order; a value of the wrong JSON type counts as
absent (the checks then say what is missing), never as an error.
"""

import json

from toolkit.forensics.model import Record

PATH_FIELDS = ("artifact_path", "output", "artifact", "path")
SIZE_FIELDS = ("artifact_size", "size")
SHA_FIELDS = ("artifact_sha256", "sha256")
REASON_FIELDS = ("reason", "error", "message")
SOURCE_FIELDS = ("source", "file", "name")
INPUT_DIGEST_FIELDS = ("input_sha256", "digest", "sha256")  # in a payload, sha256 is the input's


def first(obj: dict, names, kind):
    for name in names:
        value = obj.get(name)
        if type(value) is kind and (kind is not str or value):
            return value
    return None


def failure_class(obj: dict) -> str | None:
    """transient / permanent from ``failure`` or ``retryable``; None when unclassified."""
    failure = obj.get("failure")
    if failure in ("transient", "permanent"):
        return failure
    retryable = obj.get("retryable")
    if type(retryable) is bool:
        return "transient" if retryable else "permanent"
    return None


def foreign_item(key, state, raw_state, info: dict, *, source=None, input_digest=None,
                 updated=None) -> dict:
    """A normalized item record from a foreign record ``info`` (result fields)."""
    return Record(key, state=state, raw_state=raw_state,
                    source=source if type(source) is str else None,
                    input_digest=input_digest if type(input_digest) is str else None,
                    artifact_path=first(info, PATH_FIELDS, str),
                    artifact_size=first(info, SIZE_FIELDS, int),
                    artifact_sha256=first(info, SHA_FIELDS, str),
                    failure=failure_class(info) if state == "failed" else None,
                    reason=first(info, REASON_FIELDS, str), updated=updated)


def same_record(a: dict, b: dict) -> bool:
    """Two records of one key that say the same thing (timestamps aside)."""
    ignore = ("ts", "time", "updated", "updated_at")
    return ({k: v for k, v in a.items() if k not in ignore}
            == {k: v for k, v in b.items() if k not in ignore})


def parse_json_column(value) -> tuple[dict, str | None]:
    """A TEXT/BLOB column holding a JSON object → (object, problem or None)."""
    if value is None or value == "":
        return {}, None
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return {}, "not UTF-8"
    if not isinstance(value, str):
        return {}, f"{type(value).__name__}, not JSON text"
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError):
        return {}, "not JSON"
    if not isinstance(obj, dict):
        return {}, f"JSON {type(obj).__name__}, not an object"
    return obj, None
