"""The Spark refresh engine: tasks in their own backend sessions, one exported snapshot."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.reflect import fetch_catalog
from cache.maintenance.pipeline import Maintainer
from cache.maintenance.spark import SparkEngine, block_ranges
from cache.store.cache_file import CacheStore
from cache.tools import bookstore
from sql_ext import parse
from sql_ext.errors import OperationalError
from tests.maintenance.test_maintenance import assert_mirrors_backend, local, pg
from tests.store.test_store import SCHEMA_FILE, dump

SALES = "CREATE CACHED VIEW salescopy AS SELECT * FROM sales REFRESH EVERY 1 MIN;"


@pytest.fixture
def backend(pg_cluster: EmbeddedPostgres, request: pytest.FixtureRequest) -> str:
    dsn = pg_cluster.create_database("s_" + request.node.name[:40])
    bookstore.load_into(dsn, {"sales": 60000})
    return dsn


@pytest.fixture
def store(backend: str, tmp_path: Path) -> Iterator[CacheStore]:
    opened = CacheStore(tmp_path / "cache.duckdb")
    opened.save_catalog(fetch_catalog(backend))
    opened.apply_ddl(parse(SCHEMA_FILE.read_text() + SALES), opened.load_catalog())
    yield opened
    opened.close()


def test_block_ranges_split_the_heap_and_leave_the_end_open() -> None:
    assert block_ranges(100, 1) == [None]
    assert block_ranges(3, 8) == [None]
    assert block_ranges(10, 3) == [
        "ctid >= '(0,0)'::tid AND ctid < '(3,0)'::tid",
        "ctid >= '(3,0)'::tid AND ctid < '(6,0)'::tid",
        "ctid >= '(6,0)'::tid",
    ]


def test_spark_admission_mirrors_the_backend(
    store: CacheStore, backend: str, spark_engine: SparkEngine
) -> None:
    maintainer = Maintainer(store, backend, spark_engine)
    maintainer.admit("citylist_csct", [("Madison",)])
    maintainer.admit("authorlist_pct", [(4,), (8,), (5,)])
    maintainer.admit("reviewerlist_pct", [(2,)])
    assert_mirrors_backend(store, backend)
    assert local(store, "SELECT DISTINCT engine FROM mtcache.snapshots") == [("spark",)]


def test_a_split_pull_reads_one_snapshot_in_every_task(
    store: CacheStore, backend: str, spark_engine: SparkEngine
) -> None:
    """A writer restamps every sale in each transaction while the tasks pull disjoint block
    ranges: all pulled rows must carry one stamp, and the full table must arrive once."""
    pages = fetch_catalog(backend).table("sales").pages  # type: ignore[union-attr]
    assert pages // spark_engine.min_pages_per_task >= 2, "the pull must be split"
    pg(backend, "UPDATE sales SET qty = 0")  # every committed state has one stamp from here on
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(backend, autocommit=True) as conn:
            n = 0
            while not stop.is_set() and n < 200:
                n += 1
                conn.execute("UPDATE sales SET qty = %s", (n,))

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(3):
            Maintainer(store, backend, spark_engine).refresh("salescopy")
            stamps = local(store, "SELECT DISTINCT qty FROM salescopy")
            assert len(stamps) == 1, stamps
            assert local(store, "SELECT count(*), count(DISTINCT saleid) FROM salescopy") == [
                (60000, 60000)
            ]
    finally:
        stop.set()
        writer.join()
    assert sorted(local(store, "SELECT saleid FROM salescopy"))[-1] == (60000,)


def test_a_failed_spark_task_leaves_the_cache_unchanged(
    store: CacheStore, backend: str, spark_engine: SparkEngine
) -> None:
    Maintainer(store, backend, spark_engine).refresh("salescopy")
    pg(backend, "UPDATE sales SET qty = qty + 1")
    before = dump(store)
    with pytest.raises(OperationalError, match=r"a Spark task failed.*InjectedFault"):
        Maintainer(store, backend, spark_engine, faults_enabled=["task"]).refresh("salescopy")
    assert dump(store) == before


def test_a_derived_view_is_refreshed_on_spark(
    store: CacheStore, backend: str, spark_engine: SparkEngine
) -> None:
    """The backend's computation of a derived view, pulled by a Spark task in the
    operation's snapshot, is what PostgreSQL computes (values and Python types)."""
    store.apply_ddl(
        parse(
            "CREATE CACHED VIEW daily AS SELECT s.sold_on, count(*) AS sales, "
            "sum(s.qty) AS sold, avg(s.qty) AS mean FROM sales s "
            "GROUP BY s.sold_on"
        ),
        store.load_catalog(),
    )
    Maintainer(store, backend, spark_engine).refresh("daily")
    want = pg(
        backend,
        "SELECT sold_on, count(*), sum(qty), sum(qty)::numeric, count(qty) "
        "FROM sales GROUP BY sold_on",
    )
    got = local(store, "SELECT * FROM daily")
    assert want and sorted(got) == sorted(want)
    assert {tuple(map(type, row)) for row in got} == {tuple(map(type, row)) for row in want}
    assert local(store, "SELECT DISTINCT engine FROM mtcache.snapshots") == [("spark",)]
