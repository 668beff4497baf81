"""What a session asks the cache about itself, through the DB-API (the server's sessions are
the same engine: tests/server/test_server.py drives them over the wire): EXPLAIN LAST
STATEMENT, SHOW CACHED VIEWS, SHOW CACHE STATUS, the cache's session settings
(``mtcache.*``) with the provenance NOTICE, and REFRESH CACHED VIEW."""

from __future__ import annotations

import datetime as dt
import json
import re
import typing as t
from collections.abc import Iterator
from pathlib import Path

import pytest

import cache
from cache.engine.inspect import status_document
from sql_ext import CacheSetting, Inspect, RefreshCachedView, parse_one
from sql_ext.errors import ProgrammingError, SqlSyntaxError
from tests.schemas import AUTHORS_AND_BOOKS

SCHEMA = AUTHORS_AND_BOOKS

BOOKS = "SELECT isbn, title FROM books WHERE authorid = %s ORDER BY isbn"


@pytest.fixture(scope="module")
def conn(bookstore_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[t.Any]:
    path = tmp_path_factory.mktemp("inspect") / "cache.duckdb"
    with cache.connect(bookstore_dsn, path, autocommit=True, background=False) as connection:
        connection.admin.apply_ddl(SCHEMA)
        connection.admin.admit("authorlist_pct", [1, 2])
        yield connection


# -- the statements, parsed (no database) ---------------------------------------------------------


def test_the_statements_parse() -> None:
    assert parse_one("EXPLAIN LAST STATEMENT;") == Inspect(
        "EXPLAIN LAST STATEMENT;", "last statement"
    )
    assert parse_one("show cached views") == Inspect("show cached views", "cached views")
    assert parse_one("SHOW CACHE STATUS") == Inspect("SHOW CACHE STATUS", "cache status")
    assert parse_one("SET SESSION mtcache.Provenance TO on") == CacheSetting(
        "SET SESSION mtcache.Provenance TO on", "set", "mtcache.provenance", "on"
    )
    assert parse_one("SET mtcache.currency_bound = '10 min'").value == "10 min"
    assert parse_one("SET mtcache.stale_ok = DEFAULT").value is None
    assert parse_one("RESET mtcache.stale_ok").action == "reset"
    assert parse_one("SHOW mtcache.stale_ok").action == "show"
    assert parse_one("REFRESH CACHED VIEWS") == RefreshCachedView(
        "REFRESH CACHED VIEWS", None, None
    )
    assert parse_one("REFRESH CACHED VIEW v KEY (1, 'a'), (-2, 'b c')").keys == (
        ("1", "a"),
        ("-2", "b c"),
    )
    # the backend's own SET / SHOW / REFRESH are not the cache's
    for backend in (
        "SHOW search_path",
        "SET search_path = public",
        "RESET ALL",
        "REFRESH MATERIALIZED VIEW m",
    ):
        assert not isinstance(parse_one(backend), Inspect | CacheSetting | RefreshCachedView)


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("SET LOCAL mtcache.provenance = on", "hold for the session", 1),
        ("SET mtcache.provenance = on off", "takes one value", 29),
        ("SET mtcache.provenance", "expected = or TO", 13),
        ("EXPLAIN LAST STATEMENT please", "takes nothing more", 24),
        ("REFRESH CACHED VIEW v KEY 1", "expected (value, ...)", 27),
        ("REFRESH CACHED VIEW v KEY (1 2)", "expected , or )", 30),
        ("REFRESH CACHED VIEWS now", "takes nothing more", 22),
        ("REFRESH CACHED VIEW v KEY (x)", "a key value is a string or a number", 28),
    ],
)
def test_malformed_statements_say_where(text: str, message: str, column: int) -> None:
    with pytest.raises(SqlSyntaxError, match=re.escape(message)) as caught:
        parse_one(text)
    assert (caught.value.line, caught.value.col) == (1, column)


# -- EXPLAIN LAST STATEMENT ----------------------------------------------------------------------


def test_explain_last_statement_gives_the_provenance_as_rows(conn: t.Any) -> None:
    cur = conn.cursor()
    cur.execute(BOOKS + " CURRENCY BOUND 10 MIN", [1])
    provenance = cur.provenance
    assert [p["route"] for p in provenance] == ["local"]
    cur.execute("EXPLAIN LAST STATEMENT")
    assert [d[0] for d in cur.description] == [
        "table",
        "route",
        "view",
        "regions",
        "currency_seconds",
        "snapshot_ids",
        "stale",
    ]
    rows = cur.fetchall()
    assert [(r[0], r[1], r[2], json.loads(r[3]), json.loads(r[5]), r[6]) for r in rows] == [
        (p["table"], p["route"], p["view"], p["regions"], p["snapshot_ids"], p["stale"])
        for p in provenance
    ]
    assert isinstance(rows[0][4], float) and rows[0][4] >= 0
    # asking again asks about the same statement: the cache's own statements are not counted
    cur.execute("SHOW mtcache.provenance")
    assert cur.execute("EXPLAIN LAST STATEMENT").fetchall() == rows
    # a read the backend answered, a write: remote, then nothing read
    cur.execute("SELECT title FROM books WHERE authorid = %s", [3])
    assert [r[:3] for r in cur.execute("EXPLAIN LAST STATEMENT")] == [("books", "remote", None)]
    cur.execute("CREATE TEMP TABLE IF NOT EXISTS scratch (n int)")
    cur.execute("INSERT INTO scratch VALUES (1)")
    assert cur.execute("EXPLAIN LAST STATEMENT").fetchall() == []


# -- SHOW CACHED VIEWS, SHOW CACHE STATUS ---------------------------------------------------------


def test_show_cached_views_has_a_row_per_view(conn: t.Any) -> None:
    document = conn.admin.status()
    cur = conn.execute("SHOW CACHED VIEWS")
    assert cur.statusmessage == "SHOW 2"
    views = {
        row[0]: dict(zip([d[0] for d in cur.description], row, strict=True))
        for row in cur.fetchall()
    }
    assert set(views) == {v["name"] for v in document["views"]}
    author = views["authorcopy"]
    assert (author["table"], author["refresh"], author["regions"]) == ("authors", "every 5 min", 2)
    assert author["rows"] == next(v["rows"] for v in document["views"] if v["name"] == "authorcopy")
    assert views["bookcopy"]["refresh"] == "with authorcopy"
    assert isinstance(author["last_refresh"], dt.datetime)
    assert author["last_refresh"].tzinfo is not None


def test_show_cache_status_is_the_status_document(conn: t.Any) -> None:
    rows = conn.execute("SHOW CACHE STATUS").fetchall()
    document = status_document(rows)
    expected = conn.admin.status()
    assert list(document) == list(expected)
    assert [v["name"] for v in document["views"]] == [v["name"] for v in expected["views"]]
    assert document["control_tables"] == expected["control_tables"]


# -- the cache's session settings -----------------------------------------------------------------


def test_settings_set_show_reset(conn: t.Any) -> None:
    cur = conn.cursor()
    assert cur.execute("SHOW mtcache.currency_bound").fetchall() == [("none",)]
    assert cur.description[0][0] == "mtcache.currency_bound"
    cur.execute("SET mtcache.currency_bound = '10 min'")
    assert conn.currency_bound == 600
    assert cur.execute("SHOW CURRENCY BOUND").fetchall() == [("10 min",)]
    cur.execute("RESET mtcache.currency_bound")
    assert conn.currency_bound is None
    cur.execute("SET mtcache.stale_ok TO true")
    assert conn.stale_ok is True
    assert cur.execute("SHOW mtcache.stale_ok").fetchall() == [("on",)]
    cur.execute("SET mtcache.stale_ok = DEFAULT")
    assert conn.stale_ok is False
    for bad, message in (
        ("SET mtcache.stale_ok = maybe", "requires a Boolean value"),
        ("SET mtcache.currency_bound = 'soon'", "is not a duration"),
        ("SET mtcache.refresh_engine = 'magic'", "is one of"),
        ("SHOW mtcache.nonsense", "unrecognized configuration parameter"),
    ):
        with pytest.raises(ProgrammingError, match=message):
            cur.execute(bad)
    with pytest.raises(ProgrammingError) as caught:
        cur.execute("SET mtcache.nonsense = 1")
    assert caught.value.sqlstate == "42704"
    assert "mtcache.provenance" in str(caught.value)  # it names the settings there are
    assert conn.stale_ok is False  # nothing changed


def test_provenance_notice_after_each_statement(conn: t.Any) -> None:
    cur = conn.cursor()
    cur.execute("SET mtcache.provenance = on")
    try:
        cur.execute(BOOKS + " CURRENCY BOUND 10 MIN", [2])
        [(_, message)] = cur.messages
        assert message.startswith("provenance: books: local via bookcopy")
        assert json.loads(message.detail) == cur.provenance.to_json()
        cur.execute("SELECT 1")
        [(_, message)] = cur.messages
        assert message == "provenance: no table read"
    finally:
        cur.execute("RESET mtcache.provenance")
    cur.execute(BOOKS + " CURRENCY BOUND 10 MIN", [2])
    assert cur.messages == []


# -- REFRESH CACHED VIEW and control-table edits report as JSON ----------------------------------


def test_refresh_and_admission_notices_carry_their_report(conn: t.Any) -> None:
    cur = conn.cursor()
    cur.execute("REFRESH CACHED VIEW authorcopy KEY (1)")
    [(_, message)] = cur.messages
    report = json.loads(message.detail)
    assert report["operation"].startswith("refresh authorcopy") and report["engine"] == "inline"
    assert message == f"{report['operation']}: {len(report['regions'])} regions"
    cur.execute("INSERT INTO authorlist_pct VALUES (3)")
    [(_, message)] = cur.messages
    assert json.loads(message.detail)["operation"].startswith("admit")
    cur.execute("DELETE FROM authorlist_pct WHERE authorid = 3")
    assert json.loads(cur.messages[0][1].detail)["operation"].startswith("evict")
    with pytest.raises(ProgrammingError, match="ghost"):
        cur.execute("REFRESH CACHED VIEW ghost")


def test_an_empty_admission_needs_the_setting(conn: t.Any, tmp_path: Path) -> None:
    cur = conn.cursor()
    with pytest.raises(cache.Error, match="no rows"):
        cur.execute("INSERT INTO authorlist_pct VALUES (999999)")
    cur.execute("SET mtcache.admit_empty = on")
    try:
        cur.execute("INSERT INTO authorlist_pct VALUES (999999)")
    finally:
        cur.execute("RESET mtcache.admit_empty")
        cur.execute("DELETE FROM authorlist_pct WHERE authorid = 999999")
