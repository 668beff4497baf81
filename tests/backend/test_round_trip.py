"""What is cached is what the backend holds: for every cacheable column type, its special and
edge values (NaN, +-Infinity, -0, real's precision, the extremes of numeric(p,s) and of the
integers, dates and timestamps at their limits, BC and infinity, 24:00:00, empty strings, the
strings NA and NULL, trailing blanks, quotes, commas and newlines) survive a pull (REFRESH
EVERY), a stream apply (REFRESH CONTINUOUSLY) and an answer unchanged.

Each value is read back twice: through the cache, as an application reads it (the answer
psycopg gives for it on PostgreSQL - the same value and Python type, or the same error where
psycopg cannot load it, as for infinity), and as DuckDB stores it (its text, which keeps what
Python's types cannot hold)."""

from __future__ import annotations

import contextlib
import re
import typing as t
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.reflect import fetch_catalog
from cache.execution.lookup import USES_BEFORE_BUILD
from cache.maintenance import stream
from cache.maintenance.engines import InlineEngine
from cache.maintenance.pipeline import Maintainer
from cache.store.cache_file import CacheStore
from sql_ext import parse
from tests.answers import typed

COLUMNS = """id integer PRIMARY KEY, i2 smallint, i4 integer, i8 bigint, n0 numeric(10,0),
    n2 numeric(15,2), n38 numeric(38,10), f4 real, f8 double precision, b boolean, t text,
    v varchar(20), c char(5), d date, ts timestamp, tz timestamptz, tm time, u uuid"""
NAMES = [c.split()[0] for c in re.split(r",\s*(?![^()]*\))", COLUMNS) if c.split()[0] != "id"]
ROWS = [
    "(1, 0, 0, 0, 0, 0.00, 0, 0, 0, false, '', '', '', '2000-01-01', '2000-01-01 00:00',"
    " '2000-01-01 00:00+00', '00:00', '00000000-0000-0000-0000-000000000000')",
    "(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL)",
    "(3, 1, 1, 1, 1, 0.01, 0.0000000001, 'NaN', 'NaN', true, 'NA', 'NULL', ' ',"
    " 'infinity', 'infinity', 'infinity', '24:00:00', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11')",
    "(4, -1, -1, -1, -1, -0.01, -0.0000000001, '-Infinity', '-Infinity', false, '\\N',"
    " 'N/A', 'ab', '-infinity', '-infinity', '-infinity', '23:59:59.999999', NULL)",
    "(5, 32767, 2147483647, 9223372036854775807, 9999999999, 9999999999999.99,"
    " 9999999999999999999999999999.9999999999, 3.4028235e38, 1.7976931348623157e308, true,"
    " 'trailing  ', 'a\"b,c', 'ab  ', '9999-12-31', '9999-12-31 23:59:59.999999',"
    " '9999-12-31 23:59:59.999999+00', '12:00', NULL)",
    "(6, -32768, -2147483648, -9223372036854775808, -9999999999, -9999999999999.99,"
    " -9999999999999999999999999999.9999999999, 1e-45, 5e-324, false, e'line\\nbreak\\ttab',"
    " 'ÄÖü€', 'Q R', '0001-01-01', '0001-01-01 00:00', '0001-01-01 00:00+00', '00:00:01', NULL)",
    "(7, 7, 7, 7, 7, 2.50, 1.2345678901, '-0', '-0', NULL, '\"quoted\"', ',', 'x',"
    " '0044-03-15 BC', '4713-01-01 00:00 BC', '0044-03-15 12:00+00 BC', '10:15:30.5', NULL)",
    "(8, 2, 2, 2, 2, 0.10, 0.1, 0.1, 0.1, true, 'NaN', 'Infinity', 'NaN', '5874897-12-31',"
    " '294200-01-01 00:00', '294200-01-01 00:00+00', '00:00:00.000001', NULL)",
]
IDS = range(1, len(ROWS) + 1)


@pytest.fixture(scope="module")
def backend(pg_cluster: EmbeddedPostgres) -> str:
    dsn = pg_cluster.create_database("round_trip")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE pulled ({COLUMNS})")
        conn.execute(f"CREATE TABLE streamed ({COLUMNS})")
        conn.execute(f"INSERT INTO pulled VALUES {', '.join(ROWS)}")
    return dsn


@pytest.fixture(scope="module")
def cached(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache file holding ``pulled`` (pulled) and ``streamed`` (its rows inserted on the
    backend after the view was made: applied from the replication stream)."""
    path = tmp_path_factory.mktemp("round_trip") / "cache.duckdb"
    store = CacheStore(path)
    ddl = (
        "CREATE CACHED VIEW pulled_copy AS SELECT * FROM pulled REFRESH EVERY 10 MIN;"
        "CREATE CACHED VIEW streamed_copy AS SELECT * FROM streamed REFRESH CONTINUOUSLY"
    )
    stream.apply_ddl(store, backend, parse(ddl), fetch_catalog(backend))
    with stream.Consumer(store, backend) as consumer:
        Maintainer(store, backend, InlineEngine()).refresh("streamed_copy")  # empty: its start
        with psycopg.connect(backend, autocommit=True) as conn:
            conn.execute(f"INSERT INTO streamed VALUES {', '.join(ROWS)}")
        consumer.catch_up()
    assert store.con.execute("SELECT count(*) FROM streamed_copy").fetchone() == (len(ROWS),)
    store.close()
    with cache.connect(backend=backend, cache_path=path, background=False) as conn:
        conn.admin.refresh("pulled_copy")
    yield path
    with CacheStore(path) as again:  # the slot goes with the last continuous view
        stream.apply_ddl(
            again, backend, parse("DROP CACHED VIEW streamed_copy"), fetch_catalog(backend)
        )


def outcome(run: t.Callable[[str], t.Any], sql: str) -> tuple[str, object]:
    try:
        return "rows", typed(run(sql).fetchall())
    except (psycopg.Error, cache.Error) as exc:
        return "error", type(exc).__name__


def canonical(text: str | None) -> str | None:
    """A date or time's text as PostgreSQL and DuckDB both mean it (``0044-03-15 BC`` and
    ``0044-03-15 (BC)``; a zone offset of +00 and none)."""
    if text is None:
        return None
    bc = " BC" in text or "(BC)" in text
    plain = re.sub(r" ?\(BC\)| BC", "", text).replace("+00", "")
    return plain + (" BC" if bc else "")


@contextlib.contextmanager
def _connected(
    backend: str, cached: Path
) -> Iterator[tuple[cache.Connection, psycopg.Connection[t.Any]]]:
    """The cache (its guarded plan, a bound of 10 minutes) and PostgreSQL, in UTC."""
    with (
        cache.connect(
            backend=backend,
            cache_path=cached,
            background=False,
            currency_bound="10 min",
            plan_choice="guarded",
            autocommit=True,
        ) as conn,
        psycopg.connect(backend, autocommit=True) as pg,
    ):
        pg.execute("SET TimeZone = 'UTC'")
        yield conn, pg


@pytest.mark.parametrize("table", ["pulled", "streamed"])
def test_every_value_survives_and_answers_as_postgres(
    backend: str, cached: Path, table: str
) -> None:
    with _connected(backend, cached) as (conn, pg):
        cursor = conn.cursor()
        for row in IDS:
            for column in NAMES:
                sql = f"SELECT x.{column} FROM {table} x WHERE x.id = {row}"
                want = outcome(pg.execute, sql)
                got = outcome(lambda q: cursor.execute(q) or cursor, sql)
                assert got == want, f"{table} row {row} {column}: {got} != {want}"
                if want[0] == "rows":  # (0001-01-01 and 9999-12-31 too: not infinity)
                    assert [p["route"] for p in cursor.provenance] == ["local"], sql
        # the same as point lookups with a parameter, run often enough for the server's
        # lookup index of the view (which must not read infinity as an extreme date)
        for _ in range(USES_BEFORE_BUILD + 1):
            for row in IDS:
                sql = f"SELECT x.d, x.ts FROM {table} x WHERE x.id = %s"
                want = outcome(lambda q: pg.execute(q, [row]), sql)  # noqa: B023
                got = outcome(lambda q: cursor.execute(q, [row]) or cursor, sql)  # noqa: B023
                assert got == want, f"{table} row {row}: {got} != {want}"


@pytest.mark.parametrize("table", ["pulled", "streamed"])
def test_arrays_of_every_value_answer_as_postgres(backend: str, cached: Path, table: str) -> None:
    """array_agg of each column, over each row and over all of them: each element as it is
    answered alone (infinity, BC and 24:00:00 among them: psycopg's error, as PostgreSQL's)."""
    with _connected(backend, cached) as (conn, pg):
        cursor = conn.cursor()
        local = 0
        for where in ["", *(f" WHERE x.id = {row}" for row in IDS)]:
            for column in NAMES:
                sql = f"SELECT array_agg(x.{column} ORDER BY x.id) FROM {table} x{where}"
                want = outcome(pg.execute, sql)
                got = outcome(lambda q: cursor.execute(q) or cursor, sql)
                assert got == want, f"{sql}: {got} != {want}"
                if want[0] == "rows" and column != "u":  # (no uuid arrays)
                    assert [p["route"] for p in cursor.provenance] == ["local"], sql
                    local += 1
        assert local > len(IDS) * (len(NAMES) - 1) // 2


@pytest.mark.parametrize("table", ["pulled", "streamed"])
def test_what_python_cannot_hold_is_stored_as_postgres_holds_it(
    backend: str, cached: Path, table: str
) -> None:
    """Infinity, BC, year 10000 and later, 24:00:00: held exactly (psycopg cannot load them,
    so the application gets PostgreSQL's error; the cache's copy must still be right)."""
    temporal = ["d", "ts", "tz", "tm"]
    with psycopg.connect(backend, autocommit=True) as pg:
        pg.execute("SET TimeZone = 'UTC'")
        pg.execute("SET DateStyle = 'ISO, YMD'")
        want = pg.execute(
            f"SELECT id, {', '.join(c + '::text' for c in temporal)} FROM {table} ORDER BY id"
        ).fetchall()
    with CacheStore(cached) as store:
        got = store.con.execute(
            f"SELECT id, {', '.join(f'CAST({c} AS VARCHAR)' for c in temporal)} FROM "
            f"{table}_copy ORDER BY id"
        ).fetchall()
    assert [tuple(map(canonical, r[1:])) for r in got] == [
        tuple(map(canonical, r[1:])) for r in want
    ]
