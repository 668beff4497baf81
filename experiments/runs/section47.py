"""The dissertation's §4.7.1 setup, shared by plan-choices and guard-overhead (reconstructed
from the prose; docs/decisions/tpcd-experiment-setups.md): TPC-H customer and orders on the
backend with an index on ``c_acctbal`` (and on ``o_custkey``: the dissertation's orders were
clustered on (o_custkey, o_orderkey)); in the cache the projections ``cust_prj`` and
``orders_prj`` without secondary indexes, refreshed every 10 min, pulled in two snapshots
(different regions, not mutually consistent)."""

from __future__ import annotations

import psycopg

import cache
from experiments import tpch

CACHE = """
CREATE CACHED VIEW cust_prj AS SELECT c_custkey, c_name, c_nationkey, c_acctbal FROM customer
    REFRESH EVERY 10 MIN;
CREATE CACHED VIEW orders_prj AS SELECT o_custkey, o_orderkey, o_totalprice FROM orders
    REFRESH EVERY 10 MIN
"""


def load_backend(dsn: str, sf: float) -> None:
    tpch.load(dsn, sf, ["customer", "orders"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE INDEX IF NOT EXISTS mtcache_acctbal ON customer (c_acctbal)")
        conn.execute("CREATE INDEX IF NOT EXISTS mtcache_bench_2 ON orders (o_custkey)")
        conn.execute("ANALYZE customer")


def create_views(conn: cache.Connection) -> None:
    """Declare the two views and pull them, one after the other (two snapshots)."""
    cur = conn.cursor()
    for statement in CACHE.split(";"):
        cur.execute(statement)
    conn.admin.refresh("cust_prj")
    conn.admin.refresh("orders_prj")
