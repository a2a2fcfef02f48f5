"""The audit's input checks: each item's input, looked for in ``--inputs`` as ``run`` would.

``run`` takes every entry of the folder that is an input (``runner.inputs.scan``: named
``*.pdf`` in any case, or a regular file that starts as a PDF), follows a symlink entry
wherever it points, and keys the item by the entry's content (content + options), never
by its name. So the audit answers the same way:

- a name that escapes the folder (``..``, an absolute path elsewhere, a directory symlink
  on the way) is ``unsafe_input_path`` and never opened; the entry itself may be a symlink
  to anywhere (run reads it), and a dangling one is ``input_missing``;
- an item whose recorded content is in the folder under another name (renamed, or names
  swapped) is ``input_renamed``: run finds it by content, so it keeps its own plan;
- otherwise a name that is gone is ``input_missing``, and a name that now holds other
  content is ``stale_input``; its detail says whether another item of the ledger holds
  the new content (``SUPERSEDED``: taken up before the change or by a later run).

Which entries are inputs is ``documents.is_input_entry``, the rule ``run``'s scan asks.
Only regular files are read (``O_NONBLOCK``, ``fstat``), and the folder's other entries
are hashed only when an item's content is not where its name says (once per audit).
"""

import os

from toolkit import roots
from toolkit.documents import is_input_entry
from toolkit.forensics.checks import SUPERSEDED, file_digest, inside, unnamable
from toolkit.forensics.model import Anomaly


def named(source: str) -> str:
    """An input's name in a detail exactly as the item's ``source`` holds it, quoted: the
    text report and the JSON then escape both the same way (``b'bad\\xff.pdf'`` is stored
    ``bad\\xff.pdf`` and shown as the source column shows it); a ``repr`` here doubled
    every backslash and wrote a newline as ``\\n`` before the view escaped it again."""
    return f"'{source}'"


class Folder:
    """The ``--inputs`` folder as ``run`` sees it; digests read once per audit."""

    def __init__(self, root: str, items: dict, ours: bool):
        self.root, self.items, self.ours = root, items, ours
        self.base, self.real_root = os.path.abspath(root), os.path.realpath(root)
        self.digests: dict = {}       # path -> (size, sha256, problem)
        self._parents: dict = {}      # folder named -> its real path (one per folder, not item)
        self._holders = None          # sha256 -> the first input name (sorted) holding it
        self._recorded = None         # recorded input digest -> key

    def locate(self, recorded: str) -> tuple[str | None, str | None]:
        """(path to open, None) or (None, why it escapes the folder). The last component
        may be a symlink to anywhere (run follows it); the folder it is in must be the
        inputs folder or inside it, resolved."""
        why = unnamable(recorded)
        if why:
            return None, why
        full = os.path.normpath(os.path.join(self.base, recorded))  # an absolute name wins
        if not (inside(full, self.base) or inside(full, self.real_root)):
            return None, f"{roots.quoted(recorded)} is outside {self.root!r}"
        if full in (self.base, self.real_root):
            return self.real_root, None  # the folder itself: not a regular file
        folder = os.path.dirname(full)
        parent = self._parents.get(folder)
        if parent is None:
            parent = self._parents[folder] = os.path.realpath(folder)
        if not inside(parent, self.real_root):
            return None, (f"{roots.quoted(recorded)} is in "
                          f"{os.path.relpath(parent, self.real_root)!r} "
                          f"from {self.root!r}, outside it")
        return os.path.join(parent, os.path.basename(full)), None

    def digest(self, path: str) -> tuple[int | None, str | None, str | None]:
        """``file_digest`` of the file ``path`` names (a symlink followed), once."""
        if path not in self.digests:
            size, sha, problem = file_digest(path, follow=True)
            if problem and os.path.islink(path) and not os.path.exists(path):
                problem = "a dangling symlink"
            self.digests[path] = size, sha, problem
        return self.digests[path]

    def holder(self, sha: str) -> str | None:
        """The name (as the ledger stores names) of the first input entry holding ``sha``."""
        if self._holders is None:
            self._holders = {}
            with os.scandir(self.real_root) as entries:
                names = sorted(entry.name for entry in entries)
            for name in names:
                path = os.path.join(self.real_root, name)
                if is_input_entry(path, name):
                    _, found, problem = self.digest(path)
                    if not problem:
                        self._holders.setdefault(found, roots.escaped_name(os.fsencode(name)))
        return self._holders.get(sha)

    def item_with(self, sha: str) -> str | None:
        """The key of the ledger's item recorded with input content ``sha``, if any."""
        if self._recorded is None:
            self._recorded = {}
            for key, item in self.items.items():
                if type(item.input_digest) is str and item.input_digest:
                    self._recorded.setdefault(item.input_digest.lower(), key)
        return self._recorded.get(sha)

    def check(self, item) -> list[Anomaly]:
        """The findings for ``item``'s input; none when it records no input name."""
        key, source, recorded = item.key, item.source, item.input_digest
        if type(source) is not str or not source:
            return []  # nothing named: counted by ``unchecked``
        bare = type(recorded) is not str or not recorded
        if bare and self.ours:
            return []  # ours: an odd entry (a FIFO, a dangling link), its reason recorded
        path, unsafe = self.locate(roots.real_name(source))  # the name the run escaped
        if unsafe:
            return [Anomaly(key, "unsafe_input_path", f"{unsafe}; not opened")]
        _, actual, problem = self.digest(path)
        if bare:  # a foreign format's name alone: only its presence
            return [Anomaly(key, "input_missing", f"input {named(source)}: {problem} (no "
                            "digest recorded: only its presence was checked)")] if problem else []
        recorded = recorded.lower()
        if actual == recorded:
            return []
        holder = self.holder(recorded)
        if holder is not None:  # run keys by content: it finds the item under this name
            now = problem or f"now holds other content (sha256 {actual[:12]}…)"
            return [Anomaly(key, "input_renamed", f"input {named(source)}: {now}; its recorded "
                            f"content is in {named(holder)}: run finds it there by content "
                            "(the key is content + options)")]
        if problem:  # gone, renamed or unreadable: its content was never read, so never "stale"
            return [Anomaly(key, "input_missing", f"input {named(source)}: {problem} (its "
                            "content was not read)")]
        other = self.item_with(actual)
        later = (f"; {SUPERSEDED} {other} (taken up before the change, or by a later run)"
                 if other is not None
                 else "; no item holds its new content yet (a run takes it up as a new item)")
        return [Anomaly(key, "stale_input", f"input {named(source)} has sha256 {actual[:12]}…, "
                        f"the item was recorded with {recorded[:12]}…{later}")]


def unchecked(items: dict, lookup: bool) -> list[Anomaly]:
    """In a format other than ours, one line-level note when ``--inputs`` could not be
    applied to every item: items that record no input name, and names without a digest,
    whose content cannot be compared (never silent). Ours record both for every input with
    content; an odd entry (a FIFO, a dangling link) has no content to record."""
    nameless = bare = 0
    if lookup:
        return []  # ours: every input run read is named (a nameless item came from the API)
    for item in items.values():
        if type(item.source) is not str or not item.source:
            nameless += 1
        elif not lookup and (type(item.input_digest) is not str or not item.input_digest):
            bare += 1
    said = [f"{nameless} item(s) record no input name: not checked" if nameless else "",
            f"{bare} item(s) record a name but no input digest: only its presence was "
            "checked (a changed content cannot be seen)" if bare else ""]
    if not nameless and not bare:
        return []
    return [Anomaly(None, "unchecked_inputs", "--inputs given, but " +
                    "; ".join(part for part in said if part))]
