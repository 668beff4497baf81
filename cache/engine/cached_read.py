"""The cached read, as a session takes it: a query with currency clauses planned, guarded and
run as far as the cache answers it (`CachedReads.reading`, the generator `cache.engine.read`
drives), each step's waiting way beside its at-hand twin; who may read locally
(`cache.engine.privileges`); what an answer counts and notes for the session (hits, the
provenance EXPLAIN LAST STATEMENT shows, the decisions it saw). `cache.engine.session.Session`
is made of it: the session's other statements, settings and timeline are its own."""

from __future__ import annotations

import datetime as dt
import functools
import logging
import math
import time
import typing as t

import duckdb
import psycopg
import pyarrow as pa
from psycopg import pq

from cache.backend.copy_arrow import copy_to_arrow
from cache.backend.pool import in_one_snapshot
from cache.engine.advice import PRIVILEGES, why_guards_failed, why_planned_remote
from cache.engine.boundary import public_read
from cache.engine.engine import Engine
from cache.engine.lane import Lane
from cache.engine.link import BackendLink
from cache.engine.link.effects import effects_of
from cache.engine.read import Read, Reading, drive
from cache.engine.result import Result
from cache.engine.state import SessionState
from cache.execution.decisions import DecisionMemo, expiry
from cache.execution.execute import (
    Fetch,
    LocalUnfit,
    Memo,
    Zone,
    answer_at_hand,
    checks_values,
    compiled_for,
    run_local,
)
from cache.execution.execute import Result as LocalRun
from cache.execution.phases import Phases
from cache.execution.planning import Planner, Prepared
from cache.execution.provenance import Executed, Provenance
from cache.store.cache_file import CacheStore
from cache.store.counters import Counter, Counts
from cache.store.region_state import read_region_state
from control_tables.kinds import GuardKind
from control_tables.regions import RegionState
from optimizer.plan import Plan
from optimizer.rules.evaluate_guards import Decision, Misses, evaluate_guards
from sql_ext import Query
from sql_ext.errors import (
    BackendUnavailableError,
    translate,
)
from sql_ext.params import ParameterValues, Params, values_for

# how many times a query decides again when the cache file changed under its guards before
# the backend answers it
GUARD_ATTEMPTS = 3
# the guards whose reads are of keyed regions (`_note_hits`)
_KEYED = (GuardKind.PRESENCE, GuardKind.COMPLETENESS)


log = logging.getLogger("mtcache.engine")


class CachedReads:
    """The cached read's steps over a session's parts (see the module)."""

    # (the session's parts they use: `Session.__init__` makes them)
    engine: Engine
    closed: bool
    store: CacheStore
    state: SessionState
    planner: Planner
    link: BackendLink
    counters: Counts
    phases: Phases | None
    currency_bound: float | None
    stale_ok: bool
    admit_on_miss: bool
    provenance_notices: bool
    last_route: str
    _decisions: DecisionMemo
    _last: Provenance | t.Callable[[], Provenance]
    _last_zone: Zone
    _seen_decision: Decision | None
    _seen_moment: dt.datetime | None
    # why the last read went to the backend (`cache.engine.advice`), and the statement sent
    # there by `answered_remotely` with when, until its answer is whole (`remote_finished`)
    _remote_why: tuple[str, str, Plan] | None
    _remote_sent: list[tuple[Query, tuple[str, str, Plan] | None, float]]

    if t.TYPE_CHECKING:  # (the session's own, which it uses)

        def _check_open(self) -> None: ...

        def _run_backend(self, executed: Executed, params: Params) -> Result: ...

        def _query(self, sql: str) -> Query: ...

        def _noted(
            self, result: Result, lineage: Provenance | t.Callable[[], Provenance] | None = None
        ) -> Result: ...

    # -- a query with currency clauses, top to bottom --------------------------------------------

    def _read(self, query: Query, params: Params) -> Result:
        try:
            reading = drive(self.reading(query, params))
            if reading.result is not None:
                return reading.result
            prepared = reading.prepared
            assert prepared is not None
            # the whole statement on the backend
            why, self._remote_why = self._remote_why, None
            started = time.perf_counter()
            result = self._run_backend(prepared.remote, params)
            self._note_remote(query, why, time.perf_counter() - started)
            self.link.left(effects_of(prepared.remote.backend_sql))
            self._mark("run")
            result.plan = prepared.plan
            result.set_provenance(lambda: Provenance.remote(self.planner.base_tables(query)))
            self.counters[Counter.REMOTE] += 1
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
            # (each step tried at hand first, else waited for after a yield: `cache.engine.read`)
            prepared = self.planner.prepared_at_hand(query, params, bound)
            if prepared is None:
                yield
                prepared = self.planner.prepare(query, params, bound)
            self._mark("lookup")
            plan = prepared.plan
            self._remote_why = None  # (told below when the backend is to answer it)
            # (a plan that chose the whole statement remote has no guard to evaluate)
            if not prepared.plan.local:
                self.last_route = "remote"
                self._remote_why = (*why_planned_remote(plan), plan)
                return Reading(prepared)
            readable = self._readable_at_hand(prepared)
            if readable is False:
                yield
                readable = self._readable_until(prepared)
            if readable is None:
                self.last_route = "remote"
                self._remote_why = ("privileges", PRIVILEGES, plan)
                return Reading(prepared)
            try:
                found = yield from self._deciding(prepared, params, readable if lane else None)
            except LocalUnfit as unfit:
                # DuckDB cannot give PostgreSQL's answer: the backend
                found = Reading(prepared)
                self._remote_why = (
                    "allowlist",
                    f"DuckDB cannot answer it as PostgreSQL: {unfit}",
                    plan,
                )
        except BackendUnavailableError as down:
            yield
            return Reading(None, self._answer_without_backend(query, params, down))
        if found.result is None:
            self.last_route = "fallback"
            if found.decision is not None:
                self._remote_why = (
                    *why_guards_failed(prepared.plan, found.decision),
                    prepared.plan,
                )
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
            seen = store.committed_version_at_hand()
            if seen is None:
                yield
                seen = store.committed_version()
            decision = None if stale else self._guard_at_hand(prepared, params)
            if decision is None:
                yield
                decision = self._guard(prepared, params, ignore_currency=stale)
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
        zone = self._zone()
        ran = None
        if decision.local == len(decision.bindings or ()):  # all local
            ran = answer_at_hand(prepared, decision, params, memo, zone)
        at_hand = ran is not None
        if ran is None:
            yield
            ran = self._run_local(prepared, decision, params, memo, zone)
        store = self.store
        version = store.committed_version_at_hand()
        if version is None:
            yield
            version = store.committed_version()
        return (ran, at_hand) if version == seen else None

    def _run_local(
        self,
        prepared: Prepared,
        decision: Decision,
        params: Params,
        memo: Memo | None,
        zone: Zone | None = None,
    ) -> LocalRun:
        """`run_local` on the session's DuckDB handle, its errors in the PEP 249 tree
        (``zone``: the session's time zone, when the caller has it)."""
        try:
            return run_local(
                prepared,
                decision,
                params,
                self.store.con,
                self._leaf_fetcher,
                memo,
                zone or self._zone(),
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
            result_shape.convert,
            prepared.plan.asks,
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
            counters[Counter.PRESENCE_MISSES] += misses.presence
            counters[Counter.CURRENCY_MISSES] += misses.currency
            counters[Counter.COMPLETENESS_MISSES] += misses.completeness
            counters[Counter.CONSISTENCY_MISSES] += misses.consistency
            counters[Counter.TIMELINE_MISSES] += misses.timeline
            if misses.unused and self.store.region_reads.watched:
                self.store.region_reads.read(misses.unused, decision.now)
            if misses.admittable:
                self._note_reads(plan, misses.admittable)
                if self.admit_on_miss:
                    counters[Counter.DEFERRED_ADMISSIONS] += self.engine.admissions.request(
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
        asks = prepared.plan.asks
        if asks and not stale:  # (the bounds it asked of its views: what REFRESH AUTO follows)
            self.store.asks.asked(asks)
        if remote:
            self.counters[Counter.REMOTE] += 1
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
        counters[Counter.HITS] += decision.local
        counters[Counter.MEMO_HITS] += 1
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
        counters[Counter.HITS] += decision.local
        if memo is not None:
            counters[Counter.MEMO_HITS if memo else Counter.MEMO_MISSES] += 1

    def _note_hits(self, plan: Plan, decision: Decision) -> None:
        """The presence regions a local answer read: for the size budget (`_note_reads`), and
        for the refreshes of REFRESH AUTO views (`cache.store.region_reads`)."""
        store = self.store
        budget, watched = store.budget.limit is not None, store.region_reads.watched
        if not budget and not watched:
            return  # (nothing on the hit path without a budget or a REFRESH AUTO view)
        read = [
            (guard.control, key, guard.kind)
            for binding in decision.bindings or ()
            if (guard := binding.guard) is not None
            and guard.kind in _KEYED
            and guard.control is not None
            for key, _ in binding.regions
        ]
        if budget:
            self._note_reads(plan, [(c, k) for c, k, kind in read if kind == GuardKind.PRESENCE])
        if watched and read:
            store.region_reads.read([(c, k) for c, k, _ in read], decision.now)

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

    def _note_remote(self, query: Query, why: tuple[str, str, Plan] | None, seconds: float) -> None:
        """The backend answered ``query`` in ``seconds``, for the reason its read gave: the
        advice counts it (`cache.store.remote_reads`), and the bounds its plan asked count as
        asked (an answer, local or not, counts them once: `_local_result`, a lane's)."""
        if why is None:
            return
        kind, message, plan = why
        if plan.asks:
            self.store.asks.asked(plan.asks)
        self.store.remote_reads.answered(query.normalized, kind, message, seconds * 1000.0)

    def sending_remotely(self, query: Query) -> None:
        """The caller is about to have the backend answer a query `read_locally` left to it:
        its time runs from now until `remote_finished` (the server's protocol cycle ends)."""
        why, self._remote_why = self._remote_why, None
        self._remote_sent.append((query, why, time.perf_counter()))

    def remote_finished(self) -> None:
        """The statements sent to the backend have their whole answers now (the server's
        cycle ended): each counted with its reason and the time since it was sent. Never
        fails the cycle: what cannot be counted is logged."""
        sent, self._remote_sent = self._remote_sent, []
        done = time.perf_counter()
        for query, why, started in sent:
            try:
                self._note_remote(query, why, done - started)
            except Exception as exc:  # (bookkeeping: the client's answer stands)
                log.warning("counting a read the backend answered failed: %s", exc)

    def answered_remotely(self, query: Query, timed: bool = False) -> None:
        """The caller had the backend answer a query `read_locally` left to it (``timed``:
        `sending_remotely` was told before it was sent; else it was sent just now, and is
        timed from here: each statement of a pipeline counts)."""
        if not timed:
            self.sending_remotely(query)
        self.link.left(effects_of(query.backend_sql))
        self._last = lambda: Provenance.remote(self.planner.base_tables(query))
        self.counters[Counter.REMOTE] += 1
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


__all__ = ["GUARD_ATTEMPTS", "CachedReads"]
