"""The statement without extensions means what the user wrote: run the original (without its
clause) and the regenerated SQL on PostgreSQL, and the DuckDB rendering on DuckDB, and compare."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import psycopg
import pyarrow as pa
import pytest

from sql_ext import Query, parse_one

TABLES = ("authors", "books", "reviewers", "reviews", "sales")

# Plain PostgreSQL, beyond what the extensions touch: casts, ILIKE, DISTINCT ON, windows,
# LATERAL, CTEs, set operations, intervals, string functions, placeholders-free.
POSTGRES_ONLY = [
    "SELECT DISTINCT ON (a.city) a.city, a.name FROM authors a ORDER BY a.city, a.authorid",
    "SELECT a.name FROM authors a WHERE a.name ILIKE 'author 1%' ORDER BY 1",
    "SELECT b.isbn, x.n FROM books b, LATERAL (SELECT count(*) AS n FROM reviews r "
    "WHERE r.isbn = b.isbn) x ORDER BY 1 LIMIT 20",
    "SELECT s.sold_on + INTERVAL '1 day' AS next_day, s.qty::text || 'x' FROM sales s "
    "ORDER BY s.saleid LIMIT 10",
    "SELECT string_agg(a.name, ',' ORDER BY a.authorid) FROM authors a WHERE a.state = 'WA'",
]

# Valid in both PostgreSQL and DuckDB once rendered by sqlglot.
PORTABLE = [
    "SELECT b.title, r.rating FROM books b, reviews r WHERE b.isbn = r.isbn "
    "CURRENCY BOUND 10 MIN ON (b, r) ORDER BY b.title, r.rating",
    "SELECT a.city, count(*) AS n, sum(b.price) AS total FROM authors a JOIN books b "
    "ON a.authorid = b.authorid GROUP BY a.city HAVING count(*) > 3 ORDER BY a.city "
    "CURRENCY BOUND 1 HOUR BY a.city",
    "SELECT s.qty, t.title FROM sales s, (SELECT b.isbn, b.title FROM books b, reviews r "
    "WHERE b.isbn = r.isbn CURRENCY BOUND 10 MIN ON (b, r)) t WHERE s.isbn = t.isbn "
    "CURRENCY BOUND 5 MIN ON (s, t) ORDER BY 1, 2",
    "SELECT b.title FROM books b WHERE b.isbn IN (SELECT s.isbn FROM sales s WHERE s.sold_on "
    ">= DATE '2003-01-01' AND s.sold_on < DATE '2004-01-01' CURRENCY BOUND 10 MIN ON (s, b)) "
    "ORDER BY 1 CURRENCY BOUND 10 MIN ON (b)",
    "WITH recent AS (SELECT s.isbn, sum(s.qty) AS q FROM sales s GROUP BY s.isbn "
    "CURRENCY BOUND 1 HOUR) SELECT b.title, recent.q FROM books b JOIN recent "
    "ON b.isbn = recent.isbn ORDER BY recent.q DESC, b.title LIMIT 15 CURRENCY BOUND 1 HOUR",
    "SELECT a.city FROM authors a CURRENCY BOUND 1 MIN UNION SELECT v.city FROM reviewers v "
    "CURRENCY BOUND 2 MIN ORDER BY 1",
    "SELECT b.isbn, rank() OVER (PARTITION BY b.authorid ORDER BY b.price DESC, b.isbn) AS rk "
    "FROM books b ORDER BY b.isbn LIMIT 30 CURRENCY BOUND 5 MIN",
    "SELECT a.name FROM authors a WHERE NOT EXISTS (SELECT 1 FROM books b WHERE b.authorid = "
    "a.authorid AND b.price > 60 CURRENCY BOUND 1 MIN ON (b, a)) ORDER BY 1 CURRENCY BOUND 1 MIN",
    "SELECT b.type, CASE WHEN avg(b.price) > 30 THEN 'dear' ELSE 'cheap' END AS band, "
    "coalesce(max(b.publisherid), 0) FROM books b GROUP BY b.type ORDER BY 1",
    "SELECT r.rating, count(DISTINCT r.reviewerid) FROM reviews r GROUP BY r.rating "
    "ORDER BY 1 CURRENCY BOUND 30 SEC",
    "SELECT * FROM book_reviews v WHERE v.rating >= 4 ORDER BY v.reviewid LIMIT 25 "
    "CURRENCY BOUND 3 MIN",
]


def strip_clauses_by_hand(sql: str) -> str:
    """The user's query as PostgreSQL would take it: the clause text cut out of the string,
    independently of the parser under test."""
    import re

    return re.sub(
        r"CURRENCY BOUND [0-9.]+ \w+( ON \([^)]*\))?( BY [\w.]+(, [\w.]+)*)?"
        r"(, [0-9.]+ \w+( ON \([^)]*\))?( BY [\w.]+(, [\w.]+)*)?)*",
        "",
        sql,
    )


def rows_pg(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def duck(
    bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB file holding the same bookstore rows, moved through Arrow."""
    path: Path = tmp_path_factory.mktemp("duck") / "bookstore.duckdb"
    con = duckdb.connect(str(path))
    with psycopg.connect(bookstore_dsn) as conn:
        for table in TABLES:
            cur = conn.execute(f"SELECT * FROM {table}")
            names = [d.name for d in cur.description or []]
            data = pa.Table.from_pylist(
                [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
            )
            con.register("incoming", data)
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM incoming")
            con.unregister("incoming")
        definition = conn.execute("SELECT pg_get_viewdef('book_reviews', true)").fetchone()
    assert definition is not None
    con.execute(f"CREATE VIEW book_reviews AS {definition[0]}")
    yield con
    con.close()


@pytest.mark.parametrize("sql", POSTGRES_ONLY + PORTABLE)
def test_regenerated_postgres_sql_returns_the_same_rows(sql: str, bookstore_dsn: str) -> None:
    query = parse_one(sql)
    assert isinstance(query, Query)
    expected = rows_pg(bookstore_dsn, strip_clauses_by_hand(sql))
    assert expected, "the case should return rows to compare"
    assert rows_pg(bookstore_dsn, query.to_sql("postgres")) == expected


@pytest.mark.parametrize("sql", PORTABLE)
def test_duckdb_rendering_returns_the_same_rows(
    sql: str, bookstore_dsn: str, duck: duckdb.DuckDBPyConnection
) -> None:
    query = parse_one(sql)
    assert isinstance(query, Query)
    expected = rows_pg(bookstore_dsn, strip_clauses_by_hand(sql))
    got = duck.execute(query.to_sql("duckdb")).fetchall()
    assert [tuple(normalize(v) for v in row) for row in got] == [
        tuple(normalize(v) for v in row) for row in expected
    ]


def normalize(value: object) -> object:
    """Compare numbers by value: PostgreSQL and DuckDB pick different numeric types."""
    from decimal import Decimal

    if isinstance(value, Decimal | float) and not isinstance(value, bool):
        return round(float(value), 6)
    return value


@pytest.mark.parametrize(
    "sql",
    [
        "EXPLAIN SELECT * FROM books b WHERE b.price > 10 CURRENCY BOUND 1 MIN",
        "EXPLAIN (FORMAT JSON, COSTS OFF) SELECT b.isbn FROM books b CURRENCY BOUND 1 MIN ON (b)",
        "EXPLAIN VERBOSE SELECT a.name FROM authors a WHERE a.authorid IN "
        "(SELECT b.authorid FROM books b CURRENCY BOUND 1 MIN) CURRENCY BOUND 1 MIN",
    ],
)
def test_explain_runs_on_postgres_without_the_clause(sql: str, bookstore_dsn: str) -> None:
    query = parse_one(sql)
    assert isinstance(query, Query) and query.explain is not None
    plan = rows_pg(bookstore_dsn, query.to_sql("postgres"))
    assert plan and any("books" in str(row) for row in plan)
