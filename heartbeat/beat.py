"""The heartbeat: one row per source in a backend table, its timestamp set by the
backend's own clock every few seconds by `mtcache heartbeat` or by a thread of the process that
owns a cache file.

The table (created on first use, in the backend's default schema):

    mtcache_heartbeat (source text PRIMARY KEY, beat_at timestamptz NOT NULL, beats bigint NOT NULL)

Each beat is one autocommit upsert that returns the ``clock_timestamp()`` it wrote, so a beat is
also a measurement of the backend clock (heartbeat.clock): the local times before and after it
bracket the backend's reading. The heartbeat keeps the tightest estimate of its recent beats
(the least upper bound of the offset, erring late: currency errs older). Running two
heartbeats of one source is harmless (each beat is a complete upsert); the table is created
with IF NOT EXISTS, and a concurrent creation is tolerated.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
import typing as t
from collections import deque
from dataclasses import dataclass, field

import psycopg
from psycopg import errors as pg_errors

from heartbeat.clock import DRIFT, BackendClock, from_samples
from heartbeat.defaults import DEFAULT_INTERVAL, DEFAULT_SOURCE
from heartbeat.loop import Loop

log = logging.getLogger("mtcache.heartbeat")

TABLE = "mtcache_heartbeat"
WINDOW = 30  # beats whose clock samples the estimate is taken from

CREATE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (source text PRIMARY KEY, "
    "beat_at timestamptz NOT NULL, beats bigint NOT NULL)"
)
BEAT = (
    f"INSERT INTO {TABLE} AS h VALUES (%s, clock_timestamp(), 1) ON CONFLICT (source) "
    "DO UPDATE SET beat_at = clock_timestamp(), beats = h.beats + 1 "
    "RETURNING beat_at, beats"
)


@dataclass(frozen=True)
class Beat:
    beat_at: dt.datetime  # the backend's clock, as written
    beats: int  # of this source, by every heartbeat that ever ran for it
    sample: tuple[float, float, float]  # (local before, backend, local after), epoch seconds


def ensure_table(conn: psycopg.Connection[t.Any]) -> None:
    """Create the heartbeat table if it is missing (``conn`` in autocommit)."""
    # another heartbeat may create it at the same moment
    with contextlib.suppress(pg_errors.UniqueViolation, pg_errors.DuplicateTable):
        conn.execute(CREATE)


def beat(conn: psycopg.Connection[t.Any], source: str = DEFAULT_SOURCE) -> Beat:
    """One beat on an autocommit connection."""
    before = time.time()
    row = conn.execute(BEAT, (source,)).fetchone()
    after = time.time()
    assert row is not None
    return Beat(row[0], int(row[1]), (before, row[0].timestamp(), after))


@dataclass
class Heartbeat:
    """Beats every ``interval`` seconds until stopped; reconnects when the backend goes away
    (a heartbeat outlives backend restarts). ``clock`` is the estimate from recent beats."""

    dsn: str
    interval: float = DEFAULT_INTERVAL
    source: str = DEFAULT_SOURCE
    beats: int = 0  # by this heartbeat
    last: Beat | None = None
    # the estimate from recent beats (None before the first), made once per beat: sessions
    # read it on every query
    clock: BackendClock | None = None
    failures: int = 0  # beats that could not reach the backend
    _samples: deque[tuple[float, float, float]] = field(
        default_factory=lambda: deque(maxlen=WINDOW)
    )
    _loop: Loop = field(default_factory=lambda: Loop("mtcache-heartbeat"))

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise ValueError(f"the heartbeat interval must be positive, not {self.interval:g}")

    def _estimate(self) -> BackendClock:
        """The tightest offset of the recent beats' samples, each pushed later by the drift
        since it was taken; as of the newest beat."""
        samples = list(self._samples)
        newest = samples[-1][2]

        def late(clock: BackendClock) -> float:
            return clock.offset_seconds + DRIFT * (newest - clock.measured_at.timestamp())

        best = min((from_samples([s]) for s in samples), key=late)
        return BackendClock(
            late(best), best.uncertainty_seconds, dt.datetime.fromtimestamp(newest, dt.UTC)
        )

    def run(self, on_failure: t.Callable[[Exception], None] | None = None) -> int:
        """Beat in this thread until `stop`; returns the beats made."""
        conn: psycopg.Connection[t.Any] | None = None
        down = False
        try:
            while not self._loop.stopping.is_set():
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(self.dsn, autocommit=True)
                        ensure_table(conn)
                    self.last = beat(conn, self.source)
                    self._samples.append(self.last.sample)
                    self.clock = self._estimate()
                    self.beats += 1
                    down = False
                except psycopg.Error as exc:
                    self.failures += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    if not down and on_failure is not None:
                        on_failure(exc)  # once per outage
                    down = True
                self._loop.stopping.wait(self.interval)
        finally:
            if conn is not None:
                conn.close()
        return self.beats

    def start(self) -> None:
        """Beat in a daemon thread of this process."""
        self._loop.start(self.run, on_failure=lambda e: log.warning("heartbeat: %s", e))

    def stop(self) -> None:
        self._loop.stop()
