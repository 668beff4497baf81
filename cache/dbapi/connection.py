"""The DB-API 2.0 connection and cursor (PEP 249), shaped like psycopg's so an application can
switch to ``cache.connect(...)`` unchanged.

What a statement does depends on what it is:

* plain SQL without extensions goes to the backend verbatim, in the connection's backend
  transaction (so the session always reads its own writes);
* a query with currency clauses is planned; this release plans every access remote, which
  satisfies any bound (the data is current), and reports it in ``cursor.provenance``;
* cache DDL (CREATE CONTROL TABLE, CREATE CACHED VIEW, DROP) changes the cache schema;
* INSERT INTO / DELETE FROM a control table admits / evicts control keys (pulling or removing
  their regions);
* BEGIN / END TIMEORDERED bracket a session timeline (§2.3).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import queue
import threading
import typing as t
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import psycopg
import pyarrow as pa
from psycopg import pq
from sqlglot import exp

from cache.backend.copy_arrow import copy_to_arrow
from cache.backend.pool import in_parallel
from cache.backend.reflect import connect_backend, fetch_catalog
from cache.execution.execute import (
    DecisionTemplate,
    Fetch,
    Misses,
    Parameters,
    Result,
    Session,
    decide,
    decision_template,
    remote_provenance,
    run_template,
    slots,
)
from cache.execution.explaining import explain_query
from cache.maintenance.pipeline import Maintainer
from cache.store.cache_file import CacheStore
from cache.store.region_index import RegionIndex
from heartbeat.clock import measure as measure_clock
from optimizer.accesses import model_query
from optimizer.normalize_constraint import normalize_constraint
from sql_ext import (
    Query,
    Statement,
    Timeline,
    errors,
    parse_one,
)
from sql_ext.errors import InterfaceError, NotSupportedError, ProgrammingError, first_line
from sql_ext.params import Params, bind_literals
from sql_ext.statements import DIALECT

DEFAULT_CACHE = ".mtcache/cache.duckdb"
PLAN_CACHE_SIZE = 256
CLOCK_MAX_AGE = 600.0  # seconds between measurements of the backend clock's offset
DRIFT = 1e-4  # clock drift assumed per second when a measurement is overdue (100 ppm)
_EXTENSION_WORDS = {"CURRENCY", "TIMEORDERED", "CACHED", "CONTROL", "EXPLAIN"}


class DBAPITypeObject:
    """Compares equal to every type code of its group (PEP 249 type objects)."""

    def __init__(self, name: str, *pg_types: str) -> None:
        self.name = name
        self.values = frozenset(
            info.oid for n in pg_types if (info := psycopg.postgres.types.get(n)) is not None
        )

    def __eq__(self, other: object) -> bool:
        return other in self.values if isinstance(other, int) else other is self

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"<DBAPITypeObject {self.name}>"


STRING = DBAPITypeObject(
    "STRING", "text", "varchar", "bpchar", "char", "name", "json", "jsonb", "xml", "uuid"
)
BINARY = DBAPITypeObject("BINARY", "bytea")
NUMBER = DBAPITypeObject("NUMBER", "int2", "int4", "int8", "float4", "float8", "numeric", "oid")
DATETIME = DBAPITypeObject("DATETIME", "date", "time", "timetz", "timestamp", "timestamptz",
                           "interval")  # fmt: skip
ROWID = DBAPITypeObject("ROWID", "oid", "tid")


class Connection:
    """A session: one backend connection (its transaction is the session's), the cache file."""

    # PEP 249 optional extension: the exception classes as attributes.
    Warning = errors.Warning
    Error = errors.Error
    InterfaceError = errors.InterfaceError
    DatabaseError = errors.DatabaseError
    DataError = errors.DataError
    OperationalError = errors.OperationalError
    IntegrityError = errors.IntegrityError
    InternalError = errors.InternalError
    ProgrammingError = errors.ProgrammingError
    NotSupportedError = errors.NotSupportedError

    def __init__(
        self,
        backend: str | None = None,
        cache_path: str | Path | None = None,
        *,
        autocommit: bool = False,
        stale_ok: bool = False,
        admit_on_miss: bool = True,
    ) -> None:
        self.cache_path = Path(cache_path or DEFAULT_CACHE)
        if backend is None:
            from cache.backend.embedded_pg import EmbeddedPostgres

            backend = EmbeddedPostgres(self.cache_path.parent / "pg").ensure_running()
        self.backend = backend
        self.stale_ok = stale_ok
        self.admit_on_miss = admit_on_miss
        self._admissions: queue.Queue[tuple[str, tuple[t.Any, ...]] | None] = queue.Queue()
        self._queued: set[tuple[str, tuple[t.Any, ...]]] = set()
        self._admitter: threading.Thread | None = None
        self.admission_errors: list[str] = []
        self._pg = connect_backend(backend, autocommit=autocommit)
        self._notices: list[str] = []  # backend NOTICEs, handed to the cursor that caused them
        self._pg.add_notice_handler(lambda d: self._notices.append(d.message_primary or ""))
        try:
            self.clock = measure_clock(self._pg)  # currency is judged on the backend's clock
            self._store = CacheStore(self.cache_path)
        except psycopg.Error as exc:
            self._pg.close()
            raise _backend_error(exc, "connect again when it is back") from exc
        except BaseException:
            self._pg.close()
            raise
        self._store.save_clock(self.clock)
        if not self._store.has_catalog():
            self._store.save_catalog(fetch_catalog(backend))
        self._catalog = self._store.load_catalog()
        self._catalog_stale = False
        self._plans: dict[str, PlanEntry] = {}
        self._parses: OrderedDict[str, Statement | None] = OrderedDict()
        self._tables_of: dict[int, tuple[Query, list[str]]] = {}
        self._index: RegionIndex | None = None
        self._dirty: set[str] = set()  # tables written in the open backend transaction
        self._dirty_unknown = False  # a write whose tables the parser could not name
        self._last_write: dict[str, dt.datetime] = {}  # committed writes of this session
        self._last_unknown_write: dt.datetime | None = None
        self._counters = dict.fromkeys(("hits", "presence_misses", "currency_misses", "remote"), 0)
        self._timeline_floor: dt.datetime | None = None  # None: not inside TIMEORDERED
        self._timeline_active = False
        self.closed = False

    # -- PEP 249 --------------------------------------------------------------------------

    def cursor(self) -> Cursor:
        self._check_open()
        return Cursor(self)

    def execute(self, operation: str, parameters: Params = None) -> Cursor:
        """psycopg's shortcut: a new cursor, executed."""
        return self.cursor().execute(operation, parameters)

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """psycopg's transaction block: commits on success, rolls back on an exception (a
        savepoint when nested or inside an open transaction). Writes inside count as
        uncommitted until the block's own COMMIT."""
        self._check_open()
        try:
            with self._pg.transaction():
                yield self
        except psycopg.Error as exc:
            self._settle_writes(rolled_back=True)
            raise errors.translate(exc) from exc
        except BaseException:
            self._settle_writes(rolled_back=True)
            raise
        self._settle_writes()

    def commit(self) -> None:
        self._check_open()
        self._backend_call(self._pg.commit)
        self._writes_committed()

    def rollback(self) -> None:
        self._check_open()
        self._backend_call(self._pg.rollback)
        self._dirty.clear()
        self._dirty_unknown = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.wait_for_admissions()
        if self._admitter is not None:
            self._admissions.put(None)
            self._admitter.join()
        try:
            self._pg.close()
        finally:
            try:
                self._flush_counters()
            finally:
                self._store.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # As psycopg: commit on success, roll back on an exception, then close.
        if not self.closed:
            try:
                if exc_type is None:
                    self.commit()
                else:
                    self.rollback()
            finally:
                self.close()

    @property
    def autocommit(self) -> bool:
        return bool(self._pg.autocommit)

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        self._check_open()
        self._backend_call(lambda: setattr(self._pg, "autocommit", value))

    # -- session timeline (§2.3) -------------------------------------------------------------

    @contextmanager
    def timeordered(self) -> Iterator[Connection]:
        """Inside, no query reads data older than what an earlier query of the block read."""
        self.begin_timeordered()
        try:
            yield self
        finally:
            self.end_timeordered()

    def begin_timeordered(self) -> None:
        if self._timeline_active:
            raise ProgrammingError("BEGIN TIMEORDERED inside a TIMEORDERED block: end it first")
        self._timeline_active = True
        self._timeline_floor = None

    def end_timeordered(self) -> None:
        if not self._timeline_active:
            raise ProgrammingError("END TIMEORDERED without BEGIN TIMEORDERED")
        self._timeline_active = False
        self._timeline_floor = None

    @property
    def timeline_floor(self) -> dt.datetime | None:
        """The freshest data time read inside the current TIMEORDERED block (None outside)."""
        return self._timeline_floor

    def _read_at(self, moment: dt.datetime) -> None:
        if self._timeline_active and (
            self._timeline_floor is None or moment > self._timeline_floor
        ):
            self._timeline_floor = moment

    # -- internals ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise InterfaceError("the connection is closed")

    def _backend_call(self, action: t.Callable[[], t.Any]) -> t.Any:
        try:
            return action()
        except psycopg.Error as exc:
            raise errors.translate(exc) from exc

    def _apply_cache_ddl(self, statement: Statement) -> None:
        self._catalog = fetch_catalog(self.backend)
        self._store.save_catalog(self._catalog)
        self._store.apply_ddl([statement], self._catalog)

    def _base_tables(self, query: Query) -> list[str]:
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
                    self._catalog = fetch_catalog(self.backend)
                except errors.BackendUnavailableError:
                    break  # the backend is down: plan with the catalog we have
                self._store.save_catalog(self._catalog)
                self._catalog_stale = False
                self._tables_of.clear()
            try:
                constraint = normalize_constraint(query, self._catalog)
            except errors.CatalogError:
                continue  # created since the catalog was read: read it again, once
            return [instance.table for instance in constraint.instances]
        # Relations the catalog does not list (temporary tables): name them as written.
        return [
            source.table
            for block in query.analysis.blocks
            for source in block.sources
            if source.is_table and source.table is not None
        ]

    # -- what the guards need --------------------------------------------------------------

    def _region_index(self) -> RegionIndex:
        if self._index is None or self._index.version != self._store.version:
            self._index = RegionIndex.build(self._store)
        return self._index

    def _wrote(self, tables: set[str] | None) -> None:
        """A write reached the backend (tables None: the parser could not name them)."""
        if tables is None:
            self._dirty_unknown = True
        else:
            self._dirty |= tables
        self._settle_writes()

    def _settle_writes(self, rolled_back: bool = False) -> None:
        """Once the backend session is outside any transaction, its writes are over: committed
        (autocommit, a COMMIT sent as SQL, the end of a transaction block) or rolled back. A
        rollback the session cannot tell from a commit counts as a commit: stricter reads."""
        if not (self._dirty or self._dirty_unknown):
            return
        if self._pg.info.transaction_status != pq.TransactionStatus.IDLE:
            return
        if rolled_back:
            self._dirty.clear()
            self._dirty_unknown = False
        else:
            self._writes_committed()

    def _writes_committed(self) -> None:
        now = self._backend_now()
        for table in self._dirty:
            self._last_write[table] = now
        if self._dirty_unknown:
            self._last_unknown_write = now
        self._dirty.clear()
        self._dirty_unknown = False

    def _session(self, catalog_tables: t.Iterable[str]) -> Session:
        # The guards only read the session's sets: shared, copied only when widened below.
        session = Session(
            now=self._backend_now(),
            timeline_floor=self._timeline_floor,
            dirty_tables=self._dirty,
            last_write=self._last_write,
        )
        if self._dirty_unknown:
            session.dirty_tables = self._dirty | set(catalog_tables)
        if self._last_unknown_write is not None:
            session.last_write = dict(self._last_write)
            for table in catalog_tables:
                previous = session.last_write.get(table)
                if previous is None or previous < self._last_unknown_write:
                    session.last_write[table] = self._last_unknown_write
        return session

    def _leaf_fetcher(self) -> Fetch:
        """How a mixed plan gets its remote leaves: from the process's backend pool, in
        parallel; through the session's own connection while it holds uncommitted writes
        (only it can see them)."""
        if self._dirty or self._dirty_unknown:
            pg = self._pg
            return lambda leaves: [copy_to_arrow(pg, *leaf) for leaf in leaves]
        backend = self.backend
        return lambda leaves: in_parallel(
            backend, [functools.partial(_copy_leaf, leaf=leaf) for leaf in leaves]
        )

    def _backend_now(self) -> dt.datetime:
        """The backend's clock (erring late), re-measured every CLOCK_MAX_AGE seconds."""
        clock = self.clock
        now = dt.datetime.now(dt.UTC)
        if (now - clock.measured_at).total_seconds() > CLOCK_MAX_AGE:
            try:
                self.clock = clock = measure_clock(self._pg)
                self._store.save_clock(clock)
            except psycopg.Error:
                # the backend is unreachable: keep the last measurement, pushed later by the
                # drift it may have accumulated since (so the estimate still errs late)
                self.clock = clock = dataclasses.replace(
                    clock,
                    offset_seconds=clock.offset_seconds + DRIFT * CLOCK_MAX_AGE,
                    measured_at=now,
                )
        return now + dt.timedelta(seconds=clock.offset_seconds)

    def _flush_counters(self) -> None:
        pending = {k: v for k, v in self._counters.items() if v}
        if pending:
            self._store.add_counters(pending)
        self._counters = dict.fromkeys(self._counters, 0)

    # -- admission on a presence miss (SPEC 5.5) ---------------------------------------------

    def _admit_later(self, misses: list[tuple[str, tuple[t.Any, ...]]]) -> None:
        for item in misses:
            if item in self._queued:
                continue
            self._queued.add(item)
            if self._admitter is None:
                self._admitter = threading.Thread(
                    target=self._admit_loop, name="mtcache-admit", daemon=True
                )
                self._admitter.start()
            self._admissions.put(item)

    def wait_for_admissions(self) -> None:
        """Block until the background admissions queued so far are done."""
        if self._admitter is not None:
            self._admissions.join()

    def _admit_loop(self) -> None:
        store = self._store.for_thread()
        try:
            while (item := self._admissions.get()) is not None:
                control, key = item
                try:
                    Maintainer(store, self.backend).admit(control, [key])
                except Exception as exc:  # the query was answered remotely; log and go on
                    self.admission_errors.append(f"admitting {key} into {control}: {exc}")
                finally:
                    self._queued.discard(item)
                    self._admissions.task_done()
            self._admissions.task_done()
        finally:
            store.close()

    def _parsed(self, operation: str) -> Statement | None:
        """The typed statement for a text, parsed once per connection (LRU)."""
        parses = self._parses
        try:
            parses.move_to_end(operation)
            return parses[operation]
        except KeyError:
            pass
        statement = _parse(operation)
        if len(parses) >= PLAN_CACHE_SIZE:
            parses.popitem(last=False)
        parses[operation] = statement
        return statement

    def _plan(self, operation: str, query: Query, parameters: Params) -> PlanEntry:
        """The plan of a statement shape, from the plan cache when the schema is unchanged."""
        entry = self._plans.get(operation)
        if entry is not None and entry.schema_version == self._store.schema_version:
            return entry
        self._base_tables(query)  # refreshes a stale catalog
        model = model_query(query, self._catalog)
        try:
            document = explain_query(query, parameters, self._catalog, self._store, self.backend)
            use_cache = document["plan"]["op"] != "RemoteQuery"
        except errors.BackendUnavailableError:
            use_cache = True  # no backend to cost against: the guards decide
        entry = PlanEntry(query, model, use_cache, self._store.schema_version)
        if len(self._plans) >= PLAN_CACHE_SIZE:
            self._plans.pop(next(iter(self._plans)))
        self._plans[operation] = entry
        return entry

    def _maintainer(self) -> Maintainer:
        return Maintainer(self._store, self.backend)


@dataclass
class PlanEntry:
    """What a statement shape costs once: its parse, model and the cost-based choice between
    the whole statement remote and the guarded (local/mixed) plan."""

    query: Query
    model: t.Any
    use_cache: bool
    schema_version: int
    # per decision (view or remote leaf of each access) and parameter style
    templates: dict[tuple[tuple[tuple[int, str], ...], bool], DecisionTemplate] = field(
        default_factory=dict
    )
    slots: dict[int, int | str] | None = None  # placeholder -> parameter, found once


# psycopg's test for "the statement returned rows" (Cursor.description), on a result
_ROW_STATUSES = frozenset((pq.ExecStatus.TUPLES_OK, pq.ExecStatus.SINGLE_TUPLE,
                           pq.ExecStatus.TUPLES_CHUNK))  # fmt: skip


class _ResultShape:
    """A backend result's columns, kept so the DB-API description is built only when read:
    psycopg.Column reads exactly these attributes of a cursor, frozen here at one result
    (the psycopg cursor itself is reused by the next statement)."""

    __slots__ = ("_encoding", "adapters", "pgresult")

    def __init__(self, result: pq.abc.PGresult, cursor: psycopg.Cursor[t.Any]) -> None:
        self.pgresult = result
        self._encoding = cursor._encoding
        self.adapters = cursor.adapters


class Cursor:
    """PEP 249 cursor. ``provenance`` tells, per table access of the last query, where the
    data came from (SPEC §9); ``messages`` holds warnings as (class, text) pairs."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.arraysize = 1
        self._description: list[tuple[t.Any, ...]] | None = None
        self._pg_columns: _ResultShape | None = None  # the backend's result, described lazily
        self.rowcount = -1
        self.messages: list[tuple[type[Warning], str]] = []
        self._provenance: list[dict[str, t.Any]] = []
        # the provenance of the last query, built when first read (most callers never do)
        self._pending: t.Callable[[], list[dict[str, t.Any]]] | None = None
        self._pg_cursor: psycopg.Cursor[t.Any] | None = None  # reused for backend statements
        self.plan: dict[str, t.Any] | None = None  # the last EXPLAIN's document
        self.closed = False
        self._rows: list[tuple[t.Any, ...]] = []
        self._position = 0

    # -- PEP 249 --------------------------------------------------------------------------

    @property
    def description(self) -> list[tuple[t.Any, ...]] | None:
        """Seven items per result column (PEP 249), None when the statement returned no rows.
        Built on first access: most applications never read it on the hot path."""
        if self._description is None and self._pg_columns is not None:
            shape = self._pg_columns
            self._description = [
                (c.name, c.type_code, c.display_size, c.internal_size, c.precision, c.scale,
                 c.null_ok)
                for c in (psycopg.Column(t.cast(t.Any, shape), i)
                          for i in range(shape.pgresult.nfields))
            ]  # fmt: skip
        return self._description

    @description.setter
    def description(self, value: list[tuple[t.Any, ...]] | None) -> None:
        self._description = value
        self._pg_columns = None

    @property
    def provenance(self) -> list[dict[str, t.Any]]:
        """Per table access of the last query: where its rows came from (SPEC §9)."""
        if self._pending is not None:
            self._provenance = self._pending()
            self._pending = None
        return self._provenance

    @provenance.setter
    def provenance(self, value: list[dict[str, t.Any]]) -> None:
        self._provenance = value
        self._pending = None

    def execute(self, operation: str, parameters: Params = None) -> Cursor:
        if self.closed or self.connection.closed:
            self._check_open()
        self._reset()
        statement = self.connection._parsed(operation)
        if isinstance(statement, Query):
            self._run_query(statement, operation, parameters)
        elif statement is None:
            self._run_backend(operation, parameters)
        elif isinstance(statement, Timeline):
            if parameters:
                raise ProgrammingError("TIMEORDERED takes no parameters")
            if statement.begin:
                self.connection.begin_timeordered()
            else:
                self.connection.end_timeordered()
        else:
            if parameters:
                raise ProgrammingError("cache DDL takes no parameters")
            self.connection._apply_cache_ddl(statement)
        return self

    def executemany(self, operation: str, seq_of_parameters: Sequence[Params]) -> Cursor:
        self._check_open()
        total = 0
        for parameters in seq_of_parameters:
            self.execute(operation, parameters)
            total += max(self.rowcount, 0)
        self.rowcount = total
        self.description = None
        self._rows = []
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

    # -- execution ------------------------------------------------------------------------

    def _run_query(self, query: Query, operation: str, parameters: Params) -> None:
        connection = self.connection
        if query.is_select and query.explain is None:  # reads: the hot paths first
            if query.has_currency_clause:
                try:
                    plan = connection._plan(operation, query, parameters)
                    if plan.use_cache and self._run_through_cache(plan, parameters):
                        return
                    self._run_backend(query.backend_sql, parameters)
                except errors.BackendUnavailableError as exc:
                    self._answer_without_backend(query, operation, parameters, exc)
                    return
            else:  # plain SQL: the backend gets exactly what the application wrote
                self._run_backend(operation, parameters)
            self._record_remote(query)
            connection._counters["remote"] += 1
            return
        target = _control_target(query, connection._store)
        if target is not None:
            self._edit_control_table(query, target, parameters)
            return
        if query.explain is not None and query.has_currency_clause and query.is_select:
            self._explain(query, parameters)
            return
        if query.has_currency_clause or query.explain is not None:
            sql = query.backend_sql
        else:
            sql = operation
        self._run_backend(sql, parameters)
        if isinstance(query.tree, exp.Create | exp.Drop | exp.Alter | exp.Command):
            connection._catalog_stale = True  # the backend's tables may have changed
            if isinstance(query.tree, exp.Command):
                connection._wrote(None)
        elif isinstance(query.tree, exp.Insert | exp.Update | exp.Delete | exp.Merge):
            connection._wrote(_written_tables(query.tree))

    def _run_through_cache(self, plan: PlanEntry, parameters: Params) -> bool:
        """Run locally (or mixed) when the guards allow; False to go remote whole."""
        connection = self.connection
        model = plan.model
        if plan.slots is None:
            plan.slots = slots(model)
        bound = Parameters(model, parameters, plan.slots)
        index = connection._region_index()
        session = connection._session(connection._catalog.tables)
        misses = Misses()
        bindings = decide(model, index, bound, session, misses, connection._catalog)
        counters = connection._counters
        counters["presence_misses"] += misses.presence
        counters["currency_misses"] += misses.currency
        if connection.admit_on_miss and misses.admittable:
            connection._admit_later(misses.admittable)
        if bindings is None:
            return False
        result = self._run_decision(plan, bindings, bound, session.now)
        self.description = result.description
        self._rows = result.rows
        self.rowcount = len(result.rows)
        self._pending = lambda: result.provenance
        local = result.local_count
        counters["hits"] += local
        remote = local < len(result.bindings)
        if remote:
            counters["remote"] += 1
        if connection._timeline_active:
            moments = [session.now] if remote else []
            if (newest := result.newest_local) is not None:
                moments.append(newest)
            if moments:
                connection._read_at(max(moments))
        return True

    def _run_decision(
        self, plan: PlanEntry, bindings: dict[int, t.Any], bound: Parameters, now: dt.datetime
    ) -> Result:
        """Run the guards' decision with the plan's statement for it (made on first use)."""
        connection = self.connection
        with_params = bound.params is not None
        signature = (
            tuple(sorted((i, b.match.view.name if b.match else "") for i, b in bindings.items())),
            with_params,
        )
        template = plan.templates.get(signature)
        if template is None:
            template = decision_template(plan.model, bindings, connection._catalog, with_params)
            plan.templates[signature] = template
        fetch = connection._leaf_fetcher() if template.leaves else None
        try:
            return run_template(template, bound, bindings, connection._store.con, now, fetch)
        except psycopg.Error as exc:
            raise _backend_error(exc, "a remote part of the query needs it") from exc
        except duckdb.Error as exc:
            raise errors.translate(exc, "the local plan failed in DuckDB") from exc

    def _run_backend(self, sql: str, parameters: Params) -> None:
        connection = self.connection
        try:
            cur = self._pg_cursor
            if cur is None or cur.closed:
                cur = self._pg_cursor = connection._pg.cursor()
            cur.execute(sql, parameters)  # type: ignore[arg-type]
            self.rowcount = cur.rowcount
            result = cur.pgresult
            if result is not None and (result.nfields or result.status in _ROW_STATUSES):
                self._pg_columns = _ResultShape(result, cur)
                self._rows = cur.fetchall()  # psycopg rows are tuples already
                self.rowcount = len(self._rows)
        except psycopg.Error as exc:
            raise _backend_error(exc, "the statement needs it: reconnect when it is back") from exc
        finally:
            while connection._notices:
                self.messages.append((errors.Warning, connection._notices.pop(0)))
            if connection._dirty or connection._dirty_unknown:
                connection._settle_writes()  # e.g. a COMMIT sent as SQL
        if connection._timeline_active:
            connection._read_at(connection._backend_now())

    def _explain(self, query: Query, parameters: Params) -> None:
        """EXPLAIN of a query with clauses: the cache's plan, one text line per row."""
        from optimizer.explain_plan import render

        connection = self.connection
        connection._base_tables(query)
        document = explain_query(
            query, parameters, connection._catalog, connection._store, connection.backend
        )
        text = psycopg.postgres.types.get("text")
        self.description = [("QUERY PLAN", text.oid if text else None, None, None, None, None,
                             None)]  # fmt: skip
        self._rows = [(line,) for line in render(document)]
        self.rowcount = len(self._rows)
        self.plan = document

    def _answer_without_backend(
        self,
        query: Query,
        operation: str,
        parameters: Params,
        down: errors.BackendUnavailableError,
    ) -> None:
        """SPEC §5.9: with stale_ok, present local data of any age answers, flagged stale;
        otherwise say which access needs the backend, its bound and the local data's age."""
        connection = self.connection
        plan = connection._plans.get(operation)
        if plan is None or plan.schema_version != connection._store.schema_version:
            model = model_query(query, connection._catalog)
            plan = PlanEntry(query, model, True, connection._store.schema_version)
        model = plan.model
        index = connection._region_index()
        session = connection._session(connection._catalog.tables)
        session.ignore_currency = True
        bound = Parameters(model, parameters)
        bindings = decide(model, index, bound, session, Misses(), connection._catalog)
        if connection.stale_ok and bindings is not None:
            result = self._run_decision(plan, bindings, bound, session.now)
            limits = {
                i.table: cls.bound_seconds
                for cls in model.constraint.classes
                for i in cls.instances
            }
            for entry in result.provenance:
                if entry["currency_seconds"] > limits.get(entry["table"], 0.0):
                    entry["stale"] = True
                    self.messages.append((
                        errors.Warning,
                        f"{entry['table']}: answered from {entry['view']} "
                        f"{entry['currency_seconds']:.1f}s old, beyond its bound of "
                        f"{limits[entry['table']]:g}s: the backend is unreachable (stale_ok)",
                    ))  # fmt: skip
            self.description = result.description
            self._rows = result.rows
            self.rowcount = len(result.rows)
            self.provenance = result.provenance
            return
        raise errors.BackendUnavailableError(
            _needs_backend(model, bindings, session.now) + f"; {down}"
        ) from down

    def _record_remote(self, query: Query) -> None:
        connection = self.connection
        self._pending = lambda: [remote_provenance(t) for t in connection._base_tables(query)]

    def _edit_control_table(
        self, query: Query, target: tuple[str, str], parameters: Params
    ) -> None:
        """INSERT INTO control ... admits keys; DELETE FROM control ... evicts them."""
        kind, control = target
        store = self.connection._store
        columns = store.load_schema().control_tables[control].column_names
        tree = bind_literals(query.tree, parameters)
        if kind == "insert":
            source = tree.expression
            named = [c.name.lower() for c in tree.this.expressions] if isinstance(
                tree.this, exp.Schema) else list(columns)  # fmt: skip
            unknown = [c for c in named if c not in columns]
            if unknown or sorted(named) != sorted(columns):
                raise ProgrammingError(
                    f"INSERT INTO {control} must give exactly its control key "
                    f"({', '.join(columns)}); got ({', '.join(named)})"
                )
            rows = store.con.execute(source.sql(dialect="duckdb")).fetchall()
            keys = [tuple(row[named.index(c)] for c in columns) for row in rows]
            report = self.connection._maintainer().admit(control, keys)
            self.rowcount = len(keys)
        else:
            where = tree.args.get("where")
            select = ", ".join(f'"{c}"' for c in columns)
            sql = f'SELECT {select} FROM "{control}"'
            if where is not None:
                sql += f" WHERE {where.this.sql(dialect='duckdb')}"
            keys = [tuple(r) for r in store.con.execute(sql).fetchall()]
            report = self.connection._maintainer().evict(control, keys)
            self.rowcount = len(keys)
        self.messages.append((errors.Warning, f"{report.operation}: {len(report.regions)} regions"))

    # -- state ----------------------------------------------------------------------------

    def _reset(self) -> None:
        self._description = None
        self._pg_columns = None
        self.rowcount = -1
        self.messages = []
        self._provenance = []
        self._pending = None
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


def _parse(operation: str) -> Statement | None:
    """The typed statement, or None for plain SQL the parser cannot read but the backend may
    (e.g. psycopg's ``%%``): anything using an extension must parse."""
    try:
        return parse_one(operation)
    except errors.SqlSyntaxError:
        words = {tok.text.upper() for tok in _tokens(operation)}
        if words & _EXTENSION_WORDS:
            raise
        return None


def _tokens(operation: str) -> list[t.Any]:
    try:
        return list(DIALECT.tokenize(operation))
    except Exception:
        return []


def _control_target(query: Query, store: CacheStore) -> tuple[str, str] | None:
    """("insert"|"delete", control table) when the statement edits a control table."""
    tree = query.tree
    if isinstance(tree, exp.Insert):
        table = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
        kind = "insert"
    elif isinstance(tree, exp.Delete):
        table, kind = tree.this, "delete"
    elif isinstance(tree, exp.Update):
        table, kind = tree.this, "update"
    else:
        return None
    if not isinstance(table, exp.Table) or table.db:
        return None
    name = table.name.lower()
    if name not in store.load_schema().control_tables:
        return None
    if kind == "update":
        raise NotSupportedError(
            f"UPDATE on control table {name}: control keys are admitted with INSERT and "
            "evicted with DELETE"
        )
    return kind, name


def _needs_backend(model: t.Any, bindings: dict[int, t.Any] | None, now: dt.datetime) -> str:
    """Which access could not be answered locally, with its bound and its local data's age."""
    for cls in model.constraint.classes:
        for instance in sorted(cls.instances, key=lambda i: i.id):
            binding = (bindings or {}).get(instance.id)
            label = f"{instance.table} ({instance.label})"
            if binding is None or binding.match is None:
                return (
                    f"{label} needs the backend (CURRENCY BOUND {cls.bound_seconds:g}s) and "
                    "the cache holds no usable copy of it"
                )
            ages = [(now - s[0]).total_seconds() for _, s in binding.regions if s[0]]
            if ages and max(ages) > cls.bound_seconds:
                return (
                    f"{label} needs the backend (CURRENCY BOUND {cls.bound_seconds:g}s): the "
                    f"local data in {binding.match.view.name} is {max(ages):.1f}s old; "
                    "connect with stale_ok=True to accept it"
                )
    return "a remote part of the query needs the backend"


def _written_tables(tree: exp.Expr) -> set[str] | None:
    target = tree.this
    if isinstance(target, exp.Schema):
        target = target.this
    if isinstance(target, exp.Table):
        return {target.name.lower()}
    return None


def _copy_leaf(
    conn: psycopg.Connection[t.Any],
    *,
    leaf: tuple[str, list[tuple[str, str]], dict[str, t.Any] | None],
) -> pa.Table:
    return copy_to_arrow(conn, *leaf)


def _backend_error(exc: psycopg.Error, consequence: str) -> errors.Error:
    """A psycopg error in the PEP 249 tree; a lost backend says what it stops."""
    if isinstance(exc, psycopg.OperationalError):
        return errors.BackendUnavailableError(
            f"the backend is unreachable ({first_line(exc)}); {consequence}"
        )
    return errors.translate(exc)
