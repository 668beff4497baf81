"""What the reads teach, gathered in the process that answers and kept in the cache file now
and then: the bounds asked (`cache.store.bound_asks`) and the reads the backend answered
(`cache.store.remote_reads`). Both are read from the file once per process, changed under one
lock, and written at most every ``SAVE_EVERY`` seconds unless forced (when the process's last
handle on the file closes)."""

from __future__ import annotations

import abc
import threading
import typing as t
from collections.abc import Iterable

SAVE_EVERY = 60.0  # seconds between writes to the cache file


class Gathered(abc.ABC):
    TABLE: t.ClassVar[str]  # its table in the file (schema mtcache)
    COLUMNS: t.ClassVar[str]  # what `load` takes of its rows (a SELECT list)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded = False
        self._dirty = False  # changed since last written
        self._saved_at: float | None = None

    @property
    def loaded(self) -> bool:
        return self._loaded

    def _first_load(self) -> bool:
        """Under the lock: whether the file's rows are to be read in now (once)."""
        if self._loaded:
            return False
        self._loaded = True
        return True

    @abc.abstractmethod
    def load(self, rows: Iterable[tuple[t.Any, ...]]) -> None:
        """The file's rows (``COLUMNS`` of ``TABLE``), once per process, added to what this
        process gathered before."""

    @abc.abstractmethod
    def to_save(self, now: float, force: bool = False) -> list[tuple[t.Any, ...]] | None:
        """The rows of ``TABLE`` to write at ``now``; None: nothing changed, or not yet (at
        most every SAVE_EVERY seconds unless ``force``)."""

    def unsaved(self) -> None:
        """The write `_due` allowed failed: to be written again."""
        with self._lock:
            self._dirty = True

    def _due(self, now: float, force: bool) -> bool:
        """Under the lock: whether to write now (then counted as written)."""
        if not self._dirty or (
            not force and self._saved_at is not None and now - self._saved_at < SAVE_EVERY
        ):
            return False
        self._saved_at, self._dirty = now, False
        return True
