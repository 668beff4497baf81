"""Admission on a presence miss(, like Noria's upquery): the query that missed is
answered by the backend, and the missing control key is admitted in the background - one
thread per engine, with a DuckDB handle of its own - so the next query hits. The sessions of
an engine share it (a key two of them miss is admitted once)."""

from __future__ import annotations

import queue
import threading
import typing as t
from collections.abc import Callable, Iterable

from cache.maintenance.pipeline import Maintainer
from cache.store.cache_file import CacheStore

Item = tuple[str, tuple[t.Any, ...]]  # (control table, key)


class Admissions:
    def __init__(self, store: CacheStore, dsn: Callable[[], str]) -> None:
        self._store = store
        self._dsn = dsn
        self._queue: queue.Queue[Item | None] = queue.Queue()
        self._queued: set[Item] = set()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []  # the failures (their queries were answered remotely)
        self._lock = threading.Lock()

    def request(self, items: Iterable[Item]) -> None:
        with self._lock:
            for item in items:
                if item in self._queued:
                    continue
                self._queued.add(item)
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._loop, name="mtcache-admit", daemon=True
                    )
                    self._thread.start()
                self._queue.put(item)

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
                    self._queued.discard(item)
                    self._queue.task_done()
            self._queue.task_done()
        finally:
            store.close()
