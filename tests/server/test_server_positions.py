"""Several cache servers in front of one backend, each with its own cache file: a session's
freshness position (SHOW mtcache.position, or a ParameterStatus with mtcache.report_position)
given to another server (SET mtcache.min_position, or the startup option) keeps that server
from answering it with older data: read-your-writes and monotonic reads across servers. Every
answer is checked against what the session has seen, and against PostgreSQL's."""

from __future__ import annotations

import random
import time
import typing as t
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from tests.serving import Served, server_of

BOUND = "-c mtcache.currency_bound=600"
KEYS = range(1, 6)


@pytest.fixture(scope="module")
def servers(
    bookstore_dsn: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Served, Served]]:
    with psycopg.connect(bookstore_dsn, autocommit=True) as pg:
        pg.execute("DROP TABLE IF EXISTS counter")
        pg.execute("CREATE TABLE counter (k integer PRIMARY KEY, v integer NOT NULL)")
        pg.execute("INSERT INTO counter SELECT k, 0 FROM generate_series(1, 5) AS k")
    where = tmp_path_factory.mktemp("positions")
    with (
        server_of(bookstore_dsn, where / "a.duckdb") as a,
        server_of(bookstore_dsn, where / "b.duckdb") as b,
    ):
        for served in (a, b):
            with psycopg.connect(served.dsn, autocommit=True) as conn:
                conn.execute(
                    "CREATE CACHED VIEW countercopy AS SELECT k, v FROM counter "
                    "REFRESH EVERY 10 MIN"
                )
                conn.execute("REFRESH CACHED VIEW countercopy")
        yield a, b


def connect(served: Served, options: str = BOUND) -> psycopg.Connection[t.Any]:
    return psycopg.connect(served.dsn, autocommit=True, options=options)


def _position(conn: psycopg.Connection[t.Any]) -> str:
    row = conn.execute("SHOW mtcache.position").fetchone()
    assert row is not None
    return str(row[0])


def _route(conn: psycopg.Connection[t.Any]) -> str:
    rows = conn.execute("EXPLAIN LAST STATEMENT").fetchall()
    names = [d.name for d in conn.execute("EXPLAIN LAST STATEMENT").description or ()]
    return str(rows[0][names.index("route")])


def _timeline_failures(conn: psycopg.Connection[t.Any]) -> float:
    """The server's guard failures of the timeline kind (SHOW CACHE STATS)."""
    for name, labels, value, _ in conn.execute("SHOW CACHE STATS"):
        if name == "mtcache_guard_failures_total" and '"timeline"' in labels:
            return float(value)
    raise AssertionError("no timeline guard failures in SHOW CACHE STATS")


def _refresh_after(served: Served, pg: psycopg.Connection[t.Any], position: str) -> None:
    """Refresh the server's view once the backend's clock has passed ``position`` (so the
    refresh's snapshot is newer than it)."""
    while pg.execute("SELECT clock_timestamp() <= %s::timestamptz", [position]).fetchone() == (
        True,
    ):
        time.sleep(0.01)
    with psycopg.connect(served.dsn, autocommit=True) as conn:
        conn.execute("REFRESH CACHED VIEW countercopy")


def test_a_write_on_one_server_is_read_on_the_other(servers: tuple[Served, Served]) -> None:
    a, b = servers
    with connect(a) as on_a, connect(b) as on_b, psycopg.connect(a.backend, autocommit=True) as pg:
        _refresh_after(b, pg, "-infinity")
        before = on_b.execute("SELECT v FROM counter WHERE k = 1").fetchone()
        assert _route(on_b) == "local"
        on_a.execute("UPDATE counter SET v = v + 1 WHERE k = 1")
        position = _position(on_a)
        written = pg.execute("SELECT v FROM counter WHERE k = 1").fetchone()
        assert written is not None and before is not None and written[0] == before[0] + 1
        # what a position prevents: B's cache is within the session's bound, but older
        assert on_b.execute("SELECT v FROM counter WHERE k = 1").fetchone() == before
        # given the position (a startup option here), B never answers from older data
        with connect(b, f"{BOUND} -c mtcache.min_position={position}") as moved:
            failures = _timeline_failures(moved)
            assert moved.execute("SELECT v FROM counter WHERE k = 1").fetchone() == written
            assert _route(moved) == "remote"
            assert _timeline_failures(moved) > failures  # (counted by kind, as /metrics)
            assert _position(moved) >= position
            _refresh_after(b, pg, position)  # B's cache now holds the write: local again
            assert moved.execute("SELECT v FROM counter WHERE k = 1").fetchone() == written
            assert _route(moved) == "local"


def test_the_position_is_reported_after_each_statement(servers: tuple[Served, Served]) -> None:
    a, _ = servers
    with connect(a, f"{BOUND} -c mtcache.report_position=on") as conn:
        conn.execute("SELECT v FROM counter WHERE k = 2").fetchall()
        first = conn.info.parameter_status("mtcache.position")
        assert first is not None and first == _position(conn)
        conn.execute("UPDATE counter SET v = v + 1 WHERE k = 2")
        second = conn.info.parameter_status("mtcache.position")
        assert second is not None and second > first
        with pytest.raises(psycopg.errors.CantChangeRuntimeParam, match="min_position"):
            conn.execute("SET mtcache.position = 'none'")
        with pytest.raises(psycopg.ProgrammingError, match="time zone"):
            conn.execute("SET mtcache.min_position = '2024-01-01 00:00:00'")


def test_a_session_moving_between_servers_never_reads_older_data(
    servers: tuple[Served, Served],
) -> None:
    """A session hops between the servers at random while another client writes at random
    and the servers refresh at random: each read is at least as new as everything the
    session saw before (read-your-writes, monotonic reads), and PostgreSQL's own rows when
    the session's writes are the newest."""
    rng = random.Random(2811)
    a, b = servers
    with connect(a) as on_a, connect(b) as on_b, psycopg.connect(a.backend, autocommit=True) as pg:
        conns = {"a": on_a, "b": on_b}
        seen = {k: 0 for k in KEYS}  # the newest value of each key the session has seen
        here = "a"
        for step in range(120):
            action = rng.random()
            if action < 0.25:  # another client writes
                pg.execute("UPDATE counter SET v = v + 1 WHERE k = %s", [rng.choice(KEYS)])
            elif action < 0.35:  # a server refreshes
                with psycopg.connect(rng.choice((a, b)).dsn, autocommit=True) as admin:
                    admin.execute("REFRESH CACHED VIEW countercopy")
            elif action < 0.5:  # the session writes
                k = rng.choice(KEYS)
                row = (
                    conns[here]
                    .execute("UPDATE counter SET v = v + 1 WHERE k = %s RETURNING v", [k])
                    .fetchone()
                )
                assert row is not None
                seen[k] = max(seen[k], row[0])
            elif action < 0.7:  # the session moves, its position with it
                there = "b" if here == "a" else "a"
                conns[there].execute(
                    sql.SQL("SET mtcache.min_position = {}").format(_position(conns[here]))
                )
                here = there
            else:  # the session reads
                rows = conns[here].execute("SELECT k, v FROM counter ORDER BY k").fetchall()
                for k, v in rows:
                    assert v >= seen[k], (step, here, k, v, seen[k])
                    seen[k] = v
        assert sum(seen.values()) > 0


def test_position_of_a_fresh_session_is_none(servers: tuple[Served, Served]) -> None:
    a, _ = servers
    with connect(a) as conn:
        assert _position(conn) == "none"
        conn.execute("SET mtcache.min_position = '2024-01-01 00:00:00+00'")
        assert _position(conn) == "2024-01-01T00:00:00.000000+00:00"
        conn.execute("RESET mtcache.min_position")
        assert conn.execute("SHOW mtcache.min_position").fetchone() == ("none",)


@pytest.mark.parametrize("prepare", [False, True])
def test_a_write_alone_moves_the_position(servers: tuple[Served, Served], prepare: bool) -> None:
    """A session's own write, with no read after it, is in the position it shows at once:
    whichever way the write went (a worker, the loop's relay, byte for byte), the other
    server given that position reads the write."""
    a, b = servers
    update = "UPDATE counter SET v = v + 1 WHERE k = %s RETURNING v"
    read = "SELECT v FROM counter WHERE k = %s"
    with connect(a) as on_a, psycopg.connect(a.backend, autocommit=True) as pg:
        _refresh_after(b, pg, "-infinity")
        for k in (3, 4, 3, 4, 3, 4):  # (prepared: later runs relayed by the loop)
            written = on_a.execute(update, [k], prepare=prepare).fetchone()
            position = _position(on_a)
            with connect(b, f"{BOUND} -c mtcache.min_position={position}") as moved:
                assert moved.execute(read, [k], prepare=prepare).fetchone() == written
                assert pg.execute(read, [k]).fetchone() == written
