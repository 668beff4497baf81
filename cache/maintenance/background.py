"""The background work of the process that owns a cache file: the refresh
scheduler, the stream consumer of continuously maintained views and, when a connection asks
for it, the heartbeat thread; one of each per cache file per process.

The first connection that opens the file with ``background=True`` (the default) starts it; it
runs while any such connection of the process is open and stops when the last one closes (a
refresh in flight finishes first: it is one transaction, and the next tick never comes). The
scheduler refreshes every white view per its ``REFRESH EVERY`` (cache.maintenance.scheduler),
pulling inline or on Spark by size (`SizedEngine`). The heartbeat beats the backend's heartbeat
row and keeps the process's estimate of the backend clock (`heartbeat.beat`); the connections'
sessions use it. The consumer applies the replication slot of the file's `REFRESH CONTINUOUSLY`
views (`cache.maintenance.stream`; idle while there are none) and rides out backend outages.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from cache.maintenance.pipeline import SizedEngine
from cache.maintenance.scheduler import RefreshScheduler
from cache.maintenance.stream import DEFAULT_LAG_LIMIT, Consumer
from cache.maintenance.stream.arrangements import ARRANGED_BYTES
from cache.store.cache_file import CacheStore
from heartbeat.beat import Heartbeat

log = logging.getLogger("mtcache.background")

TICK_SECONDS = 1.0  # how often the scheduler looks for due views


@dataclass
class Background:
    path: Path
    scheduler: RefreshScheduler
    consumer: Consumer
    heartbeat: Heartbeat | None = None
    users: int = 0


_RUNNING: dict[Path, Background] = {}
_LOCK = threading.Lock()


def attach(
    store: CacheStore,
    backend: str,
    heartbeat: float | None = None,
    lag_limit: int = DEFAULT_LAG_LIMIT,
    arranged_bytes: int = ARRANGED_BYTES,
    spark_master: str | None = None,
) -> Background:
    """The file's background work, started if this is its first user in the process; with a
    heartbeat every ``heartbeat`` seconds if asked (and none runs yet); the stream consumer
    warns when its slot holds more than ``lag_limit`` bytes of WAL, and its arrangements take
    at most ``arranged_bytes`` (`cache.maintenance.stream.arrangements`); the scheduler's
    pulls on Spark run on ``spark_master`` (default local[*])."""
    path = store.path.resolve()
    with _LOCK:
        background = _RUNNING.get(path)
        if background is None:
            scheduler = RefreshScheduler(
                store, backend, SizedEngine(spark_master), tick=TICK_SECONDS
            )
            consumer = Consumer(
                store.for_thread(), backend, lag_limit=lag_limit, arranged_bytes=arranged_bytes
            )
            background = _RUNNING[path] = Background(path, scheduler, consumer)
            scheduler.start()
            consumer.start()
            log.info("refresh scheduler started for %s", path)
        if heartbeat is not None and background.heartbeat is None:
            background.heartbeat = Heartbeat(backend, heartbeat, source=str(path))
            background.heartbeat.start()
        background.users += 1
        return background


def detach(background: Background) -> None:
    """One user fewer; the last one stops the work (and waits for a refresh in flight)."""
    with _LOCK:
        background.users -= 1
        if background.users > 0:
            return
        del _RUNNING[background.path]
    if background.heartbeat is not None:
        background.heartbeat.stop()
    background.consumer.stop()
    background.consumer.store.close()
    background.scheduler.stop()
    log.info("refresh scheduler stopped for %s", background.path)


def running(path: Path) -> Background | None:
    """The background work of a file in this process, if any."""
    with _LOCK:
        return _RUNNING.get(path.resolve())
