"""EXPLAIN for queries with currency clauses: the optimizer's plan description, costed with the
backend's own estimates (``EXPLAIN (FORMAT JSON)``, so backend indexes count) and the cache's
row counts."""

from __future__ import annotations

import dataclasses
import typing as t

import psycopg

from cache.backend.pool import pooled
from cache.store.cache_file import CacheStore
from optimizer.accesses import model_query
from optimizer.explain_plan import explain
from sql_ext import MTCache, Query, parse_one
from sql_ext.catalog import Catalog
from sql_ext.params import Params, bind_literals


def explain_query(
    query: Query, params: Params, catalog: Catalog, store: CacheStore, dsn: str
) -> dict[str, t.Any]:
    query = dataclasses.replace(query, explain=None)  # the plan of the statement itself
    if params:
        bound = bind_literals(query.tree, params).sql(dialect=MTCache)
        bound_query = parse_one(bound)
        assert isinstance(bound_query, Query)
        query = bound_query
    model = model_query(query, catalog)
    schema = store.load_schema()
    with pooled(dsn) as conn:

        def remote_cost(sql: str) -> tuple[float, float]:
            try:
                row = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}").fetchone()  # type: ignore[arg-type]
            except psycopg.Error:
                return float("inf"), 0.0  # not a plan the backend accepts: never chosen
            plan = row[0][0]["Plan"] if row else {}
            return float(plan.get("Total Cost", 0.0)), float(plan.get("Plan Rows", 0.0))

        def local_rows(view: str) -> float:
            ((count,),) = store.con.execute(f'SELECT count(*) FROM "{view}"').fetchall()
            return float(count)

        return explain(model, schema, remote_cost, local_rows, catalog)
