"""The cache within its size budget (issue 30): with ``cache_size_limit`` set, admissions,
refreshes and stream batches evict whole presence regions (with their cascade) to stay under
it; a statement never reads an evicted region (the guards see an eviction with its commit);
every answer is PostgreSQL's. The eviction policy, the decayed hits and the doorkeeper are
checked apart, on explicit times."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import cache
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.engine.admission import Doorkeeper
from cache.maintenance.budget import BudgetExceeded
from cache.store.budget import RegionHits, parse_size
from cache.store.counters import Counter
from optimizer.rules.eviction_policy import Held, victims
from tests.answers import assert_same_answer

ITEMS = 400
DDL = """
CREATE CONTROL TABLE item_pct (id integer);
CREATE CACHED VIEW itemcopy AS SELECT * FROM items PRESENCE ON (id) IN item_pct;
CREATE CACHED VIEW linecopy AS SELECT * FROM lines PRESENCE ON (itemid) IN itemcopy (id)
    CONSISTENCY ROOT;
"""
POINT = "SELECT i.id, i.grp, i.val FROM items i WHERE i.id = %s"
JOINED = (
    "SELECT i.id, i.val, l.lineid, l.qty FROM items i JOIN lines l ON l.itemid = i.id "
    "WHERE i.id = %s ORDER BY l.lineid"
)


@pytest.fixture(scope="module")
def budget_dsn(pg_cluster: EmbeddedPostgres) -> Iterator[str]:
    dsn = pg_cluster.create_database("budget")
    with psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute(
            "CREATE TABLE items (id integer PRIMARY KEY, grp integer NOT NULL, val text NOT NULL)"
        )
        pg.execute(
            "CREATE TABLE lines (lineid integer PRIMARY KEY, itemid integer NOT NULL, "
            "qty numeric(8,2))"
        )
        pg.execute(
            f"INSERT INTO items SELECT g, g % 7, repeat('v', 1 + g % 40) || g FROM "
            f"generate_series(1, {ITEMS}) g"
        )
        pg.execute(
            f"INSERT INTO lines SELECT g, 1 + g % {ITEMS}, g / 7.0 FROM "
            f"generate_series(1, {3 * ITEMS}) g"
        )
    yield dsn


def _data_bytes(conn: cache.Connection) -> int:
    return int(conn.admin.status()["resources"]["data_bytes"])


def _held(conn: cache.Connection) -> set[int]:
    return {k for (k,) in conn.admin.store.con.execute("SELECT id FROM item_pct").fetchall()}


def _per_key(dsn: str, path: Path) -> float:
    """The data's bytes per admitted item (its row and its lines), measured without a budget."""
    with cache.connect(dsn, path, background=False, admit_on_miss=False) as conn:
        conn.admin.apply_ddl(DDL)
        conn.admin.admit("item_pct", [(k,) for k in range(1, 81)])
        return _data_bytes(conn) / 80


def test_a_random_workload_stays_within_the_budget_and_gets_postgresql_s_answers(
    budget_dsn: str, tmp_path: Path
) -> None:
    """Zipf-like point and join queries admitting on a miss, explicit admissions and refreshes
    after backend writes: after every step the data is within the budget; a query is local
    exactly when its key is held (an evicted one goes to the backend at once); every answer
    is PostgreSQL's (values, types, description)."""
    path = tmp_path / "c.duckdb"
    limit = int(_per_key(budget_dsn, tmp_path / "m.duckdb") * 60)  # about 60 of the 400 items
    rng = random.Random(30)
    weights = [1 / k for k in range(1, ITEMS + 1)]
    order = list(range(1, ITEMS + 1))
    rng.shuffle(order)  # (the popular keys are not the smallest ones)
    with (
        cache.connect(budget_dsn, path, background=False, cache_size_limit=limit) as conn,
        psycopg.connect(budget_dsn, autocommit=True) as pg,
    ):
        conn.admin.apply_ddl(DDL)
        assert conn.admin.status()["resources"]["cache_size_limit"] == limit
        routes = {"local": 0, "remote": 0}
        for step in range(260):
            roll = rng.random()
            if roll < 0.05:
                key = rng.randint(1, ITEMS)
                pg.execute("UPDATE items SET val = val || 'w' WHERE id = %s", (key,))
                conn.admin.refresh("itemcopy")
            elif roll < 0.10:
                conn.admin.admit("item_pct", [(k,) for k in rng.sample(range(1, ITEMS + 1), 8)])
            else:
                key = rng.choices(order, weights)[0]
                held = key in _held(conn)
                sql, bound = (POINT, "i") if roll < 0.7 else (JOINED, "i, l")
                bounded = f"{sql} CURRENCY BOUND 10 MIN ON ({bound})"
                answer = assert_same_answer(conn, budget_dsn, bounded, sql, (key,))
                assert answer.route == ("local" if held else "remote"), (step, key, held)
                routes[answer.route] += 1
                conn.engine.admissions.wait()  # type: ignore[union-attr]
            assert _data_bytes(conn) <= limit, step
        counters = conn.admin.status()["counters"]
        assert counters[Counter.EVICTIONS] > 50 and counters[Counter.BUDGET_OVERRUNS] == 0
        assert routes["local"] > routes["remote"] > 0, routes  # the popular keys stay
        # every row held belongs to a held region, the cascade included
        con = conn.admin.store.con
        assert con.execute(
            "SELECT count(*) FROM itemcopy WHERE id NOT IN (SELECT id FROM item_pct)"
        ).fetchone() == (0,)
        assert con.execute(
            "SELECT count(*) FROM linecopy WHERE itemid NOT IN (SELECT id FROM itemcopy)"
        ).fetchone() == (0,)
        kept = sorted(_held(conn))
        assert (
            con.execute("SELECT * FROM itemcopy ORDER BY id").fetchall()
            == pg.execute("SELECT * FROM items WHERE id = ANY(%s) ORDER BY id", (kept,)).fetchall()
        )


def test_an_admission_the_budget_cannot_hold_fails_and_changes_nothing(
    budget_dsn: str, tmp_path: Path
) -> None:
    path = tmp_path / "c.duckdb"
    per_key = _per_key(budget_dsn, path)
    with cache.connect(
        budget_dsn, path, background=False, admit_on_miss=False, cache_size_limit=int(per_key * 100)
    ) as conn:
        before = _held(conn)
        with pytest.raises(BudgetExceeded, match="above its cache_size_limit") as caught:
            conn.admin.admit("item_pct", [(k,) for k in range(101, 301)])
        assert isinstance(caught.value, cache.OperationalError)
        assert "nothing was changed" in str(caught.value)
        assert _held(conn) == before
        assert conn.admin.store.con.execute(
            "SELECT count(*) FROM itemcopy WHERE id > 100"
        ).fetchone() == (0,)
        conn.admin.admit("item_pct", [(k,) for k in range(101, 131)])  # (within: it evicts)
        assert _data_bytes(conn) <= per_key * 100
        assert set(range(101, 131)) <= _held(conn)


def test_the_doorkeeper_admits_on_a_second_miss(budget_dsn: str, tmp_path: Path) -> None:
    """With ``doorkeeper_seconds`` a key's first miss is counted, not admitted; its second
    miss admits it."""
    with cache.connect(
        budget_dsn, tmp_path / "c.duckdb", background=False, doorkeeper_seconds=3600
    ) as conn:
        conn.admin.apply_ddl(DDL)
        sql = POINT + " CURRENCY BOUND 10 MIN ON (i)"
        for expected_held in (False, True):
            assert_same_answer(conn, budget_dsn, sql, POINT, (7,))
            conn.engine.admissions.wait()  # type: ignore[union-attr]
            assert (7 in _held(conn)) is expected_held
        answer = assert_same_answer(conn, budget_dsn, sql, POINT, (7,))
        assert answer.route == "local"
        assert conn.session.counters[Counter.DEFERRED_ADMISSIONS] == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("given", [0, -5, "lots", "12 parsecs", True, 2.5])
def test_a_bad_cache_size_limit_is_refused_before_anything_is_opened(
    budget_dsn: str, tmp_path: Path, given: object
) -> None:
    with pytest.raises(cache.ProgrammingError, match="cache_size_limit must"):
        cache.connect(budget_dsn, tmp_path / "c.duckdb", cache_size_limit=given)  # type: ignore[arg-type]
    assert not (tmp_path / "c.duckdb").exists()


# -- without a database ---------------------------------------------------------------------


def test_sizes_read_as_duckdb_reads_its_memory_limit() -> None:
    assert parse_size(1000) == 1000
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size(" 1.5 kb ") == 1500
    assert parse_size("4096") == 4096


def test_the_policy_evicts_the_least_worth_per_byte_first() -> None:
    hot_small = Held("c", (1,), rows=1, bytes=100, hits=9.0, saved=8.0)
    cold_big = Held("c", (2,), rows=50, bytes=5000, hits=1.0, saved=8.0)
    never_hit = Held("c", (3,), rows=1, bytes=100)
    costly = Held("c", (4,), rows=1, bytes=100, hits=1.0, saved=0.1, refreshes=10.0)
    order = victims([hot_small, cold_big, never_hit, costly], 10**9)
    assert order == [costly, never_hit, cold_big, hot_small]
    assert victims([hot_small, cold_big, never_hit, costly], 150) == [costly, never_hit]
    assert victims([], 100) == []


def test_reads_halve_each_window_and_outlive_what_is_evicted() -> None:
    hits = RegionHits(half_life=10.0)
    hits.hit("c", (1,), 4.0, now=0.0)
    hits.hit("c", (1,), 4.0, now=1.0)
    assert hits.worth("c", (1,), now=2.0) == (2.0, 4.0)
    assert hits.worth("c", (1,), now=10.0) == (1.0, 4.0)
    hits.hit("c", (1,), 1.0, now=20.0)  # 0.5 left, one more; what a hit saves is the last's
    assert hits.worth("c", (1,), now=20.0) == (1.5, 1.0)
    count, saved = hits.worth("c", (2,), now=20.0)  # never read: the table's mean
    assert count == 0.0 and 1.0 < saved < 4.0
    assert hits.worth("d", (1,), now=20.0) == (0.0, 0.0)


def test_the_sketch_never_counts_a_key_under_its_reads() -> None:
    hits = RegionHits(width=64)  # (small: keys share counters)
    for key in range(500):
        for _ in range(key % 5):
            hits.hit("c", (key,), 1.0, now=0.0)
    assert all(hits.worth("c", (key,), now=0.0)[0] >= key % 5 for key in range(500))


def test_the_doorkeeper_forgets_a_first_miss_after_its_window() -> None:
    now = [0.0]
    gate = Doorkeeper(60, clock=lambda: now[0])
    item = ("ctl", (1,))
    assert not gate.admits(item)
    now[0] = 61.0
    assert not gate.admits(item)  # too late: a first miss again
    now[0] = 100.0
    assert gate.admits(item)
    assert not gate.admits(item)  # (admitted: a miss after that is a first one again)
