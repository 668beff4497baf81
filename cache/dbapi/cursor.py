"""The DB-API 2.0 cursor (PEP 249). ``execute`` routes a statement (`cache.dbapi.route`) and
runs it; a query with currency clauses takes the cache's path, top to bottom:

    parse (sql_ext) -> analyse (optimizer.analyze) -> plan (optimizer.planner, cached per
    shape) -> guard (optimizer.evaluate_guards) -> execute (cache.execution.execute, or the
    whole statement on the backend) -> provenance (cache.execution.provenance)

``cursor.provenance`` tells, per table access of the last query, where its rows came from;
``cursor.plan`` is the plan the last cached read or EXPLAIN ran with, ``cursor.executed`` what
the last statement sent to PostgreSQL and to DuckDB.
"""

from __future__ import annotations

import typing as t
from collections.abc import Callable, Iterator, Sequence

import duckdb
import psycopg
from psycopg import pq
from sqlglot import exp

from cache.backend.describe import ResultShape
from cache.dbapi.boundary import public
from cache.dbapi.route import (
    CachedRead,
    ControlEdit,
    Explain,
    Passthrough,
    SessionSetting,
    TimelineBracket,
    Write,
)
from cache.execution.execute import LocalUnfit, run_local, text_column
from cache.execution.planning import Prepared
from cache.execution.provenance import Executed, Provenance
from cache.store.region_state import read_region_state
from control_tables.regions import RegionState
from optimizer.evaluate_guards import Decision, evaluate_guards
from optimizer.plan import Plan
from sql_ext import Query
from sql_ext import errors as _errors
from sql_ext.errors import BackendUnavailableError, InterfaceError, ProgrammingError, translate
from sql_ext.nodes import format_duration
from sql_ext.params import ParameterValues, Params, bind_literals

if t.TYPE_CHECKING:
    from cache.dbapi.connection import Connection

# psycopg's test for "the statement returned rows" (Cursor.description), on a result
_ROW_STATUSES = frozenset((pq.ExecStatus.TUPLES_OK, pq.ExecStatus.SINGLE_TUPLE,
                           pq.ExecStatus.TUPLES_CHUNK))  # fmt: skip


_NO_PROVENANCE = Provenance()

# how many times a query decides again when the cache file changed under its guards before
# the backend answers it
GUARD_ATTEMPTS = 3


# the public methods' edge (cache.dbapi.boundary), naming this cache file
_public = public(lambda self: self.connection.cache_path, lambda self: self.connection._lock)


class Cursor:
    """PEP 249 cursor. ``provenance`` tells, per table access of the last query, where the
    data came from (SPEC §9); ``messages`` holds warnings as (class, text) pairs."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.arraysize = 1
        self._description: list[tuple[t.Any, ...]] | None = None
        self._pg_columns: ResultShape | None = None  # the backend's result, described lazily
        self.rowcount = -1
        self.messages: list[tuple[type[Warning], str]] = []
        self._provenance = _NO_PROVENANCE
        # the provenance of the last query, built when first read (most callers never do)
        self._pending: Callable[[], Provenance] | None = None
        self._pg_cursor: psycopg.Cursor[t.Any] | None = None  # reused for backend statements
        self.plan: Plan | None = None  # the plan of the last cached read or EXPLAIN
        self.executed: Executed | None = None  # what the last statement sent where
        self.closed = False
        self._rows: list[tuple[t.Any, ...]] = []
        self._position = 0

    # -- PEP 249 --------------------------------------------------------------------------

    @property
    def description(self) -> list[tuple[t.Any, ...]] | None:
        """Seven items per result column (PEP 249), None when the statement returned no rows.
        Built on first access: most applications never read it on the hot path."""
        if self._description is None and self._pg_columns is not None:
            self._description = self._pg_columns.description()
        return self._description

    @property
    def provenance(self) -> Provenance:
        """Per table access of the last query: where its rows came from (SPEC §9). It
        stays readable after the cursor is closed, until the cursor runs another statement."""
        if self._pending is not None:
            self._provenance = self._pending()
            self._pending = None
        return self._provenance

    @_public
    def execute(self, operation: str, parameters: Params = None) -> Cursor:
        if self.closed or self.connection.closed:
            self._check_open()
        self._reset()
        connection = self.connection
        store = connection._store
        phases = connection._phases
        if phases is not None:
            phases.start()
        route = connection._statements.route(
            operation,
            store.schema_version,
            store.control_table_names,
            connection._currency_bound is not None,
            parameters is not None,
        )
        if isinstance(route, CachedRead):
            self._read(route.query, parameters)
        elif isinstance(route, Passthrough):
            if phases is not None:
                phases.mark("lookup")
            self._run_backend(route.executed, parameters)
            if phases is not None:
                phases.mark("run")
            if route.reads is not None:
                query = route.reads
                self._pending = lambda: Provenance.remote(connection._planner.base_tables(query))
                connection._counters["remote"] += 1
            if route.changes_catalog:
                connection._planner.catalog_changed()
        elif isinstance(route, Write):
            self._run_backend(route.executed, parameters)
            if route.changes_catalog:
                connection._planner.catalog_changed()
            connection._session.wrote(route.tables)
        elif isinstance(route, Explain):
            self._explain(route.query, parameters)
        elif isinstance(route, ControlEdit):
            self._edit_control_table(route, parameters)
        elif isinstance(route, TimelineBracket):
            if parameters:
                raise ProgrammingError("TIMEORDERED takes no parameters")
            if route.begin:
                connection.begin_timeordered()
            else:
                connection.end_timeordered()
        elif isinstance(route, SessionSetting):
            if parameters:
                raise ProgrammingError(f"{route.action.upper()} CURRENCY BOUND takes no parameters")
            if route.action == "show":
                bound = connection.currency_bound
                shown = format_duration(bound) if bound is not None else "none"
                self._set_result([tuple(text_column("currency_bound"))], [(shown,)])
            else:
                connection.currency_bound = route.bound_seconds
        else:
            if parameters:
                raise ProgrammingError("cache DDL takes no parameters")
            connection.admin.apply_ddl([route.statement])
        return self

    @_public
    def executemany(self, operation: str, seq_of_parameters: Sequence[Params]) -> Cursor:
        self._check_open()
        total = 0
        for parameters in seq_of_parameters:
            self.execute(operation, parameters)
            total += max(self.rowcount, 0)
        self.rowcount = total
        self._set_result(None, [])
        return self

    def fetchone(self) -> tuple[t.Any, ...] | None:
        self._check_result()
        if self._position >= len(self._rows):
            return None
        row = self._rows[self._position]
        self._position += 1
        return row

    def fetchmany(self, size: int | None = None) -> list[tuple[t.Any, ...]]:
        self._check_result()
        count = self.arraysize if size is None else size
        rows = self._rows[self._position : self._position + count]
        self._position += len(rows)
        return rows

    def fetchall(self) -> list[tuple[t.Any, ...]]:
        self._check_result()
        rows = self._rows[self._position :]
        self._position = len(self._rows)
        return rows

    def __iter__(self) -> Iterator[tuple[t.Any, ...]]:
        while (row := self.fetchone()) is not None:
            yield row

    def close(self) -> None:
        self.closed = True
        self._rows = []
        if self._pg_cursor is not None:
            self._pg_cursor.close()

    def setinputsizes(self, sizes: t.Any) -> None:
        """PEP 249 lets an implementation ignore size hints; this one does."""

    def setoutputsize(self, size: t.Any, column: int | None = None) -> None:
        """PEP 249 lets an implementation ignore size hints; this one does."""

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- a query with currency clauses -------------------------------------------------------

    def _read(self, query: Query, parameters: Params) -> None:
        connection = self.connection
        phases = connection._phases
        try:
            prepared = connection._planner.prepare(query, parameters, connection._currency_bound)
            plan = self.plan = prepared.plan
            if phases is not None:
                phases.mark("lookup")
            # a plan that chose the whole statement remote has no guard to evaluate
            if plan.local:
                try:
                    if self._decide_and_run(prepared, parameters)[1]:
                        return
                except LocalUnfit:
                    pass  # DuckDB cannot give PostgreSQL's answer here: the backend gives it
            self._run_backend(prepared.remote, parameters)
            if phases is not None:
                phases.mark("run")
            self._pending = lambda: Provenance.remote(connection._planner.base_tables(query))
            connection._counters["remote"] += 1
        except BackendUnavailableError as exc:
            self._answer_without_backend(query, parameters, exc)

    def _decide(
        self, plan: Plan, parameters: Params, ignore_currency: bool = False,
        regions: RegionState | None = None,
    ) -> Decision:  # fmt: skip
        """Evaluate the plan's guards (on ``regions``, else the connection's current region
        state); a decision about current data counts its misses and requests the admissions
        that would fill them."""
        connection = self.connection
        state = connection._session
        session = state.guard_session(connection._planner.catalog.tables, ignore_currency)
        memo = connection._decisions if regions is None and not ignore_currency else None
        if regions is None:
            regions = connection._region_state()
        decision = memo.get(plan, parameters, regions, session, state.now) if memo else None
        if decision is None:
            values = ParameterValues(plan.analysis.parameter_keys, parameters)
            decision = evaluate_guards(plan, regions, values, session, state.now())
            if memo is not None:
                memo.put(plan, parameters, regions, session, decision)
        if not ignore_currency:
            misses = decision.misses
            counters = connection._counters
            counters["presence_misses"] += misses.presence
            counters["currency_misses"] += misses.currency
            if connection.admit_on_miss and misses.admittable:
                connection._admissions.request(misses.admittable)
        return decision

    def _decide_and_run(self, prepared: Prepared, parameters: Params,
                        stale: bool = False) -> tuple[Decision, bool]:  # fmt: skip
        """Evaluate the guards and run what they keep local (whole or in part): whether it ran,
        with the decision. The guards and the rows they pass must come from one state of the
        cache file: a change committed in between (an eviction while a remote leaf was
        fetched, a refresh) makes it decide again, a few times, then once more inside one
        DuckDB transaction."""
        store = self.connection._store
        phases = self.connection._phases
        for _ in range(GUARD_ATTEMPTS):
            seen = store.committed_version()
            decision = self._decide(prepared.plan, parameters, ignore_currency=stale)
            if phases is not None:
                phases.mark("guard")
            if decision.remote:
                return decision, False
            ran = self._run_decision(prepared, decision, parameters, seen, stale)
            if phases is not None:
                phases.mark("run")
            if ran:
                return decision, True
        return self._decide_and_run_in_one_transaction(prepared, parameters, stale)

    def _decide_and_run_in_one_transaction(
        self, prepared: Prepared, parameters: Params, stale: bool
    ) -> tuple[Decision, bool]:
        """Changes keep landing while the local plan runs (a stream applying writes): read the
        regions, decide and run inside one DuckDB transaction, a state of the file no commit
        moves. Not the first way: a transaction costs two statements more on the hit path."""
        store = self.connection._store
        store.con.execute("BEGIN TRANSACTION")
        try:
            regions = read_region_state(store)
            decision = self._decide(prepared.plan, parameters, stale, regions)
            if decision.remote:
                return decision, False
            return decision, self._run_decision(prepared, decision, parameters, None, stale)
        finally:
            store.con.execute("ROLLBACK")  # it only read

    def _run_decision(
        self, prepared: Prepared, decision: Decision, parameters: Params, seen: int | None,
        stale: bool = False,
    ) -> bool:  # fmt: skip
        """Run a local or mixed decision in DuckDB; False (and no result) if the cache file
        changed since version ``seen``, on which the guards decided (None: they decided inside
        the transaction this runs in; the result memo, which holds the newest answers, is not
        used)."""
        connection = self.connection
        memo = connection._memo if seen is not None else None
        try:
            result = run_local(prepared, decision, parameters, connection._store.con,
                               connection._leaf_fetcher, memo, connection._zone())  # fmt: skip
        except psycopg.Error as exc:
            raise translate(exc, unreachable="a remote part of the query needs it") from exc
        except duckdb.Error as exc:
            raise translate(exc, "the local plan failed in DuckDB") from exc
        if seen is not None and connection._store.committed_version() != seen:
            return False
        self._set_result(result.description, result.rows)
        self.executed = result.executed
        bindings = decision.bindings or ()
        remote = decision.local < len(bindings)
        connection._counters["hits"] += decision.local
        if result.memo is not None:
            connection._counters["memo_hits" if result.memo else "memo_misses"] += 1
        if remote:
            connection._counters["remote"] += 1
        if stale:
            self._provenance = Provenance.of(decision, mark_stale=True)
        else:
            self._pending = lambda: Provenance.of(decision)
        session = connection._session
        if session.timeline_active:
            moments = [decision.now] if remote else []
            stamps = [s[0] for b in bindings for _, s in b.regions if s[0] is not None]
            if stamps:
                moments.append(max(stamps))
            if moments:
                session.read_at(max(moments))
        return True

    def _answer_without_backend(
        self, query: Query, parameters: Params, down: BackendUnavailableError
    ) -> None:
        """SPEC §5.9: with stale_ok, present local data of any age answers, flagged stale;
        otherwise say which access needs the backend, its bound and the local data's age."""
        connection = self.connection
        bound = connection._currency_bound
        prepared = connection._planner.cached(query, parameters, bound)
        if prepared is None:
            prepared = Prepared(connection._planner.uncosted(query, parameters, bound), -1)
        if connection.stale_ok:
            try:
                decision, ran = self._decide_and_run(prepared, parameters, stale=True)
            except LocalUnfit as unfit:
                raise BackendUnavailableError(
                    f"{unfit}, and the backend is unreachable: {down}") from down  # fmt: skip
        else:
            decision, ran = self._decide(prepared.plan, parameters, ignore_currency=True), False
        if ran:
            for entry in self._provenance:
                if entry.stale:
                    bound = next(b.bound_seconds for b in decision.bindings or ()
                                 if b.access.table == entry.table)  # fmt: skip
                    self.messages.append((
                        _errors.Warning,
                        f"{entry.table}: answered from {entry.view} "
                        f"{entry.currency_seconds:.1f}s old, beyond its bound of "
                        f"{bound:g}s: the backend is unreachable (stale_ok)",
                    ))  # fmt: skip
            return
        needs = _needs_backend(prepared.plan, decision)
        raise BackendUnavailableError(f"{needs}; {down}") from down

    def _explain(self, query: Query, parameters: Params) -> None:
        """EXPLAIN of a query with clauses: the cache's plan, one text line per row."""
        connection = self.connection
        plan = connection._planner.prepare(query, parameters, connection._currency_bound).plan
        self.plan = plan
        self._set_result([tuple(text_column("QUERY PLAN"))], [(line,) for line in plan.render()])

    # -- other statements ----------------------------------------------------------------------

    def _run_backend(self, executed: Executed, parameters: Params) -> None:
        """Send a statement to PostgreSQL on the session's connection (``executed``: its SQL,
        as `cursor.executed` reports it)."""
        connection = self.connection
        session = connection._session
        try:
            pg = connection._backend_session()
            cur = self._pg_cursor
            if cur is None or cur.closed or cur.connection is not pg:
                cur = self._pg_cursor = pg.cursor()
            cur.execute(executed.backend_sql, parameters)  # type: ignore[arg-type]
            self.executed = executed
            self.rowcount = cur.rowcount
            result = cur.pgresult
            if result is not None and (result.nfields or result.status in _ROW_STATUSES):
                self._pg_columns = ResultShape(result, cur)
                self._rows = cur.fetchall()  # psycopg rows are tuples already
                self.rowcount = len(self._rows)
        except psycopg.Error as exc:
            raise translate(exc, unreachable="the statement needs it: reconnect when it is "
                            "back") from exc  # fmt: skip
        finally:
            while connection._notices:
                self.messages.append((_errors.Warning, connection._notices.pop(0)))
            if session.uncommitted or session.uncommitted_unknown:
                session.settle()  # e.g. a COMMIT sent as SQL
        if session.timeline_active:
            session.read_at(session.now())

    def _edit_control_table(self, edit: ControlEdit, parameters: Params) -> None:
        """INSERT INTO control ... admits keys; DELETE FROM control ... evicts them."""
        connection = self.connection
        store = connection._store
        control = edit.control
        columns = store.load_schema().control_tables[control].column_names
        tree = bind_literals(edit.query.tree, parameters)
        if edit.kind == "insert":
            named = [c.name.lower() for c in tree.this.expressions] if isinstance(
                tree.this, exp.Schema) else list(columns)  # fmt: skip
            if sorted(named) != sorted(columns):
                raise ProgrammingError(
                    f"INSERT INTO {control} must give exactly its control key "
                    f"({', '.join(columns)}); got ({', '.join(named)})"
                )
            rows = store.con.execute(tree.expression.sql(dialect="duckdb")).fetchall()
            keys = [tuple(row[named.index(c)] for c in columns) for row in rows]
            report = connection.admin.admit(control, keys)
        else:
            keys = store.matching_keys(control, columns, tree.args.get("where"))
            report = connection.admin.evict(control, keys)
        self.rowcount = len(keys)
        done = f"{report.operation}: {len(report.regions)} regions"
        self.messages.append((_errors.Warning, done))

    # -- state ----------------------------------------------------------------------------

    def _set_result(
        self, description: list[tuple[t.Any, ...]] | None, rows: list[tuple[t.Any, ...]]
    ) -> None:
        self._description = description
        self._pg_columns = None
        self._rows = rows
        self.rowcount = len(rows) if description is not None else self.rowcount

    def _reset(self) -> None:
        self._description = None
        self._pg_columns = None
        self.rowcount = -1
        self.messages = []
        self._provenance = _NO_PROVENANCE
        self._pending = None
        self.plan = None
        self.executed = None
        self._rows = []
        self._position = 0

    def _check_open(self) -> None:
        if self.closed:
            raise InterfaceError("the cursor is closed")
        self.connection._check_open()

    def _check_result(self) -> None:
        self._check_open()
        if self._description is None and self._pg_columns is None:
            raise ProgrammingError("the last statement returned no rows to fetch")


def _needs_backend(plan: Plan, decision: Decision) -> str:
    """Which access could not be answered locally, with its bound and its local data's age."""
    bindings = {b.access.instance.id: b for b in decision.bindings or ()}
    for cls_plan in plan.classes:
        for access in cls_plan.accesses:
            binding = bindings.get(access.instance.id)
            label = f"{access.table} ({access.alias})"
            bound = cls_plan.bound_seconds
            if binding is None or binding.guard is None:
                return (
                    f"{label} needs the backend (CURRENCY BOUND {bound:g}s) and the cache "
                    "holds no usable copy of it"
                )
            ages = [(decision.now - s[0]).total_seconds() for _, s in binding.regions if s[0]]
            if ages and max(ages) > bound:
                return (
                    f"{label} needs the backend (CURRENCY BOUND {bound:g}s): the local data "
                    f"in {binding.guard.view} is {max(ages):.1f}s old; connect with "
                    "stale_ok=True to accept it"
                )
    return "a remote part of the query needs the backend"
