"""Names that need quotes - mixed case, spaces, unicode, SQL keywords - work end to end, as
PostgreSQL reads them (an unquoted name folded to lower case, a quoted one as written): cache
DDL, the shadow catalog, view matching and guards, refresh and admission, the replication
stream, status and the command line; answers equal PostgreSQL's, types and description."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psycopg
import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.maintenance import stream
from sql_ext.errors import ProgrammingError

BACKEND = """
CREATE TABLE "Order Items" ("Item Id" int PRIMARY KEY, "Qty" int NOT NULL, "select" text,
                            "Größe" text, plain int);
INSERT INTO "Order Items" SELECT g, g * 2, 'k' || g, 'g' || g, g FROM generate_series(1, 20) g;
CREATE TABLE "CustList" ("Key" int PRIMARY KEY, "Name" text, "order" int);
INSERT INTO "CustList" SELECT g, 'n' || g, g % 3 FROM generate_series(1, 6) g;
CREATE TABLE lower_case (id int PRIMARY KEY, v text);
INSERT INTO lower_case SELECT g, 'v' || g FROM generate_series(1, 4) g;
"""

SCHEMA = """
CREATE CACHED VIEW "Item Copy" AS SELECT "Item Id", "Qty", "select", "Größe" FROM "Order Items"
    REFRESH CONTINUOUSLY;
CREATE CONTROL TABLE "Hot Keys" ("Key" INTEGER);
CREATE CACHED VIEW "Cust Copy" AS SELECT * FROM "CustList"
    PRESENCE ON ("Key") IN "Hot Keys" REFRESH EVERY 10 MIN;
CREATE CACHED VIEW Lower_Copy AS SELECT ID, V FROM LOWER_CASE;
"""

QUERIES = [
    'SELECT o."Item Id", o."Qty", o."select", o."Größe" FROM "Order Items" o '
    'WHERE o."Item Id" BETWEEN 3 AND 6 ORDER BY 1',
    'SELECT "Qty" AS "Menge", count(*) FROM "Order Items" GROUP BY "Qty" ORDER BY "Menge"',
    'SELECT c."Key", c."Name", c."order" FROM "CustList" c WHERE c."Key" = 2',
    "SELECT L.ID, l.v FROM Lower_Case l WHERE L.Id <= 2 ORDER BY 1",
]


@pytest.fixture
def quoted(pg_cluster: EmbeddedPostgres, tmp_path: Path) -> tuple[str, Path]:
    dsn = pg_cluster.create_database("quoted_names")
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute(BACKEND)
    return dsn, tmp_path / "cache.duckdb"


def _pg(dsn: str, sql: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    with psycopg.connect(dsn) as pg:
        cur = pg.execute(sql)
        return cur.fetchall(), [tuple(d) for d in cur.description or ()]


def test_quoted_names_end_to_end(quoted: tuple[str, Path], mtcache_bin: str) -> None:
    dsn, path = quoted
    with cache.connect(dsn, path, background=False, admit_on_miss=False) as conn:
        conn.admin.apply_ddl(SCHEMA)
        conn.admin.refresh("Item Copy", engine="inline")
        conn.admin.refresh("lower_copy", engine="inline")
        conn.admin.admit("Hot Keys", [2])
        cur = conn.cursor()
        for sql in QUERIES:
            cur.execute(sql + " CURRENCY BOUND 10 MIN")
            got = cur.fetchall()
            want, description = _pg(dsn, sql)
            assert got == want, sql
            assert [tuple(map(type, r)) for r in got] == [tuple(map(type, r)) for r in want]
            assert [tuple(d) for d in cur.description or ()] == description, sql
            assert {p["route"] for p in cur.provenance} == {"local"}, sql
        # a key not admitted: the presence guard sends it to the backend
        cur.execute('SELECT c."Name" FROM "CustList" c WHERE c."Key" = 5 CURRENCY BOUND 10 MIN')
        assert cur.fetchall() == [("n5",)]
        assert {p["route"] for p in cur.provenance} == {"remote"}
        # the stream keeps the continuously maintained view current
        with psycopg.connect(dsn, autocommit=True) as pg:
            pg.execute('UPDATE "Order Items" SET "Qty" = 99 WHERE "Item Id" = 4')
        with conn.engine.store.for_thread() as handle, stream.Consumer(handle, dsn) as consumer:
            consumer.catch_up()
        cur.execute(
            'SELECT o."Qty" FROM "Order Items" o WHERE o."Item Id" = 4 CURRENCY BOUND 10 MIN'
        )
        assert cur.fetchall() == [(99,)]
        assert {p["route"] for p in cur.provenance} == {"local"}
        status = conn.admin.status()
        assert {v["name"]: v["table"] for v in status["views"]} == {
            "Item Copy": "Order Items",
            "Cust Copy": "CustList",
            "lower_copy": "lower_case",
        }
        assert "Hot Keys" in status["control_tables"]
        # names the backend does not have are refused, as PostgreSQL would read them
        with pytest.raises(ProgrammingError, match="Order items"):
            conn.admin.apply_ddl('CREATE CACHED VIEW x AS SELECT * FROM "Order items"')
    env = {**os.environ, "MTCACHE_BACKEND": dsn, "MTCACHE_CACHE": str(path)}

    def cli(*args: str) -> str:
        done = subprocess.run(
            [mtcache_bin, *args], capture_output=True, text=True, env=env, timeout=120, check=False
        )
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    cli("admit", "Hot Keys", "3")
    document = json.loads(
        cli(
            "query",
            "--json",
            'SELECT c."Name" FROM "CustList" c WHERE c."Key" = 3 CURRENCY BOUND 10 MIN',
        )
    )
    assert document["rows"] == [["n3"]] and document["provenance"][0]["route"] == "local"
    views = {v["name"]: v for v in json.loads(cli("status", "--json"))["views"]}
    assert sorted(r["key"] for r in views["Cust Copy"]["regions"]) == [[2], [3]]
    cli("evict", "Hot Keys", "2")
    with cache.connect(dsn, path, background=False) as conn:
        conn.admin.apply_ddl('DROP CACHED VIEW "Item Copy"')  # its slot goes with it


def test_names_duckdb_would_confuse_are_refused(quoted: tuple[str, Path]) -> None:
    """DuckDB matches names case-insensitively even when quoted: two cache objects whose names
    differ only in case cannot both be tables of the cache file."""
    dsn, path = quoted
    with cache.connect(dsn, path, background=False) as conn:
        conn.admin.apply_ddl('CREATE CACHED VIEW "Copy" AS SELECT id, v FROM lower_case')
        with pytest.raises(ProgrammingError, match="differ only in case"):
            conn.admin.apply_ddl("CREATE CACHED VIEW copy AS SELECT id, v FROM lower_case")
        assert [v["name"] for v in conn.admin.status()["views"]] == ["Copy"]
