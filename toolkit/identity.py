"""Request identity: what makes two requests "the same work".

``task_key = sha256(version ‖ content digest ‖ canonical options)``. The file
name is deliberately absent: renaming an input does not create new work, while
any byte of content or any option that changes the result does.
"""

import hashlib
import json
import math
from pathlib import Path

KEY_VERSION = "rt1"  # read when a key is made (a default of None): one place to change it
_CHUNK = 1 << 20


def _check_json_native(value, path):
    """Raise ``TypeError`` naming ``path`` if ``value`` is not plain JSON."""
    kind = type(value)
    if value is None or kind in (str, bool, int):
        return
    if kind is float:
        if not math.isfinite(value):
            raise TypeError(f"{path}: non-finite float {value!r} is not canonical JSON")
        return
    if kind is list:
        for index, item in enumerate(value):
            _check_json_native(item, f"{path}[{index}]")
        return
    if kind is dict:
        for name, item in value.items():
            if type(name) is not str:
                raise TypeError(f"{path}: key {name!r} is {type(name).__name__}, not str")
            _check_json_native(item, f"{path}[{name!r}]")
        return
    raise TypeError(f"{path}: {kind.__name__} is not a JSON-native type")


def canonical_json(value) -> str:
    """Serialize ``value`` as canonical JSON: sorted keys, no whitespace.

    Raises:
        TypeError: a value is not JSON-native (NaN/inf, set, tuple, bytes,
            non-string key, ...); the message names its path.

    >>> canonical_json({"b": [1, 2], "a": "x"})
    '{"a":"x","b":[1,2]}'
    """
    _check_json_native(value, "options")
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_digest(source) -> str:
    """SHA-256 hex digest of ``source``: bytes, or a path read in chunks."""
    digest = hashlib.sha256()
    if isinstance(source, (bytes, bytearray, memoryview)):
        digest.update(source)
        return digest.hexdigest()
    with open(source, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def task_key(digest: str, options: dict, version: str | None = None) -> str:
    """The stable identity of one unit of work.

    >>> task_key("ab", {"lang": "de"}) == task_key("ab", {"lang": "de"})
    True
    """
    material = "\n".join((KEY_VERSION if version is None else version, digest,
                          canonical_json(options)))
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


def task_keyer(options: dict, version: str | None = None) -> "TaskKeyer":
    """``task_key(digest, options)`` as a function of ``digest``, the options serialized once.

    >>> task_keyer({"lang": "de"})("ab") == task_key("ab", {"lang": "de"})
    True
    """
    return TaskKeyer(options, version)


class TaskKeyer:
    """``task_key(·, options)``: called on one digest, or ``many`` on a list (a rerun keys
    every input it vouches for: one list comprehension, no Python call per key)."""

    __slots__ = ("_head", "_tail")

    def __init__(self, options: dict, version: str | None = None):
        self._head, self._tail = f"{KEY_VERSION if version is None else version}\n", \
            f"\n{canonical_json(options)}"

    def __call__(self, digest: str) -> str:
        return self.many((digest,))[0]

    def many(self, digests) -> list[str]:
        """The key of each of ``digests``, in order (``task_key``'s material, spelled once)."""
        head, tail, sha256 = self._head, self._tail, hashlib.sha256
        return [sha256(f"{head}{digest}{tail}".encode("utf-8")).hexdigest()
                for digest in digests]

    @property
    def fingerprint(self) -> str:
        """What this keyer is: two keyers with one fingerprint give every digest one key.

        The version and the canonical options it keys with (their lengths make the pair
        unambiguous), and the key it gives a fixed digest (a change in how the material is
        spelled changes that one too). A key remembered beside a digest (the inputs' index)
        is reused only under the fingerprint it was made by."""
        head, tail = self._head, self._tail
        material = f"{len(head)}\n{head}{tail}\n{self(_PROBE)}"
        return hashlib.sha256(material.encode("utf-8")).hexdigest()


_PROBE = "0123456789abcdef" * 4  # the digest a fingerprint keys (``TaskKeyer.fingerprint``)


def file_task_key(path, options: dict) -> str:
    """``task_key`` of a file's content; the file's name plays no part."""
    return task_key(content_digest(Path(path)), options)


def idem_key(key: str, attempt: int) -> str:
    """The idempotency key sent to the provider for ``attempt`` (1-based).

    A retry after a real failure needs a fresh key: a provider that replays
    responses per key would otherwise replay the failure.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    return f"{key}:{attempt}"


PAGE_MARK = "#p"


def page_key(key: str, page: int) -> str:
    """The identity of one page (1-based) of a document processed page by page.

    Each page is its own unit of billable work: ``idem_key(page_key(k, 3), 1)``
    is ``k#p3:1``. ``document_of`` undoes it.
    """
    if page < 1:
        raise ValueError(f"page must be >= 1, got {page}")
    return f"{key}{PAGE_MARK}{page}"


def document_of(unit: str) -> str:
    """The document task key of a unit: itself, or the document a page key belongs to."""
    return unit.partition(PAGE_MARK)[0]
