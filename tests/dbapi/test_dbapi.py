"""The DB-API 2.0 module: PEP 249 compliance and the cache's statements through execute.

Written after the classic dbapi20 suite's checks, against the real backend and a DuckDB file.
"""

from __future__ import annotations

import datetime as dt
import typing as t
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import duckdb
import psycopg
import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.tools import bookstore
from tests.store.test_store import SCHEMA_FILE


@pytest.fixture(scope="module")
def dsn(pg_cluster: EmbeddedPostgres) -> str:
    created = pg_cluster.create_database("dbapi")
    bookstore.load_into(created)
    return created


@pytest.fixture
def conn(dsn: str, tmp_path: Path) -> Iterator[cache.Connection]:
    connection = cache.connect(backend=dsn, cache_path=tmp_path / "cache.duckdb")
    yield connection
    connection.close()


# -- module interface (PEP 249 "Module Interface") -------------------------------------------


def test_module_globals() -> None:
    assert cache.apilevel == "2.0"
    assert cache.threadsafety in (0, 1, 2, 3)
    assert cache.paramstyle == "pyformat"


def test_connect_reads_the_environment_the_command_line_reads(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MTCACHE_BACKEND`` and ``MTCACHE_CACHE``, as `mtcache` honours them; an argument
    first."""
    monkeypatch.setenv("MTCACHE_BACKEND", dsn)
    monkeypatch.setenv("MTCACHE_CACHE", str(tmp_path / "from-env.duckdb"))
    with cache.connect() as conn:
        assert conn.cache_path == tmp_path / "from-env.duckdb"
        cur = conn.cursor()
        cur.execute("SELECT count(*) FROM authors")
        with psycopg.connect(dsn) as pg:
            assert cur.fetchall() == pg.execute("SELECT count(*) FROM authors").fetchall()
    with cache.connect(cache_path=tmp_path / "given.duckdb") as conn:
        assert conn.cache_path == tmp_path / "given.duckdb"


def test_exception_hierarchy() -> None:
    assert issubclass(cache.Warning, Exception)
    assert issubclass(cache.Error, Exception)
    for name in ("InterfaceError", "DatabaseError"):
        assert issubclass(getattr(cache, name), cache.Error)
    for name in (
        "DataError",
        "OperationalError",
        "IntegrityError",
        "InternalError",
        "ProgrammingError",
        "NotSupportedError",
    ):
        assert issubclass(getattr(cache, name), cache.DatabaseError)


def test_exceptions_as_connection_attributes(conn: cache.Connection) -> None:
    assert conn.Error is cache.Error
    assert conn.ProgrammingError is cache.ProgrammingError


def test_type_objects_and_constructors(conn: cache.Connection) -> None:
    cur = conn.cursor()
    cur.execute("SELECT 'x'::text, 1::int4, 2.5::numeric, now(), '\\x01'::bytea, current_date")
    codes = [d[1] for d in cur.description or []]
    assert codes[0] == cache.STRING and codes[0] != cache.NUMBER
    assert codes[1] == cache.NUMBER and codes[2] == cache.NUMBER
    assert codes[3] == cache.DATETIME and codes[5] == cache.DATETIME
    assert codes[4] == cache.BINARY
    assert cache.Date(2020, 1, 2) == dt.date(2020, 1, 2)
    assert cache.Timestamp(2020, 1, 2, 3, 4, 5).hour == 3
    assert isinstance(cache.TimestampFromTicks(0), dt.datetime)
    assert isinstance(cache.DateFromTicks(0), dt.date)
    assert isinstance(cache.TimeFromTicks(0), dt.time)
    assert cache.Binary(b"ab") == b"ab"


# -- connection and cursor objects ---------------------------------------------------------


def test_cursor_description_rowcount_and_fetching(conn: cache.Connection) -> None:
    cur = conn.cursor()
    assert cur.description is None and cur.rowcount == -1 and cur.arraysize == 1
    cur.execute("SELECT authorid, name FROM authors WHERE authorid <= %s ORDER BY authorid", [5])
    assert [d[0] for d in cur.description or []] == ["authorid", "name"]
    assert all(len(d) == 7 for d in cur.description or [])
    assert cur.rowcount == 5
    assert cur.fetchone() == (1, "Author 1")
    assert cur.fetchmany() == [(2, "Author 2")]
    assert cur.fetchmany(2) == [(3, "Author 3"), (4, "Author 4")]
    assert cur.fetchall() == [(5, "Author 5")]
    assert cur.fetchone() is None and cur.fetchall() == [] and cur.fetchmany(3) == []
    cur.arraysize = 3
    cur.execute("SELECT g FROM generate_series(1, 7) g")
    assert len(cur.fetchmany()) == 3
    assert [r[0] for r in cur] == [4, 5, 6, 7]


def test_named_and_positional_parameters(conn: cache.Connection) -> None:
    cur = conn.cursor()
    cur.execute("SELECT %(a)s::int + %(b)s::int, %(a)s::int", {"a": 2, "b": 3})
    assert cur.fetchone() == (5, 2)
    cur.execute("SELECT name FROM authors WHERE authorid = %s AND city = %s", (4, "Madison"))
    assert cur.fetchall() == [("Author 4",)]
    cur.execute("SELECT 7 %% 4, 'a%%b' LIKE 'a%%'", [])  # psycopg's escaping reaches PostgreSQL
    assert cur.fetchone() == (3, True)


def test_wrong_parameter_count_is_a_programming_error(conn: cache.Connection) -> None:
    with pytest.raises(cache.ProgrammingError):
        conn.cursor().execute("SELECT %s, %s", [1])


def test_fetch_without_a_result_set_is_an_error(conn: cache.Connection) -> None:
    cur = conn.cursor()
    with pytest.raises(cache.ProgrammingError):
        cur.fetchone()
    cur.execute("CREATE TEMP TABLE t_nores (x int)")
    with pytest.raises(cache.ProgrammingError):
        cur.fetchall()


def test_closed_cursor_and_connection_refuse_work(conn: cache.Connection) -> None:
    cur = conn.cursor()
    cur.close()
    with pytest.raises(cache.InterfaceError):
        cur.execute("SELECT 1")
    conn.close()
    with pytest.raises(cache.InterfaceError):
        conn.cursor()
    conn.close()  # closing twice is harmless


def test_commit_rollback_and_executemany(conn: cache.Connection, dsn: str) -> None:
    cur = conn.cursor()
    cur.execute("CREATE TABLE IF NOT EXISTS t_tx (id int PRIMARY KEY, v text)")
    conn.commit()
    cur.execute("DELETE FROM t_tx")
    cur.executemany("INSERT INTO t_tx VALUES (%s, %s)", [(1, "a"), (2, "b"), (3, "c")])
    assert cur.rowcount == 3
    cur.execute("SELECT count(*) FROM t_tx")
    assert cur.fetchone() == (3,)  # the session reads its own uncommitted writes
    conn.rollback()
    cur.execute("SELECT count(*) FROM t_tx")
    assert cur.fetchone() == (0,)
    cur.execute("INSERT INTO t_tx VALUES (9, 'z')")
    conn.commit()
    with psycopg.connect(dsn) as other:
        assert other.execute("SELECT v FROM t_tx WHERE id = 9").fetchone() == ("z",)


def test_context_manager_commits_then_closes(dsn: str, tmp_path: Path) -> None:
    with cache.connect(backend=dsn, cache_path=tmp_path / "c.duckdb") as conn:
        cur = conn.cursor()
        cur.execute("CREATE TABLE IF NOT EXISTS t_ctx (x int)")
        cur.execute("INSERT INTO t_ctx VALUES (1)")
    assert conn.closed
    with psycopg.connect(dsn) as other:
        assert other.execute("SELECT count(*) FROM t_ctx").fetchone() == (1,)


def test_backend_errors_are_translated(conn: cache.Connection) -> None:
    cur = conn.cursor()
    with pytest.raises(cache.ProgrammingError, match="nosuch"):
        cur.execute("SELECT * FROM nosuch")
    conn.rollback()
    cur.execute("CREATE TEMP TABLE t_uniq (x int PRIMARY KEY)")
    cur.execute("INSERT INTO t_uniq VALUES (1)")
    with pytest.raises(cache.IntegrityError) as duplicate:
        cur.execute("INSERT INTO t_uniq VALUES (1)")
    # PostgreSQL's SQLSTATE and diagnostics stay with the error, as on psycopg's
    assert duplicate.value.sqlstate == "23505"
    assert duplicate.value.diag.constraint_name == "t_uniq_pkey"
    conn.rollback()
    with pytest.raises(cache.DataError) as division:
        cur.execute("SELECT 1 / 0")
    assert division.value.sqlstate == "22012"
    conn.rollback()
    with pytest.raises(cache.OperationalError) as cancelled:
        cur.execute("SET statement_timeout = 1; SELECT pg_sleep(1)")
    # a cancelled statement is not a lost backend
    assert cancelled.value.sqlstate == "57014"
    assert not isinstance(cancelled.value, cache.BackendUnavailableError)
    conn.rollback()


def test_currency_clause_errors_surface_through_execute(conn: cache.Connection) -> None:
    cur = conn.cursor()
    with pytest.raises(cache.ProgrammingError, match="line 1, column 43: unknown unit"):
        cur.execute("SELECT * FROM authors a CURRENCY BOUND 10 LIGHTYEARS")
    with pytest.raises(cache.ProgrammingError, match="not visible"):
        cur.execute("SELECT * FROM authors a CURRENCY BOUND 10 MIN ON (b)")


def test_backend_down_is_an_operational_error(tmp_path: Path) -> None:
    with pytest.raises(cache.OperationalError, match="cannot reach the PostgreSQL backend"):
        cache.connect(
            backend="postgresql://postgres@127.0.0.1:1/x", cache_path=tmp_path / "c.duckdb"
        )


# -- the cache's statements ------------------------------------------------------------------


def test_query_with_a_clause_answers_like_postgres_with_provenance(
    conn: cache.Connection, dsn: str
) -> None:
    sql = (
        "SELECT b.title, r.rating FROM books b, reviews r WHERE b.isbn = r.isbn "
        "AND b.authorid = %s ORDER BY 1, 2"
    )
    cur = conn.cursor()
    cur.execute(sql + " CURRENCY BOUND 10 MIN ON (b, r)", [4])
    with psycopg.connect(dsn) as other:
        expected = other.execute(sql, [4]).fetchall()
    assert cur.fetchall() == expected
    assert sorted(p["table"] for p in cur.provenance) == ["books", "reviews"]
    assert {p["route"] for p in cur.provenance} == {"remote"}
    assert all(p["currency_seconds"] == 0.0 and p["stale"] is False for p in cur.provenance)
    # it stays the last statement's after the cursor closes (SQLAlchemy closes a cursor once
    # its rows are read; cache.sqla.provenance reads it then), while another cursor runs
    other_cursor = conn.cursor()
    other_cursor.execute("SELECT a.name FROM authors a WHERE a.authorid = 4")
    cur.close()
    assert sorted(p["table"] for p in cur.provenance) == ["books", "reviews"]


def test_cache_ddl_and_control_table_edits_through_execute(conn: cache.Connection) -> None:
    cur = conn.cursor()
    for statement in SCHEMA_FILE.read_text().split(";"):
        if statement.strip():
            cur.execute(statement)
    cur.execute("INSERT INTO authorlist_pct (authorid) VALUES (%s), (%s)", [4, 5])
    assert cur.rowcount == 2
    # the cache file is inspectable: a view is the DuckDB table of its name
    cache_file = duckdb.connect(str(conn.cache_path))
    assert cache_file.execute("SELECT count(*) FROM authorcopy").fetchone() == (2,)
    assert cache_file.execute("SELECT count(*) FROM bookcopy").fetchone() == (10,)
    cur.execute("DELETE FROM authorlist_pct WHERE authorid = %(id)s", {"id": 5})
    assert cur.rowcount == 1
    assert cache_file.execute("SELECT authorid FROM authorcopy").fetchall() == [(4,)]
    cache_file.close()
    with pytest.raises(cache.NotSupportedError, match="UPDATE on control table"):
        cur.execute("UPDATE authorlist_pct SET authorid = 6")
    with pytest.raises(cache.ProgrammingError, match="must give exactly its control key"):
        cur.execute("INSERT INTO citylist_csct (city, nothing) VALUES ('x', 1)")


def test_timeordered_brackets(conn: cache.Connection) -> None:
    cur = conn.cursor()
    cur.execute("BEGIN TIMEORDERED")
    cur.execute("SELECT 1 FROM authors a WHERE a.authorid = 1 CURRENCY BOUND 1 MIN")
    first = conn.timeline_floor
    cur.execute("SELECT 1 FROM authors a WHERE a.authorid = 2 CURRENCY BOUND 1 MIN")
    assert first is not None and conn.timeline_floor is not None and conn.timeline_floor >= first
    cur.execute("END TIMEORDERED")
    assert conn.timeline_floor is None
    with pytest.raises(cache.ProgrammingError, match="without BEGIN"):
        cur.execute("END TIMEORDERED")
    with conn.timeordered():
        cur.execute("SELECT 1")
        with pytest.raises(cache.ProgrammingError, match="inside a TIMEORDERED block"):
            conn.begin_timeordered()
    assert conn.timeline_floor is None


def test_plain_sql_reaches_postgres_verbatim(conn: cache.Connection) -> None:
    cur = conn.cursor()
    cur.execute("SELECT E'a\\tb', 10 % 3, $$dollar$$, '{1,2}'::int[] @> ARRAY[1]")
    assert cur.fetchone() == ("a\tb", 1, "dollar", True)
    cur.execute("SELECT sum(price) FROM books WHERE authorid = 4")
    assert isinstance(cur.fetchone()[0], Decimal)  # type: ignore[index]


def test_guards_and_the_rows_they_pass_come_from_one_state(
    conn: cache.Connection, dsn: str
) -> None:
    """A region evicted between a query's guards and its read must not leave the query
    reading rows that are gone (the chaos checker caught a join answering no rows: its guard
    passed the author's region, an eviction committed while the remote leaf was fetched)."""
    import threading
    import time
    from collections import Counter

    conn.admin.apply_ddl(SCHEMA_FILE.read_text())
    conn.admin.admit("authorlist_pct", [4])
    sql = (
        "SELECT a.authorid, b.title FROM authors a JOIN books b ON b.authorid = a.authorid "
        "WHERE a.authorid = 4 ORDER BY 2"
    )
    with psycopg.connect(dsn) as pg:
        expected = pg.execute(sql).fetchall()
    assert expected
    other = cache.connect(dsn, conn.cache_path)  # this process: the same file

    def churn() -> None:
        for _ in range(15):
            other.admin.evict("authorlist_pct", [4])
            other.admin.admit("authorlist_pct", [4])
            time.sleep(0.05)  # present for a while: queries read it

    thread = threading.Thread(target=churn)
    thread.start()
    routes: Counter[str] = Counter()
    try:
        cur = conn.cursor()
        while thread.is_alive():
            for clause in (
                " CURRENCY BOUND 10 MIN ON (a, b)",
                " CURRENCY BOUND 0 SEC ON (a), 10 MIN ON (b)",
            ):
                cur.execute(sql + clause)
                assert cur.fetchall() == expected, (clause, cur.provenance)
                routes.update(p["route"] for p in cur.provenance)
    finally:
        thread.join()
        other.close()
    # the churn ended with the key admitted: the region answers now (how often it did while
    # churning depends on the threads' timing, which a test must not)
    cur.execute(sql + " CURRENCY BOUND 10 MIN ON (a, b)")
    assert cur.fetchall() == expected
    routes.update(p["route"] for p in cur.provenance)
    assert routes["local"] > 0 and routes["remote"] > 0


def test_a_query_is_answered_locally_while_changes_keep_committing(
    conn: cache.Connection, dsn: str
) -> None:
    """Changes that commit during every local attempt (a stream applying a steady write load;
    here the file's change counter moving without pause) no longer send a query to the
    backend after three tries: the last try reads the guards' regions and the rows inside one
    DuckDB transaction (the workload-shift experiment found REFRESH CONTINUOUSLY views under
    100 writes/s answering a 20 ms query remotely two times in three)."""
    import threading

    conn.admin.apply_ddl(SCHEMA_FILE.read_text())
    conn.admin.admit("authorlist_pct", [4])
    sql = (
        "SELECT a.authorid, b.title FROM authors a JOIN books b ON b.authorid = a.authorid "
        "WHERE a.authorid = 4 ORDER BY 2"
    )
    with psycopg.connect(dsn) as pg:
        expected = pg.execute(sql).fetchall()
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            conn.engine.store.bump(["bookcopy"])

    thread = threading.Thread(target=churn)
    routes = []
    thread.start()
    try:
        cur = conn.cursor()
        for _ in range(30):
            cur.execute(sql + " CURRENCY BOUND 10 MIN ON (a, b)")
            assert cur.fetchall() == expected, cur.provenance
            routes += [p["route"] for p in cur.provenance]
    finally:
        stop.set()
        thread.join()
    assert set(routes) == {"local"}, routes


def test_pooled_backend_connections_the_backend_dropped_are_replaced(
    conn: cache.Connection, dsn: str
) -> None:
    """The process's pool (estimates, descriptions, remote leaves) may hold connections the
    backend has since ended (a restart, an administrator): the next query still plans with
    the backend's estimates and answers, instead of failing or planning blind."""
    conn.admin.apply_ddl(SCHEMA_FILE.read_text())
    conn.admin.admit("authorlist_pct", [4])
    sql = "SELECT a.name FROM authors a WHERE a.authorid = %s CURRENCY BOUND 10 MIN ON (a)"
    assert conn.execute(sql, [4]).provenance[0]["route"] == "local"  # the pool is in use
    own = conn.session.backend_pid
    with psycopg.connect(dsn, autocommit=True) as admin:
        ended = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid NOT IN (pg_backend_pid(), %s)",
            (own,),
        ).fetchone()
    assert ended is not None and ended[0] >= 1
    other = sql.replace("a.name", "a.name, a.city")  # a new shape: planned with estimates now
    plan = conn.explain(other, [4])
    assert plan.local, plan.reason
    cur = conn.execute(other, [4])
    assert cur.fetchall() and cur.provenance[0]["route"] == "local"


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("SELECT a.authorid FROM authors a WHERE a.authorid %% 2 = %s", [1]),
        (
            "SELECT a.authorid, a.name LIKE 'A%%' FROM authors a WHERE a.authorid = %(id)s",
            {"id": 4},
        ),
        ("SELECT a.authorid, '100%%' FROM authors a WHERE a.authorid IN (%s, %s)", (4, 5)),
        ("SELECT mod(a.authorid, 3), 'x%%%%y' FROM authors a", ()),
    ],
)
def test_percent_marks_read_as_psycopg_reads_them(
    conn: cache.Connection, dsn: str, sql: str, params: t.Any
) -> None:
    """With parameters psycopg reads %% as one %: the cache accepts every such statement with
    a clause, answers as PostgreSQL does, and refuses a lone % as psycopg does."""
    conn.admin.apply_ddl(SCHEMA_FILE.read_text())
    conn.admin.admit("authorlist_pct", [4, 5])
    cur = conn.cursor()
    cur.execute(f"{sql} CURRENCY BOUND 10 MIN", params)
    got = cur.fetchall()
    with psycopg.connect(dsn) as pg:
        want = pg.execute(sql, params).fetchall()  # type: ignore[arg-type]
    assert sorted(got) == sorted(want)
    with pytest.raises(cache.ProgrammingError, match="only '%s', '%b', '%t'"):
        cur.execute(
            "SELECT a.authorid FROM authors a WHERE a.name LIKE 'A%' AND "
            "a.authorid = %s CURRENCY BOUND 10 MIN",
            [4],
        )
