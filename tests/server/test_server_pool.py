"""Transaction pooling (`mtcache serve --pool-size`): client sessions share a bounded pool of
backend connections per role, each held for a transaction or a statement outside one. What a
session set (SET) and prepared follows it to whichever connection it gets; what cannot follow
(temporary tables, LISTEN, advisory locks, WITH HOLD cursors) pins it to its connection. Every
answer is compared with PostgreSQL's own."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import os
import resource
import subprocess
import threading
import time
import typing as t
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest

from cache.server.options import ServerOptions
from cache.server.process import serving_process
from tests.serving import Served, serving

POOL = 20
BOUND = "-c mtcache.currency_bound=600"


@pytest.fixture(scope="module")
def served(bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with psycopg.connect(bookstore_dsn, autocommit=True) as pg:
        pg.execute("DROP TABLE IF EXISTS tally")
        pg.execute("CREATE TABLE tally (session integer, n integer)")
    with serving(
        bookstore_dsn,
        tmp_path_factory.mktemp("pool") / "cache.duckdb",
        (1, 2),
        ServerOptions(pool_size=POOL, pool_timeout=60),
    ) as found:
        yield found


@pytest.fixture
def small(bookstore_dsn: str, tmp_path: t.Any) -> Iterator[Served]:
    """A server whose pool holds one connection per role, and waits half a second."""
    with serving(
        bookstore_dsn, tmp_path / "cache.duckdb", (1,), ServerOptions(pool_size=1, pool_timeout=0.5)
    ) as found:
        yield found


def connect(served: Served, **kwargs: t.Any) -> psycopg.Connection[t.Any]:
    return psycopg.connect(served.dsn, autocommit=True, **kwargs)


def _pid(conn: psycopg.Connection[t.Any]) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def _same(
    conn: psycopg.Connection[t.Any],
    pg: psycopg.Connection[t.Any],
    sql: str,
    params: t.Sequence[t.Any] | None = None,
) -> list[tuple[t.Any, ...]]:
    """The server's answer, checked against PostgreSQL's (values, types, description)."""
    cur, ref = conn.execute(sql, params), pg.execute(sql, params)
    got, want = cur.fetchall(), ref.fetchall()
    assert got == want
    assert [[type(v) for v in r] for r in got] == [[type(v) for v in r] for r in want]
    assert [(d.name, d.type_code) for d in cur.description or ()] == [
        (d.name, d.type_code) for d in ref.description or ()
    ]
    return got


def test_a_thousand_sessions_over_a_pool_of_twenty(served: Served) -> None:
    """1,000 client sessions open at once, each reading, writing in a transaction and
    reading the cache: never more than 20 backend connections for them (the backend
    itself allows 300, the test cluster's max_connections), and every answer PostgreSQL's."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    with psycopg.connect(served.backend, autocommit=True) as pg:
        pg.execute("TRUNCATE tally")
        want_books = pg.execute("SELECT count(*) FROM books").fetchone()
        want_authors = pg.execute("SELECT * FROM authors WHERE authorid = 1").fetchone()

    async def one(k: int, ready: asyncio.Event, opened: list[int]) -> tuple[t.Any, ...]:
        conn = await psycopg.AsyncConnection.connect(served.dsn, options=BOUND, autocommit=True)
        try:
            opened.append(k)
            await ready.wait()  # (every session open before any works)
            books = await (await conn.execute("SELECT count(*) FROM books")).fetchone()
            async with conn.transaction():
                await conn.execute("INSERT INTO tally VALUES (%s, 1), (%s, 2)", (k, k))
                mine = await (
                    await conn.execute("SELECT sum(n) FROM tally WHERE session = %s", (k,))
                ).fetchone()
            cached = await (
                await conn.execute("SELECT * FROM authors WHERE authorid = 1")
            ).fetchone()
            return books, mine, cached
        finally:
            await conn.close()

    async def run() -> list[tuple[t.Any, ...]]:
        ready, opened = asyncio.Event(), []
        tasks = []
        for k in range(1000):
            tasks.append(asyncio.ensure_future(one(k, ready, opened)))
            if k % 50 == 49:
                await asyncio.sleep(0)  # (connects in batches: the server's backlog is 512)
        while len(opened) < 1000 and not any(task.done() for task in tasks):
            await asyncio.sleep(0.05)
        assert served.server.sessions() == 1000
        ready.set()
        return await asyncio.gather(*tasks)

    answers = asyncio.run(run())
    assert answers == [(want_books, (Decimal(3),), want_authors)] * 1000
    stats = served.server.pool.stats()  # type: ignore[union-attr]
    assert stats.peak.get("postgres", 0) <= POOL
    assert stats.acquired >= 2000  # (the read and the transaction of each, at least)
    assert stats.opened <= POOL
    with connect(served) as conn:  # the pool's figures, over SQL as at /metrics
        figures = {
            (name, tuple(sorted(json.loads(labels).values()))): value
            for name, labels, value, _ in conn.execute("SHOW CACHE STATS")
        }
    assert figures[("mtcache_session_pool_acquired_total", ())] >= 2000
    assert (
        figures[("mtcache_session_pool_connections", ("busy", "postgres"))]
        + figures[("mtcache_session_pool_connections", ("idle", "postgres"))]
        <= POOL
    )
    with psycopg.connect(served.backend, autocommit=True) as pg:
        found = pg.execute("SELECT count(*), count(DISTINCT session) FROM tally").fetchone()
        assert found == (2000, 1000)
        held = pg.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '' "
            "AND backend_type = 'client backend' AND usename = 'postgres' "
            "AND pid <> pg_backend_pid() AND client_port IS NOT NULL "
            "AND state = 'idle' AND datname = current_database()"
        ).fetchone()
        assert held is not None and held[0] <= POOL + 10  # (the pool, the server's own few)


def test_settings_follow_the_session(small: Served) -> None:
    """Two sessions over one backend connection, each with its own SET: each sees its own,
    as PostgreSQL would show it."""
    with (
        connect(small) as a,
        connect(small) as b,
        psycopg.connect(small.backend, autocommit=True) as pg,
    ):
        a.execute("SET search_path = pg_catalog, public")
        a.execute("SET statement_timeout = '41s'")
        b.execute("SET DateStyle = 'German, DMY'")
        assert _pid(a) == _pid(b)  # (one connection, shared)
        for _ in range(2):
            assert a.execute("SHOW statement_timeout").fetchone() == ("41s",)
            assert b.execute("SHOW statement_timeout").fetchone() == ("0",)
            assert b.execute("SHOW DateStyle").fetchone() == ("German, DMY",)
            assert a.execute("SHOW DateStyle").fetchone() == ("ISO, MDY",)
            assert a.execute("SHOW search_path").fetchone() == ("pg_catalog, public",)
        b.execute("RESET DateStyle")
        assert b.execute("SHOW DateStyle").fetchone() == ("ISO, MDY",)
        pg.execute("SET DateStyle = 'German, DMY'")
        b.execute("SET DateStyle = 'German, DMY'")
        _same(b, pg, "SELECT DATE '2024-03-01' AS d, now() > DATE '2000-01-01' AS later")


# what a session does to its settings, each step a statement with its parameters (a
# parameter makes psycopg use the extended protocol, none the simple one)
SETTING_SCRIPTS: dict[str, list[tuple[str, list[str] | None]]] = {
    "SET, simple protocol": [("SET bars.tag = 'q-session'", None)],
    "SET, extended protocol": [("SET bars.tag = 'q-session'", [])],
    "set_config in a SELECT": [("SELECT set_config('bars.tag', %s, false)", ["q-session"])],
    "set_config in a SELECT, simple": [("SELECT set_config('Bars.Tag', 'q', false)", None)],
    "SET LOCAL": [("BEGIN", None), ("SET LOCAL bars.tag = 'in-block'", None), ("COMMIT", None)],
    "set_config, local": [
        ("BEGIN", None),
        ("SELECT set_config('bars.tag', 'in-block', true)", None),
        ("COMMIT", None),
    ],
    "RESET": [("SET bars.tag = 'x'", None), ("RESET bars.tag", None)],
    "RESET ALL": [
        ("SET bars.tag = 'x'", None),
        ("SET statement_timeout = '7s'", None),
        ("RESET ALL", None),
    ],
    "DISCARD ALL": [("SET bars.tag = 'x'", None), ("DISCARD ALL", None)],
    "two, then one changed": [
        ("SET bars.tag = 'one'", None),
        ("SET other.tag TO 'two'", None),
        ("SET bars.tag = 'three'", None),
    ],
}
READ_SETTINGS = (
    "SELECT current_setting('bars.tag', true) AS tag, current_setting('other.tag', true) "
    "AS other, current_setting('statement_timeout') AS timeout"
)


@pytest.mark.parametrize("bound", [None, BOUND], ids=["no bound", "session bound"])
@pytest.mark.parametrize("script", list(SETTING_SCRIPTS))
def test_a_setting_follows_its_session_and_reaches_no_other(
    small: Served, script: str, bound: str | None
) -> None:
    """Whatever a session sets (a custom placeholder too, by SET, SET LOCAL, set_config in a
    SELECT, either protocol) it sees as PostgreSQL would show it, on whichever connection it
    gets; sessions that come after it on that connection see what a new PostgreSQL session
    sees (a placeholder never defined is NULL, not empty), never its values."""
    with (
        connect(small, options=bound) as a,
        psycopg.connect(small.backend, autocommit=True) as pg_a,
    ):
        for sql, params in SETTING_SCRIPTS[script]:
            a.execute(sql, params)
            pg_a.execute(sql, params)
        for _ in range(3):
            for read in (READ_SETTINGS, (READ_SETTINGS, [])):
                sql, params = read if isinstance(read, tuple) else (read, None)
                with (
                    connect(small, options=bound) as b,
                    psycopg.connect(small.backend, autocommit=True) as pg_b,
                ):
                    assert b.execute(sql, params).fetchall() == pg_b.execute(sql).fetchall()
                assert a.execute(sql, params).fetchall() == pg_a.execute(sql).fetchall()


def test_prepared_statements_follow_the_session(served: Served) -> None:
    """Sessions prepare statements (psycopg prepares each at once here) and run them again
    on whichever connection they get: each is parsed there first."""
    conns = [connect(served, prepare_threshold=0) for _ in range(30)]
    try:
        with psycopg.connect(served.backend, autocommit=True) as pg:

            def run(conn: psycopg.Connection[t.Any], round_: int) -> None:
                _same(
                    conn,
                    pg,
                    "SELECT isbn, title FROM books WHERE authorid = %s ORDER BY isbn",
                    [1 + round_ % 2],
                )
                _same(conn, pg, "SELECT %s::int + 1 AS n", [round_])

            with cf.ThreadPoolExecutor(10) as workers:
                for round_ in range(3):
                    list(workers.map(run, conns, [round_] * len(conns)))
    finally:
        for conn in conns:
            conn.close()


def test_what_cannot_follow_pins_the_session(small: Served) -> None:
    """A temporary table, LISTEN, an advisory lock and a WITH HOLD cursor keep their
    session's connection until it ends; that connection is then closed, never handed to
    another session with them."""
    pool = small.server.pool
    assert pool is not None
    with connect(small) as a:
        a.execute("CREATE TEMP TABLE mine (n integer)")
        a.execute("INSERT INTO mine VALUES (7)")
        assert a.execute("SELECT n FROM mine").fetchone() == (7,)
        a.execute("LISTEN pinned")
        a.execute("SELECT pg_advisory_lock(42)")
        a.execute("BEGIN")
        a.execute("DECLARE held CURSOR WITH HOLD FOR SELECT n FROM mine")
        a.execute("COMMIT")
        assert a.execute("FETCH held").fetchone() == (7,)
        with psycopg.connect(small.dsn, autocommit=True, connect_timeout=5) as b:
            # the pool's one connection is a's: b waits, then gives up (53300)
            with pytest.raises(psycopg.errors.TooManyConnections, match="--pool-size"):
                b.execute("SELECT 1")
            a.execute("NOTIFY pinned, 'hello'")
            assert [n.payload for n in a.notifies(timeout=5, stop_after=1)] == ["hello"]
            a.close()  # its connection is closed with what it held
            assert b.execute(
                "SELECT count(*) FROM pg_class WHERE relname = 'mine' AND relpersistence = 't'"
            ).fetchone() == (0,)
            assert b.execute("SELECT pg_try_advisory_lock(42)").fetchone() == (True,)
            b.execute("SELECT pg_advisory_unlock(42)")
    assert pool.stats().open.get("postgres", 0) <= 1


def test_a_read_the_backend_answers_under_a_bound_pins_too(small: Served) -> None:
    """Under a session bound a SELECT takes the cache's path; one the backend answers
    (a session advisory lock) leaves its mark all the same: the session keeps its
    connection, which no other session gets."""
    with connect(small, options=BOUND) as a:
        assert a.execute("SELECT pg_advisory_lock(43)").fetchone() == ("",)
        with psycopg.connect(small.dsn, autocommit=True, connect_timeout=5) as b:
            with pytest.raises(psycopg.errors.TooManyConnections, match="--pool-size"):
                b.execute("SELECT 1")
            a.close()
            # the server closes the pinned connection; PostgreSQL frees the lock once that
            # backend has ended, which it does after the close returns: wait for it
            _until_unlocked(small.backend, 43)
            assert b.execute("SELECT pg_try_advisory_lock(43)").fetchone() == (True,)
            b.execute("SELECT pg_advisory_unlock(43)")


def _until_unlocked(backend: str, key: int) -> None:
    """Return once no backend holds the session advisory lock ``key`` (a bounded wait for
    an event, not a measured delay)."""
    with psycopg.connect(backend, autocommit=True) as pg:
        for _ in range(600):
            held = pg.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s",
                (key,),
            ).fetchone()
            if held == (0,):
                return
            time.sleep(0.1)
    raise AssertionError(f"advisory lock {key} still held a minute after its session ended")


def test_a_full_pool_fails_the_statement_not_the_session(small: Served) -> None:
    """A statement that finds the pool busy past --pool-timeout gets 53300; its session
    goes on once a connection is free; a transaction keeps its connection to its end."""
    with (
        connect(small) as a,
        connect(small) as b,
        psycopg.connect(small.backend, autocommit=True) as pg,
    ):
        a.execute("BEGIN")
        pid = _pid(a)
        with pytest.raises(psycopg.errors.TooManyConnections, match=r"became free within 0\.5s"):
            b.execute("SELECT 1")
        assert _pid(a) == pid
        a.execute("COMMIT")
        assert _pid(b) == pid  # (the one connection, now b's for a statement)
        _same(b, pg, "SELECT count(*) AS n FROM books")
        # cached reads need no connection at all, even while the pool is taken
        a.execute("BEGIN")
        with connect(small, options=BOUND) as c:
            _same(c, pg, "SELECT * FROM authors WHERE authorid = 1")
        a.execute("ROLLBACK")


def test_errors_cancels_and_lost_connections(small: Served) -> None:
    """A failed transaction, a cancelled statement and a backend connection ended while
    it sat in the pool: each session goes on with a good connection."""
    with connect(small) as a, psycopg.connect(small.backend, autocommit=True) as pg:
        a.execute("BEGIN")
        with pytest.raises(psycopg.errors.DivisionByZero):
            a.execute("SELECT 1 / 0")
        a.execute("ROLLBACK")
        assert a.execute("SELECT 2").fetchone() == (2,)
        with cf.ThreadPoolExecutor(1) as workers:
            running = workers.submit(a.execute, "SELECT pg_sleep(60)")
            for _ in range(600):
                if pg.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = "
                    "'SELECT pg_sleep(60)' AND state = 'active'"
                ).fetchone() == (1,):
                    break
                pg.execute("SELECT pg_sleep(0.05)")
            a.cancel_safe()
            with pytest.raises(psycopg.errors.QueryCanceled):
                running.result(timeout=60)
        pid = _pid(a)
        pg.execute("SELECT pg_terminate_backend(%s)", [pid])
        for _ in range(600):  # (until the backend has ended it)
            if not pg.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
                break
            pg.execute("SELECT pg_sleep(0.05)")
        assert _pid(a) != pid  # another connection, the session unaffected
        _same(a, pg, "SELECT count(*) AS n FROM books")


def test_pgbench_writes_through_mtcache_serve_with_a_pool(
    bookstore_dsn: str, tmp_path: Path
) -> None:
    """pgbench's own transactions (TPC-B: updates, an insert, reads in a block) from 40
    clients through `mtcache serve --pool-size 4`: every transaction commits, pgbench's
    balances agree, and the backend saw at most 4 connections of the server's sessions."""
    with (
        serving_process(
            bookstore_dsn,
            tmp_path / "cache.duckdb",
            "--pool-size",
            "4",
            "--pool-timeout",
            "120 sec",
        ) as where,
        psycopg.connect(bookstore_dsn, autocommit=True) as pg,
    ):
        env = dict(
            os.environ,
            PGHOST=where.host,
            PGPORT=str(where.port),
            PGUSER="postgres",
            PGDATABASE=where.database,
            PGAPPNAME="pooled-bench",
        )
        init = subprocess.run(
            ["pgbench", "-i", "-s", "1", "-q"],
            env=env,
            text=True,
            capture_output=True,
            timeout=300,
            check=False,
        )
        assert init.returncode == 0, init.stderr
        most = [0]

        def watch() -> None:
            with psycopg.connect(bookstore_dsn, autocommit=True) as watcher:
                while not done.is_set():
                    row = watcher.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                        "'pooled-bench'"
                    ).fetchone()
                    most[0] = max(most[0], row[0] if row else 0)
                    done.wait(0.02)

        done = threading.Event()
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            for mode in ("simple", "prepared"):
                run = subprocess.run(
                    ["pgbench", "-M", mode, "-c", "40", "-j", "2", "-t", "25", "-n"],
                    env=env,
                    text=True,
                    capture_output=True,
                    timeout=600,
                    check=False,
                )
                assert run.returncode == 0, run.stderr
                assert "actually processed: 1000/1000" in run.stdout, run.stdout
        finally:
            done.set()
            watcher.join()
        assert most[0] <= 4  # (sampled: never more than the pool)
        sums = pg.execute(
            "SELECT (SELECT sum(abalance) FROM pgbench_accounts), "
            "(SELECT sum(tbalance) FROM pgbench_tellers), "
            "(SELECT sum(bbalance) FROM pgbench_branches), "
            "(SELECT sum(delta) FROM pgbench_history), "
            "(SELECT count(*) FROM pgbench_history)"
        ).fetchone()
        assert sums is not None and len(set(sums[:4])) == 1 and sums[4] == 2000
