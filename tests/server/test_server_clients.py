"""Real PostgreSQL clients against `mtcache serve`, each with cached and uncached reads, writes,
transactions, errors, prepared statements and the cache's statements, their answers compared
with the same client's answers from PostgreSQL directly: pgbench (its tables initialized
through the server, select-only runs in each query mode), asyncpg (binary protocol, its
introspection queries) and pgjdbc (tests/clients/JdbcClient.java). psql and psycopg:
tests/server/test_server.py."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psycopg
import pytest

from cache.store.counters import Counter
from tests.answers import typed
from tests.paths import CLIENTS
from tests.serving import Served, serving

JDBC_JAR = Path("/usr/share/java/postgresql.jar")  # Debian's libpostgresql-jdbc-java
BOUND = "-c mtcache.currency_bound=600"  # a session bound from the connection string


@pytest.fixture(scope="module")
def served(bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(
        bookstore_dsn, tmp_path_factory.mktemp("clients") / "cache.duckdb", (1, 2)
    ) as found:
        yield found


# -- pgbench ------------------------------------------------------------------------------------


def test_pgbench_initializes_through_the_server_and_runs_select_only(served: Served) -> None:
    env = dict(
        os.environ,
        PGHOST=served.host,
        PGPORT=str(served.port),
        PGUSER="postgres",
        PGDATABASE=served.dbname,
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
    with psycopg.connect(served.dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE CACHED VIEW accountcopy AS SELECT * FROM pgbench_accounts REFRESH EVERY 10 MIN"
        )
        conn.execute("REFRESH CACHED VIEW accountcopy")
    bound = dict(env, PGOPTIONS=BOUND)
    for mode in ("simple", "extended", "prepared"):
        hits = served.engine.counters()[Counter.HITS]
        run = subprocess.run(
            ["pgbench", "-S", "-M", mode, "-c", "4", "-j", "2", "-t", "100", "-n"],
            env=bound,
            text=True,
            capture_output=True,
            timeout=300,
            check=False,
        )
        assert run.returncode == 0, run.stderr
        assert "number of transactions actually processed: 400/400" in run.stdout, run.stdout
        assert "number of failed transactions: 0" in run.stdout, run.stdout
        assert served.engine.counters()[Counter.HITS] >= hits + 400, mode  # the cache answered
    # what the runs read is PostgreSQL's answer
    sql = "SELECT aid, bid, abalance, filler FROM pgbench_accounts WHERE aid = ANY(%s) ORDER BY aid"
    aids = [1, 500, 99_999, 100_000]
    with psycopg.connect(served.dsn, options=BOUND) as conn, psycopg.connect(served.backend) as pg:
        got = conn.execute(sql, [aids]).fetchall()
        assert typed(got) == typed(pg.execute(sql, [aids]).fetchall())


# -- asyncpg --------------------------------------------------------------------------------------


def test_asyncpg(served: Served) -> None:
    asyncio.run(_asyncpg(served))


async def _asyncpg(served: Served) -> None:
    sql = "SELECT isbn, title, price, authorid FROM books WHERE authorid = $1 ORDER BY isbn"
    conn = await asyncpg.connect(
        host=served.host,
        port=served.port,
        user="postgres",
        database=served.dbname,
        server_settings={"mtcache.currency_bound": "600"},
    )
    pg = await asyncpg.connect(served.backend)
    try:
        hits = served.engine.counters()[Counter.HITS]
        for author in (1, 2, 1):  # cached: binary results through asyncpg's own codecs
            got = [tuple(r) for r in await conn.fetch(sql, author)]
            assert typed(got) == typed([tuple(r) for r in await pg.fetch(sql, author)])
        assert served.engine.counters()[Counter.HITS] >= hits + 3
        route = await conn.fetch("EXPLAIN LAST STATEMENT")
        assert [(r["table"], r["route"]) for r in route] == [("books", "local")]
        statement = await conn.prepare(sql)  # a named prepared statement
        assert [tuple(r) for r in await statement.fetch(2)] == [
            tuple(r) for r in await pg.fetch(sql, 2)
        ]
        assert [a.name for a in statement.get_attributes()] == [
            "isbn",
            "title",
            "price",
            "authorid",
        ]
        # types asyncpg introspects (an enum, an array, json) through the backend
        await conn.execute("CREATE TEMP TABLE ap (n int, tags text[], doc jsonb)")
        await conn.executemany(
            "INSERT INTO ap VALUES ($1, $2, $3)",
            [(i, [f"t{i}"], f'{{"i": {i}}}') for i in range(20)],
        )
        assert await conn.fetchval("SELECT sum(n) FROM ap") == sum(range(20))
        copied = await conn.copy_records_to_table("ap", records=[(99, ["x"], "{}")])
        assert copied == "COPY 1"
        # a transaction reads its own write, then rolls back
        try:
            async with conn.transaction():
                await conn.execute("UPDATE books SET price = price + 1 WHERE isbn = 'isbn-00003'")
                got_price = await conn.fetchval(
                    "SELECT price FROM books WHERE isbn = $1", "isbn-00003"
                )
                want = await pg.fetchval(
                    "SELECT price + 1 FROM books WHERE isbn = $1", "isbn-00003"
                )
                assert got_price == want
                raise _Rollback
        except _Rollback:
            pass
        with pytest.raises(asyncpg.UndefinedColumnError):
            await conn.fetch("SELECT no_such_column FROM books")
        assert await conn.fetchval("SELECT count(*) FROM books") == await pg.fetchval(
            "SELECT count(*) FROM books"
        )
    finally:
        await conn.close()
        await pg.close()


class _Rollback(Exception):
    pass


# -- pgjdbc ---------------------------------------------------------------------------------------


def test_jdbc(served: Served, tmp_path: Path) -> None:
    assert JDBC_JAR.exists(), f"{JDBC_JAR} is missing: make test installs libpostgresql-jdbc-java"
    subprocess.run(
        ["javac", "-d", str(tmp_path), str(CLIENTS / "JdbcClient.java")],
        check=True,
        timeout=300,
        capture_output=True,
    )
    classpath = f"{tmp_path}:{JDBC_JAR}"
    backend = psycopg.conninfo.conninfo_to_dict(served.backend)

    def run(url: str, *extra: str) -> list[str]:
        done = subprocess.run(
            ["java", "-cp", classpath, "JdbcClient", url, "postgres", *extra],
            text=True,
            capture_output=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    options = re.sub(r"\s", "%20", BOUND)
    hits = served.engine.counters()[Counter.HITS]
    through = run(
        f"jdbc:postgresql://{served.host}:{served.port}/{served.dbname}?options={options}", "cache"
    )
    assert served.engine.counters()[Counter.HITS] >= hits + 8  # the prepared reads were the cache's
    direct = run(f"jdbc:postgresql://{backend['host']}:{backend['port']}/{backend['dbname']}")
    assert [line for line in through if line.startswith("cache: ")] == [
        "cache: books local bookcopy"
    ]
    assert [line for line in through if not line.startswith("cache: ")] == direct
    assert "batch: 50" in direct and "error: 42703" in direct
