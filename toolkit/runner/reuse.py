"""What a rerun reuses: done items whose artifact is the one recorded (the safe runner).

A done item's artifact is vouched for by the stat recorded at ``done`` (size,
``mtime_ns``, ``ctime_ns``, inode: ``artifacts``, git's index), else by its full
SHA-256; under another ``--out`` it is found under the recorded outputs root and
materialized here (``roots``). The chunk's done items that enqueue read and whose
stat is the recorded one are settled in one pass before ``process`` sees the rest
(``_reused``): a rerun of a large, nearly done batch is mostly these.

Mixed into ``Runner``: it uses the pipeline's ``out_dir``, ``_known``, ``verify_all``,
``other_roots``, ``_unplaced`` and the runner's ``_unwritable``.
"""

from pathlib import Path

from toolkit import documents, roots
from toolkit.ledger import State
from toolkit.runner import artifacts

S = State


class Reuse:
    """Mixed into ``Runner``: reuse of done items, one by one and a chunk at a time."""

    _own_process = None  # the safe runner's ``process`` (set beside it): ``_reused`` runs
    # only while that is the one in force (a strategy or a test that replaces it decides)

    def _process_chunk(self, keys, ended=None) -> dict:
        """``Pipeline._process_chunk``, the chunk's reusable done items first (``_reused``)."""
        return super()._process_chunk(keys, self._reused(keys))

    def _reused(self, keys) -> dict:
        """The done items of ``keys`` that enqueue read (``_known``: vouched for by the ledger)
        whose artifact's stat is the one recorded at done, by key: reused exactly as
        ``process`` reuses them, in one pass with no call of it per item (a rerun of a
        large, nearly done batch is mostly these). Any other item, and every item of a
        strategy with its own ``process``, goes to ``process``; none with ``--verify``."""
        cls = type(self)
        if self.verify_all or cls.process is not cls._own_process:  # replaced: that decides
            return {}
        known, done = self._known, S.DONE
        items = [item for key in keys if (item := known.get(key)) is not None
                 and item.state is done and item.artifact_path]
        same = artifacts.unchanged_all(self._artifact_texts(items), items)
        reused = {item.key: item for item, ok in zip(items, same) if ok}
        self.reused += len(reused)
        return reused

    def _artifact_file(self, item) -> Path:
        return roots.resolve(self.out_dir, item.artifact_path)

    def _artifact_intact(self, item) -> bool:
        """Verified under ``--out`` (by its recorded stat, else its SHA-256: ``artifacts``);
        or found verified (hashed) under the recorded outputs root and materialized here
        (a rerun with another ``--out``): reads and a copy, no state."""
        if not item.artifact_path:
            return False
        if self._stat_vouches(item):
            return True  # the very file recorded at done
        if documents.verify(self._artifact_file(item), item.artifact_size, item.artifact_sha256):
            return True
        if Path(item.artifact_path).is_absolute():
            return False
        target = self.out_dir / item.artifact_path
        try:
            return roots.materialize(item.artifact_path, item.artifact_size,
                                     item.artifact_sha256, target, self.other_roots)
        except OSError as exc:  # e.g. a directory where the artifact goes: this item only
            self._unplaced.add(item.key)
            self._unwritable(target, exc)  # a full disk halts the batch
            return False

    def _stat_vouches(self, item) -> bool:
        """True when ``item``'s artifact under ``--out`` has the stat recorded at done
        (``artifacts.unchanged``); never with ``--verify``, which hashes every one."""
        return bool(item.artifact_path) and not self.verify_all and artifacts.unchanged(
            self._artifact_texts((item,))[0], item)

    def _artifact_texts(self, items) -> list:
        """The path of each item's artifact under ``--out``, as text (an absolute one is
        itself): ``os.path.join``'s rule, without its Python call per item."""
        out = self._out_slash
        return [path if (path := item.artifact_path)[0] == "/" else out + path
                for item in items]
