"""Fixtures of the pull tests on Spark: a backend with 60,000 sales (enough heap pages for a
pull split into several tasks) and a cache of the bookstore schema with a copy of them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.reflect import fetch_catalog
from cache.store.cache_file import CacheStore
from cache.tools import bookstore
from sql_ext import parse
from tests.store.test_store import SCHEMA_FILE
from tests.writers import committing

SALES = "CREATE CACHED VIEW salescopy AS SELECT * FROM sales REFRESH EVERY 1 MIN;"


@contextmanager
def restamping(dsn: str, times: int) -> Iterator[None]:
    """A writer setting every sale's qty to 1, 2, ... (up to ``times``), one transaction each,
    while the block runs: every committed state has one qty in all rows (it starts at 0)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE sales SET qty = 0")
    with committing(dsn, "UPDATE sales SET qty = %s", range(1, times + 1)):
        yield


@pytest.fixture
def sales_dsn(pg_cluster: EmbeddedPostgres, request: pytest.FixtureRequest) -> str:
    dsn = pg_cluster.create_database("s_" + request.node.name[:40])
    bookstore.load_into(dsn, {"sales": 60000})
    return dsn


@pytest.fixture
def sales_store(sales_dsn: str, tmp_path: Path) -> Iterator[CacheStore]:
    opened = CacheStore(tmp_path / "cache.duckdb")
    opened.save_catalog(fetch_catalog(sales_dsn))
    opened.apply_ddl(parse(SCHEMA_FILE.read_text() + SALES), opened.load_catalog())
    yield opened
    opened.close()
