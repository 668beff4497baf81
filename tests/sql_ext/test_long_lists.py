"""Long IN lists (`sql_ext.long_lists`): applications send lists of thousands of keys. A list of
at least LONG_LIST integers or plain strings is one node, bound to DuckDB as one list
parameter; the answers are PostgreSQL's, values, types and description, whether the list is
answered locally (integers with integer columns, strings with text), from a presence-controlled
view (every key probed), or at the backend (any other comparison)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import cache
from cache.dbapi.connection import Connection
from cache.tools import bookstore
from sql_ext.long_lists import LONG_LIST
from tests.answers import assert_same_answer

CLAUSE = " CURRENCY BOUND 10 MIN"
VIEWS = """
CREATE CACHED VIEW salescopy AS SELECT * FROM sales REFRESH EVERY 10 MIN;
CREATE CACHED VIEW bookfull AS SELECT isbn, title, price FROM books REFRESH EVERY 10 MIN;
"""


@pytest.fixture
def conn(bookstore_dsn: str, tmp_path: Path) -> Iterator[Connection]:
    # guarded plans: the routes are tested here, not the cost model's choices
    connection = cache.connect(
        backend=bookstore_dsn,
        cache_path=tmp_path / "c.duckdb",
        admit_on_miss=False,
        background=False,
        plan_choice="guarded",
    )
    connection.admin.apply_ddl(bookstore.CACHE_SCHEMA_FILE.read_text() + VIEWS)
    for view in ("salescopy", "bookfull"):
        connection.admin.refresh(view, engine="inline")
    yield connection
    connection.close()


def listed(values: object) -> str:
    return ", ".join(map(str, values))  # type: ignore[call-overload]


def same(conn: Connection, dsn: str, sql: str, route: str) -> str:
    """The cache's answer to ``sql`` with a clause is PostgreSQL's, taken by ``route``; the
    statement DuckDB ran (when local)."""
    answer = assert_same_answer(conn, dsn, sql + CLAUSE, sql)
    assert answer.route == route, answer.reason
    assert answer.rows, "a test of an empty answer proves little"
    cursor = conn.cursor()
    cursor.execute(sql + CLAUSE)
    return cursor.result.executed.duckdb_sql or ""


KEYS = range(1, 3 * LONG_LIST, 2)  # odd sale ids: half the sales table and many absent ones


@pytest.mark.parametrize(
    "shape",
    [
        f"saleid IN ({listed(KEYS)})",
        f"saleid NOT IN ({listed(KEYS)})",
        f"saleid IN ({listed([*KEYS, 2**31 + 5, 2**62])})",  # int8 constants meet a bigint
        f"qty IN ({listed(range(LONG_LIST))}) AND saleid < 50",  # an integer column
        f"isbn IN ({listed(repr(f'isbn-{i}') for i in range(LONG_LIST))}) OR saleid < 5",
    ],
)
def test_a_long_list_is_answered_locally_as_postgresql_answers(
    conn: Connection, bookstore_dsn: str, shape: str
) -> None:
    sql = f"SELECT saleid, isbn, qty FROM sales WHERE {shape} ORDER BY saleid"
    duckdb_sql = same(conn, bookstore_dsn, sql, "local")
    assert "mtcache_list_0" in duckdb_sql and len(duckdb_sql) < 500  # bound, not printed


def test_strings_with_quotes_and_percent_signs(conn: Connection, bookstore_dsn: str) -> None:
    isbns = [row[0] for row in conn.execute("SELECT isbn FROM books").fetchall()]
    strings = [*isbns, *(f"it's {i} %" for i in range(LONG_LIST))]
    literal = listed("'" + s.replace("'", "''") + "'" for s in strings)
    sql = f"SELECT isbn, title, price FROM books WHERE isbn IN ({literal}) ORDER BY isbn"
    same(conn, bookstore_dsn, sql, "local")
    # with parameters, %% is a % in strings as psycopg reads them
    cursor = conn.cursor()
    cursor.execute(
        sql.replace("%", "%%").replace(" ORDER BY", " AND price > %s ORDER BY") + CLAUSE, (0,)
    )
    assert cursor.result.executed.duckdb_sql is not None
    assert len(cursor.fetchall()) == len(isbns)


def test_other_comparisons_go_to_the_backend_and_say_why(
    conn: Connection, bookstore_dsn: str
) -> None:
    """A numeric column with integer constants (PostgreSQL compares them as numerics):
    answered by the backend, with the reason in the plan."""
    sql = (
        f"SELECT isbn, price FROM books WHERE price NOT IN ({listed(range(LONG_LIST))}) "
        "ORDER BY isbn"
    )
    answer = assert_same_answer(conn, bookstore_dsn, sql + CLAUSE, sql)
    assert answer.route == "remote"
    assert "a list of 1000 constants" in (answer.reason or "")


def test_a_presence_controlled_view_probes_every_listed_key(
    conn: Connection, bookstore_dsn: str
) -> None:
    """A long list on a presence-controlled view is local only when every key is present."""
    authors = [row[0] for row in conn.execute("SELECT authorid FROM authors").fetchall()]
    conn.admin.admit("authorlist_pct", authors)
    conn.commit()
    conn.admin.refresh("authorcopy", engine="inline")
    absent = range(max(authors) + 1, max(authors) + LONG_LIST)
    present = (
        f"SELECT authorid, name FROM authors WHERE authorid IN ({listed(authors * 2)}"
        f"{', ' + listed(authors[:1] * LONG_LIST)}) ORDER BY authorid"
    )
    same(conn, bookstore_dsn, present, "local")
    missing = (
        f"SELECT authorid, name FROM authors WHERE authorid IN ({listed(authors)}, "
        f"{listed(absent)}) ORDER BY authorid"
    )
    same(conn, bookstore_dsn, missing, "remote")


def test_a_megabyte_statement_is_answered(conn: Connection, bookstore_dsn: str) -> None:
    """The issue's 1.1 MB statement with a clause: parsed, planned and run locally."""
    keys = listed(range(1, 160_000))
    sql = f"SELECT saleid, qty FROM sales WHERE saleid IN ({keys}) ORDER BY saleid"
    assert len(sql) > 1_100_000
    same(conn, bookstore_dsn, sql, "local")
