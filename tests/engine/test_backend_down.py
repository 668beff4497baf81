"""Backend down, cache up: a connection opens without the backend (the last known
catalog and clock), answers what its guards allow, names what needs the backend, and
connects again by itself when the backend is back; so does the CLI."""

from __future__ import annotations

import subprocess
import typing as t
from pathlib import Path

import psycopg
import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.tools import bookstore
from tests.answers import typed

AUTHOR = "SELECT a.authorid, a.name FROM authors a WHERE a.authorid = {} CURRENCY BOUND 10 MIN"
LOCAL, REMOTE = AUTHOR.format(4), AUTHOR.format(5)  # author 4 is admitted, 5 is not


@pytest.fixture
def cached(pg_cluster: EmbeddedPostgres, tmp_path: Path) -> tuple[str, Path]:
    dsn = pg_cluster.create_database("backend_down")
    bookstore.load_into(dsn)
    path = tmp_path / "cache.duckdb"
    with cache.connect(dsn, path, background=False) as conn:
        conn.admin.apply_ddl(bookstore.CACHE_SCHEMA_FILE.read_text())
        conn.admin.admit("authorlist_pct", [4])
    return dsn, path


def test_a_fresh_connection_answers_locally_while_the_backend_is_down(
    pg_cluster: EmbeddedPostgres,
    cached: tuple[str, Path],
    mtcache_bin: str,
    clean_env: dict[str, str],
) -> None:
    dsn, path = cached
    with psycopg.connect(dsn) as pg:
        expected = pg.execute(LOCAL.split(" CURRENCY", maxsplit=1)[0])
        expected_rows = typed(expected.fetchall())
        expected_description = [(d.name, d.type_code) for d in expected.description or []]
    pg_cluster.stop()
    try:
        with cache.connect(dsn, path, background=False) as conn:  # catalog and clock on file
            cur = conn.execute(LOCAL)
            assert typed(cur.fetchall()) == expected_rows  # values and Python types
            assert [(d[0], d[1]) for d in cur.description or []] == expected_description
            assert cur.provenance[0]["route"] == "local"
            with pytest.raises(cache.OperationalError, match=r"authors \(a\) needs the backend"):
                conn.execute(REMOTE)
            with pytest.raises(cache.OperationalError, match="cannot reach the PostgreSQL backend"):
                conn.execute("UPDATE authors SET name = name WHERE authorid = 4")
            conn.rollback()
        # the CLI: the same, a fresh process each time
        base = [mtcache_bin, "--backend", dsn, "--cache", str(path)]

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*base, *args],
                capture_output=True,
                text=True,
                env=clean_env,
                timeout=120,
                check=False,
            )

        shown = cli("query", LOCAL)
        assert shown.returncode == 0, shown.stderr
        assert "provenance: authors: local" in shown.stdout
        refused = cli("query", REMOTE)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1
        assert "needs the backend" in refused.stderr
        explained = cli("explain", LOCAL)
        assert explained.returncode == 0 and "SwitchUnion" in explained.stdout, explained.stderr
        status = cli("status")
        assert status.returncode == 0 and "authorlist_pct(4)" in status.stdout, status.stderr
        # the backend comes back: a connection opened while it was down reaches it by itself
        with cache.connect(dsn, path, background=False) as conn:
            pg_cluster.ensure_running()
            cur = conn.execute(REMOTE)
            assert cur.fetchall() and cur.provenance[0]["route"] == "remote"
    finally:
        pg_cluster.ensure_running()


def test_without_a_catalog_on_file_the_connection_says_what_to_do(
    pg_cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    dsn = pg_cluster.create_database("backend_down_empty")
    pg_cluster.stop()
    try:
        with pytest.raises(cache.OperationalError, match="connect once while the backend is up"):
            cache.connect(dsn, tmp_path / "new.duckdb", background=False)
    finally:
        pg_cluster.ensure_running()


# local answers whose description PostgreSQL gives its own way: an aggregate's name and type
# (count: bigint, sum of integers: bigint, of numerics: numeric), a char(n) column, casts
DESCRIBED = [
    "SELECT count(*), sum(s.qty), max(s.sold_on), avg(s.qty) FROM sales s CURRENCY BOUND 10 MIN",
    "SELECT b.authorid, count(*), sum(b.price) FROM books b GROUP BY b.authorid "
    "ORDER BY 1 CURRENCY BOUND 10 MIN",
    "SELECT a.authorid, a.gender, a.state, upper(a.name) FROM authors a WHERE a.authorid = 4 "
    "CURRENCY BOUND 10 MIN",
    "SELECT b.price, b.price::numeric(10, 1), b.price * 2 AS twice, b.authorid::bigint "
    "FROM books b WHERE b.isbn = '0-0000-0001-x' CURRENCY BOUND 10 MIN",
]


def test_a_local_answer_is_described_as_postgresql_describes_it_without_the_backend(
    pg_cluster: EmbeddedPostgres, cached: tuple[str, Path]
) -> None:
    """A connection opened while the backend is down gives local answers PostgreSQL's
    description (names, types, sizes, precision and scale), worked out without it."""
    dsn, path = cached
    with cache.connect(dsn, path, background=False) as conn:
        conn.admin.apply_ddl(
            "CREATE CACHED VIEW salecopy AS SELECT * FROM sales;"
            "CREATE CACHED VIEW bookall AS SELECT * FROM books"
        )
    with psycopg.connect(dsn) as pg:
        expected = []
        for sql in DESCRIBED:
            cur = pg.execute(sql.split(" CURRENCY", maxsplit=1)[0])
            expected.append((typed(cur.fetchall()), _described(cur.description)))
    pg_cluster.stop()
    try:
        with cache.connect(dsn, path, background=False) as conn:
            for sql, (rows, description) in zip(DESCRIBED, expected, strict=True):
                cur = conn.execute(sql)
                assert typed(cur.fetchall()) == rows, sql
                assert _described(cur.description) == description, sql
                assert {p["route"] for p in cur.provenance} == {"local"}, sql
    finally:
        pg_cluster.ensure_running()


def _described(description: t.Any) -> list[tuple[t.Any, ...]]:
    return [tuple(d)[:6] for d in description or []]
