"""A session of the engine: one client's backend connection (its transaction is the session's),
settings, writes and timeline, over the engine's shared parts (`cache.engine.engine`).

``session.execute(sql, params)`` runs one statement and returns its `Result`. It routes the
statement (`cache.engine.route`); a query with currency clauses takes the cache's path, which
reads top to bottom in `cache.engine.cached_read` (`CachedReads._read`):

    parse and route (cached per text) -> plan (`Planner.prepare`, cached per shape: names
    resolved, the constraint normalized, the backend's estimates and description gathered,
    then `optimizer.planner.plan_query`) -> guard (`decide`: `optimizer.rules.evaluate_guards`)
    -> run what the guards keep local in DuckDB, its remote leaves from PostgreSQL
    (`run`: `cache.execution.execute`), or the whole statement on the backend -> provenance
    (`cache.execution.provenance`, made when first read)

Every other statement goes to the backend on the session's connection, as written, except the
cache's own: its DDL, control-table edits (admit and evict), TIMEORDERED brackets and the
session currency bound. Calls are serialized per session (`cache.engine.boundary`); errors
leave as the PEP 249 tree of `sql_ext.errors`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
import typing as t
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import psycopg
from sqlglot import exp

from cache.backend.reflect import (
    existing_relations,
    temporary_relations,
)
from cache.backend.session_pool import SessionPool
from cache.defaults import DEFAULT_ENGINE
from cache.engine import inspect
from cache.engine.admin import Admin
from cache.engine.boundary import public
from cache.engine.cached_read import CachedReads
from cache.engine.engine import Engine, SessionOptions, bound_seconds
from cache.engine.link import BackendLink
from cache.engine.result import NO_PROVENANCE, Result, no_rows
from cache.engine.route import (
    CachedRead,
    ControlEdit,
    Explain,
    Inspection,
    Passthrough,
    Refresh,
    Route,
    SessionSetting,
    TimelineBracket,
    Write,
)
from cache.engine.settings import SETTINGS, CantChange, setting
from cache.engine.state import SessionState
from cache.execution.decisions import DecisionMemo
from cache.execution.execute import (
    UTC,
    zone_named,
)
from cache.execution.phases import Phases
from cache.execution.planning import Planner
from cache.execution.provenance import Executed, Provenance
from cache.store.counters import Counter
from cache.store.seed import take_seed
from heartbeat.clock import BackendClock
from optimizer.plan import Plan
from optimizer.rules.evaluate_guards import Decision
from sql_ext import CreateCachedView, CreateControlTable, DropCacheObject, Query
from sql_ext.errors import (
    BackendUnavailableError,
    InterfaceError,
    ProgrammingError,
    translate,
    translating,
)
from sql_ext.nodes import plural
from sql_ext.params import Params, bind_literals
from sql_ext.quoting import folded


class SeedRefused(ProgrammingError):
    sqlstate = "42501"  # insufficient_privilege


# the public methods' edge (cache.engine.boundary), naming this cache file
_public = public(lambda self: self.engine.cache_path, lambda self: getattr(self, "lock", None))


class Session(CachedReads):
    """One client's session on an engine (see the module). ``stale_ok``: answer from stale
    local data when the backend is down, with a warning; ``admit_on_miss``: admit a missed
    presence key in the background."""

    @_public
    def __init__(
        self,
        engine: Engine,
        options: SessionOptions | None = None,
        *,
        backend_parameters: t.Mapping[str, str] | None = None,
        backend_credentials: t.Mapping[str, str] | None = None,
        connect: bool = True,
        time_zone: str | None = None,
        pool: SessionPool | None = None,
    ) -> None:
        """``backend_parameters``: the backend session's startup parameters (user,
        application_name, options, settings such as DateStyle); ``backend_credentials``: what
        logs it in as that user (libpq's password or SCRAM keys: secret, never shown);
        ``connect``: open the backend
        connection now (else when a statement first needs it); ``time_zone``: the TimeZone
        the backend will report, for local answers given before it is connected; ``pool``:
        take the backend connection from this pool and give it back between transactions
        (`release_backend`; `cache.backend.session_pool`)."""
        options = options or SessionOptions()
        self.engine = engine
        self.lock = threading.RLock()  # one call at a time (cache.engine.boundary)
        self.stale_ok = options.stale_ok
        self.admit_on_miss = options.admit_on_miss
        self.currency_bound = options.currency_bound  # seconds, None: the strict default
        # the other settings of `cache.engine.settings` (SET mtcache.name = ...)
        self.provenance_notices = False
        self.admit_empty = False
        self.refresh_engine = DEFAULT_ENGINE  # (auto: inline unless a pull is large)
        self.spark_master: str | None = None  # (None: the engine's, `Engine.spark_master`)
        self.report_position = False  # a ParameterStatus mtcache.position after statements
        # how the last statement was answered (`cache.engine.conversation.statistics`): local,
        # mixed, fallback (guards failed), remote; the caller sets "cache" before the cache's
        self.last_route = "cache"
        self._seen_decision: Decision | None = None  # (`_saw`)
        self._seen_moment: dt.datetime | None = None
        self._remote_why: tuple[str, str, t.Any] | None = None
        self._remote_sent: list[tuple[Query, tuple[str, str, t.Any] | None, float]] = []
        # where the last statement's rows came from (EXPLAIN LAST STATEMENT): the provenance
        # or how to make it, never the rows
        self._last: Provenance | t.Callable[[], Provenance] = NO_PROVENANCE
        self._last_zone = zone_named(time_zone) if time_zone else UTC  # `_zone`
        # the backend connection and its books; while the backend is down the cache answers
        # what its guards allow, and the next statement that needs the backend connects
        self.link = BackendLink(
            engine.backend,
            engine.owner_role,
            autocommit=options.autocommit,
            context=options.context,
            parameters=backend_parameters,
            credentials=backend_credentials,
            pool=pool,
            on_lost=self._lost_transaction_ended,
        )
        self.counters = Counter.zeros()  # this session's, until it closes
        self.phases: Phases | None = None  # set to time each statement's phases
        self.closed = True  # until everything below is open
        engine.join(self)
        # while the backend is down the cache answers what its guards allow; the next
        # statement that needs the backend connects (`BackendLink.connection`)
        if connect:
            with contextlib.suppress(BackendUnavailableError):
                self.link.connect()
        self.store = engine.store.for_thread()  # a DuckDB handle of the session's own
        try:
            # a session without a backend connection judges currency on the process's clock
            self.state = SessionState(
                lambda: self.link.pg,
                self.store,
                engine.heartbeat_clock if connect else self._process_clock,
                (lambda now: (False, engine.heartbeat_clock()))
                if connect
                else self._process_clock_at_hand,
                self.link.ran_own,
            )
            self.planner = Planner(
                self.store,
                engine.backend,
                choice=options.plan_choice,
                given_delays=options.refresh_delays,
                plans=engine.plans,
                existing=lambda names: existing_relations(self.link.for_own_statement(), names),
                temporary=lambda: temporary_relations(self.link.for_own_statement()),
            )
        except BaseException:
            self.link.close()
            self.store.close()
            engine.leave(self)
            raise
        # what RESET returns each setting to: its value when the session began
        self._setting_defaults = {
            s.attribute: getattr(self, s.attribute) for s in SETTINGS.values() if s.writable
        }
        self._decisions = DecisionMemo()  # guard decisions while the regions and session stand
        self.admin = Admin(
            self.store,
            lambda: engine.backend,
            admissions=engine.admissions,
            on_catalog=self.planner.use_catalog,
            lock=self.lock,
            counters=lambda: engine.counters(self.store),
        )
        self.closed = False

    # -- one statement -------------------------------------------------------------------------

    @_public
    def execute(self, sql: str, params: Params = None) -> Result:
        """Run one statement (psycopg's ``%s`` / ``%(name)s`` placeholders for ``params``)."""
        self._check_open()
        phases = self.phases
        if phases is not None:
            phases.start()
        store = self.store
        route = self.engine.statements.route(
            sql,
            store.schema_version,
            store.control_table_names,
            self.currency_bound is not None,
            params is not None,
        )
        if isinstance(route, CachedRead):
            result = self._read(route.query, params)
            return self._noted(result, result.lineage)
        if isinstance(route, Passthrough | Write):
            self._mark("lookup")
            result = self._run_backend(route.executed, params)
            self._mark("run")
            self.forwarded(route)
            result.set_provenance(self._last)
            return self._noted(result)
        if isinstance(route, Explain):
            plan = self.planner.prepare(route.query, params, self.currency_bound).plan
            document, lines = self.explained(plan)
            lines = [json.dumps(document)] if route.json else lines
            return inspect.rows_of(
                inspect.EXPLAIN, [(line,) for line in lines], "EXPLAIN", plan=plan
            )
        if isinstance(route, ControlEdit):
            self._last = NO_PROVENANCE  # the cache's own statements read no table
            return self._edit_control_table(route, params)
        if params:  # the cache's other statements take none
            raise ProgrammingError(f"{_route_words(route)} takes no parameters")
        if isinstance(route, Inspection):  # about the last statement: it stays the last
            return self._inspect(route)
        if isinstance(route, SessionSetting):
            return self._setting_statement(route)
        self._last = NO_PROVENANCE
        if isinstance(route, Refresh):
            report = self.admin.refresh(
                route.view,
                route.keys,
                engine=self.refresh_engine,
                spark_master=self.spark_master or self.engine.spark_master,
            )
            return no_rows("REFRESH CACHED VIEW", notices=[_report_notice(report)])
        if isinstance(route, TimelineBracket):
            if route.begin:
                self.begin_timeordered()
            else:
                self.end_timeordered()
            return no_rows(f"{'BEGIN' if route.begin else 'END'} TIMEORDERED")
        return self.apply_cache_ddl([route.statement])[0]

    @_public
    def apply_cache_ddl(self, statements: list[t.Any]) -> list[Result]:
        """Cache DDL statements (`sql_ext` statements, as a script's) applied together, all
        or nothing: a result per statement."""
        self._check_open()
        self._last = NO_PROVENANCE
        applied = self.admin.apply_ddl(statements)
        results = [no_rows(_ddl_status(statement)) for statement in statements]
        notices = results[-1].notices if results else []
        notices += [_report_notice(report) for report in applied.filled]
        notices += [
            f"{view} was created but not filled: {why} (its reads go to the backend until "
            f"`REFRESH CACHED VIEW {view}` fills it)"
            for view, why in applied.unfilled
        ]
        return results

    # -- other statements ----------------------------------------------------------------------

    def _run_backend(self, executed: Executed, params: Params) -> Result:
        """Send a statement to PostgreSQL on the session's connection (``executed``: its SQL,
        as the result reports it)."""
        state = self.state
        try:
            result = self.link.run(executed, params)
        finally:
            if state.uncommitted or state.uncommitted_unknown:
                state.settle()  # e.g. a COMMIT sent as SQL
        if state.timeline_active:
            state.read_at(state.now())
        return result

    def _edit_control_table(self, edit: ControlEdit, params: Params) -> Result:
        """INSERT INTO control ... admits keys; DELETE FROM control ... evicts them."""
        store = self.store
        control = edit.control
        columns = store.load_schema().control_tables[control].column_names
        tree = bind_literals(edit.query.tree, params)
        if edit.kind == "insert":
            named = (
                [folded(c) for c in tree.this.expressions]
                if isinstance(tree.this, exp.Schema)
                else list(columns)
            )
            if sorted(named) != sorted(columns):
                raise ProgrammingError(
                    f"INSERT INTO {control} must give exactly its control key "
                    f"({', '.join(columns)}); got ({', '.join(named)})"
                )
            rows = store.con.execute(tree.expression.sql(dialect="duckdb")).fetchall()
            keys = [tuple(row[named.index(c)] for c in columns) for row in rows]
            report = self.admin.admit(control, keys, allow_empty=self.admit_empty)
            status = f"INSERT 0 {len(keys)}"
        else:
            keys = store.matching_keys(control, columns, tree.args.get("where"))
            report = self.admin.evict(control, keys)
            status = f"DELETE {len(keys)}"
        return no_rows(status, len(keys), [_report_notice(report)])

    # -- what a session asks the cache about itself (cache.engine.inspect) ---------------------

    def _inspect(self, route: Inspection) -> Result:
        if route.what == "last statement":
            return inspect.last_statement(self.last_provenance())
        if route.what == "cache advice":
            # pg_stat_statements is read as the cache's own role: only its sessions see what
            # it lists (another role is shown what the cache counted)
            owner = self._reader() == self.engine.owner_role
            return inspect.cache_advice(self.admin.advice(backend=owner))
        if route.what == "cache seed":
            # every cached row of every view: the cache's own role only
            if self._reader() != self.engine.owner_role:
                raise SeedRefused(
                    "SHOW CACHE SEED gives every cached row: only the cache's own role "
                    f"({self.engine.owner_role}) may take it; connect as that role"
                )
            return inspect.rows_of(inspect.CACHE_SEED, take_seed(self.store), "SHOW")
        document = self.admin.status(route.views)
        if route.what == "cached views":
            return inspect.cached_views(document, self._zone().info)
        if route.what == "cache stats":
            return inspect.cache_stats(self.engine.stats(document))
        return inspect.cache_status(document)

    def last_provenance(self) -> Provenance:
        """Where the session's last statement's rows came from (the cache's own statements
        and those that read no table: nothing)."""
        last = self._last
        if not isinstance(last, Provenance):
            last = self._last = last()
        return last

    def statement_notice(self) -> inspect.Notice | None:
        """The provenance NOTICE of the last statement, when the session asks for one
        (``mtcache.provenance``)."""
        return (
            inspect.provenance_notice(self.last_provenance()) if self.provenance_notices else None
        )

    def _noted(
        self, result: Result, lineage: Provenance | t.Callable[[], Provenance] | None = None
    ) -> Result:
        """A statement's result, its provenance kept as the session's last (``lineage``),
        with the provenance NOTICE if the session asks for one."""
        if lineage is not None:
            self._last = lineage
        notice = self.statement_notice()
        if notice is not None:
            result.notices.append(notice)
        return result

    # -- the cache's session settings (cache.engine.settings) ----------------------------------

    def _setting_statement(self, route: SessionSetting) -> Result:
        columns = inspect.result_columns(route)
        if columns is not None:  # SHOW
            return inspect.rows_of(columns, [(self.setting(route.name),)], "SHOW")
        value = route.value if route.action == "set" else None
        self.set_setting(route.name, value)
        return no_rows(route.action.upper())

    def setting(self, name: str) -> str:
        """A cache session setting's value as SHOW gives it (``mtcache.provenance``)."""
        found = setting(name)
        return found.show(getattr(self, found.attribute))

    @_public
    def set_setting(self, name: str, value: str | float | None, *, default: bool = False) -> None:
        """Set a cache session setting from its text (None: back to the session's default);
        ``default``: also make it the value RESET returns to (a startup option)."""
        found = setting(name)
        if not found.writable:
            raise CantChange(
                f'parameter "{name}" cannot be changed: it is the session\'s own '
                "(SET mtcache.min_position gives another cache's position)"
            )
        if value is None:
            chosen = self._setting_defaults[found.attribute]
        elif isinstance(value, str):
            chosen = found.read(value, name)
        else:  # SET CURRENCY BOUND's duration, in seconds already
            chosen = value
        setattr(self, found.attribute, chosen)
        if default:
            self._setting_defaults[found.attribute] = chosen

    # -- for a front end that sends statements to the backend itself (cache.server) ----------

    def route(self, sql: str, with_params: bool = False) -> Route:
        """What ``execute`` would do with the statement (`cache.engine.route`)."""
        store = self.store
        bound = self.currency_bound is not None
        return self.engine.statements.route(
            sql, store.schema_version, store.control_table_names, bound, with_params
        )

    def _process_clock(self) -> BackendClock | None:
        """The clock of this process (`SessionState`) for a session that connects only when
        it first needs the backend: the shared one until then (`Engine.shared_clock`), the
        heartbeat's alone once the session measures on a connection of its own (as a
        session that connected at once: asking the shared one then costs each statement
        that needs the time, a write passed through among them, and gains nothing)."""
        engine = self.engine
        return engine.heartbeat_clock() if self.link.pg is not None else engine.shared_clock()

    def _process_clock_at_hand(self, now: dt.datetime) -> tuple[bool, BackendClock | None]:
        """`_process_clock` at ``now`` without measuring: whether it would measure the
        backend's clock, and the clock it has."""
        engine = self.engine
        if self.link.pg is not None:
            return False, engine.heartbeat_clock()
        return engine.shared_clock_at_hand(now)

    def forwarded(self, route: Passthrough | Write) -> None:
        """A statement of this route reached the backend on this session's connection (sent
        by ``execute`` or by the caller itself): count it, and let the session's later reads
        see its writes and catalog changes."""
        if not self.forwarded_at_hand(route):
            self.caught_up()

    def forwarded_at_hand(self, route: Passthrough | Write) -> bool:
        """`forwarded`, but for what needs a measurement of the backend's clock (a write's
        commit time, the timeline's floor): False when that is left, the writes noted as
        uncommitted (stricter reads) until `caught_up` does the rest."""
        self.last_route = "remote"
        if isinstance(route, Passthrough) and route.reads is not None:
            query = route.reads
            self._last = lambda: Provenance.remote(self.planner.base_tables(query))
            self.counters[Counter.REMOTE] += 1
            self.state.saw_backend()
        else:
            self._last = NO_PROVENANCE
        if route.changes_catalog:
            self.planner.catalog_changed()
        self.link.left(route.effects)
        state = self.state
        if isinstance(route, Write):
            state.wrote(route.tables)
        if not state.settle_at_hand():  # (a write's, or a COMMIT sent as SQL)
            return False
        if state.timeline_active:
            now = state.now_at_hand()
            if now is None:
                return False
            state.read_at(now)
        return True

    def _lost_transaction_ended(self) -> None:
        """The backend connection was lost and is replaced: a transaction open on it ended
        with it (its writes count as committed for the session's own reads, the stricter
        choice)."""
        self.state.settle()

    def caught_up(self) -> None:
        """What `forwarded` left undone when it could not wait: the writes' commit time and
        the timeline's floor, on the backend's clock now (both later than they would have
        been: stricter reads, never looser)."""
        state = self.state
        state.settle()
        if state.timeline_active:
            state.read_at(state.now())

    def settle(self) -> None:
        """The backend session may have ended a transaction (a pipeline the caller ran):
        writes of a finished one are committed (or rolled back) for the session's reads."""
        self.state.settle()

    def settle_at_hand(self) -> bool:
        """`settle` if that needs no measurement of the backend's clock; False: nothing
        changed (`caught_up` does it)."""
        return self.state.settle_at_hand()

    def cancel(self) -> None:
        """Cancel the statement running in this session (from another thread): its DuckDB
        work and its backend statement. Nothing happens to a session that runs nothing."""
        self.interrupt_local()
        self.link.cancel()

    def cancel_backend(self) -> None:
        """Cancel the session's backend statement, if one runs (from another thread)."""
        self.link.cancel()

    def interrupt_local(self) -> None:
        """Interrupt the session's DuckDB statement, if one runs (DuckDB forgets an interrupt
        that comes before its statement starts: a canceller repeats it while the cancelled
        statement runs)."""
        con = self.store.con
        if con is not None:  # (None: the session closed meanwhile)
            with contextlib.suppress(duckdb.Error):
                con.interrupt()

    # -- EXPLAIN ---------------------------------------------------------------------------------

    @_public
    def explain(self, sql: str, params: Params = None) -> Plan:
        """The plan a query runs with (the one EXPLAIN shows): planned now, or the cached
        plan of its shape."""
        self._check_open()
        return self.prepare(sql, params).plan

    def explained(self, plan: Plan) -> tuple[dict[str, t.Any], list[str]]:
        """What EXPLAIN shows of a plan: its document and its text lines, with notes on what
        the cache holds that makes its guards fail whatever the bound (a view never filled:
        `inspect.unfilled_notes`)."""
        notes = inspect.unfilled_notes(plan, self.store, self.engine.fills_views)
        document = plan.to_json()
        if notes:
            document["notes"] = notes
        return document, [*plan.render(), *(f"note: {note}" for note in notes)]

    def _query(self, sql: str) -> Query:
        statement = self.engine.statements.parse(sql)
        if not isinstance(statement, Query):
            what = (
                f"a {statement.kind} statement"
                if statement is not None
                else "not SQL the cache can read"
            )
            raise ProgrammingError(f"explain takes a query; this is {what} (try `mtcache parse`)")
        if statement.explain is not None:
            statement = statement.without_explain()
        return statement

    # -- transactions ----------------------------------------------------------------------------

    @_public
    def commit(self) -> None:
        self._check_open()
        self.link.commit()
        self.state.committed()

    @_public
    def rollback(self) -> None:
        self._check_open()
        self.link.rollback()
        self.state.rolled_back()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """psycopg's transaction block: commits on success, rolls back on an exception (a
        savepoint when nested or inside an open transaction). Writes inside count as
        uncommitted until the block's own COMMIT."""
        self._check_open()
        try:
            with self.link.transaction():
                yield self
        except psycopg.Error as exc:
            self.state.settle(rolled_back=True)
            raise translate(exc) from exc
        except BaseException:
            self.state.settle(rolled_back=True)
            raise
        self.state.settle()

    @property
    def autocommit(self) -> bool:
        return self.link.autocommit

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        self._check_open()
        self.link.autocommit = value

    # -- settings --------------------------------------------------------------------------------

    def set_currency_bound(self, value: str | float | dt.timedelta | None) -> None:
        """The session's bound for every SELECT block without a clause (None: bound 0)."""
        self._check_open()
        self.currency_bound = bound_seconds(value)

    def backend_setting(self, name: str) -> t.Any:
        """A psycopg session setting (``isolation_level``, ``read_only``, ``deferrable``)."""
        return self.link.setting(name)

    def set_backend_setting(self, name: str, value: t.Any) -> None:
        """Set it on the backend session, and keep it for the next one if this is lost."""
        self._check_open()
        self.link.set_setting(name, value)

    @property
    def info(self) -> psycopg.ConnectionInfo:
        """The backend session's connection information (psycopg's), connecting if needed."""
        self._check_open()
        info = translating(lambda: self.link.for_own_statement().info)
        return t.cast(psycopg.ConnectionInfo, info)

    @property
    def broken(self) -> bool:
        """Whether the backend session was lost (the next statement connects again)."""
        return self.link.broken

    @property
    def backend_pid(self) -> int | None:
        """The process id of the session's backend connection (None: none is open)."""
        return self.link.pid

    def add_notice_handler(self, handler: t.Callable[[t.Any], None]) -> None:
        """Call ``handler`` with each notice the backend sends (a psycopg ``Diagnostic``)."""
        self.link.add_notice_handler(handler)

    # -- the session timeline (§2.3) -----------------------------------------------------------

    def begin_timeordered(self) -> None:
        self.state.begin_timeordered()

    def end_timeordered(self) -> None:
        self.state.end_timeordered()

    @property
    def clock(self) -> BackendClock:
        """The backend clock as this session estimates it now."""
        self.state.now()  # brings the estimate up to date (the heartbeat's, a re-measure)
        return self.state.clock

    @property
    def timeline_floor(self) -> dt.datetime | None:
        return self.state.timeline_floor

    # -- the freshness position (several caches in front of one backend) -------------------

    @property
    def position(self) -> dt.datetime | None:
        """The newest backend moment the session has seen (`SessionState.position`): given
        to another cache as ``min_position``, it never reads older data there."""
        return self.state.position()

    @property
    def min_position(self) -> dt.datetime | None:
        return self.state.min_position

    @min_position.setter
    def min_position(self, moment: dt.datetime | None) -> None:
        self.state.require(moment)

    # -- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.link.close()
        finally:
            self.store.close()
            self.engine.leave(self)

    def _check_open(self) -> None:
        if self.closed:
            raise InterfaceError("the connection is closed")


def _report_notice(report: t.Any) -> inspect.Notice:
    """The NOTICE of an admission, eviction or refresh: what it did, its report as JSON."""
    return inspect.Notice.with_detail(
        f"{report.operation}: {plural(report.regions_counted, 'region')}", report.to_json()
    )


def _route_words(route: Route) -> str:
    """What a statement of the cache's own is, for its errors."""
    if isinstance(route, Inspection):
        return (
            "EXPLAIN LAST STATEMENT"
            if route.what == "last statement"
            else f"SHOW {route.what.upper()}"
        )
    if isinstance(route, SessionSetting):
        return f"{route.action.upper()} {route.name}"
    if isinstance(route, Refresh):
        return "REFRESH CACHED VIEW"
    if isinstance(route, TimelineBracket):
        return "TIMEORDERED"
    return "cache DDL"


def _ddl_status(statement: t.Any) -> str:
    """The command status of cache DDL: CREATE CONTROL TABLE, DROP CACHED VIEW, ..."""
    if isinstance(statement, CreateCachedView):
        return "CREATE CACHED VIEW"
    if isinstance(statement, CreateControlTable):
        return "CREATE CONTROL TABLE"
    if isinstance(statement, DropCacheObject):
        return f"DROP {statement.object_kind.upper()}"
    return "CACHE DDL"
