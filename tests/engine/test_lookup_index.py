"""Point lookups answered from a lookup index (`cache.execution.lookup`): the same answers as
PostgreSQL's, in values and types, for integer and text keys, keys with several rows, NULL and
parameters of other types; an index stale after its view changes is never used, and is built
again; a view too large to index on the statement's thread is indexed in the background."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import random
import typing as t
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import cache
from cache.engine.lane import Lane
from cache.engine.read import Suspended, at_hand
from cache.engine.result import Result
from cache.engine.route import CachedRead
from cache.engine.session import Session
from cache.execution.lookup import LookupIndexes, lookup_shape
from cache.store.counters import Counter
from tests.answers import assert_same_answer, cached_copies, typed

BOUND = " CURRENCY BOUND 10 MIN"
NAMES = ("p0", "p1")  # the DuckDB names of a statement's parameters, in order


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT a, b FROM v AS t WHERE k = $p0",
        "SELECT * FROM v WHERE k = $p0 AND j = $p1",
        "SELECT t.a AS x, t.* FROM v AS t WHERE $p0 = t.k",
    ],
)
def test_point_lookups_are_recognized(sql: str) -> None:
    shape = lookup_shape(sql, NAMES)
    assert shape is not None
    assert shape.params == tuple(range(sql.count("$")))  # where each key's value is


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT a + 1 FROM v WHERE k = $p0",  # an expression could fail on rows never looked up
        "SELECT a FROM v WHERE k = $p0 ORDER BY a",
        "SELECT a FROM v WHERE k = $p0 LIMIT 1",
        "SELECT DISTINCT a FROM v WHERE k = $p0",
        "SELECT a FROM v JOIN w ON v.a = w.a WHERE k = $p0",
        "SELECT a FROM v WHERE k = $p0 OR j = $p1",
        "SELECT a FROM v WHERE k = 3",
        "SELECT a FROM v WHERE k > $p0",
        "SELECT a FROM v WHERE k = $p0 AND j = $p0",
        "SELECT count(*) FROM v WHERE k = $p0",
        "SELECT a FROM v WHERE k = $p0 GROUP BY a",
        "SELECT a FROM (SELECT * FROM v) AS s WHERE k = $p0",
        "SELECT a FROM v",
    ],
)
def test_other_statements_are_not_lookups(sql: str) -> None:
    assert lookup_shape(sql, NAMES) is None


@pytest.fixture(scope="module")
def backend(backend_dsn: str) -> str:
    with psycopg.connect(backend_dsn, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS people, readings")
        setup.execute(
            "CREATE TABLE people (id integer PRIMARY KEY, name text, team text, "
            "score numeric(6,2), born date, big bigint, flag boolean, "
            "ratio double precision, seen timestamptz, at timestamp)"
        )
        setup.execute(
            "INSERT INTO people SELECT g, 'p' || g, CASE WHEN g % 7 = 0 THEN NULL "
            "ELSE 't' || (g % 5) END, g * 1.25, date '2000-01-01' + g, g * 10000000000, "
            "g % 2 = 0, g / 7.0, "
            "timestamptz '2024-03-01 12:00+00' + g * interval '1 hour 1 second', "
            "timestamp '2024-03-01 12:00' + g * interval '1 minute 0.5 second' "
            "FROM generate_series(1, 200) g"
        )
        setup.execute("CREATE TABLE readings (id integer PRIMARY KEY, v double precision)")
        setup.execute("INSERT INTO readings SELECT g, g / 3.0 FROM generate_series(1, 60000) g")
    return backend_dsn


@pytest.fixture
def conn(backend: str, tmp_path: Path) -> Iterator[cache.Connection]:
    with cached_copies(
        backend,
        tmp_path / "c.duckdb",
        "CREATE CACHED VIEW peoplecopy AS SELECT * FROM people;"
        "CREATE CACHED VIEW readingscopy AS SELECT * FROM readings",
    ) as conn:
        yield conn


def lookups(conn: cache.Connection) -> LookupIndexes:
    memo = conn.engine.memo
    assert memo is not None and memo.lookups is not None
    return memo.lookups


QUERIES = [
    ("SELECT p.name, p.score, p.born FROM people p WHERE p.id = %s", lambda r: r.randint(-2, 205)),
    (
        "SELECT id, name, team, born FROM people WHERE team = %s",
        lambda r: r.choice(["t0", "t1", "t4", "t9", ""]),
    ),
    ("SELECT id, team FROM people WHERE big = %s", lambda r: r.randint(0, 210) * 10000000000),
    (
        "SELECT p.flag, p.ratio, p.at, p.id FROM people p WHERE p.id = %s",
        lambda r: r.randint(1, 200),
    ),
]


def test_lookups_answer_as_postgresql(conn: cache.Connection, backend: str) -> None:
    draw = random.Random(27)
    index = lookups(conn)
    for sql, key in QUERIES:
        before = index.answered
        for _ in range(40):
            answer = assert_same_answer(conn, backend, sql + BOUND, sql, (key(draw),))
            assert answer.route == "local", (sql, answer.reason)
        assert index.answered > before + 30, sql  # after a few runs, the index answers
    two = "SELECT id, name FROM people WHERE team = %s AND id = %s"
    for values in [("t1", 11), ("t1", 12), (None, 14), ("t2", None), ("t0", 14)] * 2:
        assert_same_answer(conn, backend, two + BOUND, two, values)
    # parameters of other types than the key's: the index does not answer them, DuckDB does
    sql = QUERIES[0][0]
    built = index.built
    for value in (3.0, 3.5, decimal.Decimal("4"), "5") * 2:
        before = index.answered
        assert_same_answer(conn, backend, sql + BOUND, sql, (value,))
        assert index.answered == before, value
    assert index.built == built  # and its index, current, is not built again for them
    for _ in range(2):  # NULL matches no key
        assert_same_answer(conn, backend, sql + BOUND, sql, (None,))
    # a date key, a value with a time zone: never indexed, DuckDB answers
    for sql, value in [
        ("SELECT id FROM people WHERE born = %s", dt.date(2000, 1, 9)),
        ("SELECT seen, name FROM people WHERE id = %s", 9),
    ]:
        before = index.answered
        for _ in range(6):
            assert_same_answer(conn, backend, sql + BOUND, sql, (value,))
        assert index.answered == before, sql


def test_a_changed_view_is_never_answered_from_its_old_index(
    conn: cache.Connection, backend: str
) -> None:
    sql = QUERIES[0][0]
    index = lookups(conn)
    for key in range(1, 10):
        assert_same_answer(conn, backend, sql + BOUND, sql, (key,))
    answered = index.answered
    assert answered > 0
    with psycopg.connect(backend, autocommit=True) as other:
        other.execute("UPDATE people SET name = 'changed' WHERE id = 3")
        other.execute("DELETE FROM people WHERE id = 4")
    conn.admin.refresh("peoplecopy")
    for key in (3, 4, 5, 6, 7, 8, 3, 4):
        assert_same_answer(conn, backend, sql + BOUND, sql, (key,))
    assert conn.execute(sql + BOUND, (3,)).fetchall()[0][0] == "changed"
    assert index.answered > answered  # built again on the changed view, and answering
    with psycopg.connect(backend, autocommit=True) as other:
        other.execute("UPDATE people SET name = 'p3' WHERE id = 3")
        other.execute(
            "INSERT INTO people SELECT 4, 'p4', 't4', 5.00, date '2000-01-05', 40000000000"
        )


def test_a_large_view_is_indexed_in_the_background(conn: cache.Connection, backend: str) -> None:
    sql = "SELECT r.v FROM readings r WHERE r.id = %s"
    index = lookups(conn)
    for key in range(1, 6):
        assert_same_answer(conn, backend, sql + BOUND, sql, (key,))
    index.wait()
    before = index.answered
    draw = random.Random(3)
    for _ in range(50):
        assert_same_answer(conn, backend, sql + BOUND, sql, (draw.randint(0, 60001),))
    assert index.answered == before + 50
    assert any(entry["keys"] == 60000 for entry in index.summary())


def test_a_lane_answers_as_the_full_path_while_nothing_it_depends_on_changes(
    conn: cache.Connection, backend: str
) -> None:
    """A read's lane (`Session.read` with ``lane``, the server's hit path): for a statement
    answered at hand, other
    keys of the same type get `read_locally`'s rows, counted and noted alike (the provenance
    EXPLAIN LAST STATEMENT shows); it answers None, with nothing counted, for a key of another
    type, once its decision has expired, while decisions are observed and after the cache
    file changed (a refresh); a session with a timeline gets no lane."""
    session = conn.session
    assert isinstance(session, Session)
    sql = QUERIES[0][0]
    routed = session.route(sql + BOUND, with_params=True)
    assert isinstance(routed, CachedRead)
    query = routed.query
    for key in range(1, 6):  # DuckDB answers, then the index is built
        assert_same_answer(conn, backend, sql + BOUND, sql, (key,))
    lookups(conn).wait()
    _, lane = read_with_lane(session, query, [3])
    assert lane is not None

    def counted() -> tuple[int, int]:
        return session.counters[Counter.HITS], session.counters[Counter.MEMO_HITS]

    def accesses() -> list[tuple[t.Any, ...]]:
        return [
            (a.table, a.route, a.view, a.regions, a.snapshot_ids, a.stale)
            for a in session.last_provenance()
        ]

    for key in (3, 7, 250, -1):
        before = counted()
        rows = lane.rows([key])
        assert rows is not None
        assert counted() == (before[0] + 1, before[1] + 1)
        noted = accesses()
        waited = session.read_locally(query, [key])
        assert waited is not None and typed(rows) == typed(waited.rows)
        assert noted == accesses() and noted[0][1] == "local"
    before = counted()
    assert lane.rows(["3"]) is None and lane.rows([3.0]) is None and lane.rows([None]) is None
    expired = dataclasses.replace(lane, expires=session.state.now() - dt.timedelta(seconds=1))
    assert expired.rows([3]) is None
    conn.engine.on_decision = lambda plan, decision: None
    try:
        assert lane.rows([3]) is None
    finally:
        conn.engine.on_decision = None
    assert counted() == before
    with psycopg.connect(backend, autocommit=True) as other:
        other.execute("UPDATE people SET name = 'renamed' WHERE id = 3")
    try:
        conn.admin.refresh("peoplecopy")
        assert lane.rows([3]) is None
        assert_same_answer(conn, backend, sql + BOUND, sql, (3,))
    finally:
        with psycopg.connect(backend, autocommit=True) as other:
            other.execute("UPDATE people SET name = 'p3' WHERE id = 3")
        conn.admin.refresh("peoplecopy")
    conn.execute("BEGIN TIMEORDERED")
    try:
        for key in range(1, 6):  # (the refresh made the index stale: built again)
            assert_same_answer(conn, backend, sql + BOUND, sql, (key,))
        lookups(conn).wait()
        answer, lane = read_with_lane(session, query, [3])
        assert lane is None
        waited = session.read_locally(query, [3])
        assert waited is not None and typed(answer.rows) == typed(waited.rows)
    finally:
        conn.execute("END TIMEORDERED")


def read_with_lane(
    session: Session, query: t.Any, params: list[t.Any]
) -> tuple[Result, Lane | None]:
    """A read answered at hand, and the lane it leaves (as the server's event loop asks)."""
    reading = at_hand(session.read(query, params, lane=True))
    assert not isinstance(reading, Suspended) and reading.result is not None
    return reading.result, reading.lane


def test_an_answer_at_hand_never_waits_and_is_counted_once(
    conn: cache.Connection, backend: str
) -> None:
    """What the server's event loop asks (`Session.read` as far as it goes at hand): until
    the plan is made and the index built, the read stops where it would wait with nothing
    counted; then the same answer as waiting gives, each counted once; after a refresh, it
    stops again until the index is built again."""
    session = conn.session
    assert isinstance(session, Session)
    sql = QUERIES[0][0]
    routed = session.route(sql + BOUND, with_params=True)
    assert isinstance(routed, CachedRead)
    # a fully materialized view: one guard decision serves every key
    assert not session.prepare(routed.query, [1]).plan.guards_read_parameters

    def answered_at_hand(key: int) -> Result | Suspended:
        found = at_hand(session.read(routed.query, [key]))
        return found if isinstance(found, Suspended) or found.result is None else found.result

    def counted() -> tuple[int, int, int]:
        memo = conn.engine.memo
        assert memo is not None
        return (
            session.counters[Counter.HITS],
            session.counters[Counter.MEMO_HITS],
            memo.results.misses,
        )

    for _ in range(2):
        before = counted()
        assert isinstance(answered_at_hand(5), Suspended)
        assert counted() == before
        for key in range(1, 6):  # DuckDB answers, then the index is built
            assert_same_answer(conn, backend, sql + BOUND, sql, (key,))
        before = counted()
        for key in (3, 7, 250):
            found = answered_at_hand(key)
            assert isinstance(found, Result)
            waited = session.read_locally(routed.query, [key])
            assert waited is not None and found.rows == waited.rows
            assert found.description == waited.description
        hits, memo_hits, misses = counted()
        assert (hits - before[0], memo_hits - before[1], misses) == (6, 6, before[2])
        with psycopg.connect(backend, autocommit=True) as other:
            other.execute("UPDATE people SET name = name WHERE id = 1")
        conn.admin.refresh("peoplecopy")
