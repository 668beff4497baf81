"""Plans of one session: the shadow catalog they are made against, the plan cache, and the
I/O planning needs (the backend's estimates, the views' row counts), gathered before the pure
planner (`optimizer.planner.plan_query`) runs.

A plan is made once per statement shape - its text in mtcache's dialect, whether it is
executed with parameters (psycopg reads ``%%`` differently then), and the session's currency
bound for blocks without a clause - and kept until the cache schema changes; a shape is costed
with the parameters of its first execution (SPEC §5.6). EXPLAIN looks its plan up here too, so
it shows the plan that runs.
"""

from __future__ import annotations

import functools
import typing as t
from collections import OrderedDict
from dataclasses import dataclass, field

from cache.backend.estimates import backend_estimates
from cache.backend.reflect import fetch_catalog
from cache.execution.provenance import Executed
from cache.store.cache_file import CacheStore
from optimizer.analyze import analyze
from optimizer.estimate_cost import DEFAULT_DELAY
from optimizer.normalize_constraint import normalize_constraint
from optimizer.plan import Estimates, Plan, PlanInputs
from optimizer.planner import estimate_requests, plan_query
from sql_ext import Query
from sql_ext.catalog import Catalog
from sql_ext.errors import BackendUnavailableError, CatalogError
from sql_ext.params import Params, duckdb_name, values_for

PLAN_CACHE_SIZE = 256


@dataclass
class Prepared:
    """A plan with what the executor compiled for it (`cache.execution.execute`): one DuckDB
    statement per guard decision, made on first use."""

    plan: Plan
    schema_version: int
    compiled: dict[t.Any, t.Any] = field(default_factory=dict)

    @functools.cached_property
    def remote(self) -> Executed:
        """The whole statement sent to PostgreSQL, as `cursor.executed` reports it."""
        return Executed(self.plan.sql)


class Planner:
    def __init__(self, store: CacheStore, dsn: str, delay: float = DEFAULT_DELAY) -> None:
        self.store = store
        self.dsn = dsn
        self.delay = delay
        self.catalog: Catalog = store.load_catalog()
        self._catalog_stale = False
        self._plans: OrderedDict[tuple[str, bool, float | None], Prepared] = OrderedDict()
        self._tables_of: dict[int, tuple[Query, list[str]]] = {}

    def catalog_changed(self) -> None:
        """The backend's tables may have changed (DDL): read the catalog again before the next
        plan that needs it."""
        self._catalog_stale = True

    def reload_catalog(self) -> Catalog:
        """Read the backend's catalog now and keep it in the cache file."""
        catalog = fetch_catalog(self.dsn)
        self.store.save_catalog(catalog)
        self.use_catalog(catalog)
        return catalog

    def use_catalog(self, catalog: Catalog) -> None:
        """Plan against ``catalog`` from now on (read from the backend just now)."""
        self.catalog = catalog
        self._catalog_stale = False
        self._tables_of.clear()

    def prepare(self, query: Query, params: Params, default_bound: float | None = None) -> Prepared:
        """The plan of a statement shape, from the plan cache while the schema is unchanged;
        ``default_bound``: the session's currency bound for blocks without a clause."""
        key = (query.shape, params is not None, default_bound)
        version = self.store.schema_version
        prepared = self._plans.get(key)
        if prepared is not None and prepared.schema_version == version:
            return prepared
        self.base_tables(query)  # reads a stale catalog again
        plan, costed = self._plan(query, params, default_bound)
        prepared = Prepared(plan, version)
        if costed:  # a plan made without the backend's estimates is not kept
            if len(self._plans) >= PLAN_CACHE_SIZE:
                self._plans.popitem(last=False)
            self._plans[key] = prepared
        return prepared

    def cached(
        self, query: Query, params: Params, default_bound: float | None = None
    ) -> Prepared | None:
        """The cached plan of a shape, if there is one for the current schema."""
        prepared = self._plans.get((query.shape, params is not None, default_bound))
        if prepared is not None and prepared.schema_version == self.store.schema_version:
            return prepared
        return None

    def uncosted(self, query: Query, params: Params, default_bound: float | None = None) -> Plan:
        """A plan made without asking the backend (it is down): its guards decide."""
        schema = self.store.load_schema()
        analysis = analyze(query, self.catalog, default_bound)
        return plan_query(analysis, PlanInputs(schema, self.catalog, None, self.delay),
                          with_params=params is not None)  # fmt: skip

    def _plan(
        self, query: Query, params: Params, default_bound: float | None
    ) -> tuple[Plan, bool]:
        schema = self.store.load_schema()
        analysis = analyze(query, self.catalog, default_bound)
        with_params = params is not None
        values = values_for(analysis.keys, params)  # psycopg's errors for wrong parameters
        named = dict(zip(map(duckdb_name, analysis.keys), values, strict=True))
        wanted = estimate_requests(analysis, schema, self.catalog, with_params=with_params)
        try:
            remote = backend_estimates(
                self.dsn,
                [(wanted.statement, params), *((sql, named or None) for sql in wanted.leaves)],
            )
        except BackendUnavailableError:
            estimates = None  # no backend to cost against: the guards decide
        else:
            estimates = Estimates(remote, self.store.row_counts(wanted.views))
        inputs = PlanInputs(schema, self.catalog, estimates, self.delay)
        return plan_query(analysis, inputs, with_params=with_params), estimates is not None

    # -- the tables a statement reads ----------------------------------------------------------

    def base_tables(self, query: Query) -> list[str]:
        """The base tables a query reads (views expanded), one entry per access; remembered
        per statement until the catalog is read again."""
        known = self._tables_of.get(id(query))
        if known is not None and known[0] is query and not self._catalog_stale:
            return known[1]
        tables = self._resolve_tables(query)
        if len(self._tables_of) >= PLAN_CACHE_SIZE:
            self._tables_of.pop(next(iter(self._tables_of)))
        self._tables_of[id(query)] = (query, tables)
        return tables

    def _resolve_tables(self, query: Query) -> list[str]:
        for attempt in range(2):
            if self._catalog_stale or attempt:
                try:
                    self.reload_catalog()
                except BackendUnavailableError:
                    break  # the backend is down: plan with the catalog there is
            try:
                constraint = normalize_constraint(query, self.catalog)
            except CatalogError:
                continue  # created since the catalog was read: read it again, once
            return [instance.table for instance in constraint.instances]
        # Relations the catalog does not list (temporary tables): name them as written.
        return [
            source.table
            for block in query.analysis.blocks
            for source in block.sources
            if source.is_table and source.table is not None
        ]
