"""Bad input gets a clear error and loses nothing (issue 10's table, row by row): control-key
values typed without rounding, missing keys reported, evicting what is not there refused -
each leaving the cache exactly as it was."""

from __future__ import annotations

import decimal
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import cache
from cache.dbapi.connection import Connection
from cache.tools import bookstore
from tests.fuzzing import cache_contents

SCHEMA = bookstore.CACHE_SCHEMA_FILE


@pytest.fixture
def conn(bookstore_dsn: str, tmp_path: Path) -> Iterator[Connection]:
    connection = cache.connect(
        backend=bookstore_dsn, cache_path=tmp_path / "c.duckdb", admit_on_miss=False
    )
    connection.admin.apply_ddl(SCHEMA.read_text())
    yield connection
    connection.close()


def keys(conn: Connection, control: str) -> list[tuple[object, ...]]:
    columns = ", ".join(conn.admin.control_key(control))
    sql = f"SELECT {columns} FROM {control} ORDER BY ALL"
    return [tuple(r) for r in conn.engine.store.con.execute(sql).fetchall()]


def snapshot(conn: Connection) -> dict[str, tuple[int, int | None]]:
    """Every table of the cache file, hashed, to show a rejected call changed nothing."""
    return cache_contents(conn.engine.store.con)


@pytest.mark.parametrize(
    "value", ["6.5", 6.5, "2.4", decimal.Decimal("2.4"), "1e3", "seven", "", True, "9999999999999"]
)
def test_an_integer_key_is_never_rounded(conn: Connection, value: object) -> None:
    conn.admin.admit("authorlist_pct", [2])
    before = snapshot(conn)
    with pytest.raises(cache.DataError, match=r"authorlist_pct.*authorid.*integer"):
        conn.admin.admit("authorlist_pct", [value])
    with pytest.raises(cache.DataError, match=r"authorlist_pct.*authorid.*integer"):
        conn.admin.evict("authorlist_pct", [value])
    assert snapshot(conn) == before


@pytest.mark.parametrize("value", ["7", " 7 ", 7, 7.0, decimal.Decimal("7.000"), "+7"])
def test_integral_spellings_of_a_key_are_read_exactly(conn: Connection, value: object) -> None:
    conn.admin.admit("authorlist_pct", [value])
    assert keys(conn, "authorlist_pct") == [(7,)]


def test_a_key_the_backend_does_not_have_is_reported(conn: Connection) -> None:
    conn.admin.admit("authorlist_pct", [2])
    before = snapshot(conn)
    with pytest.raises(cache.ProgrammingError, match=r"99999.*no rows.*allow_empty"):
        conn.admin.admit("authorlist_pct", [2, 99999])
    assert snapshot(conn) == before  # all or nothing: 2 is not re-pulled either
    report = conn.admin.admit("authorlist_pct", [99999], allow_empty=True)
    assert report.rows_inserted.get("authorcopy", 0) == 0
    assert keys(conn, "authorlist_pct") == [(2,), (99999,)]


def test_evicting_what_is_not_there_says_so(conn: Connection) -> None:
    conn.admin.admit("authorlist_pct", [2, 4])
    conn.admin.evict("authorlist_pct", [4])
    before = snapshot(conn)
    with pytest.raises(cache.ProgrammingError, match=r"authorlist_pct has no key \(4,\)"):
        conn.admin.evict("authorlist_pct", [2, 4])
    assert snapshot(conn) == before


def test_the_cli_refuses_bad_keys_in_one_line(
    mtcache_bin: str, bookstore_dsn: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "MTCACHE_BACKEND": bookstore_dsn,
        "MTCACHE_CACHE": str(tmp_path / "cli.duckdb"),
    }

    def mtcache(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [mtcache_bin, *args], capture_output=True, text=True, env=env, timeout=120, check=False
        )

    assert mtcache("ddl", str(SCHEMA)).returncode == 0
    for args, message in [
        (
            ("admit", "authorlist_pct", "6.5"),
            "DataError: authorlist_pct.authorid is integer: '6.5' is not an integer",
        ),
        (("evict", "authorlist_pct", "6.5"), "'6.5' is not an integer"),
        (("admit", "authorlist_pct", "99999"), "the backend has no rows for key (99999,)"),
        (("evict", "authorlist_pct", "99999"), "authorlist_pct has no key (99999,)"),
    ]:
        result = mtcache(*args)
        assert result.returncode == 1, (args, result.stdout)
        assert result.stdout == ""
        assert len(result.stderr.splitlines()) == 1 and message in result.stderr, result.stderr
    assert mtcache("admit", "--allow-empty", "authorlist_pct", "99999").returncode == 0
    assert mtcache("evict", "authorlist_pct", "99999").returncode == 0
    assert mtcache("evict", "authorlist_pct", "99999").returncode == 1


def test_admitting_many_keys_without_rows_names_a_few(conn: Connection) -> None:
    """The error names the first keys and counts the rest (one line, not a thousand keys)."""
    before = snapshot(conn)
    with pytest.raises(cache.ProgrammingError) as caught:
        conn.admin.admit("authorlist_pct", [(k,) for k in range(90000, 90030)])
    message = str(caught.value)
    assert "no rows for keys (90000,), (90001,)" in message, message
    assert "(90009,) and 20 more (30 keys)" in message and "(90010,)" not in message
    assert snapshot(conn) == before


@pytest.mark.parametrize(
    ("script", "where", "what"),
    [
        (
            "CREATE CONTROL TABLE x_pct (authorid INTEGER);\n\nCREATE CACHED VIEW xc AS SELECT * "
            "FROM authorz\n  PRESENCE ON (authorid) IN x_pct;",
            (3, 40),
            "no table 'authorz'",
        ),
        (
            "CREATE CONTROL TABLE x_pct (authorid INTEGER);\n\nCREATE CACHED VIEW xc AS SELECT * "
            "FROM authors\n  PRESENCE ON (authorid) IN y_pct;",
            (4, 29),
            "'y_pct'",
        ),
        (
            "CREATE CONTROL TABLE x_pct (authorid INTEGER);\nCREATE CACHED VIEW xc AS\n "
            "SELECT * FROM authors PRESENCE ON (nocol) IN x_pct;",
            (2, 20),
            "names nocol",
        ),
        (
            "CREATE CONTROL TABLE x_pct (authorid INTEGER);\n  DROP CACHED VIEW nope;",
            (2, 20),
            "no cached view 'nope'",
        ),
        (
            "CREATE CONTROL TABLE x_pct (authorid INTEGER);\n\n\n    CREATE CONTROL TABLE x_pct (a "
            "INTEGER)",
            (4, 26),
            "x_pct already exists",
        ),
    ],
)
def test_cache_ddl_errors_give_line_and_column(
    conn: Connection, script: str, where: tuple[int, int], what: str
) -> None:
    before = snapshot(conn)
    with pytest.raises(cache.ProgrammingError) as caught:
        conn.admin.apply_ddl(script)
    assert (caught.value.line, caught.value.col) == where, str(caught.value)  # type: ignore[attr-defined]
    assert str(caught.value).startswith(f"line {where[0]}, column {where[1]}: ")
    assert what in str(caught.value)
    assert snapshot(conn) == before


def test_one_connection_shared_by_threads_serializes_its_statements(conn: Connection) -> None:
    """psycopg's connections may be shared by threads (threadsafety 2); so may ours: each
    thread's statements run one at a time, with the right answers, local and remote alike."""
    import concurrent.futures

    conn.admin.admit("authorlist_pct", [1, 2, 3])
    conn.commit()
    queries = [
        ("SELECT name FROM authors WHERE authorid = %s CURRENCY BOUND 10 MIN ON (authors)", 2),
        ("SELECT count(*) FROM books WHERE authorid = %s", 1),
        ("SELECT authorid, name FROM authors WHERE authorid <= %s ORDER BY authorid", 3),
    ]
    with psycopg.connect(conn.backend) as pg:
        expected = {
            (sql, arg): pg.execute(sql.split(" CURRENCY")[0], (arg,)).fetchall()
            for sql, arg in queries
        }

    def work(worker: int) -> list[tuple[object, ...]]:
        answers = []
        for i in range(40):
            sql, arg = queries[(worker + i) % len(queries)]
            cur = conn.cursor()
            cur.execute(sql, (arg,))
            answers.append(((sql, arg), cur.fetchall()))
        conn.commit()
        return answers

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = [a for f in [pool.submit(work, w) for w in range(4)] for a in f.result()]
    assert len(results) == 160
    for key, rows in results:
        assert rows == expected[key]
    assert cache.threadsafety == 2


@pytest.mark.parametrize("shape", ["parentheses", "and", "or", "long or", "plus", "subqueries"])
def test_deep_and_long_statements_are_answered_as_postgresql_answers(
    conn: Connection, shape: str
) -> None:
    """Statements an ORM generates (long AND/OR chains, long sums) or a person nests deeply
    get PostgreSQL's answer, with a clause (planned) and without one (sent remote whole)."""
    conn.admin.admit("authorlist_pct", [1, 2, 3])
    conn.commit()
    where = {
        "parentheses": "authorid = " + "(" * 300 + "2" + ")" * 300,
        "and": " AND ".join(f"authorid <> {i}" for i in range(4, 2000)),
        "or": " OR ".join(f"authorid = {i}" for i in range(3000)),
        # nests 18,000 deep: typed without recursing down the chain
        "long or": " OR ".join(f"authorid = {i}" for i in range(18_000)),
        "plus": "authorid = " + " + ".join(["0"] * 1500) + " + 2",
        "subqueries": "authorid IN "
        + "(SELECT authorid FROM authors WHERE authorid IN " * 60
        + "(2, 3)"
        + ")" * 60,
    }[shape]
    sql = f"SELECT authorid, name FROM authors WHERE {where} ORDER BY authorid"
    with psycopg.connect(conn.backend) as pg:
        expected = pg.execute(sql).fetchall()
    assert expected
    for suffix in ("", " CURRENCY BOUND 10 MIN ON (authors)"):
        assert conn.execute(sql + suffix).fetchall() == expected


def test_a_statement_nested_past_the_limit_is_refused_and_the_session_goes_on(
    conn: Connection,
) -> None:
    depth = 20_000
    with pytest.raises(cache.ProgrammingError, match="nested too deeply"):
        conn.execute("SELECT " + "(" * depth + "1" + ")" * depth)
    assert conn.execute("SELECT 1").fetchall() == [(1,)]


def test_a_call_with_wrong_arguments_is_the_callers_error(
    conn: Connection, bookstore_dsn: str, tmp_path: Path
) -> None:
    """A misspelled option or a missing argument is a ProgrammingError naming it, not an
    InternalError calling it a bug in mtcache."""
    with pytest.raises(cache.ProgrammingError, match="unexpected keyword argument 'cache'"):
        cache.connect(backend=bookstore_dsn, cache=tmp_path / "other.duckdb")
    assert not (tmp_path / "other.duckdb").exists()
    missing = r"Admin.admit\(\): missing a required argument: 'control'"
    with pytest.raises(cache.ProgrammingError, match=missing):
        conn.admin.admit(sql="x")  # type: ignore[call-arg]
    cur = conn.cursor()
    cur.execute("SELECT 1")
    assert cur.fetchall() == [(1,)]
