"""Every entry of the allowlist (optimizer/postgres/allowlist/) proven against PostgreSQL: each
of its proofs, an expression over a table of edge values (NULLs, empty strings, trailing blanks in
char(n), zero and negative scales, negative zero, newlines, long and non-ASCII strings,
extremes of every type), is answered by the cache locally
with PostgreSQL's values, Python types and description; where the extremes make PostgreSQL
raise, the cache raises the same SQLSTATE, and the rows without them are answered locally.
Each expression the entry lists as raising raises the same SQLSTATE through the cache."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import cache
from optimizer.postgres.allowlist import ENTRIES, Entry
from tests.answers import typed

EDGE = """CREATE TABLE edge (
    id integer PRIMARY KEY, i2 smallint, i4 integer, i8 bigint,
    n numeric(12,2), n0 numeric(10,0), n4 numeric(18,4), f4 real, f8 double precision,
    c char(5), c1 char(1), v varchar(10), t text,
    d date, ts timestamp, tz timestamptz, tm time, b boolean)"""
# rows 5 and 6 hold the extremes, at which arithmetic overflows (PostgreSQL raises there)
ROWS = """INSERT INTO edge VALUES
    (1, 0, 0, 0, 0.00, 0, 0.0000, 0, 0, '', '', '', '', '2000-01-01', '2000-01-01 00:00:00',
     '2000-01-01 00:00:00+00', '00:00', false),
    (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
     NULL, NULL, NULL),
    (3, 1, 7, 10, 2.50, 3, 1.2345, 0.1, 0.1, 'ab', 'A', 'ab  ', 'Ab ', '1995-01-31',
     '1995-01-31 10:20:30.5', '1995-01-31 10:20:30.5+00', '10:15:00', true),
    (4, -1, -7, -3000000000, -2.55, -5, -0.0005, -2.5, -2.5, ' x', 'z', ' lead', 'x y',
     '1992-02-29', '1998-12-31 23:59:59', '1998-12-31 23:59:59+00', '23:59:59.999999', false),
    (5, 32767, 2147483647, 9223372036854775807, 9999999999.99, 9999999999,
     99999999999999.9999, 3.4e38, 1.7976931348623157e308, 'ABCDE', ' ', 'ÄÖü€', 'tab	here',
     '0001-01-01', '9999-12-31 23:59:59', '2999-12-31 23:59:59+00', '12:00', true),
    (6, -32768, -2147483648, -9223372036854775808, -9999999999.99, -9999999999,
     -99999999999999.9999, -3.4e38, 5e-324, 'a%_\\', 'Ä', 'a%_', 'Customer#000000001',
     '1970-01-01', '1970-01-01 00:00:00', '1970-01-01 00:00:00+00', '00:00:01', false),
    (7, 5, 2, 2, 1.00, 10, 0.5000, 1.5, 1e-10, 'Q R', 'B', 'Q R ', 'furiously quick',
     '2024-06-01', '2024-06-01 06:06:06.000001', '2024-06-01 06:06:06+00', '06:06', NULL),
    (8, 2, 3, -1, -0.01, 1, -0.0001, '-0', '-0', 'é a', 'é', E'a\nc',
     repeat('xé', 300) || E'\nCustomer#0042 a1c yy', '2000-02-29', '2000-02-29 12:00:00',
     '2000-02-29 12:00:00+00', '12:30', true)"""
EXTREMES = (5, 6)


@pytest.fixture(scope="module")
def backend(backend_dsn: str) -> str:
    with psycopg.connect(backend_dsn, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS edge")
        setup.execute(EDGE)
        setup.execute(ROWS)
    return backend_dsn


@contextlib.contextmanager
def edge_connection(backend: str, path: Path) -> Iterator[cache.Connection]:
    """A cache connection on ``path`` holding the edge table, planning the guarded plan."""
    with cache.connect(
        backend=backend,
        cache_path=path,
        admit_on_miss=False,
        autocommit=True,
        background=False,
        plan_choice="guarded",
        currency_bound="10 min",
    ) as conn:
        conn.cursor().execute("CREATE CACHED VIEW edge_copy AS SELECT * FROM edge")
        conn.admin.refresh("edge_copy")
        yield conn


@pytest.fixture(scope="module")
def conn(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[cache.Connection]:
    with edge_connection(backend, tmp_path_factory.mktemp("allowlist") / "cache.duckdb") as conn:
        yield conn


def outcome(run: object, sql: str) -> tuple[str, object]:
    """("rows", (typed rows, description)) or ("error", SQLSTATE) of running ``sql`` (rows
    in order only when it orders them)."""
    try:
        cursor = run(sql)  # type: ignore[operator]
        rows = typed(cursor.fetchall())
        described = [(d[0], d[1]) for d in cursor.description]
    except (psycopg.Error, cache.Error) as exc:
        return "error", getattr(exc, "sqlstate", None) or type(exc).__name__
    return "rows", (rows if " ORDER BY " in sql else sorted(rows), described)


def check(conn: cache.Connection, backend: str, sql: str, local: bool = True) -> str:
    """The cache's outcome of ``sql`` is PostgreSQL's (``local``: where PostgreSQL answers,
    the cache answered from its view); "error" or the route it took."""
    with psycopg.connect(backend, autocommit=True) as pg:
        want = outcome(pg.execute, sql)
    cursor = conn.cursor()
    got = outcome(lambda q: cursor.execute(q) or cursor, sql)
    assert got == want, f"{sql}\n  cache: {got}\n  pg:    {want}"
    if want[0] == "error":
        return "error"
    routes = {p["route"] for p in cursor.provenance}
    if local:
        assert routes == {"local"}, f"{sql}: {cursor.plan.reason if cursor.plan else routes}"
    return "local" if routes == {"local"} else "remote"


def statement(proof: str, where: str = "") -> str:
    """A proof as a statement over the edge table: an expression per row, or its own SELECT
    (aggregates)."""
    if proof.startswith("SELECT "):
        if not where:
            return proof
        joiner = " AND " if " WHERE " in proof else " WHERE "
        head, group, tail = proof.partition(" GROUP BY ")
        return f"{head}{joiner}{where}{group}{tail}"
    return f"SELECT e.id, {proof} FROM edge e{' WHERE ' + where if where else ''} ORDER BY e.id"


def entry_uses(conn: cache.Connection, sql: str) -> frozenset[str]:
    cursor = conn.cursor()
    cursor.execute(f"EXPLAIN {sql}")
    assert cursor.plan is not None
    return cursor.plan.analysis.semantics.entries


# the entries proven under the test cluster's C ctype (those of another ctype:
# tests/optimizer/test_unicode_case.py)
C_ENTRIES = [e for e in ENTRIES if e.ctype == "C"]


@pytest.mark.parametrize("entry", C_ENTRIES, ids=[e.name for e in C_ENTRIES])
def test_every_entry_is_proven_against_postgres(
    conn: cache.Connection, backend: str, entry: Entry
) -> None:
    assert entry.proofs, f"{entry.name} has no proof: an entry is listed only with one"
    for proof in entry.proofs:
        sql = statement(proof)
        assert entry.name in entry_uses(conn, sql), f"{proof} does not use {entry.name}"
        # every row, the extremes included: PostgreSQL's answer or error (DuckDB's types may
        # overflow where PostgreSQL's numerics do not: then the backend answers)
        check(conn, backend, sql, local=False)
        # the rows without the extremes: answered locally
        check(conn, backend, statement(proof, f"e.id NOT IN {EXTREMES}"))
    for failing in entry.raises:
        sql = f"SELECT e.id, {failing} FROM edge e WHERE e.id = 1"
        assert check(conn, backend, sql) == "error", f"{failing} does not raise"


ZONED = (
    "e.tz",
    "e.tz::date",
    "e.tz::timestamp",
    "e.tz < e.ts",
    "e.tz >= e.d",
    "e.tz = '1995-01-31 10:20:30.5'",
    "date_trunc('month', e.d)",
    "date_trunc('day', e.d) = e.tz",
    "(SELECT max(x.tz) FROM edge x)",
    "e.tz - date_trunc('month', e.d)",
    "e.tz - (SELECT max(x.tz) FROM edge x) < interval '1 hour'",
)


@pytest.mark.parametrize("zone", ["Asia/Kathmandu", "America/Sao_Paulo"])
def test_times_with_time_zone_follow_the_sessions_zone(
    conn: cache.Connection, backend: str, zone: str
) -> None:
    """Where PostgreSQL reads a time in the session's time zone (timestamps with time zone
    printed, cast to dates, compared with timestamps), the cache does too: the session's
    TimeZone is set through the cache, and PostgreSQL is asked with the same setting."""
    cursor = conn.cursor()
    cursor.execute(f"SET TimeZone = '{zone}'")
    try:
        for expression in ZONED:
            sql = (
                f"SELECT e.id, {expression} FROM edge e WHERE e.id NOT IN {EXTREMES} ORDER BY e.id"
            )
            with psycopg.connect(backend, autocommit=True) as pg:
                pg.execute(f"SET TimeZone = '{zone}'")
                want = outcome(pg.execute, sql)
            got = outcome(lambda q: cursor.execute(q) or cursor, sql)
            assert got == want, f"{sql}\n  cache: {got}\n  pg:    {want}"
            assert {p["route"] for p in cursor.provenance} == {"local"}, sql
    finally:
        cursor.execute("RESET TimeZone")


# the constructs that are parts of a query rather than entries of the list, over the same
# edge values: NULLs, empty inputs, ties, negative zero, long and non-ASCII strings
STRUCTURES = (
    # LATERAL: an aggregate per row, the first rows per row, an empty body
    "SELECT e.id, x.c, x.m FROM edge e, LATERAL (SELECT count(*) AS c, max(y.t) AS m "
    "FROM edge y WHERE y.i2 > e.i2) AS x",
    "SELECT e.id, x.t FROM edge e LEFT JOIN LATERAL (SELECT y.t FROM edge y "
    "WHERE y.c = e.c AND y.id <> e.id ORDER BY y.id LIMIT 1) AS x ON true",
    "SELECT e.id, x.s FROM edge e CROSS JOIN LATERAL (SELECT sum(y.n) AS s FROM edge y "
    "WHERE false) AS x",
    "SELECT e.id, x.v FROM edge e LEFT JOIN LATERAL (SELECT y.v FROM edge y "
    "WHERE y.f8 = e.f8 AND y.id > e.id) AS x ON true",
    # WITH RECURSIVE: a counter from each row, a walk that ties, text growing non-ASCII
    "WITH RECURSIVE r(id, n, s) AS (SELECT e.id, e.i4, e.t FROM edge e WHERE e.id NOT IN (5, 6) "
    "UNION ALL SELECT r.id, r.n + 1, r.s || 'é' FROM r WHERE r.n < 3) SELECT id, n, s FROM r",
    "WITH RECURSIVE r(b) AS (SELECT e.b FROM edge e UNION SELECT NOT r.b FROM r) SELECT b FROM r",
    "WITH RECURSIVE r(d) AS (SELECT min(e.d) FROM edge e WHERE e.id NOT IN (5, 6) UNION ALL "
    "SELECT r.d + 400 FROM r WHERE r.d < DATE '1990-01-01') SELECT count(*), max(d) FROM r",
    # VALUES: untyped numbers of several scales, NULLs, negative zero, non-ASCII and long text
    "SELECT v.a, v.b, e.id FROM (VALUES (-0.0, 'ÄÖü'), (NULL, ''), (1.50, repeat('é', 300)), "
    "(2, NULL)) AS v(a, b) LEFT JOIN edge e ON e.n = v.a",
    "SELECT v.k, count(e.id) FROM (VALUES (0), (7), (NULL)) AS v(k) LEFT JOIN edge e "
    "ON e.i4 = v.k GROUP BY v.k",
)


@pytest.mark.parametrize("sql", STRUCTURES)
def test_query_structures_answer_as_postgres_over_edge_values(
    conn: cache.Connection, backend: str, sql: str
) -> None:
    check(conn, backend, sql)
