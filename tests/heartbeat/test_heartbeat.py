"""The heartbeat: `mtcache heartbeat` and the Heartbeat thread keep a row of the
backend's heartbeat table beating, survive each other and backend outages, stop cleanly on
SIGTERM/SIGINT, and measure the backend clock as they beat."""

from __future__ import annotations

import signal
import subprocess
import time
import typing as t
from pathlib import Path

import psycopg
import pytest

from cache.backend.embedded_pg import EmbeddedPostgres
from heartbeat.beat import TABLE, Heartbeat
from heartbeat.clock import measure


def beats(dsn: str, source: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT beats FROM {TABLE} WHERE source = %s", (source,)).fetchone()
    return int(row[0]) if row else 0


def wait_for(condition: t.Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def dsn(pg_cluster: EmbeddedPostgres) -> str:
    return pg_cluster.create_database("heartbeat")


def test_two_heartbeat_processes_beat_and_stop_cleanly(
    mtcache_bin: str, dsn: str, clean_env: dict[str, str]
) -> None:
    """Idempotent and safe to run twice: both beat the same row (the table created by whichever
    came first); SIGTERM and SIGINT each end one with exit 0 and a last line."""
    clean_env["MTCACHE_BACKEND"] = dsn
    command = [mtcache_bin, "heartbeat", "--interval", "0.1", "--source", "twice"]
    first = subprocess.Popen(
        command, env=clean_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    second = subprocess.Popen(
        command, env=clean_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        for process in (first, second):
            assert process.stdout is not None
            line = process.stdout.readline()
            assert "heartbeat: source 'twice' in mtcache_heartbeat every 0.1s" in line, line
        seen = beats(dsn, "twice")
        wait_for(lambda: beats(dsn, "twice") >= seen + 10)
    finally:
        first.send_signal(signal.SIGTERM)
        second.send_signal(signal.SIGINT)
        out_first, err_first = first.communicate(timeout=60)
        out_second, err_second = second.communicate(timeout=60)
    assert (first.returncode, err_first) == (0, "")
    assert (second.returncode, err_second) == (0, "")
    assert "heartbeat stopped after" in out_first and "heartbeat stopped after" in out_second


@pytest.mark.parametrize(
    ("args", "backend", "message"),
    [
        (["--interval", "0"], None, "--interval must be a positive number of seconds, not 0"),
        ([], "postgresql://nobody@127.0.0.1:1/none", "cannot reach the PostgreSQL backend"),
    ],
)
def test_heartbeat_errors_are_one_line(
    mtcache_bin: str,
    dsn: str,
    clean_env: dict[str, str],
    args: list[str],
    backend: str | None,
    message: str,
) -> None:
    clean_env["MTCACHE_BACKEND"] = backend or dsn
    result = subprocess.run(
        [mtcache_bin, "heartbeat", *args],
        env=clean_env,
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_the_heartbeat_thread_rides_out_a_restart_and_measures_the_clock(
    pg_cluster: EmbeddedPostgres, dsn: str
) -> None:
    heart = Heartbeat(dsn, interval=0.05, source="thread")
    heart.start()
    try:
        wait_for(lambda: heart.beats >= 3)
        pg_cluster.stop()
        wait_for(lambda: heart.failures >= 1)
        pg_cluster.ensure_running()
        before = heart.beats
        wait_for(lambda: heart.beats >= before + 3)
    finally:
        heart.stop()
    clock = heart.clock
    assert clock is not None and beats(dsn, "thread") == heart.beats
    with psycopg.connect(dsn) as conn:
        measured = measure(conn)
    # both are upper bounds of (backend - local) on one host: neither below the true offset,
    # which lies within the round trip of each
    lowest_true = max(
        clock.offset_seconds - clock.uncertainty_seconds,
        measured.offset_seconds - measured.uncertainty_seconds,
    )
    assert lowest_true <= min(clock.offset_seconds, measured.offset_seconds)
    assert 0 <= clock.uncertainty_seconds < 5


def test_a_heartbeat_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        Heartbeat("postgresql://unused", interval=0)


def test_a_connection_can_run_the_heartbeat_and_judges_currency_on_its_clock(
    dsn: str, tmp_path: Path
) -> None:
    """The heartbeat as a thread of the owning process: started by a connection that asks,
    its row named after the cache file, its clock used by the sessions, stopped at close."""
    import threading

    import cache

    path = tmp_path / "cache.duckdb"
    with pytest.raises(cache.ProgrammingError, match="heartbeat must be a positive number"):
        cache.connect(dsn, path, heartbeat=-1)
    conn = cache.connect(dsn, path, heartbeat=0.05)
    try:
        connected = conn.clock.measured_at
        source = str(path.resolve())
        wait_for(lambda: beats(dsn, source) >= 3)
        wait_for(lambda: conn.clock.measured_at > connected)
        assert conn.clock.uncertainty_seconds < 5
    finally:
        conn.close()
    assert not [t for t in threading.enumerate() if t.name == "mtcache-heartbeat"]
