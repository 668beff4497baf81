"""A loop in a daemon thread, started once and stopped with a join: the heartbeat's, and the
background work of the process that owns a cache file (the refresh scheduler, the stream
consumer). The loop itself watches `Loop.stopping` (``stopping.wait(seconds)`` between
rounds)."""

from __future__ import annotations

import threading
import typing as t


class Loop:
    def __init__(self, name: str) -> None:
        self.name = name
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, target: t.Callable[..., object], **kwargs: t.Any) -> None:
        """Run ``target(**kwargs)`` in a daemon thread (once: a second start does nothing)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=target, kwargs=kwargs, name=self.name, daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Ask the loop to stop and wait until it has (a round in flight finishes first)."""
        self.stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
