"""A session of the engine: one client's backend connection (its transaction is the session's),
settings, writes and timeline, over the engine's shared parts (`cache.engine.engine`).

``session.execute(sql, params)`` runs one statement and returns its `Result`. It routes the
statement (`cache.engine.route`); a query with currency clauses takes the cache's path, which
reads top to bottom in `Session._read`:

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
import functools
import json
import math
import threading
import time
import typing as t
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import psycopg
import pyarrow as pa
from psycopg import pq
from sqlglot import exp

from cache.backend.copy_arrow import copy_to_arrow
from cache.backend.pool import in_one_snapshot
from cache.backend.reflect import (
    existing_relations,
    temporary_relations,
)
from cache.backend.session_pool import SessionPool
from cache.engine import inspect
from cache.engine.admin import Admin
from cache.engine.boundary import public, public_read
from cache.engine.engine import Engine, SessionOptions, bound_seconds
from cache.engine.lane import Lane
from cache.engine.link import BackendLink
from cache.engine.link.effects import effects_of
from cache.engine.read import Read, Reading, drive, either
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
from cache.execution.decisions import DecisionMemo, expiry
from cache.execution.execute import (
    UTC,
    Fetch,
    LocalUnfit,
    Memo,
    Zone,
    answer_at_hand,
    checks_values,
    compiled_for,
    run_local,
    zone_named,
)
from cache.execution.execute import Result as LocalRun
from cache.execution.phases import Phases
from cache.execution.planning import Planner, Prepared
from cache.execution.provenance import Executed, Provenance
from cache.store.cache_file import COUNTERS
from cache.store.region_state import read_region_state
from control_tables.regions import RegionState
from heartbeat.clock import BackendClock
from optimizer.plan import Plan
from optimizer.rules.evaluate_guards import Decision, Misses, evaluate_guards
from sql_ext import CreateCachedView, CreateControlTable, DropCacheObject, Query
from sql_ext.errors import (
    BackendUnavailableError,
    InterfaceError,
    ProgrammingError,
    translate,
    translating,
)
from sql_ext.params import ParameterValues, Params, bind_literals, values_for
from sql_ext.quoting import folded

# how many times a query decides again when the cache file changed under its guards before
# the backend answers it
GUARD_ATTEMPTS = 3


# the public methods' edge (cache.engine.boundary), naming this cache file
_public = public(lambda self: self.engine.cache_path, lambda self: getattr(self, "lock", None))


class Session:
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
        self.refresh_engine = "inline"
        self.spark_master: str | None = None
        self.report_position = False  # a ParameterStatus mtcache.position after statements
        # how the last statement was answered (`cache.engine.conversation.statistics`): local,
        # mixed, fallback (guards failed), remote; the caller sets "cache" before the cache's
        self.last_route = "cache"
        self._seen_decision: Decision | None = None  # (`_saw`)
        self._seen_moment: dt.datetime | None = None
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
        self.counters = dict.fromkeys(COUNTERS, 0)  # this session's, until it closes
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
                (lambda: False) if connect else self._process_clock_due,
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
                route.view, route.keys, engine=self.refresh_engine, spark_master=self.spark_master
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

    # -- a query with currency clauses, top to bottom --------------------------------------------

    def _read(self, query: Query, params: Params) -> Result:
        try:
            reading = drive(self.reading(query, params))
            if reading.result is not None:
                return reading.result
            prepared = reading.prepared
            assert prepared is not None
            # the whole statement on the backend
            result = self._run_backend(prepared.remote, params)
            self.link.left(effects_of(prepared.remote.backend_sql))
            self._mark("run")
            result.plan = prepared.plan
            result.set_provenance(lambda: Provenance.remote(self.planner.base_tables(query)))
            self.counters["remote"] += 1
            self.state.saw_backend()
            return result
        except BackendUnavailableError as exc:
            return self._answer_without_backend(query, params, exc)

    def reading(self, query: Query, params: Params, lane: bool = False) -> Read[Reading]:
        """A query with currency clauses as far as the cache answers it (`cache.engine.read`):
        its plan (made once per shape, kept until the schema changes), then, when the plan
        keeps something local and the session's role may read it here, its guards and the
        local run of what they keep local. ``lane``: also the lane an answer made at hand
        leaves for the statement's next runs. While the backend is down, what its guards
        allow is answered (`_answer_without_backend`)."""
        try:
            bound = self.currency_bound
            prepared = yield from either(
                lambda: self.planner.prepared_at_hand(query, params, bound),
                lambda: self.planner.prepare(query, params, bound),
            )
            self._mark("lookup")
            # (a plan that chose the whole statement remote has no guard to evaluate)
            if not prepared.plan.local:
                self.last_route = "remote"
                return Reading(prepared)
            readable = self._readable_at_hand(prepared)
            if readable is False:
                yield
                readable = self._readable_until(prepared)
            if readable is None:
                self.last_route = "remote"
                return Reading(prepared)
            try:
                found = yield from self._deciding(prepared, params, readable if lane else None)
            except LocalUnfit:
                found = Reading(prepared)  # DuckDB cannot give PostgreSQL's answer: the backend
        except BackendUnavailableError as down:
            yield
            return Reading(None, self._answer_without_backend(query, params, down))
        if found.result is None:
            self.last_route = "fallback"
        return found

    def _deciding(
        self,
        prepared: Prepared,
        params: Params,
        lane_readable: float | None = None,
        stale: bool = False,
    ) -> Read[Reading]:
        """Evaluate the guards and run what they keep local (whole or in part); the answer is
        None when they send it all to the backend. The guards and the rows they pass must
        come from one state of the cache file: a change committed in between (an eviction
        while a remote leaf was fetched, a refresh) makes it decide again, a few times, then
        once more inside one DuckDB transaction. ``lane_readable``: until when the session's
        role may read it (`time.monotonic`), when a lane is asked for; ``stale``: data of
        any age answers (the backend is down, `stale_ok`)."""
        store = self.store
        for _ in range(GUARD_ATTEMPTS):
            seen = yield from either(store.committed_version_at_hand, store.committed_version)
            decision = yield from either(
                lambda: None if stale else self._guard_at_hand(prepared, params),
                lambda: self._guard(prepared, params, ignore_currency=stale),
            )
            self._mark("guard")
            if decision.remote:
                yield  # (the backend answers: where waiting is allowed)
                self._counted(prepared, decision, stale)
                return Reading(prepared, None, decision)
            ran = yield from self._running(prepared, decision, params, seen)
            self._mark("run")
            if ran is None:
                continue  # (the cache file changed meanwhile)
            self._counted(prepared, decision, stale)
            result, at_hand = ran
            made = None
            if lane_readable is not None and at_hand:
                made = self._lane(prepared, decision, seen, params, lane_readable)
            answer = self._local_result(prepared, decision, result, stale)
            return Reading(prepared, answer, decision, made)
        yield
        decision, last = self._decide_and_run_in_one_transaction(prepared, params, stale)
        return Reading(prepared, last, decision)

    def _running(
        self, prepared: Prepared, decision: Decision, params: Params, seen: int
    ) -> Read[tuple[LocalRun, bool] | None]:
        """Run a local or mixed decision: its answer, and whether the memo or a lookup index
        gave it at hand; None if the cache file changed since version ``seen``, on which the
        guards decided."""
        memo = self.engine.memo
        ran = None
        if decision.local == len(decision.bindings or ()):  # all local
            ran = answer_at_hand(prepared, decision, params, memo, self._zone())
        at_hand = ran is not None
        if ran is None:
            yield
            ran = self._run_local(prepared, decision, params, memo)
        store = self.store
        version = yield from either(store.committed_version_at_hand, store.committed_version)
        return (ran, at_hand) if version == seen else None

    def _run_local(
        self, prepared: Prepared, decision: Decision, params: Params, memo: Memo | None
    ) -> LocalRun:
        """`run_local` on the session's DuckDB handle, its errors in the PEP 249 tree."""
        try:
            return run_local(
                prepared, decision, params, self.store.con, self._leaf_fetcher, memo, self._zone()
            )
        except psycopg.Error as exc:
            raise translate(exc, unreachable="a remote part of the query needs it") from exc
        except duckdb.Error as exc:
            raise translate(exc, "the local plan failed in DuckDB") from exc

    def _lane(
        self, prepared: Prepared, decision: Decision, version: int, params: Params, readable: float
    ) -> Lane | None:
        """The lane of a plan and decision that just answered at hand on the cache file at
        ``version`` (see `cache.engine.lane`), or None; ``readable``: until when
        (`time.monotonic`) the session's role may read it locally."""
        engine = self.engine
        memo = engine.memo
        lookups = memo.lookups if memo is not None else None
        if (
            memo is None
            or lookups is None
            or self.provenance_notices
            or self.state.timeline_active
            or engine.on_decision is not None
            or decision.misses != Misses()
            or prepared.plan.guards_read_parameters
        ):
            return None
        compiled = compiled_for(prepared, decision)
        statement, shape = compiled.statement, compiled.lookup
        if shape is None:
            return None
        keys = statement.keys
        types = tuple(map(type, values_for(keys, params)))
        result_shape = compiled.results.get((self._zone(), *types))
        if result_shape is None or checks_values(statement, types):
            return None  # (values that must be checked one by one: `run_local`)
        token = memo.change_token_at_hand(compiled.views)
        if token is None or not lookups.holds(shape, token):
            return None
        if not self.store.unchanged_since(version):
            return None
        expires = expiry(decision)
        if readable != math.inf:  # (what the role may read is asked again then)
            now = self.state.now_at_hand()
            if now is None:
                return None
            until = now + dt.timedelta(seconds=readable - time.monotonic())
            expires = until if expires is None else min(expires, until)
        return Lane(
            self,
            version,
            decision,
            expires,
            keys,
            all(isinstance(k, int) for k in keys),
            types,
            shape,
            lookups,
            token,
            result_shape[1],
        )

    def _decide_and_run_in_one_transaction(
        self, prepared: Prepared, params: Params, stale: bool
    ) -> tuple[Decision, Result | None]:
        """Changes keep landing while the local plan runs (a stream applying writes): read the
        regions, decide and run inside one DuckDB transaction, a state of the file no commit
        moves (the result memo, which holds the newest answers, is not used then). Not the
        first way: a transaction costs two statements more on the hit path."""
        store = self.store
        store.con.execute("BEGIN TRANSACTION")
        try:
            regions = read_region_state(store)
            decision = self.decide(prepared, params, stale, regions)
            if decision.remote:
                return decision, None
            ran = self._run_local(prepared, decision, params, None)
            return decision, self._local_result(prepared, decision, ran, stale)
        finally:
            store.con.execute("ROLLBACK")  # it only read

    # -- the steps of a cached read, public for timing each apart ---------------------------------

    def prepare(self, sql: str | Query, params: Params = None) -> Prepared:
        """The prepared plan of a query with currency clauses (of its shape, as ``execute``
        finds it)."""
        self._check_open()
        query = self._query(sql) if isinstance(sql, str) else sql
        return self.planner.prepare(query, params, self.currency_bound)

    def decide(
        self,
        prepared: Prepared,
        params: Params = None,
        ignore_currency: bool = False,
        regions: RegionState | None = None,
    ) -> Decision:
        """Evaluate the plan's guards (on ``regions``, else the file's current region
        state); a decision about current data counts its misses and requests the admissions
        that would fill them."""
        decision = self._guard(prepared, params, ignore_currency, regions)
        self._counted(prepared, decision, ignore_currency)
        return decision

    def _guard(
        self,
        prepared: Prepared,
        params: Params,
        ignore_currency: bool = False,
        regions: RegionState | None = None,
    ) -> Decision:
        """The guards' decision (`decide`'s, not counted), on ``regions`` (else the file's
        current state, and decisions kept while it and the session stand)."""
        memo = regions is None and not ignore_currency
        found = regions if regions is not None else self.engine.region_state()
        return self._decided(prepared, params, ignore_currency, found, self.state.now(), memo)

    def _guard_at_hand(self, prepared: Prepared, params: Params) -> Decision | None:
        """`_guard` when the regions' state and the clock are at hand (None: one is not)."""
        regions = self.engine.region_state_at_hand()
        if regions is None:
            return None
        now = self.state.now_at_hand()
        if now is None:
            return None
        return self._decided(prepared, params, False, regions, now, True)

    def _decided(
        self,
        prepared: Prepared,
        params: Params,
        ignore_currency: bool,
        regions: RegionState,
        now: dt.datetime,
        memo: bool,
    ) -> Decision:
        plan = prepared.plan
        session = self.state.guard_session(self.planner.catalog.tables, ignore_currency)
        decisions = self._decisions if memo else None
        decision = decisions.get(plan, params, regions, session, lambda: now) if decisions else None
        if decision is None:
            values = ParameterValues(plan.analysis.parameter_keys, params)
            decision = evaluate_guards(plan, regions, values, session, now)
            if decisions is not None:
                decisions.put(plan, params, regions, session, decision)
        return decision

    def _counted(
        self, prepared: Prepared, decision: Decision, ignore_currency: bool = False
    ) -> None:
        """A decision about current data counts its misses and requests the admissions that
        would fill them; the engine's observer sees every decision."""
        plan = prepared.plan
        if not ignore_currency:
            misses = decision.misses
            counters = self.counters
            counters["presence_misses"] += misses.presence
            counters["currency_misses"] += misses.currency
            counters["completeness_misses"] += misses.completeness
            counters["consistency_misses"] += misses.consistency
            counters["timeline_misses"] += misses.timeline
            if misses.admittable:
                self._note_reads(plan, misses.admittable)
                if self.admit_on_miss:
                    counters["deferred_admissions"] += self.engine.admissions.request(
                        misses.admittable
                    )
        observer = self.engine.on_decision
        if observer is not None:
            observer(plan, decision)

    def run(self, prepared: Prepared, decision: Decision, params: Params = None) -> Result | None:
        """Run a local or mixed decision in DuckDB (None, and no result, if the cache file
        changed while it ran)."""
        seen = self.store.committed_version()
        ran = drive(self._running(prepared, decision, params, seen))
        return self._local_result(prepared, decision, ran[0]) if ran is not None else None

    def _local_result(
        self, prepared: Prepared, decision: Decision, ran: LocalRun, stale: bool = False
    ) -> Result:
        """A local or mixed run's answer, counted and noted: hits, the presence regions it
        read, the moment of the data it read (the session's position and timeline)."""
        described = prepared.result if ran.description is prepared.description else None
        bindings = decision.bindings or ()
        remote = decision.local < len(bindings)
        self.last_route = "mixed" if remote else "local"
        self._counted_local(decision, ran.memo)
        self._note_hits(prepared.plan, decision)
        if remote:
            self.counters["remote"] += 1
        provenance: Provenance | t.Callable[[], Provenance]
        if stale:
            provenance = Provenance.of(decision, mark_stale=True)
        else:
            provenance = lambda: Provenance.of(decision)  # noqa: E731
        state = self.state
        moment = self._saw(decision)
        if remote:  # (its remote leaves were read after the decision, so before now: a commit
            # made since the decision may be among their rows, which the decision's moment
            # would miss, letting a later read of TIMEORDERED or of another cache go back)
            read = state.now()
            state.saw(read)
            moment = read if moment is None else max(moment, read)
        if moment is not None and state.timeline_active:
            state.read_at(moment)
        return Result(
            ran.rows,
            ran.description,
            types_of=described,
            plan=prepared.plan,
            executed=ran.executed,
            provenance=provenance,
        )

    def _answer_without_backend(
        self, query: Query, params: Params, down: BackendUnavailableError
    ) -> Result:
        """With stale_ok, present local data of any age answers, flagged stale; otherwise say
        which access needs the backend, its bound and the local data's age."""
        bound = self.currency_bound
        prepared = self.planner.cached(query, params, bound)
        if prepared is None:
            prepared = self.planner.uncosted(query, params, bound)
        if self._readable_until(prepared, last_known=True) is None:
            raise down  # (its role was never seen allowed to read it: the backend decides)
        result: Result | None = None
        if self.stale_ok:
            try:
                reading = drive(self._deciding(prepared, params, stale=True))
            except LocalUnfit as unfit:
                raise BackendUnavailableError(
                    f"{unfit}, and the backend is unreachable: {down}"
                ) from down
            result, decision = reading.result, reading.decision
            assert decision is not None
        else:
            decision = self.decide(prepared, params, ignore_currency=True)
        if result is not None:
            for entry in result.provenance:
                if entry.stale:
                    bound = next(
                        b.bound_seconds
                        for b in decision.bindings or ()
                        if b.access.table == entry.table
                    )
                    result.notices.append(
                        f"{entry.table}: answered from {entry.view} "
                        f"{entry.currency_seconds:.1f}s old, beyond its bound of "
                        f"{bound:g}s: the backend is unreachable (stale_ok)"
                    )
            return result
        raise BackendUnavailableError(
            f"{_needs_backend(prepared.plan, decision)}; {down}"
        ) from down

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
        document = self.admin.status()
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

    def read(self, query: Query, params: Params = None, lane: bool = False) -> Read[Reading]:
        """A query with currency clauses as far as the cache answers it, as a read to drive
        (`cache.engine.read`): its answer is the result of a local or mixed plan (remote
        leaves fetched as ``execute`` fetches them), or None when the backend answers the
        whole statement: the caller sends ``query.backend_sql`` (the clauses cut out) on this
        session's backend connection, then calls `answered_remotely`. ``lane``: with the lane
        an answer made at hand leaves for the next runs with values of the same types. Until
        it yields, it has done nothing that counts: a driver that cannot wait may drop it
        (and read again where it can). Its errors are the PEP 249 tree's."""
        self._check_open()
        reading = yield from public_read(self.reading(query, params, lane), self.engine.cache_path)
        if reading.result is not None:
            self._noted(reading.result, reading.result.lineage)
        return reading

    def read_locally(self, query: Query, params: Params = None) -> Result | None:
        """`read`, driven to its end."""
        return drive(self.read(query, params)).result

    def answered_from_lane(self, decision: Decision, lineage: t.Callable[[], Provenance]) -> None:
        """A lane answered a query all local by this decision (from a lookup index): counted
        and noted as `read_locally` counts and notes its answers (`_counted_local`, in
        line: the server's hit path)."""
        counters = self.counters
        counters["hits"] += decision.local
        counters["memo_hits"] += 1
        self._last = lineage
        self.last_route = "local"
        self._saw(decision)

    def _saw(self, decision: Decision) -> dt.datetime | None:
        """The newest backend moment of the data a decision read (its regions' refreshes; the
        decision's moment for what it fetched remotely), noted in the session's position:
        worked out once per decision (a memo or a lane gives the same one again)."""
        if decision is self._seen_decision:
            return self._seen_moment
        bindings = decision.bindings or ()
        moments = [s[0] for b in bindings for _, s in b.regions if s[0] is not None]
        if decision.local < len(bindings):
            moments.append(decision.now)
        moment = max(moments, default=None)
        self._seen_decision, self._seen_moment = decision, moment
        if moment is not None:
            self.state.saw(moment)
        return moment

    def _counted_local(self, decision: Decision, memo: bool | None) -> None:
        """The accesses a decision kept local, and whether the memo (or an index) answered
        (None: it was not asked)."""
        counters = self.counters
        counters["hits"] += decision.local
        if memo is not None:
            counters["memo_hits" if memo else "memo_misses"] += 1

    def _note_hits(self, plan: Plan, decision: Decision) -> None:
        """The presence regions a local answer read (`_note_reads`)."""
        if self.store.budget.limit is None:
            return  # (nothing on the hit path without a budget)
        self._note_reads(
            plan,
            [
                (guard.control, key)
                for binding in decision.bindings or ()
                if (guard := binding.guard) is not None
                and guard.kind == "presence"
                and guard.control is not None
                for key, _ in binding.regions
            ],
        )

    def _note_reads(self, plan: Plan, reads: t.Sequence[tuple[str, t.Any]]) -> None:
        """Reads of presence keys - hits, and the misses that would admit them - each worth
        its share of the backend cost the plan avoids: what the size budget's policy weighs
        (`cache.store.budget.RegionHits`). None are kept without a budget."""
        budget = self.store.budget
        if budget.limit is None or not reads:
            return
        share = plan.saved_per_hit / len(reads)
        for control, key in reads:
            budget.hits.hit(control, key, share)

    def answered_remotely(self, query: Query) -> None:
        """The caller had the backend answer a query `read_locally` left to it."""
        self.link.left(effects_of(query.backend_sql))
        self._last = lambda: Provenance.remote(self.planner.base_tables(query))
        self.counters["remote"] += 1
        state = self.state
        state.saw_backend()
        if state.timeline_active:
            state.read_at(state.now())

    # -- who reads (cache.engine.privileges) ------------------------------------------------

    def _readable_until(self, prepared: Prepared, last_known: bool = False) -> float | None:
        """Until when (`time.monotonic`) the session's role may read the statement's relations
        locally; None: the backend answers it (``last_known``: as last asked, the backend
        being down). While the backend is down, a role never asked in this process reads
        locally only if it is the cache's own (the role of its backend DSN, which fills it)."""
        relations = prepared.relations
        if not relations:
            return math.inf
        privileges, owner = self.engine.privileges, self.engine.owner_role
        if not last_known:
            try:
                reader = self._reader()
                return privileges.holds_until(reader, relations) if reader else None
            except BackendUnavailableError:
                pass  # (as last known)
        role = self.link.role or self.link.login
        if role == owner and not privileges.knows(role):
            return math.inf  # (the cache's own role, never asked in this process: as before)
        return privileges.holds_until(role, relations, last_known=True)

    def _readable_at_hand(self, prepared: Prepared) -> float | t.Literal[False] | None:
        """`_readable_until` from what is known; False: the backend must be asked (what the
        role may read, or which role the session reads as)."""
        relations = prepared.relations
        if not relations:
            return math.inf
        link = self.link
        role = link.role
        if role is None:
            if link.pg is not None and not link.lost:
                return False
            role = link.login
        return self.engine.privileges.holds_until_at_hand(role, relations)

    def _reader(self) -> str | None:
        """The role the backend checks this session's reads as: its login role, or, after a
        statement that may have changed it (SET ROLE, SET SESSION AUTHORIZATION, RESET, a
        set_config call ...), the backend's current_user, kept once outside a transaction
        (None: the backend would not say, in a failed transaction: it answers itself)."""
        link = self.link
        role = link.role
        if role is not None:
            return role
        pg = link.pg
        if pg is None or link.lost:
            return link.login
        try:
            row = link.for_own_statement().execute("SELECT current_user").fetchone()
        except psycopg.OperationalError as exc:
            raise BackendUnavailableError(f"the backend connection failed: {exc}") from exc
        except psycopg.Error:
            return None
        role = str(row[0]) if row else ""
        if pg.pgconn.transaction_status == pq.TransactionStatus.IDLE:
            link.role = role  # (inside a transaction, a ROLLBACK could change it back)
        return role

    def _process_clock(self) -> BackendClock | None:
        """The clock of this process (`SessionState`) for a session that connects only when
        it first needs the backend: the shared one until then (`Engine.shared_clock`), the
        heartbeat's alone once the session measures on a connection of its own (as a
        session that connected at once: asking the shared one then costs each statement
        that needs the time, a write passed through among them, and gains nothing)."""
        engine = self.engine
        return engine.heartbeat_clock() if self.link.pg is not None else engine.shared_clock()

    def _process_clock_due(self) -> bool:
        """Whether `_process_clock` would measure the backend's clock now."""
        return self.link.pg is None and self.engine.shared_clock_due()

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
            self.counters["remote"] += 1
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

    def _zone(self) -> Zone:
        """The session's time zone, by name and as psycopg gives timestamps with time zone in
        it (the last one known while the backend is unreachable)."""
        pg = self.link.pg
        if pg is not None and not pg.closed:
            info = pg.info
            name = info.parameter_status("TimeZone") or "UTC"
            if name != self._last_zone.name:
                self._last_zone = Zone(name, info.timezone)
        return self._last_zone

    def _leaf_fetcher(self) -> Fetch:
        """How a mixed plan gets its remote leaves: from the process's backend pool, in
        parallel, in one backend snapshot; through the session's own connection while it holds
        uncommitted writes (only it can see them; the guards then allow one leaf per class,
        a statement's snapshot)."""
        if self.state.writing:
            pg = self.link.for_own_statement()
            return lambda leaves: [copy_to_arrow(pg, *leaf) for leaf in leaves]
        backend = self.engine.backend
        return lambda leaves: in_one_snapshot(
            backend, [functools.partial(_copy_leaf, leaf=leaf) for leaf in leaves]
        )

    def _mark(self, phase: str) -> None:
        phases = self.phases
        if phases is not None:
            phases.mark(phase)


def _copy_leaf(
    conn: psycopg.Connection[t.Any],
    *,
    leaf: tuple[str, list[tuple[str, str]], dict[str, t.Any] | None],
) -> pa.Table:
    return copy_to_arrow(conn, *leaf)


def _report_notice(report: t.Any) -> inspect.Notice:
    """The NOTICE of an admission, eviction or refresh: what it did, its report as JSON."""
    return inspect.Notice.with_detail(
        f"{report.operation}: {report.regions_counted} regions", report.to_json()
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
