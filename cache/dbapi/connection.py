"""The DB-API 2.0 connection (PEP 249), shaped like psycopg's so an application can switch to
``cache.connect(...)`` unchanged: one backend session (its transaction is the session's), the
cache file, and the session state the guards depend on. Statements run through its cursors
(`cache.dbapi.cursor`); ``conn.admin`` administers the cache (`cache.dbapi.admin`).
"""

from __future__ import annotations

import datetime as dt
import functools
import threading
import typing as t
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pyarrow as pa

from cache.backend.copy_arrow import copy_to_arrow
from cache.backend.embedded_pg import EmbeddedPostgres
from cache.backend.pool import in_one_snapshot
from cache.backend.reflect import (
    connect_backend,
    existing_relations,
    fetch_catalog,
    redact,
    temporary_relations,
)
from cache.dbapi.admin import Admin
from cache.dbapi.admission import Admissions
from cache.dbapi.boundary import public
from cache.dbapi.cursor import Cursor
from cache.dbapi.route import StatementCache
from cache.dbapi.session import SessionState
from cache.execution.decisions import DecisionMemo
from cache.execution.execute import UTC, Fetch, Memo, Zone
from cache.execution.memo import DEFAULT_BYTES as DEFAULT_MEMO_BYTES
from cache.execution.memo import memo_for
from cache.execution.phases import Phases
from cache.execution.planning import Planner
from cache.maintenance.background import Background, attach, detach
from cache.maintenance.stream import DEFAULT_LAG_LIMIT
from cache.store.cache_file import COUNTERS, CacheStore
from cache.store.region_state import read_region_state
from control_tables.regions import RegionState
from heartbeat.clock import BackendClock
from optimizer.plan import PLAN_CHOICES, Plan
from sql_ext import Query, parse_duration
from sql_ext import errors as _errors
from sql_ext.errors import (
    BackendUnavailableError,
    InterfaceError,
    ProgrammingError,
    SqlSyntaxError,
    translate,
)
from sql_ext.params import Params

DEFAULT_CACHE = ".mtcache/cache.duckdb"


# the public methods' edge (cache.dbapi.boundary), naming this cache file
_public = public(lambda self: Path(getattr(self, "cache_path", DEFAULT_CACHE)),
                 lambda self: getattr(self, "_lock", None))


T = t.TypeVar("T")


class _BackendSetting(t.Generic[T]):
    """A psycopg session setting (``isolation_level``, ``read_only``, ``deferrable``) of the
    connection's backend session: read from it and set on it, and kept for the next backend
    connection if this one is lost."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, conn: Connection | None, owner: type) -> T:
        if conn is None:
            return t.cast(T, self)
        pg = conn._pg
        if pg is not None and not pg.closed:
            return t.cast(T, getattr(pg, self.name))
        return t.cast(T, conn._pg_settings.get(self.name))

    def __set__(self, conn: Connection, value: T) -> None:
        conn._check_open()
        pg = conn._pg
        if pg is not None and not pg.closed:
            conn._backend_call(lambda: setattr(pg, self.name, value))
        conn._pg_settings[self.name] = value


class Connection:
    """A session: one backend connection (its transaction is the session's), the cache file.
    Options: ``autocommit`` (default False, as PEP 249), ``stale_ok`` (answer from stale local
    data when the backend is down, with a Warning), ``admit_on_miss`` (admit a missed presence
    key in the background; default True), ``currency_bound`` (the session's bound for every
    SELECT block without a clause: ``"10 min"``, seconds, or a timedelta; default none, SPEC
    §2's strict default), ``result_memo_bytes`` (memory for local answers kept and reused while
    the views they read are unchanged, per process and cache file; default 64 MiB, 0: off),
    ``background`` (run the cache file's background work in this process while the connection
    is open: the refresh scheduler, `cache.maintenance.background`; default True),
    ``heartbeat`` (seconds: also beat the backend's heartbeat row that often from this process,
    SPEC §6, and judge currency on its clock estimate; default None, no heartbeat thread),
    ``plan_choice`` ("cost", the default: the cheaper of the whole statement remote and the
    guarded plan; "remote" or "guarded" forces that candidate, as the experiments do to time
    each; guards still decide at run time), ``refresh_delays`` (view -> a duration, as
    ``currency_bound``: the refresh delay d of §4.6 the plans assume for these views instead of
    the one measured from their refreshes; for what-if planning and for tests that must not
    depend on a measured time)."""

    # PEP 249 optional extension: the exception classes as attributes.
    Warning = _errors.Warning
    Error = _errors.Error
    InterfaceError = _errors.InterfaceError
    DatabaseError = _errors.DatabaseError
    DataError = _errors.DataError
    OperationalError = _errors.OperationalError
    IntegrityError = _errors.IntegrityError
    InternalError = _errors.InternalError
    ProgrammingError = _errors.ProgrammingError
    NotSupportedError = _errors.NotSupportedError

    @_public
    def __init__(
        self,
        backend: str | None = None,
        cache_path: str | Path | None = None,
        *,
        autocommit: bool = False,
        stale_ok: bool = False,
        admit_on_miss: bool = True,
        currency_bound: str | float | dt.timedelta | None = None,
        result_memo_bytes: int = DEFAULT_MEMO_BYTES,
        background: bool = True,
        heartbeat: float | None = None,
        stream_lag_limit: int = DEFAULT_LAG_LIMIT,
        plan_choice: str = "cost",
        refresh_delays: t.Mapping[str, str | float | dt.timedelta] | None = None,
        context: psycopg.adapt.AdaptersMap | None = None,
    ) -> None:
        self._currency_bound = bound_seconds(currency_bound)
        delays: dict[str, float] = {}
        for view, given in (refresh_delays or {}).items():
            seconds = bound_seconds(given, f"refresh_delays[{view!r}]")
            if seconds is None:
                raise ProgrammingError(f"refresh_delays[{view!r}] must be a duration, not None")
            delays[view] = seconds
        # psycopg's type adapters for the backend sessions (as psycopg.connect's context=)
        self._context = context
        if plan_choice not in PLAN_CHOICES:
            raise ProgrammingError(f"plan_choice must be one of {', '.join(PLAN_CHOICES)}, "
                                   f"not {plan_choice!r}")  # fmt: skip
        self._lock = threading.RLock()  # one call at a time (cache.dbapi.boundary)
        if heartbeat is not None and (isinstance(heartbeat, bool) or not isinstance(
                heartbeat, int | float) or not heartbeat > 0):  # fmt: skip
            raise ProgrammingError(f"heartbeat must be a positive number of seconds (or None), "
                                   f"not {heartbeat!r}")  # fmt: skip
        if isinstance(stream_lag_limit, bool) or not isinstance(stream_lag_limit, int) \
                or stream_lag_limit <= 0:  # fmt: skip
            raise ProgrammingError(f"stream_lag_limit must be a positive number of bytes, "
                                   f"not {stream_lag_limit!r}")  # fmt: skip
        if isinstance(result_memo_bytes, bool) or not isinstance(result_memo_bytes, int) \
                or result_memo_bytes < 0:  # fmt: skip
            raise _errors.ProgrammingError(
                f"result_memo_bytes must be a number of bytes >= 0 (0 turns the memo off), "
                f"not {result_memo_bytes!r}")  # fmt: skip
        self.cache_path = Path(cache_path or DEFAULT_CACHE)
        if backend is None:
            backend = EmbeddedPostgres(self.cache_path.parent / "pg").ensure_running()
        self.backend = backend
        self.stale_ok = stale_ok
        self.admit_on_miss = admit_on_miss
        self._autocommit = autocommit
        self._notices: list[str] = []  # backend NOTICEs, handed to the cursor that caused them
        # psycopg's session settings and notice handlers the application gave (kept for the
        # next backend connection, if this one is lost)
        self._notice_handlers: list[t.Callable[[t.Any], None]] = []
        self._pg_settings: dict[str, t.Any] = {}
        # the session's backend connection; None while the backend is unreachable (SPEC §5.9:
        # the cache still answers what its guards allow; the next statement that needs the
        # backend connects again)
        self._pg: psycopg.Connection[t.Any] | None = None
        self._last_zone = UTC  # `_zone`
        try:
            self._connect_backend()
        except BackendUnavailableError:
            down = True
        else:
            down = False
        try:
            self._store = CacheStore(self.cache_path)
        except BaseException:
            self._close_backend()
            raise
        self._background: Background | None = None  # attached once the connection is made
        try:
            if down and not self._store.has_catalog():
                raise BackendUnavailableError(
                    f"cannot reach the PostgreSQL backend at {redact(backend)}, and the cache "
                    f"file {self.cache_path} has no catalog of it yet: connect once while the "
                    "backend is up")  # fmt: skip
            self._session = SessionState(lambda: self._pg, self._store, self._heartbeat_clock)
            if not self._store.has_catalog():
                self._store.save_catalog(fetch_catalog(backend))
        except BaseException as exc:
            self._close_backend()
            self._store.close()
            if isinstance(exc, psycopg.Error):
                raise translate(exc, unreachable="connect again when it is back") from exc
            raise
        self._planner = Planner(
            self._store, backend, choice=plan_choice, given_delays=delays,
            existing=lambda names: existing_relations(self._backend_session(), names),
            temporary=lambda: temporary_relations(self._backend_session()),
        )  # fmt: skip
        self._phases: Phases | None = None  # on for the guard-overhead experiment
        self._statements = StatementCache()
        self._admissions = Admissions(self._store, lambda: self.backend)
        self._regions: RegionState | None = None
        self._decisions = DecisionMemo()  # guard decisions while the regions and session stand
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._memo = Memo(memo_for(self._store.path, result_memo_bytes),
                          self._store.change_token) if result_memo_bytes else None  # fmt: skip
        if background or heartbeat is not None:
            self._background = attach(self._store, backend, heartbeat, stream_lag_limit)
        self.closed = False

    # -- the backend session -------------------------------------------------------------------

    def _connect_backend(self) -> psycopg.Connection[t.Any]:
        options: dict[str, object] = {"autocommit": self._autocommit}
        if self._context is not None:
            options["context"] = self._context
        pg = connect_backend(self.backend, **options)
        pg.add_notice_handler(lambda d: self._notices.append(d.message_primary or ""))
        for handler in self._notice_handlers:
            pg.add_notice_handler(handler)
        for name, value in self._pg_settings.items():
            setattr(pg, name, value)
        self._pg = pg
        return pg

    def _backend_session(self) -> psycopg.Connection[t.Any]:
        """The session's backend connection, connected again if the backend had gone (a
        transaction open on the lost connection ended with it: its writes count as
        committed for the session's own reads, the stricter choice); a
        `BackendUnavailableError` while it is still unreachable."""
        pg = self._pg
        if pg is not None and not pg.closed:
            return pg
        if pg is not None:
            self._session.settle()
        return self._connect_backend()

    def _zone(self) -> Zone:
        """The session's time zone, by name and as psycopg gives timestamps with time zone in
        it (the last one known while the backend is unreachable)."""
        pg = self._pg
        if pg is not None and not pg.closed:
            info = pg.info
            name = info.parameter_status("TimeZone") or "UTC"
            if name != self._last_zone.name:
                self._last_zone = Zone(name, info.timezone)
        return self._last_zone

    def _close_backend(self) -> None:
        if self._pg is not None:
            self._pg.close()

    # -- PEP 249 ----------------------------------------------------------------------------

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
            with self._backend_session().transaction():
                yield self
        except psycopg.Error as exc:
            self._session.settle(rolled_back=True)
            raise translate(exc) from exc
        except BaseException:
            self._session.settle(rolled_back=True)
            raise
        self._session.settle()

    @_public
    def commit(self) -> None:
        self._check_open()
        if self._pg is not None:  # with no backend session there is nothing to commit
            self._backend_call(self._pg.commit)
        self._session.committed()

    @_public
    def rollback(self) -> None:
        self._check_open()
        if self._pg is not None:
            self._backend_call(self._pg.rollback)
        self._session.rolled_back()

    @_public
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._background is not None:
            detach(self._background)
        self._admissions.close()
        try:
            self._close_backend()
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
        return self._autocommit

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        self._check_open()
        if self._pg is not None and not self._pg.closed:
            self._backend_call(lambda: setattr(self._pg, "autocommit", value))
        self._autocommit = bool(value)

    # -- psycopg's connection interface (the SQLAlchemy dialect uses it: cache.sqla) ----------

    isolation_level: _BackendSetting[psycopg.IsolationLevel | None] = _BackendSetting()
    read_only: _BackendSetting[bool | None] = _BackendSetting()
    deferrable: _BackendSetting[bool | None] = _BackendSetting()

    @property
    def info(self) -> psycopg.ConnectionInfo:
        """The backend session's connection information (psycopg's), connecting if needed."""
        self._check_open()
        info = self._backend_call(lambda: self._backend_session().info)
        return t.cast(psycopg.ConnectionInfo, info)

    @property
    def broken(self) -> bool:
        """Whether the backend session was lost (the next statement connects again)."""
        return self._pg is not None and self._pg.broken

    def add_notice_handler(self, handler: t.Callable[[t.Any], None]) -> None:
        """Call ``handler`` with each notice the backend sends (a psycopg ``Diagnostic``)."""
        self._notice_handlers.append(handler)
        if self._pg is not None and not self._pg.closed:
            self._pg.add_notice_handler(handler)

    # -- the session timeline (§2.3) -----------------------------------------------------------

    @contextmanager
    def timeordered(self) -> Iterator[Connection]:
        """Inside, no query reads data older than what an earlier query of the block read."""
        self.begin_timeordered()
        try:
            yield self
        finally:
            self.end_timeordered()

    def begin_timeordered(self) -> None:
        self._session.begin_timeordered()

    def end_timeordered(self) -> None:
        self._session.end_timeordered()

    @property
    def currency_bound(self) -> float | None:
        """The session's currency bound in seconds, for every SELECT block without a clause
        of its own (None: SPEC §2's strict default, bound 0)."""
        return self._currency_bound

    @currency_bound.setter
    def currency_bound(self, value: str | float | dt.timedelta | None) -> None:
        self._check_open()
        self._currency_bound = bound_seconds(value)

    @property
    def clock(self) -> BackendClock:
        """The backend clock as this session estimates it now (SPEC §4)."""
        self._session.now()  # brings the estimate up to date (the heartbeat's, a re-measure)
        return self._session.clock

    @property
    def timeline_floor(self) -> dt.datetime | None:
        """The freshest data time read inside the current TIMEORDERED block (None outside)."""
        return self._session.timeline_floor

    # -- the cache ---------------------------------------------------------------------------

    @functools.cached_property
    def admin(self) -> Admin:
        """Administration of this connection's cache: DDL, admit, evict, refresh, status."""
        return Admin(self._store, lambda: self.backend, admissions=self._admissions,
                     on_catalog=self._planner.use_catalog, lock=self._lock)  # fmt: skip

    @_public
    def explain(self, operation: str, parameters: Params = None) -> Plan:
        """The plan a query runs with (the one EXPLAIN shows): planned now, or the cached
        plan of its shape."""
        self._check_open()
        statement = self._statements.parse(operation)
        if not isinstance(statement, Query):
            what = f"a {statement.kind} statement" if statement is not None else "not SQL the " \
                "cache can read"
            raise ProgrammingError(f"explain takes a query; this is {what} (try `mtcache parse`)")
        if statement.explain is not None:
            statement = statement.without_explain()
        return self._planner.prepare(statement, parameters, self._currency_bound).plan

    def wait_for_admissions(self) -> None:
        """Block until the background admissions queued so far are done."""
        self._admissions.wait()

    @property
    def admission_errors(self) -> list[str]:
        """Failures of background admissions (their queries were answered remotely)."""
        return self._admissions.errors

    # -- for the cursors -------------------------------------------------------------------------

    def _heartbeat_clock(self) -> BackendClock | None:
        running = self._background
        return running.heartbeat.clock if running is not None and running.heartbeat else None

    def _check_open(self) -> None:
        if self.closed:
            raise InterfaceError("the connection is closed")

    def _backend_call(self, action: t.Callable[[], t.Any]) -> t.Any:
        try:
            return action()
        except psycopg.Error as exc:
            raise translate(exc) from exc

    def _region_state(self) -> RegionState:
        state = self._regions
        if state is None or state.version != self._store.version:
            state = self._regions = read_region_state(self._store)
        return state

    def _leaf_fetcher(self) -> Fetch:
        """How a mixed plan gets its remote leaves: from the process's backend pool, in
        parallel, in one backend snapshot; through the session's own connection while it holds
        uncommitted writes (only it can see them; the guards then allow one leaf per class,
        a statement's snapshot)."""
        if self._session.writing:
            pg = self._backend_session()
            return lambda leaves: [copy_to_arrow(pg, *leaf) for leaf in leaves]
        backend = self.backend
        return lambda leaves: in_one_snapshot(
            backend, [functools.partial(_copy_leaf, leaf=leaf) for leaf in leaves]
        )

    def _flush_counters(self) -> None:
        pending = {k: v for k, v in self._counters.items() if v}
        if pending:
            self._store.add_counters(pending)
        self._counters = dict.fromkeys(self._counters, 0)


def _copy_leaf(
    conn: psycopg.Connection[t.Any],
    *,
    leaf: tuple[str, list[tuple[str, str]], dict[str, t.Any] | None],
) -> pa.Table:
    return copy_to_arrow(conn, *leaf)


def bound_seconds(
    value: str | float | dt.timedelta | None, what: str = "currency_bound"
) -> float | None:
    """A duration in seconds (a session currency bound, ``what`` it is for the errors): as in a
    clause, seconds, a timedelta."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except SqlSyntaxError:
            raise ProgrammingError(f"{what}: {value!r} is not a duration (write one like "
                                   "'10 min')") from None  # fmt: skip
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
