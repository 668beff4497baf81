"""The result memo of the hit path (`cache.execution.memo`): a local answer is reused only
while the views it read are unchanged, never for statements that read the clock or random
numbers, within its memory bound; counted in `mtcache status`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import cache
from cache.execution.memo import ResultMemo
from cache.store.counters import Counter
from tests.answers import assert_same_answer, cached_copies

POINT = "SELECT i.id, i.price FROM items i WHERE i.id = %s"
BOUND = " CURRENCY BOUND 10 MIN"


@pytest.fixture(scope="module")
def backend(backend_dsn: str) -> str:
    with psycopg.connect(backend_dsn, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS items, others")
        setup.execute("CREATE TABLE items (id integer PRIMARY KEY, price numeric(8,2))")
        setup.execute("INSERT INTO items SELECT g, g * 1.5 FROM generate_series(1, 50) g")
        setup.execute("CREATE TABLE others (id integer PRIMARY KEY)")
        setup.execute("INSERT INTO others VALUES (1)")
    return backend_dsn


@pytest.fixture
def conn(backend: str, tmp_path: Path) -> Iterator[cache.Connection]:
    with cached_copies(
        backend,
        tmp_path / "c.duckdb",
        "CREATE CACHED VIEW itemscopy AS SELECT * FROM items;"
        "CREATE CACHED VIEW otherscopy AS SELECT * FROM others",
    ) as conn:
        yield conn


def memo_counts(conn: cache.Connection) -> tuple[int, int]:
    counters = conn.session.counters  # this connection's, not yet flushed to the file
    return counters[Counter.MEMO_HITS], counters[Counter.MEMO_MISSES]


def test_an_answer_is_reused_until_its_view_changes(conn: cache.Connection, backend: str) -> None:
    first = assert_same_answer(conn, backend, POINT + BOUND, POINT, (7,))
    again = assert_same_answer(conn, backend, POINT + BOUND, POINT, (7,))
    assert first.route == again.route == "local"
    assert memo_counts(conn) == (1, 1)
    assert_same_answer(conn, backend, POINT + BOUND, POINT, (8,))  # other parameters: kept anew
    assert memo_counts(conn) == (1, 2)
    with psycopg.connect(backend, autocommit=True) as other:
        other.execute("UPDATE items SET price = 99.99 WHERE id = 7")
    conn.admin.refresh("otherscopy")  # another view changed: the answer stays valid
    rows = conn.execute(POINT + BOUND, (7,)).fetchall()
    assert [tuple(map(str, r)) for r in rows] == [("7", "10.50")] and memo_counts(conn) == (2, 2)
    conn.admin.refresh("itemscopy")  # its own view changed: DuckDB answers again
    assert_same_answer(conn, backend, POINT + BOUND, POINT, (7,))
    assert memo_counts(conn) == (2, 3)
    conn.close()
    with cache.Admin.open(conn.cache_path) as admin:
        status = admin.status()
    assert (
        status["counters"][Counter.MEMO_HITS] == 2 and status["counters"][Counter.MEMO_MISSES] == 3
    )


def test_statements_reading_the_clock_are_never_reused(conn: cache.Connection) -> None:
    for sql in (
        "SELECT i.id, now() FROM items i WHERE i.id = 1",
        "SELECT i.id FROM items i WHERE i.id = 1 AND random() < 2",
    ):
        for _ in range(2):
            conn.execute(sql + BOUND).fetchall()
    assert memo_counts(conn) == (0, 0)


def test_parameters_of_different_types_are_different_keys(
    conn: cache.Connection, backend: str
) -> None:
    sql = "SELECT i.id, i.price FROM items i WHERE i.id = %s"
    routes = [
        assert_same_answer(conn, backend, sql + BOUND, sql, (factor,)).route
        for factor in (2, 2.0, 2, 2.0)
    ]
    assert routes == ["local"] * 4 and memo_counts(conn) == (2, 2)


def test_the_memo_can_be_turned_off(backend: str, tmp_path: Path) -> None:
    with cache.connect(
        backend=backend, cache_path=tmp_path / "off.duckdb", result_memo_bytes=0
    ) as conn:
        conn.admin.apply_ddl("CREATE CACHED VIEW itemscopy AS SELECT * FROM items")
        conn.admin.refresh()
        for _ in range(3):
            assert_same_answer(conn, backend, POINT + BOUND, POINT, (3,))
        assert memo_counts(conn) == (0, 0)
    for wrong in (-1, 1.5, "64MB", True):
        with pytest.raises(cache.ProgrammingError, match="result_memo_bytes"):
            cache.connect(
                backend=backend, cache_path=tmp_path / "x.duckdb", result_memo_bytes=wrong
            )  # type: ignore[arg-type]


def test_the_memo_keeps_within_its_bound_least_recently_used_first() -> None:
    memo = ResultMemo(max_bytes=64_000)
    rows = [(i, "x") for i in range(40)]  # ~7 KB each by the estimate
    for key in range(20):
        memo.put(key, (0,), None, rows)
        memo.get(0, (0,))  # key 0 stays recently used
    assert memo.used <= memo.max_bytes
    assert memo.get(0, (0,)) is not None and memo.get(1, (0,)) is None
    assert memo.get(19, (0,)) is not None and memo.get(19, (1,)) is None  # another token
    memo.put("huge", (0,), None, [(1, 2)] * 10_000)  # over an eighth of the bound: not kept
    assert memo.get("huge", (0,)) is None
