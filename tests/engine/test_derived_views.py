"""Derived cached views (joins along keys, groups, aggregates): created by the cache DDL,
refreshed from the backend in one snapshot, their stored rows PostgreSQL's own computation
of the view (values and Python types), and every DDL the cache cannot keep refused with a
clear error that changes nothing (real PostgreSQL and DuckDB)."""

from __future__ import annotations

import random
import typing as t
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import cache
from cache.dbapi.connection import Connection
from sql_ext.errors import CatalogError, NotSupportedError, ProgrammingError

# per author: how many books, what they cost in all, on average, at least, and the last title
AUTHOR_STATS = """CREATE CACHED VIEW author_stats AS
    SELECT b.authorid, count(*) AS books, sum(b.price) AS total, avg(b.price) AS mean,
           min(b.price) AS cheapest, max(b.title) AS last_title
    FROM books b GROUP BY b.authorid REFRESH EVERY 10 MIN"""
# what the backend computes of it: the average as its sum and count
AUTHOR_STATS_STATES = """SELECT b.authorid, count(*), sum(b.price), sum(b.price),
    count(b.price), min(b.price), max(b.title) FROM books b GROUP BY b.authorid"""
# reviews with their book: a join along the book's key
REVIEWED = """CREATE CACHED VIEW reviewed AS
    SELECT r.reviewid, r.rating, b.isbn, b.title, b.price
    FROM reviews r JOIN books b ON r.isbn = b.isbn WHERE r.rating >= 3"""
REVIEWED_ROWS = """SELECT r.reviewid, r.rating, b.isbn, b.title, b.price
    FROM reviews r JOIN books b ON r.isbn = b.isbn WHERE r.rating >= 3"""
# ratings by the author's city: two joins, grouped
CITY_RATINGS = """CREATE CACHED VIEW city_ratings AS
    SELECT a.city, count(*) AS reviews, sum(r.rating) AS stars, avg(r.rating) AS mean
    FROM reviews r JOIN books b ON r.isbn = b.isbn JOIN authors a ON b.authorid = a.authorid
    GROUP BY a.city"""
CITY_RATINGS_STATES = """SELECT a.city, count(*), sum(r.rating), sum(r.rating)::numeric,
    count(r.rating) FROM reviews r JOIN books b ON r.isbn = b.isbn
    JOIN authors a ON b.authorid = a.authorid GROUP BY a.city"""
# one row: every sale
ALL_SALES = """CREATE CACHED VIEW all_sales AS
    SELECT count(*) AS sales, sum(s.qty) AS sold, sum(s.qty * 1.5) AS weighted,
           max(s.sold_on) AS last_day FROM sales s"""
ALL_SALES_STATES = "SELECT count(*), sum(s.qty), sum(s.qty * 1.5), max(s.sold_on) FROM sales s"
# books by their author's gender, a char(1)
BY_GENDER = """CREATE CACHED VIEW by_gender AS SELECT a.gender, count(*) AS books
    FROM books b JOIN authors a ON b.authorid = a.authorid GROUP BY a.gender"""


@pytest.fixture
def conn(bookstore_dsn: str, tmp_path: Path) -> Iterator[Connection]:
    with cache.connect(
        backend=bookstore_dsn, cache_path=tmp_path / "cache.duckdb", background=False
    ) as opened:
        yield opened


def stored(conn: Connection, view: str) -> list[tuple[t.Any, ...]]:
    return sorted(conn.admin.store.con.execute(f"SELECT * FROM {view}").fetchall(), key=repr)


def backend(dsn: str, sql: str, params: t.Sequence[t.Any] = ()) -> list[tuple[t.Any, ...]]:
    with psycopg.connect(dsn) as pg:
        return sorted(pg.execute(sql, params).fetchall(), key=repr)


def typed(rows: list[tuple[t.Any, ...]]) -> list[tuple[tuple[type, t.Any], ...]]:
    return [tuple((type(v), v) for v in row) for row in rows]


@pytest.mark.parametrize(
    ("ddl", "states"),
    [
        (AUTHOR_STATS, AUTHOR_STATS_STATES),
        (REVIEWED, REVIEWED_ROWS),
        (CITY_RATINGS, CITY_RATINGS_STATES),
        (ALL_SALES, ALL_SALES_STATES),
    ],
)
def test_a_refreshed_derived_view_holds_what_the_backend_computes(
    conn: Connection, bookstore_dsn: str, ddl: str, states: str
) -> None:
    name = ddl.split()[3]
    conn.admin.apply_ddl(f"{ddl} WITH NO DATA")
    assert stored(conn, name) == []  # (created empty; a refresh fills it)
    conn.admin.refresh(name)
    want = backend(bookstore_dsn, states)
    assert want and typed(stored(conn, name)) == typed(want)
    views = {v["name"]: v for v in conn.admin.status()["views"]}
    assert views[name]["rows"] == len(want) and views[name]["last_refresh"] is not None


def test_a_derived_view_follows_the_backend_at_each_refresh(
    conn: Connection, bookstore_dsn: str
) -> None:
    conn.admin.apply_ddl(AUTHOR_STATS)
    conn.admin.refresh("author_stats")
    with psycopg.connect(bookstore_dsn, autocommit=True) as pg:
        pg.execute("INSERT INTO books VALUES ('isbn-derived', 1, 'Zzz', 1, 'ebook', 12.345)")
        try:
            conn.admin.refresh("author_stats")
            assert typed(stored(conn, "author_stats")) == typed(
                backend(bookstore_dsn, AUTHOR_STATS_STATES)
            )
            row = next(r for r in stored(conn, "author_stats") if r[0] == 1)
            assert (
                row[5]
                == pg.execute("SELECT min(price) FROM books WHERE authorid = 1").fetchone()[0]
            )
        finally:
            pg.execute("DELETE FROM books WHERE isbn = 'isbn-derived'")
    conn.admin.apply_ddl("DROP CACHED VIEW author_stats")
    assert "author_stats" not in {v["name"] for v in conn.admin.status()["views"]}


@pytest.mark.parametrize(
    ("ddl", "error", "words"),
    [
        (
            "CREATE CACHED VIEW v AS SELECT b.authorid, r.rating FROM books b "
            "JOIN reviews r ON b.authorid = r.reviewerid",
            NotSupportedError,
            "not along a key",
        ),
        (
            "CREATE CACHED VIEW v AS SELECT b.authorid, b.title, count(*) AS n FROM books b "
            "GROUP BY b.authorid",
            ProgrammingError,
            "neither grouped by nor aggregated",
        ),
        (
            "CREATE CACHED VIEW v AS SELECT count(*) AS n FROM books b GROUP BY b.authorid",
            ProgrammingError,
            "without projecting it",
        ),
        (
            "CREATE CACHED VIEW v AS SELECT r.rating, b.title FROM reviews r JOIN books b "
            "ON r.isbn = b.isbn",
            ProgrammingError,
            "projects the key of each table",
        ),
        (
            "CREATE CACHED VIEW v AS SELECT isbn, count(*) AS n FROM reviews r JOIN books b "
            "ON r.isbn = b.isbn GROUP BY isbn",
            ProgrammingError,
            "qualify it",
        ),
        (
            "CREATE CACHED VIEW v AS SELECT b.authorid, sum(b.price / 3) AS s FROM books b "
            "GROUP BY b.authorid",
            NotSupportedError,
            "display scale varies",
        ),
        (
            "CREATE CACHED VIEW v AS SELECT b.authorid, max(b.title) AS t FROM books b "
            "GROUP BY b.authorid REFRESH CONTINUOUSLY",
            NotSupportedError,
            "not of a number or a date",
        ),
        (
            "CREATE CONTROL TABLE apct (authorid integer); CREATE CACHED VIEW v AS SELECT "
            "b.authorid, count(*) AS n FROM books b GROUP BY b.authorid PRESENCE ON (authorid) IN "
            "apct PRESENCE ON (n) IN apct",
            NotSupportedError,
            "one PRESENCE clause",
        ),
        (
            "CREATE CACHED VIEW v AS SELECT b.authorid, count(*) AS n FROM nosuch b "
            "GROUP BY b.authorid",
            CatalogError,
            "no table 'nosuch'",
        ),
    ],
)
def test_what_a_derived_view_cannot_be_is_refused_and_changes_nothing(
    conn: Connection, ddl: str, error: type[Exception], words: str
) -> None:
    conn.admin.apply_ddl(AUTHOR_STATS)

    def objects() -> list[tuple[t.Any, ...]]:
        return conn.admin.store.con.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns ORDER BY ALL"
        ).fetchall()

    before = objects()
    with pytest.raises(error, match=words):
        conn.admin.apply_ddl(ddl)
    assert objects() == before


def test_a_derived_view_never_answers_a_read_of_its_tables(
    conn: Connection, bookstore_dsn: str
) -> None:
    """Its rows are groups, not the table's rows: a read of books' authorid (a column the
    view also has, by name) is the backend's, not one row per author."""
    conn.admin.apply_ddl(AUTHOR_STATS)
    conn.admin.refresh("author_stats")
    cur = conn.cursor()
    read = "SELECT authorid FROM books WHERE authorid = 1"
    cur.execute(read + " CURRENCY BOUND 10 MIN")
    got = cur.fetchall()
    cur.execute("EXPLAIN LAST STATEMENT")
    assert cur.fetchone()[1] == "remote"
    assert got == backend(bookstore_dsn, read) and len(got) > 1


# queries author_stats and city_ratings answer (merging their groups), and ones they do not
ANSWERED = [
    (
        "author_stats",
        "SELECT b.authorid, count(*), sum(b.price), avg(b.price), min(b.price), "
        "max(b.title) FROM books b GROUP BY b.authorid ORDER BY 1",
    ),
    ("author_stats", "SELECT count(*) AS n, sum(price) AS total, avg(price) AS mean FROM books"),
    (
        "author_stats",
        "SELECT authorid, avg(price) FROM books WHERE authorid IN (1, 2, 3) "
        "GROUP BY authorid ORDER BY authorid",
    ),
    ("author_stats", "SELECT count(*), sum(x.price) FROM books x WHERE x.authorid > 30"),
    ("author_stats", "SELECT count(*), avg(price) FROM books WHERE authorid = -1"),
    (
        "city_ratings",
        "SELECT a.city, avg(r.rating), count(*) FROM reviews r JOIN books b "
        "ON r.isbn = b.isbn JOIN authors a ON b.authorid = a.authorid "
        "GROUP BY a.city ORDER BY a.city",
    ),
    (
        "city_ratings",
        "SELECT avg(r.rating), sum(r.rating), count(*) FROM authors a, books b, "
        "reviews r WHERE b.authorid = a.authorid AND r.isbn = b.isbn "
        "AND a.city <> 'Seattle'",
    ),
    ("all_sales", "SELECT max(s.sold_on), count(*), sum(s.qty * 1.5) FROM sales s"),
    # groups kept by conditions on their aggregates, grouped as the view or coarser
    (
        "author_stats",
        "SELECT b.authorid, count(*) FROM books b GROUP BY b.authorid "
        "HAVING count(*) > 5 AND sum(b.price) >= 100.5 ORDER BY 1",
    ),
    (
        "city_ratings",
        "SELECT a.city, sum(r.rating) FROM reviews r JOIN books b "
        "ON r.isbn = b.isbn JOIN authors a ON b.authorid = a.authorid "
        "GROUP BY a.city HAVING sum(r.rating) BETWEEN 10 AND 400 ORDER BY 1",
    ),
    ("author_stats", "SELECT count(*), sum(b.price) FROM books b HAVING count(*) > 1"),
    # a char(n) compared as PostgreSQL compares it: its trailing blanks do not count
    (
        "by_gender",
        "SELECT count(*) FROM books b JOIN authors a ON b.authorid = a.authorid "
        "WHERE a.gender = 'F '",
    ),
    (
        "by_gender",
        "SELECT a.gender, count(*) FROM books b JOIN authors a "
        "ON b.authorid = a.authorid WHERE a.gender IN ('M  ', 'X') GROUP BY a.gender",
    ),
    # conditions on averages, as PostgreSQL divides them
    (
        "author_stats",
        "SELECT b.authorid FROM books b GROUP BY b.authorid HAVING avg(b.price) > 10 ORDER BY 1",
    ),
    ("author_stats", "SELECT count(*) FROM books b HAVING avg(b.price) BETWEEN 1 AND 99.5"),
    ("author_stats", "SELECT count(*) FROM books b WHERE b.authorid = -1 HAVING avg(price) > 1"),
    (
        "city_ratings",
        "SELECT a.city, avg(r.rating) FROM reviews r JOIN books b ON r.isbn = b.isbn "
        "JOIN authors a ON b.authorid = a.authorid GROUP BY a.city "
        "HAVING avg(r.rating) >= 3.0625 ORDER BY 1",
    ),
    # DISTINCT and count(DISTINCT) of grouping columns, operations over kept aggregates
    ("author_stats", "SELECT DISTINCT b.authorid FROM books b WHERE b.authorid < 20 ORDER BY 1"),
    ("author_stats", "SELECT count(DISTINCT b.authorid) FROM books b"),
    (
        "author_stats",
        "SELECT b.authorid, count(DISTINCT b.authorid) FROM books b GROUP BY b.authorid",
    ),
    (
        "by_gender",
        "SELECT DISTINCT a.gender FROM books b JOIN authors a ON b.authorid = a.authorid",
    ),
    (
        "author_stats",
        "SELECT sum(b.price) / count(*) AS mean, sum(price) * 100, 2.5 * sum(price), "
        "sum(price) - min(price), min(price) + 1 FROM books b",
    ),
    (
        "author_stats",
        "SELECT b.authorid, sum(b.price) / count(*), sum(b.price) / 7, (sum(b.price) * 3) "
        "FROM books b GROUP BY b.authorid ORDER BY 1",
    ),
    (
        "city_ratings",
        "SELECT a.city, sum(r.rating) * 2.5, sum(r.rating) - 0.5 FROM reviews r "
        "JOIN books b ON r.isbn = b.isbn JOIN authors a ON b.authorid = a.authorid "
        "GROUP BY a.city ORDER BY 1",
    ),
    (
        "reviewed",
        "SELECT DISTINCT b.isbn, b.title FROM reviews r JOIN books b ON r.isbn = b.isbn "
        "WHERE r.rating >= 3 ORDER BY 1",
    ),
    # a join view's rows, selected by its columns, ordered and limited
    (
        "reviewed",
        "SELECT r.reviewid, b.title, b.price FROM reviews r JOIN books b "
        "ON r.isbn = b.isbn WHERE r.rating >= 3 AND b.price > 20.5 "
        "ORDER BY r.reviewid LIMIT 7",
    ),
    (
        "reviewed",
        "SELECT r.reviewid, b.isbn FROM books b, reviews r WHERE b.isbn = r.isbn "
        "AND r.rating >= 3 AND r.rating IN (4, 5)",
    ),
]
NOT_ANSWERED = [
    ("author_stats", "SELECT b.type, count(*) FROM books b GROUP BY b.type"),  # not grouped
    ("author_stats", "SELECT count(*) FROM books b WHERE b.price > 10"),  # not a group's filter
    ("author_stats", "SELECT sum(b.publisherid) FROM books b"),  # not kept
    ("author_stats", "SELECT count(*) FROM books b JOIN reviews r ON r.isbn = b.isbn"),
    ("author_stats", "SELECT b.authorid FROM books b"),  # rows, not groups
    ("author_stats", "SELECT count(*) * 2 FROM books b"),  # (integers: overflow differs)
    ("author_stats", "SELECT avg(b.price) * 2 FROM books b"),  # (of a quotient)
    ("author_stats", "SELECT sum(b.price) / count(*) * 2 FROM books b"),  # (two operations)
    ("author_stats", "SELECT sum(b.price) / sum(b.price) FROM books b"),  # (may divide by 0)
    ("author_stats", "SELECT sum(b.price) * sum(b.price) FROM books b"),  # (past 38 digits)
    ("author_stats", "SELECT count(*) FROM books b HAVING sum(b.price) > 1e3"),  # (a DOUBLE)
    ("author_stats", "SELECT DISTINCT b.type FROM books b"),  # (not a grouping column)
    ("author_stats", "SELECT count(DISTINCT b.type) FROM books b"),
    ("author_stats", "SELECT count(*) FROM books b WHERE b.authorid = %s"),  # (a parameter)
    (
        "city_ratings",
        "SELECT a.city, count(*) FROM reviews r JOIN books b ON r.isbn = b.isbn "
        "JOIN authors a ON b.authorid = a.authorid WHERE r.rating > 2 "
        "GROUP BY a.city",
    ),  # a filter on rows the groups merged
    (
        "city_ratings",
        "SELECT a.city, count(*) FROM reviews r JOIN books b ON r.isbn = b.isbn "
        "JOIN authors a ON b.publisherid = a.authorid GROUP BY a.city",
    ),
    ("author_stats", "SELECT count(*) FROM books b HAVING max(b.title) > 'A'"),  # (text order)
    ("author_stats", "SELECT count(*) FROM books b WHERE b.authorid = 1.5"),  # (not an integer)
    ("author_stats", "SELECT count(*) FROM books b WHERE b.authorid = '3'"),  # (text)
    (
        "city_ratings",
        "SELECT count(*) FROM reviews r JOIN books b ON r.isbn = b.isbn "
        "JOIN authors a ON b.authorid = a.authorid WHERE a.city > 'M'",
    ),  # (order)
    ("reviewed", "SELECT r.reviewid FROM reviews r JOIN books b ON r.isbn = b.isbn "),  # all
    (
        "reviewed",
        "SELECT count(*) FROM reviews r JOIN books b ON r.isbn = b.isbn WHERE r.rating >= 3",
    ),  # (an aggregate of its rows)
    (
        "reviewed",
        "SELECT b.publisherid FROM reviews r JOIN books b ON r.isbn = b.isbn WHERE r.rating >= 3",
    ),  # (not one of its columns)
]


def answered_from_view(
    conn: Connection, bookstore_dsn: str, view: str, sql: str
) -> list[tuple[t.Any, ...]] | None:
    """The query's answer from the view as the cache would give it (the matched statement
    run in DuckDB, its columns made PostgreSQL's by the converter), or None: not matched."""
    from cache.backend.describe import describe_result
    from cache.execution.convert import converter
    from optimizer.derived.match import match_derived
    from sql_ext import Query, parse_one

    store = conn.admin.store
    query = parse_one(sql, percent=True)
    assert isinstance(query, Query)
    found = match_derived(query, store.load_schema().views[view], store.load_catalog())
    if found is None:
        return None
    ran = store.con.execute(found.sql)
    rows = ran.fetchall()
    types = [str(row[1]) for row in store.con.execute(f"DESCRIBE {found.sql}").fetchall()]
    shape = describe_result(bookstore_dsn, sql, None)
    assert shape is not None
    convert = converter(
        shape.types, [d[0] for d in shape.description()], types, found.outputs, scales=found.scales
    )
    assert not isinstance(convert, str), convert
    return convert(rows)


@pytest.mark.parametrize(("view", "sql"), ANSWERED)
def test_a_query_a_derived_view_answers_gets_postgresql_s_answer(
    conn: Connection, bookstore_dsn: str, view: str, sql: str
) -> None:
    conn.admin.apply_ddl(";".join((AUTHOR_STATS, CITY_RATINGS, ALL_SALES, BY_GENDER, REVIEWED)))
    conn.admin.refresh(view)
    got = answered_from_view(conn, bookstore_dsn, view, sql)
    assert got is not None, "not matched"
    with psycopg.connect(bookstore_dsn) as pg:
        want = pg.execute(sql).fetchall()
    if "ORDER BY" not in sql:
        got, want = sorted(got, key=repr), sorted(want, key=repr)
    assert typed(got) == typed(want)


@pytest.mark.parametrize(("view", "sql"), NOT_ANSWERED)
def test_a_query_a_derived_view_cannot_answer_is_not_matched(
    conn: Connection, bookstore_dsn: str, view: str, sql: str
) -> None:
    conn.admin.apply_ddl(";".join((AUTHOR_STATS, CITY_RATINGS, REVIEWED)))
    assert answered_from_view(conn, bookstore_dsn, view, sql) is None


def test_a_query_is_answered_from_a_derived_view_under_its_guard(
    conn: Connection, bookstore_dsn: str
) -> None:
    """Through the cache: the plan reads the derived view under the guard of its region
    (EXPLAIN shows it), the answer and its description are PostgreSQL's; a bound the region
    does not meet, or a change of the view's rows, sends the statement to PostgreSQL."""
    conn.admin.apply_ddl(AUTHOR_STATS + ";" + CITY_RATINGS)
    conn.admin.refresh("author_stats")
    conn.admin.refresh("city_ratings")
    queries = [
        "SELECT b.authorid, count(*), avg(b.price), min(b.price) FROM books b "
        "GROUP BY b.authorid ORDER BY 1",
        "SELECT a.city, avg(r.rating) AS mean, count(*) FROM reviews r JOIN books b "
        "ON r.isbn = b.isbn JOIN authors a ON b.authorid = a.authorid GROUP BY a.city "
        "ORDER BY 1 DESC",
        "SELECT count(*), sum(price) FROM books WHERE authorid BETWEEN 3 AND 9",
    ]
    cur = conn.cursor()
    with psycopg.connect(bookstore_dsn) as pg:
        for sql in queries:
            cur.execute(sql + " CURRENCY BOUND 10 MIN")
            got, description = cur.fetchall(), cur.description
            cur.execute("EXPLAIN LAST STATEMENT")
            routes = {row[1] for row in cur.fetchall()}
            want = pg.execute(sql)
            assert typed(got) == typed(want.fetchall())
            assert [tuple(d) for d in description] == [tuple(d) for d in want.description]
            assert routes == {"local"}, sql
            cur.execute("EXPLAIN " + sql + " CURRENCY BOUND 10 MIN")
            plan = "\n".join(r[0] for r in cur.fetchall())
            assert "DerivedScan" in plan and ("author_stats" in plan or "city_ratings" in plan)
        # a bound its region cannot meet: PostgreSQL answers
        sql = queries[0]
        cur.execute(sql + " CURRENCY BOUND 0 SECONDS")
        assert typed(cur.fetchall()) == typed(pg.execute(sql).fetchall())
        cur.execute("EXPLAIN LAST STATEMENT")
        assert {row[1] for row in cur.fetchall()} == {"remote"}


def test_random_queries_after_random_writes_get_postgresql_s_answers(
    conn: Connection, bookstore_dsn: str
) -> None:
    """Rounds of random writes to the backend (books added, repriced, moved to another
    author, removed), a refresh, then random queries the views answer (a random grouping,
    aggregates and filters): each answered locally, equal to PostgreSQL's in values, types
    and description (fixed seed)."""
    draw = random.Random(29)
    conn.admin.apply_ddl(AUTHOR_STATS + ";" + CITY_RATINGS)
    aggregates = {
        "author_stats": [
            "count(*)",
            "sum(b.price)",
            "avg(b.price)",
            "min(b.price)",
            "max(b.title)",
            "sum(b.price) / count(*)",
            "sum(b.price) * 100",
            "count(DISTINCT b.authorid)",
        ],
        "city_ratings": ["count(*)", "sum(r.rating)", "avg(r.rating)", "sum(r.rating) * 0.5"],
    }
    cur = conn.cursor()
    with psycopg.connect(bookstore_dsn, autocommit=True) as pg:
        try:
            for round_ in range(4):
                for n in range(8):
                    what = draw.choice(["add", "price", "move", "remove"])
                    isbn = f"isbn-r{round_}-{n}"
                    if what == "add":
                        pg.execute(
                            "INSERT INTO books VALUES (%s, %s, %s, 1, 'ebook', %s)",
                            [
                                isbn,
                                draw.randint(1, 40),
                                f"Random {n}",
                                round(draw.uniform(1, 99), 2),
                            ],
                        )
                    elif what == "price":
                        pg.execute(
                            "UPDATE books SET price = price + %s WHERE authorid = %s",
                            [draw.choice([-1, 1, 2.5]), draw.randint(1, 40)],
                        )
                    elif what == "move":
                        pg.execute(
                            "UPDATE books SET authorid = %s WHERE isbn IN (SELECT isbn "
                            "FROM books ORDER BY isbn LIMIT 1 OFFSET %s)",
                            [draw.randint(1, 40), draw.randint(0, 150)],
                        )
                    else:
                        pg.execute(
                            "DELETE FROM books WHERE isbn LIKE 'isbn-r%%' AND isbn IN "
                            "(SELECT isbn FROM books WHERE isbn LIKE 'isbn-r%%' "
                            "ORDER BY isbn LIMIT 1)"
                        )
                conn.admin.refresh("author_stats")
                conn.admin.refresh("city_ratings")
                for _ in range(10):
                    answered_locally_as_postgresql(cur, pg, random_query(draw, aggregates))
        finally:  # (the module's database: every test here reads PostgreSQL's answers)
            pg.execute("DELETE FROM books WHERE isbn LIKE 'isbn-r%'")


SOURCES = {
    "author_stats": ("books b", "b.authorid"),
    "city_ratings": (
        "reviews r JOIN books b ON r.isbn = b.isbn JOIN authors a ON b.authorid = a.authorid",
        "a.city",
    ),
}


def random_query(draw: random.Random, aggregates: t.Mapping[str, list[str]]) -> str:
    """A random query author_stats or city_ratings answers: some of ``aggregates`` (by
    view), grouped as the view or over all rows, with a filter of its groups or none."""
    view = draw.choice(sorted(aggregates))
    source, key = SOURCES[view]
    chosen = draw.sample(aggregates[view], draw.randint(1, 3))
    grouped = draw.random() < 0.6
    where = ""
    if view == "author_stats" and draw.random() < 0.5:
        low = draw.randint(1, 35)
        where = f" WHERE {key} BETWEEN {low} AND {low + draw.randint(0, 8)}"
    elif view == "city_ratings" and draw.random() < 0.5:
        where = f" WHERE {key} <> 'Seattle'"
    having = ""
    if draw.random() < 0.3:  # (groups kept by their average, as PostgreSQL divides it)
        value = "b.price" if view == "author_stats" else "r.rating"
        having = f" HAVING avg({value}) > {draw.choice(['3', '3.5', '25.125'])}"
    grouping = f" GROUP BY {key}{having} ORDER BY 1" if grouped else having
    return (
        f"SELECT {key + ', ' if grouped else ''}{', '.join(chosen)} FROM {source}{where}{grouping}"
    )


def answered_locally_as_postgresql(cur: t.Any, pg: psycopg.Connection[t.Any], sql: str) -> None:
    """The cache answers ``sql`` locally, with PostgreSQL's rows (values and Python types)
    and description."""
    cur.execute(sql + " CURRENCY BOUND 10 MIN")
    got, description = cur.fetchall(), cur.description
    cur.execute("EXPLAIN LAST STATEMENT")
    assert {row[1] for row in cur.fetchall()} == {"local"}, sql
    want = pg.execute(sql)
    assert typed(got) == typed(want.fetchall()), sql
    assert [tuple(d) for d in description] == [tuple(d) for d in want.description or []], sql


def test_a_query_with_parameters_is_answered_from_a_derived_view(
    conn: Connection, bookstore_dsn: str
) -> None:
    """Parameters compared with grouping columns become the local statement's: each
    execution's values give PostgreSQL's answer from the view."""
    conn.admin.apply_ddl(AUTHOR_STATS + ";" + CITY_RATINGS)
    conn.admin.refresh("author_stats")
    conn.admin.refresh("city_ratings")
    cases = [
        (
            "SELECT count(*), sum(b.price), avg(b.price) FROM books b WHERE b.authorid = %s",
            [[1], [7], [40], [999]],
        ),
        (
            "SELECT b.authorid, max(b.title) FROM books b WHERE b.authorid BETWEEN %s AND %s "
            "GROUP BY b.authorid ORDER BY 1",
            [[1, 5], [10, 12], [30, 29]],
        ),
        (
            "SELECT avg(r.rating), count(*) FROM reviews r JOIN books b ON r.isbn = b.isbn "
            "JOIN authors a ON b.authorid = a.authorid WHERE a.city = %s",
            [["Madison"], ["Seattle"], ["Nowhere"]],
        ),
    ]
    cur = conn.cursor()
    with psycopg.connect(bookstore_dsn) as pg:
        for sql, runs in cases:
            for params in runs:
                cur.execute(sql + " CURRENCY BOUND 10 MIN", params)
                got, description = cur.fetchall(), cur.description
                cur.execute("EXPLAIN LAST STATEMENT")
                assert {row[1] for row in cur.fetchall()} == {"local"}, (sql, params)
                want = pg.execute(sql, params)
                assert typed(got) == typed(want.fetchall()), (sql, params)
                assert [tuple(d) for d in description] == [tuple(d) for d in want.description]


PARTIAL = """CREATE CONTROL TABLE stats_pct (authorid integer);
CREATE CACHED VIEW author_stats AS
    SELECT b.authorid, count(*) AS books, sum(b.price) AS total, avg(b.price) AS mean,
           min(b.price) AS cheapest
    FROM books b GROUP BY b.authorid PRESENCE ON (authorid) IN stats_pct REFRESH EVERY 10 MIN;
CREATE CONTROL TABLE isbn_pct (isbn text);
CREATE CACHED VIEW reviewed AS
    SELECT r.reviewid, r.rating, b.isbn, b.title, b.price
    FROM reviews r JOIN books b ON r.isbn = b.isbn WHERE r.rating >= 3
    PRESENCE ON (isbn) IN isbn_pct"""


def test_a_derived_view_under_presence_holds_the_admitted_keys_groups(
    conn: Connection, bookstore_dsn: str
) -> None:
    """PRESENCE on a grouping column (on a join view's column): admitting a key pulls its
    groups (its rows), as the backend computes them in one snapshot; evicting it takes them
    away; a refresh refreshes the keys held."""
    conn.admin.apply_ddl(PARTIAL)
    assert stored(conn, "author_stats") == []
    conn.admin.admit("stats_pct", [3, 7])
    want = backend(
        bookstore_dsn,
        "SELECT b.authorid, count(*), sum(b.price), sum(b.price), "
        "count(b.price), min(b.price) FROM books b WHERE b.authorid IN (3, 7) "
        "GROUP BY b.authorid",
    )
    assert typed(stored(conn, "author_stats")) == typed(want)
    isbn = backend(bookstore_dsn, "SELECT min(isbn) FROM reviews WHERE rating >= 3")[0][0]
    conn.admin.admit("isbn_pct", [isbn])
    assert stored(conn, "reviewed") == backend(
        bookstore_dsn,
        "SELECT r.reviewid, r.rating, b.isbn, b.title, b.price FROM reviews r "
        "JOIN books b ON r.isbn = b.isbn WHERE r.rating >= 3 AND b.isbn = %s",
        (isbn,),
    )
    conn.admin.evict("stats_pct", [7])
    assert [r[0] for r in stored(conn, "author_stats")] == [3]
    views = {v["name"]: v for v in conn.admin.status()["views"]}
    assert [(r["key"], r["rows"]) for r in views["author_stats"]["regions"]] == [([3], 1)]
    conn.admin.refresh("author_stats")
    assert [r[0] for r in stored(conn, "author_stats")] == [3]


def test_a_query_of_admitted_keys_is_answered_from_the_partial_view(
    conn: Connection, bookstore_dsn: str
) -> None:
    """A query comparing the presence column with constants or a parameter reads the view
    when every key it names is present (a presence guard), else PostgreSQL answers; the
    answers are PostgreSQL's."""
    conn.admin.apply_ddl(PARTIAL)
    conn.admin.admit("stats_pct", [3, 7])
    isbn = backend(bookstore_dsn, "SELECT min(isbn) FROM reviews WHERE rating >= 3")[0][0]
    conn.admin.admit("isbn_pct", [isbn])
    cur = conn.cursor()
    cases = [
        (
            "SELECT b.authorid, count(*), avg(b.price), min(b.price) FROM books b "
            "WHERE b.authorid = 3 GROUP BY b.authorid",
            (),
            "local",
        ),
        ("SELECT count(*), sum(b.price) FROM books b WHERE b.authorid IN (3, 7)", (), "local"),
        ("SELECT count(*), avg(b.price) FROM books b WHERE b.authorid = %s", (7,), "local"),
        ("SELECT count(*), avg(b.price) FROM books b WHERE b.authorid = %s", (8,), "remote"),
        ("SELECT count(*) FROM books b WHERE b.authorid IN (3, 8)", (), "remote"),
        ("SELECT count(*) FROM books b", (), "remote"),  # (no key: the regions are unknown)
        (
            "SELECT r.reviewid, b.title FROM reviews r JOIN books b ON r.isbn = b.isbn "
            "WHERE r.rating >= 3 AND b.isbn = %s ORDER BY r.reviewid",
            (isbn,),
            "local",
        ),
    ]
    with psycopg.connect(bookstore_dsn) as pg:
        for sql, params, route in cases:
            cur.execute(sql + " CURRENCY BOUND 10 MIN", params)
            got, description = cur.fetchall(), cur.description
            assert {p["route"] for p in cur.provenance} == {route}, sql
            if route == "local":
                cur.execute("EXPLAIN " + sql + " CURRENCY BOUND 10 MIN", params)
                assert any("DerivedScan" in row[0] for row in cur.fetchall()), sql
            want = pg.execute(sql, params)
            assert typed(got) == typed(want.fetchall()), sql
            assert [tuple(d) for d in description] == [tuple(d) for d in want.description or []]


def test_keys_admitted_apart_are_one_snapshot_only_with_consistency_on_all(
    conn: Connection, bookstore_dsn: str
) -> None:
    """Two keys admitted one after the other: a query of both reads the view only when the
    view keeps its groups in one snapshot (CONSISTENCY ON ALL re-pulls every key it holds
    with each admission); without it, their regions are of two snapshots, and the query's
    one consistency class sends it to PostgreSQL."""
    conn.admin.apply_ddl(
        PARTIAL
        + """;
        CREATE CONTROL TABLE all_pct (authorid integer);
        CREATE CACHED VIEW all_stats AS SELECT b.authorid, count(*) AS books,
            avg(b.price) AS mean FROM books b GROUP BY b.authorid
            PRESENCE ON (authorid) IN all_pct CONSISTENCY ON ALL"""
    )
    for control in ("stats_pct", "all_pct"):
        conn.admin.admit(control, [3])
        conn.admin.admit(control, [7])
    snapshots = {
        control: conn.admin.store.con.execute(
            f"SELECT DISTINCT snapshot_id FROM {control}"
        ).fetchall()
        for control in ("stats_pct", "all_pct")
    }
    assert len(snapshots["stats_pct"]) == 2 and len(snapshots["all_pct"]) == 1
    sql = "SELECT count(*), avg(b.price) FROM books b WHERE b.authorid IN (3, 7)"
    cur = conn.cursor()
    conn.admin.apply_ddl("DROP CACHED VIEW all_stats")
    cur.execute(sql + " CURRENCY BOUND 10 MIN")  # (author_stats alone: two snapshots)
    assert {p["route"] for p in cur.provenance} == {"remote"}
    conn.admin.apply_ddl(
        "DROP CACHED VIEW author_stats; CREATE CACHED VIEW all_stats AS "
        "SELECT b.authorid, count(*) AS books, avg(b.price) AS mean FROM "
        "books b GROUP BY b.authorid PRESENCE ON (authorid) IN all_pct "
        "CONSISTENCY ON ALL"
    )
    conn.admin.refresh("all_stats")
    cur.execute(sql + " CURRENCY BOUND 10 MIN")
    assert {p["route"] for p in cur.provenance} == {"local"}
    got = cur.fetchall()
    with psycopg.connect(bookstore_dsn) as pg:
        assert typed(got) == typed(pg.execute(sql).fetchall())


@pytest.mark.parametrize(
    ("ddl", "error", "words"),
    [
        (
            "CREATE CONTROL TABLE n_pct (books bigint); CREATE CACHED VIEW v AS SELECT b.authorid, "
            "count(*) AS books FROM books b GROUP BY b.authorid PRESENCE ON (books) IN n_pct",
            ProgrammingError,
            "an aggregate is no key",
        ),
        (
            "CREATE CACHED VIEW v AS SELECT b.authorid, count(*) AS n FROM books b "
            "GROUP BY b.authorid PRESENCE ON (authorid) IN books_copy",
            NotSupportedError,
            "controlled by a control table",
        ),
        (
            "CREATE CONTROL TABLE a_pct (authorid text); CREATE CACHED VIEW v AS SELECT "
            "b.authorid, count(*) AS n FROM books b GROUP BY b.authorid PRESENCE ON (authorid) IN "
            "a_pct",
            ProgrammingError,
            "must have the type",
        ),
        (
            "CREATE CONTROL TABLE a_pct (authorid integer); CREATE CACHED VIEW v AS SELECT "
            "b.authorid, count(*) AS n FROM books b GROUP BY b.authorid PRESENCE ON (authorid) IN "
            "a_pct CONSISTENCY ON (authorid)",
            NotSupportedError,
            "takes CONSISTENCY ON ALL",
        ),
        (
            "CREATE CONTROL TABLE a_cct (authorid integer); CREATE CACHED VIEW v AS SELECT "
            "b.authorid, count(*) AS n FROM books b GROUP BY b.authorid COMPLETENESS ON (authorid) "
            "IN a_cct",
            NotSupportedError,
            "complete by construction",
        ),
    ],
)
def test_what_a_partial_derived_view_cannot_be_is_refused_and_changes_nothing(
    conn: Connection, ddl: str, error: type[Exception], words: str
) -> None:
    # (empty: a filled view's status tells its regions' ages, which move on)
    conn.admin.apply_ddl("CREATE CACHED VIEW books_copy AS SELECT * FROM books WITH NO DATA")
    before = conn.admin.status()
    with pytest.raises(error, match=words):
        conn.admin.apply_ddl(ddl)
    assert conn.admin.status()["views"] == before["views"]
    assert conn.admin.status()["control_tables"] == before["control_tables"]


def test_a_quotient_by_what_may_be_zero_is_postgresql_s_to_compute(
    conn: Connection, bookstore_dsn: str
) -> None:
    """PostgreSQL divides every group before a LIMIT keeps some, so a divisor that may be 0
    (not count(*), not a number other than 0) leaves the statement to it, error and all."""
    conn.admin.apply_ddl(AUTHOR_STATS)
    conn.admin.refresh("author_stats")
    cur = conn.cursor()
    sql = "SELECT b.authorid, sum(b.price) / 0 FROM books b GROUP BY b.authorid LIMIT 1"
    cur.execute("EXPLAIN " + sql + " CURRENCY BOUND 10 MIN")
    assert "DerivedScan" not in "\n".join(r[0] for r in cur.fetchall())
    with pytest.raises(cache.DataError) as raised:
        cur.execute(sql + " CURRENCY BOUND 10 MIN")
        cur.fetchall()
    with psycopg.connect(bookstore_dsn) as pg, pytest.raises(psycopg.errors.DivisionByZero) as want:
        pg.execute(sql)
    assert raised.value.sqlstate == want.value.sqlstate == "22012"
