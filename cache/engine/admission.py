"""Admission on a presence miss(, like Noria's upquery): the query that missed is
answered by the backend, and the missing control key is admitted in the background - one
thread per engine, with a DuckDB handle of its own - so the next query hits. The sessions of
an engine share it (a key two of them miss is admitted once).

With a doorkeeper (``doorkeeper_seconds``, as TinyLFU's), a key is admitted on its second
miss within that many seconds, not its first: a key asked for once does not push out the
regions the cache's size budget keeps (`cache.maintenance.budget`). The doorkeeper remembers
the last ``DOORKEEPER_KEYS`` keys that missed once. (Every miss counts as a read of its key
for the size budget's policy, `cache.store.budget.RegionHits`: a key admitted again comes with
its history.)"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import typing as t
from collections.abc import Callable, Iterable

from cache.maintenance.pipeline import Maintainer
from cache.store.cache_file import CacheStore

Item = tuple[str, tuple[t.Any, ...]]  # (control table, key)


DOORKEEPER_KEYS = 100_000


class Doorkeeper:
    """Admits a key on its second miss within ``seconds`` (see the module)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self._missed: dict[t.Hashable, float] = {}  # key -> when it missed once, oldest first

    def admits(self, item: t.Hashable) -> bool:
        """Whether ``item`` missed once within the window (else this first miss is noted)."""
        now = self.clock()
        missed = self._missed
        first = missed.pop(item, None)
        if first is not None and now - first <= self.seconds:
            return True
        missed[item] = now
        for old in list(itertools.islice(missed, max(len(missed) - DOORKEEPER_KEYS, 0))):
            del missed[old]  # (the oldest, beyond the keys it remembers)
        return False


class Admissions:
    def __init__(
        self, store: CacheStore, dsn: Callable[[], str], doorkeeper_seconds: float | None = None
    ) -> None:
        self._store = store
        self._dsn = dsn
        self._queue: queue.Queue[Item | None] = queue.Queue()
        self._queued: set[Item] = set()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []  # the failures (their queries were answered remotely)
        self._lock = threading.Lock()
        # None: admit on the first miss
        self.doorkeeper = Doorkeeper(doorkeeper_seconds) if doorkeeper_seconds else None

    def request(self, items: Iterable[Item]) -> int:
        """Admit these keys in the background; the number the doorkeeper deferred to their
        second miss."""
        deferred = 0
        with self._lock:
            for item in items:
                if item in self._queued:
                    continue
                if self.doorkeeper is not None and not self.doorkeeper.admits(item):
                    deferred += 1
                    continue
                self._queued.add(item)
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._loop, name="mtcache-admit", daemon=True
                    )
                    self._thread.start()
                self._queue.put(item)
        return deferred

    def wait(self) -> None:
        """Block until the admissions requested so far are done."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        self.wait()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        store = self._store.for_thread()
        try:
            while (item := self._queue.get()) is not None:
                control, key = item
                try:
                    Maintainer(store, self._dsn()).admit(control, [key])
                except Exception as exc:  # the query was answered remotely; log and go on
                    self.errors.append(f"admitting {key} into {control}: {exc}")
                finally:
                    with self._lock:
                        self._queued.discard(item)
                    self._queue.task_done()
            self._queue.task_done()
        finally:
            store.close()
