"""The backend's clock, estimated locally: local clock plus a measured offset.

A region's currency is backend_now - refreshed_at, and refreshed_at is a backend timestamp, so
the cache needs backend_now. Reading the backend clock once costs a round trip; instead the
offset between the two clocks is measured and added to the local clock.

One measurement: note the local time t0, read the backend's clock_timestamp() = b, note t1.
The backend read its clock at some local moment in [t0, t1], so the offset (backend - local)
lies in [b - t1, b - t0]. The estimate takes the upper end, b - t0: a backend_now never earlier
than the true one, so data always looks at least as old as it is ("older", never "fresher").
Of several samples the one with the shortest round trip is the tightest.
"""

from __future__ import annotations

import datetime as dt
import time
import typing as t
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg

SAMPLES = 3
DRIFT = 1e-4  # clock drift per second since a measurement (100 ppm), added: erring late
CLOCK_MAX_AGE = 600.0  # seconds between measurements of the backend clock's offset


@dataclass(frozen=True)
class BackendClock:
    offset_seconds: float  # add to the local clock: an upper bound of (backend - local)
    uncertainty_seconds: float  # the true offset is at most this much smaller
    measured_at: dt.datetime  # local time of the measurement

    def now(self) -> dt.datetime:
        """backend_now, erring late (so currency errs older)."""
        return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self.offset_seconds)

    @classmethod
    def local(cls) -> BackendClock:
        """No measurement: the local clock as is (only where no backend is involved)."""
        return cls(0.0, 0.0, dt.datetime.now(dt.UTC))

    def to_json(self) -> dict[str, t.Any]:
        return {
            "offset_seconds": round(self.offset_seconds, 6),
            "uncertainty_seconds": round(self.uncertainty_seconds, 6),
            "measured_at": self.measured_at.isoformat(),
        }


def from_samples(samples: Iterable[tuple[float, float, float]]) -> BackendClock:
    """The estimate from (t0, backend time, t1) samples, epoch seconds: the upper offset of
    the sample with the shortest round trip."""
    best: tuple[float, float, float] | None = None
    for t0, backend, t1 in samples:
        if t1 < t0:
            raise ValueError("a sample's local times go backwards")
        if best is None or t1 - t0 < best[2] - best[0]:
            best = (t0, backend, t1)
    if best is None:
        raise ValueError("no clock samples")
    t0, backend, t1 = best
    return BackendClock(
        offset_seconds=backend - t0,
        uncertainty_seconds=t1 - t0,
        measured_at=dt.datetime.fromtimestamp(t1, dt.UTC),
    )


def measure(conn: psycopg.Connection[t.Any], samples: int = SAMPLES) -> BackendClock:
    """Measure on an open backend connection. Outside a transaction it leaves none open."""
    idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    taken = []
    try:
        with conn.cursor() as cur:
            for _ in range(samples):
                t0 = time.time()
                # (seconds since the epoch: whatever the session's DateStyle and TimeZone,
                # which a client may have set on it)
                cur.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
                row = cur.fetchone()
                t1 = time.time()
                assert row is not None
                taken.append((t0, float(row[0]), t1))
    finally:
        if idle and not conn.autocommit and not conn.closed:
            conn.rollback()  # the SELECTs opened a transaction the application did not ask for
    return from_samples(taken)
