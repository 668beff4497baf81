"""The session engine: one cache file's shared parts in this process, and the sessions that
use them. Every front end is a façade over it: the DB-API connection (`cache.dbapi`) holds one
session of an engine of its own; a server holds one engine and a session per client.

An `Engine` owns what the sessions of one cache file share: the store (the DuckDB file and its
shared change counters), the parsed statements and the plans (by statement shape), the result
memo, the background admissions, the process's background work on the file (the refresh
scheduler, the stream consumer, a heartbeat), the region state the guards read, and the
counters. All of it is thread-safe: sessions run in threads of their own. A session
(`cache.engine.session.Session(engine, options)`) carries what is one client's: its backend
connection and transaction, its settings, what it wrote, its timeline.

Hooks for experiments and tools, documented here and nowhere else:

* ``engine.store``: the cache file (`cache.store.cache_file.CacheStore`), for reading its
  tables and metadata (use a session's ``store`` inside a session's work);
* ``engine.counters()``: hits, misses, remote answers and memo use so far, the file's own
  totals plus what the open sessions have not flushed yet;
* a session's ``phases`` (`cache.execution.phases.Phases`): set it to time each statement's
  phases, None (the default) to pay nothing;
* a session's ``prepare``, ``decide`` and ``run``: the three steps of a cached read, which
  ``execute`` composes, for timing each apart;
* ``engine.on_decision``: called with each guard decision (plan, decision) when set.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import typing as t
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.pool import pooled
from cache.backend.reflect import fetch_catalog, redact
from cache.backend.reported import asked_defaults
from cache.defaults import DEFAULT_CACHE
from cache.engine.admission import Admissions
from cache.engine.privileges import PRIVILEGE_SECONDS, ReadPrivileges, login_role
from cache.engine.route import StatementCache
from cache.engine.stats import Sample, document_samples
from cache.execution.execute import Memo
from cache.execution.lookup import lookups_for
from cache.execution.lookup import release as release_lookups
from cache.execution.memo import DEFAULT_BYTES as DEFAULT_MEMO_BYTES
from cache.execution.memo import memo_for
from cache.execution.planning import PlanCache
from cache.maintenance.background import Background, attach, detach
from cache.maintenance.spark import check_master_url
from cache.maintenance.stream import DEFAULT_LAG_LIMIT
from cache.maintenance.stream.arrangements import ARRANGED_BYTES
from cache.store.budget import parse_size
from cache.store.cache_file import CacheStore, check_resources
from cache.store.counters import Counter, Counts
from cache.store.region_state import read_region_state
from control_tables.regions import RegionState
from heartbeat.clock import CLOCK_MAX_AGE, BackendClock, measure
from optimizer.plan import PLAN_CHOICES, Plan
from optimizer.rules.evaluate_guards import Decision
from sql_ext import parse_duration
from sql_ext.errors import BackendUnavailableError, ProgrammingError, SqlSyntaxError, translate


class Member(t.Protocol):
    """What an engine needs of its sessions (`cache.engine.session.Session`)."""

    counters: Counts

    def close(self) -> None: ...


@dataclass(frozen=True)
class SessionOptions:
    """A session's settings, checked (`SessionOptions.of`) before anything is opened.
    ``currency_bound``: seconds for every SELECT block without a clause (None: the strict
    default, bound 0); ``plan_choice``: "cost", "remote" or "guarded"; ``refresh_delays``:
    view -> seconds, the refresh delay d plans assume for it instead of the measured one;
    ``context``: psycopg's type adapters for the session's backend connections."""

    autocommit: bool = False
    stale_ok: bool = False
    admit_on_miss: bool = True
    currency_bound: float | None = None
    plan_choice: str = "cost"
    refresh_delays: t.Mapping[str, float] = field(default_factory=dict)
    context: psycopg.adapt.AdaptersMap | None = None

    @classmethod
    def of(
        cls,
        *,
        autocommit: bool = False,
        stale_ok: bool = False,
        admit_on_miss: bool = True,
        currency_bound: str | float | dt.timedelta | None = None,
        plan_choice: str = "cost",
        refresh_delays: t.Mapping[str, str | float | dt.timedelta] | None = None,
        context: psycopg.adapt.AdaptersMap | None = None,
    ) -> SessionOptions:
        bound = bound_seconds(currency_bound)
        delays: dict[str, float] = {}
        for view, given in (refresh_delays or {}).items():
            seconds = bound_seconds(given, f"refresh_delays[{view!r}]")
            if seconds is None:
                raise ProgrammingError(f"refresh_delays[{view!r}] must be a duration, not None")
            delays[view] = seconds
        if plan_choice not in PLAN_CHOICES:
            raise ProgrammingError(
                f"plan_choice must be one of {', '.join(PLAN_CHOICES)}, not {plan_choice!r}"
            )
        return cls(
            bool(autocommit),
            bool(stale_ok),
            bool(admit_on_miss),
            bound,
            plan_choice,
            delays,
            context,
        )


class Engine:
    """One cache file's shared parts (see the module). Options: ``result_memo_bytes``
    (memory for local answers kept and reused while the views they read are unchanged, per
    process and file; 0: off), ``background`` (run the file's refresh scheduler and stream
    consumer in this process while the engine is open), ``heartbeat`` (seconds: also beat the
    backend's heartbeat row that often, and judge currency on its clock estimate),
    ``stream_lag_limit`` (bytes of WAL the slot may hold before the consumer warns),
    ``stream_memory_limit`` (bytes, or ``"1GB"``: the memory the stream consumer's arrangements
    of the derived views' copies may take; default 2 GiB)."""

    def __init__(
        self,
        backend: str | None = None,
        cache_path: str | Path | None = None,
        *,
        result_memo_bytes: int = DEFAULT_MEMO_BYTES,
        background: bool = True,
        heartbeat: float | None = None,
        stream_lag_limit: int = DEFAULT_LAG_LIMIT,
        stream_memory_limit: int | str | None = None,
        privilege_seconds: float = PRIVILEGE_SECONDS,
        memory_limit: str | None = None,
        threads: int | None = None,
        cache_size_limit: int | str | None = None,
        doorkeeper_seconds: float | None = None,
        spark_master: str | None = None,
    ) -> None:
        """``privilege_seconds``: how long what a role may read is taken as known (a GRANT or
        REVOKE takes effect on local answers within it: `cache.engine.privileges`);
        ``memory_limit`` (``"2GB"``) and ``threads``: what the cache file's DuckDB may use in
        this process (default: 80% of the memory, every core); ``cache_size_limit`` (bytes,
        or ``"500MB"``): the budget of the cached data's bytes, kept by evicting presence
        regions (`cache.maintenance.budget`; default none); ``doorkeeper_seconds``: admit a
        missed key on its second miss within that many seconds, not its first
        (`cache.engine.admission`; default None: on the first); ``spark_master``: where the
        refreshes this process runs on Spark pull (`cache.maintenance.spark`; default
        ``local[*]``), its sessions' ``mtcache.spark_master`` until they set their own."""
        _check_options(heartbeat, stream_lag_limit, result_memo_bytes, doorkeeper_seconds)
        if spark_master is not None:
            check_master_url(spark_master)
        self.spark_master = spark_master
        arranged = (
            ARRANGED_BYTES
            if stream_memory_limit is None
            else parse_size(stream_memory_limit, "stream_memory_limit")
        )
        check_resources(memory_limit, threads, cache_size_limit)  # (nothing opened if not)
        self.cache_path = Path(cache_path or DEFAULT_CACHE)
        if backend is None:
            backend = EmbeddedPostgres(self.cache_path.parent / "pg").ensure_running()
        self.backend = backend
        self.store = CacheStore(self.cache_path)
        try:
            self.store.limit_resources(memory_limit, threads, cache_size_limit)
            if not self.store.has_catalog():
                self.store.save_catalog(_first_catalog(backend, self.cache_path))
            elif not self.store.catalog_is_current():
                # (a file whose catalog predates what it keeps now: read again when it can be)
                with contextlib.suppress(BackendUnavailableError):
                    self.store.save_catalog(fetch_catalog(backend))
            if self.store.load_reported() is None:
                # what the backend reports to a new session, for a server started while it is
                # down (`cache.engine.conversation.reported`); kept once, then by the servers
                with contextlib.suppress(BackendUnavailableError):
                    self.store.save_reported(asked_defaults(backend))
        except BaseException:
            self.store.close()
            raise
        self.statements = StatementCache()
        self.plans = PlanCache()
        self.admissions = Admissions(self.store, lambda: self.backend, doorkeeper_seconds)
        self.memo = (
            Memo(
                memo_for(self.store.path, result_memo_bytes),
                self.store.change_token,
                self.store.change_token_at_hand,
                lookups_for(self.store.path),
                self.store.for_thread,
            )
            if result_memo_bytes
            else None
        )
        self.on_decision: Callable[[Plan, Decision], None] | None = None
        self.privileges = ReadPrivileges(backend, privilege_seconds)
        # more figures for `stats` from what serves the engine (the server's sessions ...)
        self.stats_sources: list[Callable[[], list[Sample]]] = []
        self.owner_role = login_role(backend)  # the role of its backend DSN, which fills it
        self._regions: RegionState | None = None
        # the engine's DuckDB handle reads the regions for every session: one thread at a time
        self._regions_lock = threading.Lock()
        self._counters = Counter.zeros()  # flushed by closed sessions, not saved yet
        self._counters_lock = threading.Lock()
        self._clock: BackendClock | None = None  # `shared_clock`
        self._clock_lock = threading.Lock()
        self._sessions: weakref.WeakSet[Member] = weakref.WeakSet()
        self._background: Background | None = None
        if background or heartbeat is not None:
            self._background = attach(
                self.store, backend, heartbeat, stream_lag_limit, arranged, spark_master
            )
        self.closed = False

    @property
    def fills_views(self) -> bool:
        """Whether this process runs the file's refresh scheduler, which fills a view due at
        once (`cache.store.refresh_times`)."""
        return self._background is not None

    def join(self, session: Member) -> None:
        """A new session (`Session(engine, options)` calls this): closed with the engine."""
        if self.closed:
            raise ProgrammingError("the engine is closed: open another")
        self._sessions.add(session)

    def leave(self, session: Member) -> None:
        """A session closed: its counts stay with the engine."""
        self._sessions.discard(session)
        self.add_counters(session.counters)

    # -- shared state the sessions read ----------------------------------------------------

    def region_state(self) -> RegionState:
        """The regions' state as of the file's current version (read again after a change)."""
        state = self._regions
        if state is None or state.version != self.store.version:
            with self._regions_lock:  # sessions of several threads may find it changed at once
                state = self._regions
                if state is None or state.version != self.store.version:
                    state = self._regions = read_region_state(self.store)
        return state

    def region_state_at_hand(self) -> RegionState | None:
        """`region_state` if it is current (None: it must be read again)."""
        state = self._regions
        return state if state is not None and state.version == self.store.version else None

    def heartbeat_clock(self) -> BackendClock | None:
        """The backend clock as this process's heartbeat estimates it (None: no heartbeat)."""
        running = self._background
        return running.heartbeat.clock if running is not None and running.heartbeat else None

    def shared_clock(self) -> BackendClock | None:
        """The backend clock for sessions without a backend connection of their own: the
        heartbeat's estimate, else one measurement on a pooled connection shared by all and
        made again every CLOCK_MAX_AGE seconds (None while the backend is unreachable)."""
        beat = self.heartbeat_clock()
        if beat is not None:
            return beat
        now = dt.datetime.now(dt.UTC)
        due, clock = self.shared_clock_at_hand(now)
        if not due:
            return clock
        with self._clock_lock:
            clock = self._clock
            if clock is None or (now - clock.measured_at).total_seconds() > CLOCK_MAX_AGE:
                try:
                    with pooled(self.backend) as conn:
                        clock = self._clock = measure(conn)
                except (psycopg.Error, BackendUnavailableError):
                    return clock
            return clock

    def shared_clock_due(self) -> bool:
        """Whether `shared_clock` would measure the backend's clock (an event loop may not
        wait for that)."""
        return self.shared_clock_at_hand(dt.datetime.now(dt.UTC))[0]

    def shared_clock_at_hand(self, now: dt.datetime) -> tuple[bool, BackendClock | None]:
        """`shared_clock` as it is at ``now`` without measuring: whether it would measure
        (`shared_clock_due`), and the clock it has (one look, for a statement's hot path)."""
        beat = self.heartbeat_clock()
        if beat is not None:
            return False, beat
        clock = self._clock
        return clock is None or (now - clock.measured_at).total_seconds() > CLOCK_MAX_AGE, clock

    # -- counters --------------------------------------------------------------------------------

    def add_counters(self, amounts: t.Mapping[Counter, int]) -> None:
        """A closing session's counts, saved in the file when the engine closes."""
        with self._counters_lock:
            for counter, value in amounts.items():
                self._counters[counter] += value

    def stats(self, document: dict[str, t.Any]) -> list[Sample]:
        """The cache's figures (`cache.engine.stats`): a status document's, and what serves
        the engine adds."""
        found = document_samples(document)
        for source in list(self.stats_sources):
            found += source()
        return found

    def counters(self, store: CacheStore | None = None) -> Counts:
        """Hits, misses, remote answers and memo use: the file's totals so far (read through
        ``store``, a session's own handle, when given), with what this engine's sessions
        counted and have not saved yet."""
        totals = (store or self.store).counters()
        with self._counters_lock:
            for counter, value in self._counters.items():
                totals[counter] = totals.get(counter, 0) + value
        for session in list(self._sessions):
            for counter, value in session.counters.items():
                totals[counter] = totals.get(counter, 0) + value
        return totals

    def _flush_counters(self) -> None:
        with self._counters_lock:
            pending = {k: v for k, v in self._counters.items() if v}
            self._counters = Counter.zeros()
        if pending:
            self.store.add_counters(pending)

    # -- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the open sessions, stop the background work, save the counters, close the
        file."""
        if self.closed:
            return
        self.closed = True
        for session in list(self._sessions):
            session.close()
        if self._background is not None:
            detach(self._background)
        self.admissions.close()
        if self.memo is not None:
            release_lookups(self.store.path)
        try:
            self._flush_counters()
        finally:
            self.store.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_options(
    heartbeat: float | None,
    stream_lag_limit: int,
    result_memo_bytes: int,
    doorkeeper_seconds: float | None = None,
) -> None:
    for name, seconds, none in (
        ("heartbeat", heartbeat, "None"),
        ("doorkeeper_seconds", doorkeeper_seconds, "None: admit on the first miss"),
    ):
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0
        ):
            raise ProgrammingError(
                f"{name} must be a positive number of seconds (or {none}), not {seconds!r}"
            )
    if (
        isinstance(stream_lag_limit, bool)
        or not isinstance(stream_lag_limit, int)
        or stream_lag_limit <= 0
    ):
        raise ProgrammingError(
            f"stream_lag_limit must be a positive number of bytes, not {stream_lag_limit!r}"
        )
    if (
        isinstance(result_memo_bytes, bool)
        or not isinstance(result_memo_bytes, int)
        or result_memo_bytes < 0
    ):
        raise ProgrammingError(
            f"result_memo_bytes must be a number of bytes >= 0 (0 turns the memo off), "
            f"not {result_memo_bytes!r}"
        )


def _first_catalog(backend: str, path: Path) -> t.Any:
    """The backend's catalog for a cache file that has none yet."""
    try:
        return fetch_catalog(backend)
    except BackendUnavailableError:
        raise BackendUnavailableError(
            f"cannot reach the PostgreSQL backend at {redact(backend)}, and the cache file "
            f"{path} has no catalog of it yet: connect once while the backend is up"
        ) from None
    except psycopg.Error as exc:
        raise translate(exc, unreachable="connect again when it is back") from exc


def bound_seconds(
    value: str | float | dt.timedelta | None,
    what: str = "currency_bound",
    bare: float | None = None,
) -> float | None:
    """A duration in seconds (a session currency bound, ``what`` it is for the errors): as in a
    clause or as PostgreSQL writes its time settings, seconds, a timedelta; ``bare``: the unit
    of a number written alone in a string (`parse_duration`)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return parse_duration(value, bare)
        except SqlSyntaxError:
            raise ProgrammingError(
                f"{what}: {value!r} is not a duration (write one like '10 min' or '2s')"
            ) from None
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ProgrammingError(
            f"{what} must be a duration like '10 min', a number of seconds or a "
            f"timedelta, not {type(value).__name__}"
        )
    if not seconds >= 0:  # negative or NaN
        raise ProgrammingError(f"{what} must be 0 or more seconds, got {value!r}")
    return seconds
