"""Threads that write to the backend while a measurement runs (benchmarks, tests): started by
the with-block, told to stop and joined at its end. A subclass writes in ``_run(index)``
until `stopping` is set."""

from __future__ import annotations

import abc
import threading
import typing as t


class Workers(abc.ABC):
    def __init__(self, count: int = 1) -> None:
        self.stopping = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(count)]

    def __enter__(self) -> t.Self:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self._threads:
            thread.join()

    @abc.abstractmethod
    def _run(self, index: int) -> None:
        """Write until `stopping` is set (thread ``index`` of ``count``)."""
