"""The backend clock estimate: local clock plus a measured offset, erring late."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import subprocess
from pathlib import Path

import psycopg
import pytest

import cache
from cache.engine.engine import Engine
from heartbeat.clock import CLOCK_MAX_AGE, BackendClock, from_samples, measure


def test_the_estimate_is_never_earlier_than_the_backend_clock() -> None:
    # The backend runs 5 s ahead. Each sample reads it at some moment inside its round trip;
    # whichever moment, the estimate (t0 + offset) is never earlier than the backend's time.
    true_offset = 5.0
    for read_fraction in (0.0, 0.3, 1.0):
        samples = []
        for t0, trip in ((100.0, 0.020), (200.0, 0.004), (300.0, 0.010)):
            read_at = t0 + read_fraction * trip
            samples.append((t0, read_at + true_offset, t0 + trip))
        clock = from_samples(samples)
        assert clock.uncertainty_seconds == pytest.approx(0.004)  # the tightest sample wins
        assert true_offset <= clock.offset_seconds <= true_offset + clock.uncertainty_seconds
    with pytest.raises(ValueError, match="no clock samples"):
        from_samples([])
    with pytest.raises(ValueError, match="backwards"):
        from_samples([(10.0, 10.0, 9.0)])


@pytest.mark.backend
def test_measured_on_the_backend_and_leaves_no_transaction_open(backend_dsn: str) -> None:
    with psycopg.connect(backend_dsn) as conn:
        before = dt.datetime.now(dt.UTC)
        clock = measure(conn)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        # one machine, one clock: the offset is within the round trip of zero
        assert -0.05 < clock.offset_seconds < clock.uncertainty_seconds + 0.05
        backend = conn.execute("SELECT clock_timestamp()").fetchone()
        assert backend is not None
        assert clock.now() >= backend[0] - dt.timedelta(seconds=clock.uncertainty_seconds)
        assert clock.measured_at >= before
        conn.rollback()
        conn.autocommit = True  # possible only because no transaction was left open


@pytest.mark.backend
def test_a_connection_measures_the_clock_and_status_reports_it(
    backend_dsn: str, tmp_path: Path, mtcache_bin: str, clean_env: dict[str, str]
) -> None:
    path = tmp_path / "cache.duckdb"
    with cache.connect(backend=backend_dsn, cache_path=path) as conn:
        assert isinstance(conn.clock, BackendClock)
        conn.autocommit = True  # the measurement left the session outside any transaction
    clean_env["MTCACHE_CACHE"] = str(path)
    result = subprocess.run(
        [mtcache_bin, "status", "--json"],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env,
    )
    document = json.loads(result.stdout)
    assert document["clock"] == "backend"
    assert set(document["backend_clock"]) == {
        "offset_seconds",
        "uncertainty_seconds",
        "measured_at",
    }


@pytest.mark.backend
def test_the_shared_clock_is_measured_again_only_where_waiting_is_allowed(
    backend_dsn: str, tmp_path: Path
) -> None:
    """The clock of sessions without a backend connection of their own (the server's) is
    measured on a pooled connection every CLOCK_MAX_AGE seconds: a session that may not wait
    (an event loop's answer at hand) finds it due then (`shared_clock_due`), never a
    measurement."""
    engine = Engine(backend_dsn, tmp_path / "cache.duckdb", background=False)
    try:
        first = engine.shared_clock()
        assert first is not None
        assert not engine.shared_clock_due() and engine.shared_clock() is first  # (fresh)
        aged = dataclasses.replace(
            first, measured_at=first.measured_at - dt.timedelta(seconds=CLOCK_MAX_AGE + 1)
        )
        engine._clock = aged  # (as it is CLOCK_MAX_AGE seconds later)
        assert engine.shared_clock_due()
        assert engine._clock is aged
        again = engine.shared_clock()
        assert again is not None and again.measured_at > first.measured_at
    finally:
        engine.close()
