"""Queries through the cache, compared with PostgreSQL's answer to the same query.

Local answers come from regions refreshed at a known snapshot; where the backend has changed
since, the expected answer is the backend's rows as they were at that snapshot.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import typing as t
from collections.abc import Iterator
from pathlib import Path

import duckdb
import psycopg
import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.pool import close_all
from cache.store.counters import Counter
from cache.tools import bookstore
from tests.answers import typed
from tests.explained import assert_ran_as_explained
from tests.store.test_store import SCHEMA_FILE

SALES = "CREATE CACHED VIEW salescopy AS SELECT saleid, isbn, sold_on, qty FROM sales"


@pytest.fixture
def backend(pg_cluster: EmbeddedPostgres, request: pytest.FixtureRequest) -> str:
    dsn = pg_cluster.create_database("q_" + re.sub(r"\W", "_", request.node.name)[:40])
    bookstore.load_into(dsn)
    return dsn


@pytest.fixture
def conn(backend: str, tmp_path: Path) -> Iterator[cache.Connection]:
    connection = cache.connect(backend=backend, cache_path=tmp_path / "cache.duckdb")
    cur = connection.cursor()
    for statement in (SCHEMA_FILE.read_text() + SALES).split(";"):
        if statement.strip():
            cur.execute(statement)
    cur.execute("INSERT INTO citylist_csct VALUES ('Madison')")
    cur.execute("INSERT INTO authorlist_pct VALUES (4), (8)")
    connection.admin.refresh("salescopy")
    connection.commit()
    yield connection
    connection.close()


def pg(dsn: str, sql: str, params: object = None) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as other:
        return other.execute(sql, params).fetchall()  # type: ignore[arg-type]


def cur_plan(conn: cache.Connection, sql: str, params: object = None) -> cache.Plan:
    """The plan a statement runs with (the one its EXPLAIN shows)."""
    return conn.explain(sql, params)  # type: ignore[arg-type]


def through_cache(
    conn: cache.Connection, sql: str, params: object = None
) -> tuple[list[tuple[object, ...]], list[str]]:
    cur = conn.cursor()
    cur.execute(sql, params)  # type: ignore[arg-type]
    return cur.fetchall(), [p["route"] for p in cur.provenance]


CASES = [
    # (name, query without clause, clause, params, expected routes)
    (
        "point query on a presence region",
        "SELECT * FROM authors a WHERE a.authorid = 4",
        "CURRENCY BOUND 10 MIN",
        None,
        ["local"],
    ),
    (
        "IN list over one snapshot",
        "SELECT a.name FROM authors a WHERE a.authorid IN (4, 8) ORDER BY 1",
        "CURRENCY BOUND 10 MIN",
        None,
        ["local"],
    ),
    (
        "parameter probe",
        "SELECT a.city FROM authors a WHERE a.authorid = %s",
        "CURRENCY BOUND 10 MIN",
        [8],
        ["local"],
    ),
    (
        "gray child through its parent",
        "SELECT a.name, b.title FROM authors a JOIN books b "
        "ON a.authorid = b.authorid WHERE a.authorid = 4 AND b.authorid = 4 ORDER BY 2",
        "CURRENCY BOUND 10 MIN ON (a, b)",
        None,
        ["local", "local"],
    ),
    (
        "an ORM joinedload: the LEFT JOIN's books probed through its ON clause",
        "SELECT a.authorid, a.name, b.isbn, b.price FROM authors a "
        "LEFT OUTER JOIN books b ON a.authorid = b.authorid WHERE a.authorid = 4 ORDER BY b.isbn",
        "CURRENCY BOUND 10 MIN",
        None,
        ["local", "local"],
    ),
    (
        "a LEFT JOIN's null-extended rows, answered locally",
        "SELECT a.authorid, b.isbn, b.price FROM authors a LEFT JOIN books b "
        "ON a.authorid = b.authorid AND b.price > 1000 WHERE a.authorid IN (4, 8) ORDER BY 1",
        "CURRENCY BOUND 10 MIN",
        None,
        ["local", "local"],
    ),
    (
        "an ORM joinedload with LIMIT: the derived table's constants reach the books",
        "SELECT t.name, b.isbn, b.title FROM (SELECT a.authorid, a.name FROM authors a "
        "WHERE a.authorid = 8 LIMIT 1) AS t LEFT OUTER JOIN books b ON t.authorid = b.authorid "
        "ORDER BY b.isbn",
        "CURRENCY BOUND 10 MIN",
        None,
        ["local", "local"],
    ),
    (
        "aggregate over a fully materialized view",
        "SELECT count(*), sum(s.qty) FROM sales s WHERE s.sold_on >= DATE '2003-01-01'",
        "CURRENCY BOUND 10 MIN",
        None,
        ["local"],
    ),
    (
        "mixed: local sales, remote books",
        "SELECT b.type, sum(s.qty) FROM sales s "
        "JOIN books b ON s.isbn = b.isbn WHERE b.authorid = 3 GROUP BY b.type ORDER BY 1",
        "CURRENCY BOUND 10 MIN ON (s), 10 MIN ON (b)",
        None,
        ["local", "remote"],
    ),
    (
        "presence miss goes remote",
        "SELECT * FROM authors a WHERE a.authorid = 5",
        "CURRENCY BOUND 10 MIN",
        None,
        ["remote"],
    ),
    (
        "currency miss goes remote",
        "SELECT * FROM authors a WHERE a.authorid = 4",
        "CURRENCY BOUND 1 MS",
        None,
        ["remote"],
    ),
    (
        "an unnamed input is bound 0",
        "SELECT b.type, sum(s.qty) FROM sales s "
        "JOIN books b ON s.isbn = b.isbn WHERE b.authorid = 3 GROUP BY b.type ORDER BY 1",
        "CURRENCY BOUND 10 MIN ON (s)",
        None,
        ["local", "remote"],
    ),
    (
        "views of different snapshots cannot serve one class",
        "SELECT count(*) FROM sales s, authors a WHERE a.authorid = 4 AND s.qty = 1",
        "CURRENCY BOUND 10 MIN ON (s, a)",
        None,
        ["remote", "remote"],
    ),
    (
        "subquery in WHERE stays remote",
        "SELECT a.name FROM authors a WHERE a.authorid = 4 AND "
        "EXISTS (SELECT 1 FROM books b WHERE b.authorid = a.authorid AND b.authorid = 4)",
        "CURRENCY BOUND 10 MIN",
        None,
        ["local", "remote"],
    ),
]


@pytest.mark.parametrize(
    ("name", "sql", "clause", "params", "routes"), CASES, ids=[c[0] for c in CASES]
)
def test_cached_answers_equal_postgres(
    conn: cache.Connection,
    backend: str,
    name: str,
    sql: str,
    clause: str,
    params: object,
    routes: list[str],
) -> None:
    explained = cur_plan(conn, f"{sql} {clause}", params)
    cur = conn.cursor()
    cur.execute(f"{sql} {clause}", params)  # type: ignore[arg-type]
    assert typed(cur.fetchall()) == typed(pg(backend, sql, params))
    assert sorted(p["route"] for p in cur.provenance) == sorted(routes)
    ran = assert_ran_as_explained(cur, explained)
    if set(routes) == {"remote"}:
        assert ran == "remote"
    elif set(routes) == {"local"}:
        assert ran == "first branches"  # the DuckDB statement EXPLAIN shows ran


def test_provenance_of_a_local_answer(conn: cache.Connection) -> None:
    cur = conn.cursor()
    cur.execute("SELECT * FROM authors a WHERE a.authorid IN (4, 8) CURRENCY BOUND 10 MIN")
    (entry,) = cur.provenance
    assert entry["table"] == "authors" and entry["view"] == "authorcopy"
    assert sorted(entry["regions"]) == [[4], [8]]
    assert len(entry["snapshot_ids"]) == 1 and 0 <= entry["currency_seconds"] < 600
    assert entry["stale"] is False
    assert [d[0] for d in cur.description or []] == ["authorid", "name", "gender", "city", "state"]
    assert cur.description[0][1] == cache.NUMBER  # type: ignore[index]


def test_a_cached_answer_is_the_backend_at_the_region_snapshot(
    conn: cache.Connection, backend: str
) -> None:
    """After the backend changes, a generous bound still answers from the region: the rows
    PostgreSQL had at the snapshot, no older than the bound."""
    before = pg(backend, "SELECT name FROM authors WHERE authorid = 4")
    with psycopg.connect(backend, autocommit=True) as other:
        other.execute("UPDATE authors SET name = 'changed' WHERE authorid = 4")
    cur = conn.cursor()
    cur.execute("SELECT name FROM authors a WHERE a.authorid = 4 CURRENCY BOUND 10 MIN")
    assert cur.fetchall() == before
    assert cur.provenance[0]["route"] == "local" and cur.provenance[0]["currency_seconds"] < 600
    cur.execute("SELECT name FROM authors a WHERE a.authorid = 4 CURRENCY BOUND 1 MS")
    assert cur.fetchall() == [("changed",)]


def test_the_session_reads_its_own_writes(conn: cache.Connection) -> None:
    cur = conn.cursor()
    query = "SELECT name FROM authors a WHERE a.authorid = 4 CURRENCY BOUND 10 MIN"
    cur.execute("UPDATE authors SET name = 'mine' WHERE authorid = 4")
    cur.execute(query)
    assert cur.fetchall() == [("mine",)] and cur.provenance[0]["route"] == "remote"
    conn.commit()
    cur.execute(query)
    assert cur.fetchall() == [("mine",)] and cur.provenance[0]["route"] == "remote"
    cur.execute("INSERT INTO authorlist_pct VALUES (4)")  # refreshes the region
    cur.execute(query)
    assert cur.fetchall() == [("mine",)] and cur.provenance[0]["route"] == "local"


def test_time_never_moves_backwards_inside_timeordered(conn: cache.Connection) -> None:
    cur = conn.cursor()
    query = "SELECT name FROM authors a WHERE a.authorid = 4 CURRENCY BOUND 10 MIN"
    with conn.timeordered():
        cur.execute(query)
        assert cur.provenance[0]["route"] == "local"
        cur.execute("SELECT count(*) FROM authors a CURRENCY BOUND 10 MIN")  # remote: now
        assert cur.provenance[0]["route"] == "remote"
        cur.execute(query)  # the region is older than what was just read
        assert cur.provenance[0]["route"] == "remote"
    cur.execute(query)
    assert cur.provenance[0]["route"] == "local"


def test_a_mixed_read_inside_timeordered_sets_the_floor_after_its_remote_rows(
    conn: cache.Connection,
) -> None:
    """A mixed plan's remote leaves are read after its decision, so a commit made in between
    may be among their rows: the bracket's floor is the backend's clock after they were
    read, not the decision's moment (with the decision's, the chaos run read a region
    refreshed in between locally, and time went back)."""
    mixed = (
        "SELECT b.type, sum(s.qty) FROM sales s JOIN books b ON s.isbn = b.isbn "
        "WHERE b.authorid = 3 GROUP BY b.type ORDER BY 1 "
        "CURRENCY BOUND 10 MIN ON (s), 10 MIN ON (b)"
    )
    state = conn.session.state
    marks: list[dt.datetime] = []

    def meanwhile(plan: object, decision: object) -> None:
        marks.append(state.now())  # (decided; the remote leaves are read next)

    cur = conn.cursor()
    with conn.timeordered():
        conn.engine.on_decision = meanwhile
        try:
            cur.execute(mixed)
        finally:
            conn.engine.on_decision = None
        assert [p["route"] for p in cur.provenance] == ["local", "remote"]
        assert len(marks) == 1 and state.timeline_floor is not None
        assert state.timeline_floor >= marks[0]
        assert state.position() is not None and state.position() >= marks[0]


def test_counters_reach_mtcache_status(
    conn: cache.Connection, backend: str, tmp_path: Path
) -> None:
    cur = conn.cursor()
    cur.execute("SELECT * FROM authors a WHERE a.authorid = 4 CURRENCY BOUND 10 MIN")
    cur.execute("SELECT * FROM authors a WHERE a.authorid = 5 CURRENCY BOUND 10 MIN")
    conn.wait_for_admissions()
    conn.close()
    # Age author 8's region past the bound, editing the closed cache file as an operator
    # could: the plan uses the cache, the guard says no.
    with duckdb.connect(str(tmp_path / "cache.duckdb")) as cache_file:
        cache_file.execute(
            "UPDATE authorlist_pct SET refreshed_at = refreshed_at - "
            "INTERVAL 1 HOUR WHERE authorid = 8"
        )
    with cache.connect(backend=backend, cache_path=tmp_path / "cache.duckdb") as again:
        cur = again.cursor()
        cur.execute("SELECT * FROM authors a WHERE a.authorid = 8 CURRENCY BOUND 10 MIN")
        assert cur.provenance[0]["route"] == "remote"
    with cache.Admin.open(tmp_path / "cache.duckdb") as admin:
        counters = admin.status()["counters"]
    assert counters[Counter.HITS] == 1
    assert counters[Counter.PRESENCE_MISSES] == 1
    assert counters[Counter.CURRENCY_MISSES] == 1
    assert counters[Counter.REMOTE] == 2  # the presence miss and the currency miss


@pytest.mark.backend
def test_backend_down_local_answers_go_on_and_stale_ok_returns_stale_data(
    tmp_path: Path,
) -> None:
    """Backend down, cache up, with a backend of its own that this test stops."""
    from tests.conftest import reachable_tempdir

    home = reachable_tempdir("mtcache-down-")
    cluster = EmbeddedPostgres(home / "pg")
    try:
        dsn = cluster.ensure_running()
        bookstore.load_into(dsn)
        for stale_ok in (False, True):
            path = tmp_path / f"cache-{stale_ok}.duckdb"
            setup = cache.connect(backend=dsn, cache_path=path)
            cur = setup.cursor()
            for statement in SCHEMA_FILE.read_text().split(";"):
                if statement.strip():
                    cur.execute(statement)
            cur.execute("INSERT INTO authorlist_pct VALUES (4)")
            setup.close()
        conns = {
            flag: cache.connect(
                backend=dsn, cache_path=tmp_path / f"cache-{flag}.duckdb", stale_ok=flag
            )
            for flag in (False, True)
        }
        cluster.stop()
        strict, lenient = conns[False].cursor(), conns[True].cursor()
        fresh = "SELECT name FROM authors a WHERE a.authorid = 4 CURRENCY BOUND 10 MIN"
        strict.execute(fresh)  # the guard passes: no backend needed
        assert strict.fetchall() == [("Author 4",)] and strict.provenance[0]["route"] == "local"
        too_old = "SELECT name FROM authors a WHERE a.authorid = 4 CURRENCY BOUND 1 MS"
        expected = r"authors \(a\) needs the backend \(CURRENCY BOUND 0.001s\): the local data"
        with pytest.raises(cache.OperationalError, match=expected):
            strict.execute(too_old)
        with pytest.raises(cache.OperationalError, match="holds no usable copy"):
            strict.execute("SELECT name FROM authors a WHERE a.authorid = 5 CURRENCY BOUND 1 MIN")
        lenient.execute(too_old)
        assert lenient.fetchall() == [("Author 4",)]
        assert lenient.provenance[0]["stale"] is True
        assert lenient.messages and "beyond its bound" in lenient.messages[0][1]
        for conn in conns.values():
            conn.close()
    finally:
        close_all()  # no pooled connection keeps retrying a backend that is gone for good
        cluster.destroy()
        shutil.rmtree(home, ignore_errors=True)


def test_a_presence_miss_admits_the_key_so_the_next_query_hits(conn: cache.Connection) -> None:
    cur = conn.cursor()
    query = "SELECT name FROM authors a WHERE a.authorid = %s CURRENCY BOUND 10 MIN"
    cur.execute(query, [5])
    assert cur.provenance[0]["route"] == "remote"
    conn.wait_for_admissions()
    assert conn.admission_errors == []
    cur.execute(query, [5])
    assert cur.fetchall() == [("Author 5",)] and cur.provenance[0]["route"] == "local"
    # A gray child's miss admits the parent's key: the author's books follow.
    books = "SELECT count(*) FROM books b WHERE b.authorid = 7 CURRENCY BOUND 10 MIN"
    cur.execute(books)
    assert cur.provenance[0]["route"] == "remote"
    conn.wait_for_admissions()
    cur.execute(books)
    assert cur.provenance[0]["route"] == "local"


def test_admission_on_miss_can_be_turned_off(backend: str, tmp_path: Path) -> None:
    with cache.connect(backend=backend, cache_path=tmp_path / "c.duckdb") as setup:
        cur = setup.cursor()
        for statement in SCHEMA_FILE.read_text().split(";"):
            if statement.strip():
                cur.execute(statement)
    with cache.connect(
        backend=backend, cache_path=tmp_path / "c.duckdb", admit_on_miss=False
    ) as conn:
        cur = conn.cursor()
        for _ in range(2):
            cur.execute("SELECT name FROM authors a WHERE a.authorid = 5 CURRENCY BOUND 10 MIN")
            conn.wait_for_admissions()
            assert cur.provenance[0]["route"] == "remote"


def test_explain_shows_switchunions_and_guards(conn: cache.Connection) -> None:
    cur = conn.cursor()
    cur.execute(
        "EXPLAIN SELECT a.name, b.title FROM authors a JOIN books b ON a.authorid = b.authorid "
        "WHERE a.authorid = %s AND b.authorid = %s CURRENCY BOUND 10 MIN ON (a, b)",
        (4, 4),
    )
    lines = [r[0] for r in cur.fetchall()]
    assert lines[0].startswith("estimated cost ")
    assert [d[0] for d in cur.description or []] == ["QUERY PLAN"]
    assert cur.plan is not None
    plan = cur.plan.to_json()
    assert plan["plan"]["op"] == "LocalQuery"
    join = plan["plan"]["children"][0]
    assert join["op"] == "Join"
    unions = join["children"]
    assert [u["op"] for u in unions] == ["SwitchUnion", "SwitchUnion"]
    assert unions[0]["guard"]["presence"] == {"columns": ["authorid"], "in": "authorlist_pct"}
    assert unions[1]["guard"]["presence"] == {"columns": ["authorid"], "in": "authorcopy"}
    assert [c["op"] for c in unions[0]["children"]] == ["LocalScan", "RemoteQuery"]
    assert unions[0]["children"][0]["view"] == "authorcopy"
    assert {a["route"] for a in plan["accesses"]} == {"guarded"}


def test_a_bound_below_the_refresh_delay_is_planned_remote(
    conn: cache.Connection, backend: str
) -> None:
    """§4.4: a bound the cache can never meet is rejected when the plan is made (the views'
    delay given: a measured one would make the test depend on how fast a refresh ran)."""
    with cache.connect(
        backend=backend,
        cache_path=conn.cache_path,
        background=False,
        refresh_delays={"authorcopy": 0.5},
    ) as given:
        cur = given.cursor()
        cur.execute("EXPLAIN SELECT * FROM authors a WHERE a.authorid = 4 CURRENCY BOUND 100 MS")
        assert cur.plan is not None
        plan = cur.plan.to_json()
    assert plan["plan"]["op"] == "RemoteQuery"
    assert plan["accesses"] == [{"table": "authors", "route": "remote", "view": None}]


@pytest.mark.parametrize("given", [-1, float("nan"), "soon", None, [1]])
def test_a_refresh_delay_that_is_no_duration_is_refused(
    conn: cache.Connection, backend: str, given: t.Any
) -> None:
    with pytest.raises(cache.ProgrammingError, match=r"refresh_delays\['authorcopy'\]"):
        cache.connect(
            backend=backend,
            cache_path=conn.cache_path,
            background=False,
            refresh_delays={"authorcopy": given},
        )


def test_a_refresh_delay_is_given_as_a_duration(conn: cache.Connection, backend: str) -> None:
    """As a currency bound is: "500 ms" plans as 0.5 does (a bound of 100 ms goes remote)."""
    for delay in ("500 ms", dt.timedelta(milliseconds=500)):
        with cache.connect(
            backend=backend,
            cache_path=conn.cache_path,
            background=False,
            refresh_delays={"authorcopy": delay},
        ) as given:
            plan = given.explain(
                "SELECT * FROM authors a WHERE a.authorid = 4 CURRENCY BOUND 100 MS"
            ).to_json()
        assert plan["plan"]["op"] == "RemoteQuery", delay


def test_a_statement_shape_is_planned_once(conn: cache.Connection, backend: str) -> None:
    # (no admission on a miss: key 5's, filled in the background, would change the measured
    # delays the plans are made with, and so re-plan at a moment the test does not choose)
    steady = cache.connect(
        backend=backend, cache_path=conn.cache_path, admit_on_miss=False, background=False
    )
    try:
        _planned_once(steady, backend)
    finally:
        steady.close()


def _planned_once(conn: cache.Connection, backend: str) -> None:
    cur = conn.cursor()
    query = "SELECT name FROM authors a WHERE a.authorid = %s CURRENCY BOUND 10 MIN"
    answers = []
    plans = []
    for key in (4, 8, 5, 4):
        cur.execute(query, [key])
        answers.append(cur.fetchall())
        plans.append(cur.plan)
    entry = plans[0]
    assert entry is not None and entry.local
    assert answers == [
        pg(backend, "SELECT name FROM authors WHERE authorid = %s", [k]) for k in (4, 8, 5, 4)
    ]
    cur.execute(query, [8])
    assert cur.plan is entry and all(p is entry for p in plans)  # reused, not re-planned
    cur.execute("CREATE CONTROL TABLE extra_pct (x INTEGER)")  # DDL invalidates plans
    cur.execute(query, [8])
    assert cur.plan is not entry


def test_wrong_parameters_on_the_local_path_are_programming_errors(
    conn: cache.Connection,
) -> None:
    cur = conn.cursor()
    query = (
        "SELECT a.name FROM authors a WHERE a.authorid = %s AND a.name <> %s CURRENCY BOUND 10 MIN"
    )
    cur.execute(query, [4, "x"])
    assert cur.fetchall() == [("Author 4",)] and cur.provenance[0]["route"] == "local"
    with pytest.raises(cache.ProgrammingError, match="2 placeholder"):
        cur.execute(query, [4])  # the probe is there, the second value is not
    named = (
        "SELECT a.name FROM authors a WHERE a.authorid = %(k)s AND a.name <> %(n)s "
        "CURRENCY BOUND 10 MIN"
    )
    cur.execute(named, {"k": 4, "n": "x"})
    with pytest.raises(cache.ProgrammingError, match=r"%\(n\)s"):
        cur.execute(named, {"k": 4})


def test_postgres_semantics_survive_local_execution(conn: cache.Connection, backend: str) -> None:
    """Integer division truncates; char(n) compares without its padding (PostgreSQL's rules)."""
    with psycopg.connect(backend, autocommit=True) as other:
        other.execute("CREATE TABLE codes (id integer PRIMARY KEY, code char(5) NOT NULL, n int)")
        other.execute("INSERT INTO codes VALUES (1, 'AB', 7), (2, 'ABCDE', 8), (3, 'X', 9)")
    cur = conn.cursor()
    cur.execute("CREATE CACHED VIEW codescopy AS SELECT * FROM codes")
    conn.admin.refresh("codescopy")
    for sql in (
        "SELECT c.n / 2, c.id FROM codes c ORDER BY c.id",
        "SELECT c.id FROM codes c WHERE c.code = 'AB'",
        "SELECT c.id FROM codes c WHERE c.code LIKE 'AB'",
        "SELECT c.code, c.id FROM codes c ORDER BY c.id",
    ):
        rows, routes = through_cache(conn, f"{sql} CURRENCY BOUND 10 MIN")
        assert rows == pg(backend, sql), sql
    rows, routes = through_cache(conn, "SELECT sum(c.n / 2) FROM codes c CURRENCY BOUND 10 MIN")
    assert routes == ["local"] and rows == pg(backend, "SELECT sum(c.n / 2) FROM codes c")
    # numeric averages and divisions are exact decimals in PostgreSQL, doubles in DuckDB
    cur.execute("CREATE CACHED VIEW allbooks AS SELECT isbn, price FROM books")
    conn.admin.refresh("allbooks")
    for sql in ("SELECT avg(b.price) FROM books b", "SELECT sum(b.price) / 3 FROM books b"):
        rows, routes = through_cache(conn, f"{sql} CURRENCY BOUND 10 MIN")
        assert rows == pg(backend, sql), sql
    rows, routes = through_cache(conn, "SELECT sum(b.price) FROM books b CURRENCY BOUND 10 MIN")
    assert routes == ["local"] and rows == pg(backend, "SELECT sum(b.price) FROM books b")


def test_text_ordering_follows_the_backend_collation(
    pg_cluster: EmbeddedPostgres, tmp_path: Path
) -> None:
    """On an ICU en-US database 'a' < 'B' < 'c'; DuckDB orders bytes. Ordering text must stay
    remote there, while other local answers go on."""
    with psycopg.connect(pg_cluster.dsn("postgres"), autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS icu_books WITH (FORCE)")
        admin.execute(
            "CREATE DATABASE icu_books LOCALE_PROVIDER icu ICU_LOCALE 'en-US' TEMPLATE template0"
        )
    dsn = pg_cluster.dsn("icu_books")
    bookstore.load_into(dsn)
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("UPDATE authors SET name = 'alice' WHERE authorid = 4")
        other.execute("UPDATE authors SET name = 'Bob' WHERE authorid = 8")
    with cache.connect(backend=dsn, cache_path=tmp_path / "icu.duckdb") as conn:
        cur = conn.cursor()
        for statement in SCHEMA_FILE.read_text().split(";"):
            if statement.strip():
                cur.execute(statement)
        cur.execute("INSERT INTO authorlist_pct VALUES (4), (8)")
        ordered = "SELECT a.name FROM authors a WHERE a.authorid IN (4, 8) ORDER BY a.name"
        rows, routes = through_cache(conn, f"{ordered} CURRENCY BOUND 10 MIN")
        assert rows == pg(dsn, ordered) == [("alice",), ("Bob",)]
        assert routes == ["remote"]
        plain = "SELECT a.name FROM authors a WHERE a.authorid = 8"
        rows, routes = through_cache(conn, f"{plain} CURRENCY BOUND 10 MIN")
        assert rows == [("Bob",)] and routes == ["local"]


MIXED_TWO_LEAVES = (
    "SELECT a.name, b.title, sum(s.qty) FROM sales s JOIN books b ON s.isbn = b.isbn "
    "JOIN authors a ON a.authorid = b.authorid WHERE b.authorid = 3 AND a.authorid = 3 "
    "GROUP BY 1, 2 ORDER BY 2"
)
MIXED_CLAUSE = "CURRENCY BOUND 10 MIN ON (s), 10 MIN ON (b), 10 MIN ON (a)"


def test_remote_leaves_come_from_the_backend_pool(
    backend: str, tmp_path: Path, conn: cache.Connection
) -> None:
    """Two remote leaves of one mixed plan: each on a pooled backend connection."""
    from cache.backend.pool import backend_pool

    conn.admit_on_miss = False  # author 3 stays a presence miss: both leaves remote
    rows, routes = through_cache(conn, f"{MIXED_TWO_LEAVES} {MIXED_CLAUSE}")  # planned here
    assert rows == pg(backend, MIXED_TWO_LEAVES) and rows
    assert routes == ["local", "remote", "remote"]
    before = backend_pool(backend).get_stats().get("requests_num", 0)
    assert through_cache(conn, f"{MIXED_TWO_LEAVES} {MIXED_CLAUSE}") == (rows, routes)
    assert backend_pool(backend).get_stats()["requests_num"] - before == 2


def test_remote_leaves_see_the_sessions_uncommitted_writes(
    backend: str, conn: cache.Connection
) -> None:
    conn.admit_on_miss = False
    cur = conn.cursor()
    cur.execute("UPDATE books SET title = 'uncommitted' WHERE authorid = 3")
    rows, routes = through_cache(conn, f"{MIXED_TWO_LEAVES} {MIXED_CLAUSE}")
    assert routes == ["local", "remote", "remote"]
    assert rows and {r[1] for r in rows} == {"uncommitted"}  # through the session itself
    assert pg(backend, MIXED_TWO_LEAVES) != rows  # nobody else sees it yet
    conn.rollback()


def test_connections_of_one_process_share_the_cache_file(
    backend: str, tmp_path: Path, conn: cache.Connection
) -> None:
    """Another connection to the same file (another thread's) sees admissions and evictions at
    once, and concurrent sessions do not trip over each other's bookkeeping."""
    import threading

    query = "SELECT a.name FROM authors a WHERE a.authorid = %s CURRENCY BOUND 10 MIN"
    other = cache.connect(backend=backend, cache_path=conn.cache_path, admit_on_miss=False)
    try:
        cur = other.cursor()
        cur.execute(query, [4])
        assert cur.provenance[0]["route"] == "local"
        conn.cursor().execute("DELETE FROM authorlist_pct WHERE authorid = 4")
        cur.execute(query, [4])  # evicted by the first connection: no stale "present" guard
        assert cur.fetchall() == pg(backend, "SELECT name FROM authors WHERE authorid = 4")
        assert cur.provenance[0]["route"] == "remote"
    finally:
        other.close()

    failures: list[str] = []

    def session(key: int) -> None:
        try:
            with cache.connect(backend=backend, cache_path=conn.cache_path) as mine:
                c = mine.cursor()
                for _ in range(20):
                    c.execute(query, [key])
                    assert c.fetchall() == [(f"Author {key}",)]
        except Exception as exc:  # reported below
            failures.append(repr(exc))

    threads = [threading.Thread(target=session, args=(k,)) for k in (8, 8, 9, 10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_psycopg_style_shortcuts_and_transaction_blocks(
    backend: str, conn: cache.Connection
) -> None:
    """conn.execute() and conn.transaction() as in psycopg 3; writes inside a block count as
    uncommitted until the block ends, also on an autocommit connection."""
    assert conn.execute("SELECT %s::int + 1", [41]).fetchone() == (42,)
    query = "SELECT name FROM authors a WHERE a.authorid = 8 CURRENCY BOUND 10 MIN"
    conn.commit()
    conn.autocommit = True
    with conn.transaction():
        conn.execute("UPDATE authors SET name = 'in a block' WHERE authorid = 8")
        cur = conn.execute(query)
        assert cur.fetchall() == [("in a block",)] and cur.provenance[0]["route"] == "remote"
        assert pg(backend, "SELECT name FROM authors WHERE authorid = 8") == [("Author 8",)]
    assert pg(backend, "SELECT name FROM authors WHERE authorid = 8") == [("in a block",)]
    cur = conn.execute(query)  # committed after the region was refreshed: still remote
    assert cur.fetchall() == [("in a block",)] and cur.provenance[0]["route"] == "remote"

    with pytest.raises(cache.IntegrityError), conn.transaction():
        conn.execute("UPDATE authors SET name = 'rolled back' WHERE authorid = 4")
        conn.execute("INSERT INTO authors (authorid, name, city) VALUES (4, 'x', 'y')")
    assert pg(backend, "SELECT name FROM authors WHERE authorid = 4") == [("Author 4",)]
    # nothing is left uncommitted: a region refreshed now serves the session again
    conn.execute("INSERT INTO authorlist_pct VALUES (4)")
    cur = conn.execute("SELECT name FROM authors a WHERE a.authorid = 4 CURRENCY BOUND 10 MIN")
    assert cur.fetchall() == [("Author 4",)] and cur.provenance[0]["route"] == "local"


def test_a_commit_sent_as_sql_ends_the_sessions_uncommitted_writes(
    backend: str, conn: cache.Connection
) -> None:
    query = "SELECT name FROM authors a WHERE a.authorid = 4 CURRENCY BOUND 10 MIN"
    conn.commit()
    cur = conn.cursor()
    cur.execute("UPDATE authors SET name = 'sql commit' WHERE authorid = 4")
    cur.execute("COMMIT")
    # committed: later reads compare regions with the write time, so the region read before
    # the commit no longer serves, one refreshed after it does
    cur.execute(query)
    assert cur.fetchall() == [("sql commit",)] and cur.provenance[0]["route"] == "remote"
    cur.execute("INSERT INTO authorlist_pct VALUES (4)")  # refreshed after the commit
    cur.execute(query)
    assert cur.fetchall() == [("sql commit",)] and cur.provenance[0]["route"] == "local"


def test_a_mixed_plan_is_made_once_and_reused_with_new_parameters(
    backend: str, conn: cache.Connection
) -> None:
    """The mixed statement and its leaf queries are made once per decision; parameters reach
    both DuckDB and the leaves; a %% in the text means % once parameters are passed, as in
    psycopg, on every path."""
    conn.admit_on_miss = False
    query = (
        "SELECT b.title, sum(s.qty), 'x%%y' FROM sales s JOIN books b ON s.isbn = b.isbn "
        "WHERE b.authorid = %s AND b.title LIKE 'Book%%' AND b.title <> 'a%%b' "
        "AND length(b.title || '%%') = length(b.title) + 1 "  # one % in the leaf, not two
        "GROUP BY 1 ORDER BY 1"
    )
    clause = " CURRENCY BOUND 10 MIN ON (s), 10 MIN ON (b)"
    for author in (3, 5, 3):
        rows, routes = through_cache(conn, query + clause, [author])
        assert routes == ["local", "remote"]
        assert rows == pg(backend, query, [author]) and rows
        assert {r[2] for r in rows} == {"x%y"}
    assert cur_plan(conn, query + clause, [3]).local
    (leaf,) = [a.leaf for a in cur_plan(conn, query + clause, [3]).accesses if a.table == "books"]
    assert "%%" in leaf.sql  # escaped for psycopg
    plain = (
        "SELECT count(*), 'x%%y' FROM sales s JOIN books b ON s.isbn = b.isbn "
        "WHERE b.authorid = 3 AND length(b.title || '%%') = length(b.title) + 1"
    )
    rows, routes = through_cache(conn, plain + clause)  # no parameters: %% stays %%
    assert routes == ["local", "remote"] and rows == pg(backend, plain)
    rows, routes = through_cache(conn, plain + clause, [])  # parameters, none used: %% is %
    assert rows == pg(backend, plain, []) and rows[0][1] == "x%y" and rows[0][0] > 0


def test_a_write_the_parser_cannot_read_is_still_read_back(conn: cache.Connection) -> None:
    """psycopg's %% makes the UPDATE unreadable to the parser: it reaches PostgreSQL verbatim
    and still counts as the session's write, so the next read does not see the cached row."""
    cur = conn.cursor()
    query = "SELECT name FROM authors a WHERE a.authorid = 4 CURRENCY BOUND 10 MIN"
    cur.execute(query)
    assert cur.provenance[0]["route"] == "local"
    cur.execute("UPDATE authors SET name = 'mine' WHERE authorid %% 1000 = %s", [4])
    assert cur.rowcount == 1
    cur.execute(query)
    assert cur.fetchall() == [("mine",)] and cur.provenance[0]["route"] == "remote"
    conn.rollback()


def test_a_session_currency_bound_lets_queries_without_a_clause_use_the_cache(
    backend: str, tmp_path: Path, conn: cache.Connection
) -> None:
    """connect(currency_bound=...) reads every block without a clause as if it ended
    with CURRENCY BOUND d; explicit clauses rule their own blocks."""
    plain = "SELECT a.name FROM authors a WHERE a.authorid = 4"
    with cache.connect(
        backend=backend, cache_path=conn.cache_path, currency_bound="10 min"
    ) as bounded:
        rows, routes = through_cache(bounded, plain)
        assert rows == pg(backend, plain) and routes == ["local"]
        rows, routes = through_cache(bounded, f"{plain} CURRENCY BOUND 1 MS")
        assert rows == pg(backend, plain) and routes == ["remote"]
        # a subquery block without a clause of its own takes the session's bound too
        nested = (
            "SELECT a.name FROM authors a WHERE a.authorid = 4 AND EXISTS "
            "(SELECT 1 FROM books b WHERE b.authorid = 4 AND b.price > 0)"
        )
        rows, routes = through_cache(bounded, nested)
        assert rows == pg(backend, nested) and routes == ["local", "local"]
    rows, routes = through_cache(conn, plain)  # unset: the strict default, bound 0
    assert routes == ["remote"]


def test_set_show_and_reset_currency_bound(backend: str, conn: cache.Connection) -> None:
    cur = conn.cursor()
    cur.execute("SHOW CURRENCY BOUND")
    assert cur.fetchall() == [("none",)] and cur.description[0][0] == "currency_bound"  # type: ignore[index]
    cur.execute("SET CURRENCY BOUND 10 MIN")
    assert conn.currency_bound == 600.0
    cur.execute("SHOW CURRENCY BOUND")
    assert cur.fetchall() == [("10 min",)]
    plain = "SELECT a.city FROM authors a WHERE a.authorid = 8"
    cur.execute(plain)
    assert cur.fetchall() == pg(backend, plain) and cur.provenance[0]["route"] == "local"
    cur.execute("EXPLAIN " + plain)  # the cache's plan, as the session reads the query
    assert cur.plan is not None and cur.plan.local
    cur.execute("RESET CURRENCY BOUND")
    assert conn.currency_bound is None
    cur.execute(plain)
    assert cur.provenance[0]["route"] == "remote"
    with pytest.raises(cache.ProgrammingError, match="not a duration"):
        conn.currency_bound = "10 fortnights"
    with pytest.raises(cache.ProgrammingError, match="0 or more"):
        conn.currency_bound = -1
    conn.currency_bound = dt.timedelta(minutes=2)
    assert conn.currency_bound == 120.0


def test_relations_the_cache_cannot_hold_are_read_from_the_backend(
    conn: cache.Connection, backend: str
) -> None:
    """With a session bound every query is planned, SQLAlchemy's reflection queries too: the
    backend's system catalogs, a temporary table and a table of another schema (even one named
    like a cached table) are answered by PostgreSQL; an unknown name is still an error."""
    with psycopg.connect(backend, autocommit=True) as other:
        other.execute(
            "CREATE SCHEMA elsewhere; CREATE TABLE elsewhere.authors AS "
            "SELECT authorid, 'Other ' || name AS name FROM authors"
        )
    # without a bound: PostgreSQL as written; its provenance is readable after the session's
    # transaction failed (naming the relation does not ask the backend)
    first = conn.cursor()
    first.execute("SELECT relname FROM pg_class LIMIT 1")
    with pytest.raises(cache.DataError):
        conn.cursor().execute("SELECT 1 / 0")
    assert [(p["table"], p["route"]) for p in first.provenance] == [("pg_class", "remote")]
    conn.rollback()
    conn.currency_bound = 600
    cur = conn.cursor()
    cur.execute("CREATE TEMPORARY TABLE scratch AS SELECT 4 AS authorid")
    queries = [
        "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relname LIKE 'auth%' "
        "ORDER BY 1",
        "SELECT table_name FROM information_schema.tables WHERE table_name = 'books'",
        "SELECT relname FROM pg_class WHERE relname = 'books'",
        "SELECT a.name FROM elsewhere.authors a WHERE a.authorid = 4",
        "SELECT a.name FROM authors a JOIN scratch s ON s.authorid = a.authorid",
    ]
    for sql in queries:
        with psycopg.connect(backend) as other:
            if "scratch" in sql:
                other.execute("CREATE TEMPORARY TABLE scratch AS SELECT 4 AS authorid")
            want = other.execute(sql).fetchall()
        cur.execute(sql)
        assert typed(cur.fetchall()) == typed(want) and want, sql
        assert {p["route"] for p in cur.provenance} == {"remote"}, sql
    assert "which the cache cannot hold" in str(cur_plan(conn, queries[3]).reason)
    with pytest.raises(cache.ProgrammingError, match="unknown table or view 'nowhere'"):
        cur.execute("SELECT * FROM nowhere")
    # a temporary table shadows the cached table of its name, until it is dropped
    shadow = "CREATE TEMPORARY TABLE authors AS SELECT 4 AS authorid, 'Temporary' AS name"
    sql = "SELECT a.name FROM authors a WHERE a.authorid = 4"
    cur.execute(shadow)
    cur.execute(sql)
    assert (cur.fetchall(), cur.provenance[0]["route"]) == ([("Temporary",)], "remote")
    cur.execute("DROP TABLE authors")  # the temporary one
    cur.execute(sql)
    assert (cur.fetchall(), cur.provenance[0]["route"]) == (pg(backend, sql), "local")


def test_a_subquerys_predicate_on_an_outer_table_does_not_restrict_its_leaf(
    backend: str, conn: cache.Connection
) -> None:
    """Inside NOT EXISTS, `b.authorid = 3` says nothing about which books reach the result:
    the remote leaf of books must not be cut down to author 3's."""
    conn.admit_on_miss = False
    query = (
        "SELECT count(*) FROM sales s JOIN books b ON s.isbn = b.isbn WHERE NOT EXISTS "
        "(SELECT 1 FROM reviewers r WHERE b.authorid = 3)"
    )
    rows, routes = through_cache(conn, f"{query} CURRENCY BOUND 10 MIN ON (s), 10 MIN ON (b)")
    assert rows == pg(backend, query) and rows[0][0] > 0
    assert routes == ["local", "remote", "remote"]


def test_the_gray_child_is_probed_through_the_join_on_its_controlling_key(
    backend: str, conn: cache.Connection
) -> None:
    """Equivalence classes: a.authorid = 4 and a.authorid = b.authorid make books probed with
    authorid 4 - bookcopy answers without `AND b.authorid = 4` written by hand; and a mixed
    plan's remote leaf of books is cut down to author 4's."""
    query = (
        "SELECT a.name, b.title FROM authors a JOIN books b ON a.authorid = b.authorid "
        "WHERE a.authorid = 4 ORDER BY b.title"
    )
    rows, routes = through_cache(conn, f"{query} CURRENCY BOUND 10 MIN ON (a, b)")
    assert rows == pg(backend, query) and routes == ["local", "local"]
    cur = conn.cursor()
    cur.execute(f"{query} CURRENCY BOUND 10 MIN ON (a), 0 SEC ON (b)")
    assert cur.fetchall() == rows
    assert [p["route"] for p in cur.provenance] == ["local", "remote"]
    assert cur.executed is not None and cur.executed.duckdb_sql is not None
    (leaf,) = cur.executed.leaves
    assert '"authorid" = 4' in leaf  # the leaf reads author 4's books only


def test_remote_leaves_are_read_in_one_backend_snapshot(backend: str) -> None:
    """The first pooled connection exports its snapshot, the others join it - six
    leaves on the pool's four connections all see one snapshot."""
    from cache.backend.pool import in_one_snapshot

    def snapshot(conn: psycopg.Connection[object]) -> str:
        row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
        assert row is not None
        return str(row[0])

    seen = in_one_snapshot(backend, [snapshot] * 6)
    assert len(seen) == 6 and len(set(seen)) == 1


def test_a_class_of_two_remote_leaves_joins_locally(backend: str, conn: cache.Connection) -> None:
    """Sales local; authors and books must come from one snapshot no older than 1 s: both
    are read as remote leaves, in one backend snapshot, and joined in DuckDB."""
    conn.admit_on_miss = False
    query = (
        "SELECT a.name, sum(s.qty) FROM sales s JOIN books b ON s.isbn = b.isbn "
        "JOIN authors a ON a.authorid = b.authorid WHERE a.authorid = 3 "
        "GROUP BY a.name"
    )
    clause = "CURRENCY BOUND 10 MIN ON (s), 1 SECONDS ON (a, b)"
    explained = cur_plan(conn, f"{query} {clause}")
    assert explained.local  # the leaves of author 3 and her books are few: cheaper than all
    cur = conn.cursor()
    cur.execute(f"{query} {clause}")
    assert cur.fetchall() == pg(backend, query)
    assert [p["route"] for p in cur.provenance] == ["local", "remote", "remote"]
    assert cur.executed is not None and len(cur.executed.leaves) == 2
    assert_ran_as_explained(cur, explained)
