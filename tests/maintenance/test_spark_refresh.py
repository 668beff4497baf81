"""The Spark refresh engine: tasks in their own backend sessions, one exported snapshot."""

from __future__ import annotations

import pytest

from cache.backend.reflect import fetch_catalog
from cache.maintenance.pipeline import Maintainer
from cache.maintenance.spark import SparkEngine, block_ranges
from cache.store.cache_file import CacheStore
from sql_ext import parse
from sql_ext.errors import OperationalError
from tests.maintenance.conftest import restamping
from tests.maintenance.test_maintenance import assert_mirrors_backend, local, pg
from tests.store.test_store import dump


def test_block_ranges_split_the_heap_and_leave_the_end_open() -> None:
    assert block_ranges(100, 1) == [None]
    assert block_ranges(3, 8) == [None]
    assert block_ranges(10, 3) == [
        "ctid >= '(0,0)'::tid AND ctid < '(3,0)'::tid",
        "ctid >= '(3,0)'::tid AND ctid < '(6,0)'::tid",
        "ctid >= '(6,0)'::tid",
    ]


def test_spark_admission_mirrors_the_backend(
    sales_store: CacheStore, sales_dsn: str, spark_engine: SparkEngine
) -> None:
    maintainer = Maintainer(sales_store, sales_dsn, spark_engine)
    maintainer.admit("citylist_csct", [("Madison",)])
    maintainer.admit("authorlist_pct", [(4,), (8,), (5,)])
    maintainer.admit("reviewerlist_pct", [(2,)])
    assert_mirrors_backend(sales_store, sales_dsn)
    assert local(sales_store, "SELECT DISTINCT engine FROM mtcache.snapshots") == [("spark",)]


def test_a_split_pull_reads_one_snapshot_in_every_task(
    sales_store: CacheStore, sales_dsn: str, spark_engine: SparkEngine
) -> None:
    """A writer restamps every sale in each transaction while the tasks pull disjoint block
    ranges: all pulled rows must carry one stamp, and the full table must arrive once."""
    pages = fetch_catalog(sales_dsn).table("sales").pages  # type: ignore[union-attr]
    assert pages // spark_engine.min_pages_per_task >= 2, "the pull must be split"
    with restamping(sales_dsn, 200):
        for _ in range(3):
            Maintainer(sales_store, sales_dsn, spark_engine).refresh("salescopy")
            stamps = local(sales_store, "SELECT DISTINCT qty FROM salescopy")
            assert len(stamps) == 1, stamps
            assert local(sales_store, "SELECT count(*), count(DISTINCT saleid) FROM salescopy") == [
                (60000, 60000)
            ]
    assert sorted(local(sales_store, "SELECT saleid FROM salescopy"))[-1] == (60000,)


def test_a_failed_spark_task_leaves_the_cache_unchanged(
    sales_store: CacheStore, sales_dsn: str, spark_engine: SparkEngine
) -> None:
    Maintainer(sales_store, sales_dsn, spark_engine).refresh("salescopy")
    pg(sales_dsn, "UPDATE sales SET qty = qty + 1")
    before = dump(sales_store)
    with pytest.raises(OperationalError, match=r"a Spark task failed.*InjectedFault"):
        Maintainer(sales_store, sales_dsn, spark_engine, faults_enabled=["task"]).refresh(
            "salescopy"
        )
    assert dump(sales_store) == before


def test_a_derived_view_is_refreshed_on_spark(
    sales_store: CacheStore, sales_dsn: str, spark_engine: SparkEngine
) -> None:
    """The backend's computation of a derived view, pulled by a Spark task in the
    operation's snapshot, is what PostgreSQL computes (values and Python types)."""
    sales_store.apply_ddl(
        parse(
            "CREATE CACHED VIEW daily AS SELECT s.sold_on, count(*) AS sales, "
            "sum(s.qty) AS sold, avg(s.qty) AS mean FROM sales s "
            "GROUP BY s.sold_on"
        ),
        sales_store.load_catalog(),
    )
    Maintainer(sales_store, sales_dsn, spark_engine).refresh("daily")
    want = pg(
        sales_dsn,
        "SELECT sold_on, count(*), sum(qty), sum(qty)::numeric, count(qty) "
        "FROM sales GROUP BY sold_on",
    )
    got = local(sales_store, "SELECT * FROM daily")
    assert want and sorted(got) == sorted(want)
    assert {tuple(map(type, row)) for row in got} == {tuple(map(type, row)) for row in want}
    assert local(sales_store, "SELECT DISTINCT engine FROM mtcache.snapshots") == [("spark",)]
