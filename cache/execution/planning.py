"""Plans of one session: the shadow catalog they are made against, the plan cache, and the
I/O planning needs (the backend's estimates, the views' row counts), gathered before the pure
planner (`optimizer.planner.plan_query`) runs.

A plan is made once per statement shape - its text in mtcache's dialect, whether it is
executed with parameters (psycopg reads ``%%`` differently then), and the session's currency
bound for blocks without a clause - and kept until the cache schema changes; a shape is costed
with the parameters of its first execution. EXPLAIN looks its plan up here too, so
it shows the plan that runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import typing as t
from collections import OrderedDict
from dataclasses import dataclass, field

import duckdb

from cache.backend.describe import ResultShape, describe_result, described_here, dollar_text
from cache.backend.estimates import backend_estimates
from cache.backend.reflect import fetch_catalog
from cache.execution.convert import converter, duckdb_result_types
from cache.execution.provenance import Executed
from cache.store.cache_file import CacheStore
from cache.store.refresh_times import measured_delays
from optimizer import describe_result as described
from optimizer.analysis.analyze import Analysis, analyze
from optimizer.analysis.normalize_constraint import normalize_constraint
from optimizer.plan import Estimates, LocalStatement, Plan, PlanInputs
from optimizer.planner import estimate_requests, initial_plan, plan_query
from optimizer.rules.estimate_cost import DEFAULT_DELAY
from sql_ext import Query
from sql_ext.catalog import Catalog
from sql_ext.errors import BackendUnavailableError, CatalogError, first_line
from sql_ext.params import Params, duckdb_name, values_for
from sql_ext.quoting import ident, qualified

PLAN_CACHE_SIZE = 256


@dataclass
class Prepared:
    """A plan with what the executor compiled for it (`cache.execution.execute`): one DuckDB
    statement per guard decision, made on first use; and the result PostgreSQL describes for
    the statement (None: the backend could not be asked), which local answers are given."""

    plan: Plan
    schema_version: int
    result: ResultShape | None = None
    compiled: dict[t.Any, t.Any] = field(default_factory=dict)
    delays: tuple[tuple[str, float], ...] = ()  # the measured refresh delays it was costed with
    # the relations the statement names and the base tables it reads: what a session's role
    # must be allowed to read for a local answer (`cache.engine.privileges`)
    relations: frozenset[str] = frozenset()

    @functools.cached_property
    def description(self) -> list[tuple[t.Any, ...]] | None:
        return self.result.description() if self.result is not None else None

    @functools.cached_property
    def remote(self) -> Executed:
        """The whole statement sent to PostgreSQL, as `cursor.executed` reports it."""
        return Executed(self.plan.sql)


MAX_OUTSIDE = 256  # relations a planner names outside its catalog (`Planner._outside`)

PlanKey = tuple[t.Hashable, ...]


class PlanCache:
    """The prepared plans of one cache file in this process, shared by its sessions: by
    statement shape and everything else a plan depends on (`Planner.prepare`'s key), least
    recently used out. Thread-safe."""

    def __init__(self, size: int = PLAN_CACHE_SIZE) -> None:
        self.size = size
        self._entries: OrderedDict[PlanKey, Prepared] = OrderedDict()
        self._tokens: dict[t.Hashable, int] = {}
        self._lock = threading.Lock()

    def get(self, key: PlanKey) -> Prepared | None:
        # no lock on the hit path: each OrderedDict call is atomic (a plan evicted meanwhile
        # is simply not moved)
        entries = self._entries
        try:
            entries.move_to_end(key)
            return entries[key]
        except KeyError:
            return None

    def put(self, key: PlanKey, prepared: Prepared) -> None:
        with self._lock:
            self._entries[key] = prepared
            self._entries.move_to_end(key)
            if len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def token(self, settings: t.Hashable) -> int:
        """A small number standing for ``settings`` (what a session's plans depend on besides
        the statement), the same for equal settings: plan keys stay cheap to hash."""
        with self._lock:
            return self._tokens.setdefault(settings, len(self._tokens))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class Planner:
    def __init__(
        self,
        store: CacheStore,
        dsn: str,
        delay: float = DEFAULT_DELAY,
        choice: str = "cost",
        existing: t.Callable[[list[str]], dict[str, bool]] | None = None,
        temporary: t.Callable[[], set[str]] | None = None,
        given_delays: t.Mapping[str, float] | None = None,
        plans: PlanCache | None = None,
    ) -> None:
        self.store = store
        self.dsn = dsn
        # which relation names the session's backend connection resolves (temporary tables
        # are its own): `cache.backend.reflect.existing_relations`
        self.existing = existing
        # the names of the session's temporary tables, which shadow the search path's
        self.temporary = temporary
        # what every catalog the planner uses names outside (`Catalog.outside`): the system
        # relations found so far, the session's temporary tables as last read
        self._system: frozenset[str] = frozenset()
        self._temporary: frozenset[str] = frozenset()
        self.delay = delay
        # refresh delays given for views (the connection's refresh_delays): not measured
        self.given_delays = dict(given_delays or {})
        self.choice = choice  # `PlanInputs.choice`: the session's plan_choice
        self.catalog: Catalog = store.load_catalog()
        self._catalog_stale = False
        # the engine's, shared with the other sessions on the file (a plan depends on what
        # its key names: the shape, the session's bound, plan choice, given delays and the
        # relations its catalog names outside)
        self._plans = plans if plans is not None else PlanCache()
        self._settings = (choice, tuple(sorted(self.given_delays.items())))
        self._token = self._plans.token((self._settings, self.catalog.outside))
        self._tables_of: dict[int, tuple[Query, list[str]]] = {}
        self._delays: tuple[int, tuple[tuple[str, float], ...]] = (-1, ())

    def catalog_changed(self) -> None:
        """The backend's tables may have changed (DDL): read the catalog again before the next
        plan that needs it; the plans made with the old one are dropped."""
        self._catalog_stale = True
        self._plans.clear()

    def reload_catalog(self) -> Catalog:
        """Read the backend's catalog now and keep it in the cache file."""
        catalog = fetch_catalog(self.dsn)
        self.store.save_catalog(catalog)
        if self.temporary is not None:
            self._temporary = frozenset(self.temporary())
        self.use_catalog(catalog)
        return self.catalog

    def _outside(self, unknown: dict[str, str], with_params: bool) -> bool:
        """Whether the session's backend resolves any of the relations the catalog does not
        describe (by written name, with its SQL name): a system catalog, a temporary table, a
        table off the search path, a name with ``%%`` run with parameters. Those it resolves,
        the catalog names outside, read from the backend as they are."""
        names = {
            written: sql.replace("%%", "%") if with_params else sql
            for written, sql in unknown.items()
        }
        if self.existing is None or len(self.catalog.outside) >= MAX_OUTSIDE:
            return False
        found = self.existing(list(names.values()))
        added = {written for written, sql in names.items() if sql in found}
        if not added:
            return False
        self._system |= {written for written in added if found[names[written]]}
        self.catalog = dataclasses.replace(self.catalog, outside=self.catalog.outside | added)
        self._token = self._plans.token((self._settings, self.catalog.outside))
        self._tables_of.clear()
        return True

    def _unknown(self, query: Query) -> dict[str, str]:
        """The statement's table references the catalog lacks: written name -> SQL name (a
        backend view's body is not searched: its first unknown name comes as an error)."""
        catalog = self.catalog
        return {
            source.written: source.sql_name
            for block in query.analysis.blocks
            for source in block.sources
            if source.is_table
            and source.table is not None
            and source.written not in catalog.outside
            and catalog.table(source.table, source.schema) is None
            and catalog.view(source.table, source.schema) is None
        }

    def delays(self) -> tuple[tuple[str, float], ...]:
        """The views' measured refresh delays d (§4.6), rounded up to a hundredth of a second
        so that a plan is made again only when one moves by that much (and a bound at most
        that much above d is planned remote by §4.4's rule); read again after every change of
        the cache file."""
        version = self.store.version
        if self._delays[0] != version:
            measured = {**measured_delays(self.store), **self.given_delays}.items()
            rounded = tuple(
                sorted((view, math.ceil(delay * 100) / 100) for view, delay in measured)
            )
            self._delays = (version, rounded)
        return self._delays[1]

    def use_catalog(self, catalog: Catalog) -> None:
        """Plan against ``catalog`` from now on (read from the backend just now), with the
        system relations and temporary tables it does not describe named outside it."""
        self.catalog = dataclasses.replace(catalog, outside=self._system | self._temporary)
        self._token = self._plans.token((self._settings, self.catalog.outside))
        self._catalog_stale = False
        self._tables_of.clear()
        self._plans.clear()

    def prepare(self, query: Query, params: Params, default_bound: float | None = None) -> Prepared:
        """The plan of a statement shape, from the plan cache while the schema is unchanged
        (`prepared_at_hand`), else made now; ``default_bound``: the session's currency bound
        for blocks without a clause."""
        delays = self.delays()  # (read again first: the plan cache then decides)
        found = self.prepared_at_hand(query, params, default_bound)
        if found is not None:
            return found
        version = self.store.schema_version
        with_params = params is not None
        analysis = self._analyze(query, with_params, default_bound)
        plan, result, costed = self._plan(analysis, params)
        prepared = Prepared(plan, version, result, delays=delays, relations=self.relations(query))
        if costed:  # a plan made without the backend is not kept
            # (the key again: naming relations outside the catalog changed it)
            self._plans.put(self._key(query, params, default_bound), prepared)
        return prepared

    def prepared_at_hand(
        self, query: Query, params: Params, default_bound: float | None = None
    ) -> Prepared | None:
        """The plan of a statement shape from the plan cache, made for the cache file as it
        is (schema and measured delays); None: it is to be made."""
        if self._delays[0] != self.store.version:
            return None  # (the delays are read again: a plan may be made again)
        prepared = self._plans.get(self._key(query, params, default_bound))
        if (
            prepared is not None
            and prepared.schema_version == self.store.schema_version
            and prepared.delays == self._delays[1]
        ):
            return prepared
        return None

    def _key(self, query: Query, params: Params, default_bound: float | None) -> PlanKey:
        return (query.shape, params is not None, default_bound, self._token)

    def cached(
        self, query: Query, params: Params, default_bound: float | None = None
    ) -> Prepared | None:
        """The cached plan of a shape, if there is one for the current schema."""
        prepared = self._plans.get(self._key(query, params, default_bound))
        if prepared is not None and prepared.schema_version == self.store.schema_version:
            return prepared
        return None

    def uncosted(
        self, query: Query, params: Params, default_bound: float | None = None
    ) -> Prepared:
        """A plan made without asking the backend (it is down): its guards decide."""
        analysis = analyze(query, self.catalog, default_bound)
        plan, result = self._uncosted(analysis, params is not None)
        return Prepared(plan, -1, result, relations=self.relations(query))

    def _uncosted(self, analysis: Analysis, with_params: bool) -> tuple[Plan, ResultShape | None]:
        """The plan, and the description PostgreSQL would give its result, worked out here
        (`optimizer.describe_result`); a statement whose description is not known for sure
        is not answered locally (its answer would be described otherwise)."""
        result = None
        if analysis.local_allowed and analysis.query.is_select:
            query = analysis.query
            text = dollar_text(query.backend_sql) if with_params else query.backend_sql
            found = described.describe_result(query, self.catalog, text)
            if isinstance(found, str):
                analysis = dataclasses.replace(
                    analysis,
                    local_blocker=(
                        "the backend, which describes its result, is unreachable, and the cache "
                        f"cannot tell PostgreSQL's description ({found})"
                    ),
                )
            else:
                result = described_here(found)
        inputs = PlanInputs(
            self.store.load_schema(),
            self.catalog,
            None,
            self.delay,
            tuple(oid for oid, _ in result.types) if result is not None else None,
            delays=self.delays(),
            choice=self.choice,
        )
        return plan_query(analysis, inputs, with_params=with_params), result

    def _analyze(self, query: Query, with_params: bool, default_bound: float | None) -> Analysis:
        """The statement's analysis (names resolved, its constraint normalized: once per
        shape), against a catalog read again when stale, or once when it lacks a name
        (created since), and naming outside it the relations the session's backend resolves
        (system relations, temporary tables: `_outside`). The tables it reads are kept for
        its provenance (`base_tables`)."""
        reloaded = False
        down: BackendUnavailableError | None = None
        for _ in range(MAX_OUTSIDE + 2):
            if self._catalog_stale:
                try:
                    self.reload_catalog()
                except BackendUnavailableError as exc:
                    down = exc
                    break  # the backend is down: plan with the catalog there is
                reloaded = True
            try:
                analysis = analyze(query, self.catalog, default_bound)
            except CatalogError as exc:
                if not reloaded:  # created since the catalog was read: read it again, once
                    self._catalog_stale = reloaded = True
                    continue
                unknown = self._unknown(query) or dict([exc.relation] if exc.relation else [])
                if not self._outside(unknown, with_params):
                    raise  # the backend has none of them either: the error stands
                continue
            self._remember_tables(query, [i.table for i in analysis.constraint.instances])
            return analysis
        try:
            return analyze(query, self.catalog, default_bound)
        except CatalogError:
            if down is not None:  # a name only the backend could resolve, and it is down
                raise down from None
            raise

    def _plan(self, analysis: Analysis, params: Params) -> tuple[Plan, ResultShape | None, bool]:
        """The plan, the result the backend describes, and whether the backend was asked (a
        plan made without it is not cached). Everything planning reads is gathered first:
        the backend's estimates for the statement and for each access's leaf, its result
        description, the views' row counts; DuckDB's result types are asked by the last rule
        (`optimizer.planner.fit_result`)."""
        query = analysis.query
        schema = self.store.load_schema()
        with_params = params is not None
        if analysis.outside:  # nothing to cost: PostgreSQL answers it on the session's connection
            inputs = PlanInputs(
                schema, self.catalog, None, self.delay, delays=self.delays(), choice=self.choice
            )
            return plan_query(analysis, inputs, with_params=with_params), None, True
        values = values_for(analysis.keys, params)  # psycopg's errors for wrong parameters
        named = dict(zip(map(duckdb_name, analysis.keys), values, strict=True))
        initial = initial_plan(analysis, self.catalog, with_params)
        wanted = estimate_requests(initial, schema)
        try:
            remote = backend_estimates(
                self.dsn,
                [(wanted.statement, params), *((sql, named or None) for sql in wanted.leaves)],
            )
            result = (
                describe_result(self.dsn, wanted.statement, params) if query.is_select else None
            )
        except BackendUnavailableError:
            return *self._uncosted(analysis, with_params), False
        inputs = PlanInputs(
            schema,
            self.catalog,
            Estimates(remote, self.store.row_counts(wanted.views)),
            self.delay,
            tuple(oid for oid, _ in result.types) if result is not None else None,
            self.delays(),
            self.choice,
            result_problem=functools.partial(self._result_problem, result=result, named=named),
        )
        return plan_query(analysis, inputs, with_params=with_params, initial=initial), result, True

    def _result_problem(
        self,
        plan: Plan,
        statement: LocalStatement,
        *,
        result: ResultShape | None,
        named: dict[str, t.Any],
    ) -> str | None:
        """Why DuckDB's answer to the plan's statement could not be PostgreSQL's, or None."""
        if result is None:
            return "the backend does not describe its result"
        try:
            types = duckdb_result_types(self.store.con, statement, named)
        except (
            duckdb.BinderException,
            duckdb.CatalogException,
            duckdb.ParserException,
            duckdb.NotImplementedException,
            duckdb.OutOfRangeException,  # (a DECIMAL scale beyond 38, found when it binds)
        ) as exc:  # a function DuckDB lacks, ...
            return f"DuckDB cannot run it: {first_line(exc)}"
        names = [d[0] for d in result.description()]
        semantics = plan.analysis.semantics
        found = converter(
            result.types,
            names,
            types,
            statement.outputs,
            semantics.output_widths,
            semantics.output_scales,
        )
        return found if isinstance(found, str) else None

    # -- the tables a statement reads ----------------------------------------------------------

    def relations(self, query: Query) -> frozenset[str]:
        """The relations a statement names (tables, views) and the base tables it reads, as
        SQL names the backend resolves (schema-qualified where the catalog knows them)."""
        named = {
            source.table
            for block in query.analysis.blocks
            for source in block.sources
            if source.is_table and source.table is not None
        }
        catalog, found = self.catalog, set()
        for name in named.union(self.base_tables(query)):
            known = catalog.table(name) or catalog.view(name)
            found.add(
                qualified(known.schema, name) if known is not None and known.schema else ident(name)
            )
        return frozenset(found)

    def base_tables(self, query: Query) -> list[str]:
        """The base tables a query reads (views expanded), one entry per access, for its
        provenance: as planning found them, or found now (remembered per statement until the
        catalog is read again). It reads no catalog again and asks the backend nothing (the
        statement's transaction may have failed since): what the catalog lacks (a temporary
        table) is named as written."""
        known = self._tables_of.get(id(query))
        if known is not None and known[0] is query and not self._catalog_stale:
            return known[1]
        try:
            tables = [i.table for i in normalize_constraint(query, self.catalog).instances]
        except CatalogError:
            return [
                source.table
                for block in query.analysis.blocks
                for source in block.sources
                if source.is_table and source.table is not None
            ]
        self._remember_tables(query, tables)
        return tables

    def _remember_tables(self, query: Query, tables: list[str]) -> None:
        if len(self._tables_of) >= PLAN_CACHE_SIZE:
            self._tables_of.pop(next(iter(self._tables_of)))
        self._tables_of[id(query)] = (query, tables)
