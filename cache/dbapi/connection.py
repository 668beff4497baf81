"""The DB-API 2.0 connection (PEP 249), shaped like psycopg's so an application can switch to
``cache.connect(...)`` unchanged: a façade over one session (`cache.engine.session`) of an
engine of its own (`cache.engine.engine`), which it closes with it. Statements run through its
cursors (`cache.dbapi.cursor`); ``conn.admin`` administers the cache (`cache.engine.admin`).
"""

from __future__ import annotations

import datetime as dt
import typing as t
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from cache.config import connection_setting
from cache.dbapi.cursor import Cursor
from cache.dbapi.remote import ServerAdmin, ServerSession, server_conninfo
from cache.defaults import DEFAULT_CACHE
from cache.engine.admin import Admin
from cache.engine.boundary import public
from cache.engine.engine import Engine, SessionOptions
from cache.engine.session import Session
from cache.execution.memo import DEFAULT_BYTES as DEFAULT_MEMO_BYTES
from cache.maintenance.stream import DEFAULT_LAG_LIMIT
from cache.store.served import ServedAt
from heartbeat.clock import BackendClock
from optimizer.plan import Plan
from sql_ext import errors as _errors
from sql_ext.params import Params

# the public methods' edge (cache.engine.boundary), naming this cache file
_public = public(
    lambda self: Path(getattr(self, "cache_path", DEFAULT_CACHE)),
    lambda self: getattr(getattr(self, "session", None), "lock", None),
)


T = t.TypeVar("T")


class _BackendSetting(t.Generic[T]):
    """A psycopg session setting (``isolation_level``, ``read_only``, ``deferrable``) of the
    session's backend connection: read from it and set on it, and kept for the next backend
    connection if this one is lost."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, conn: Connection | None, owner: type) -> T:
        if conn is None:
            return t.cast(T, self)
        return t.cast(T, conn.session.backend_setting(self.name))

    def __set__(self, conn: Connection, value: T) -> None:
        conn.session.set_backend_setting(self.name, value)


class Connection:
    """A session: one backend connection (its transaction is the session's), the cache file.
    Options: ``autocommit`` (default False, as PEP 249), ``stale_ok`` (answer from stale local
    data when the backend is down, with a Warning), ``admit_on_miss`` (admit a missed presence
    key in the background; default True), ``currency_bound`` (the session's bound for every
    SELECT block without a clause: ``"10 min"``, seconds, or a timedelta; default none: the
    strict default, bound 0), ``result_memo_bytes`` (memory for local answers kept and reused
    while the views they read are unchanged, per process and cache file; default 64 MiB, 0:
    off), ``background`` (run the cache file's background work in this process while the
    connection is open: the refresh scheduler, `cache.maintenance.background`; default True),
    ``heartbeat`` (seconds: also beat the backend's heartbeat row that often from this process,
    and judge currency on its clock estimate; default None, no heartbeat thread),
    ``plan_choice`` ("cost", the default: the cheaper of the whole statement remote and the
    guarded plan; "remote" or "guarded" forces that candidate, as the experiments do to time
    each; guards still decide at run time), ``refresh_delays`` (view -> a duration, as
    ``currency_bound``: the refresh delay d of §4.6 the plans assume for these views instead of
    the one measured from their refreshes; for what-if planning and for tests that must not
    depend on a measured time), ``memory_limit`` (``"2GB"``) and ``threads`` (what the cache
    file's DuckDB may use in this process; default 80% of the memory, every core),
    ``cache_size_limit`` (bytes, or ``"500MB"``: the budget of the cached data, kept by
    evicting presence regions; default none) and ``doorkeeper_seconds`` (admit a missed key on
    its second miss within that many seconds, not its first; default None), ``spark_master``
    (where this process's refreshes on Spark run: ``local[*]``, the default,
    ``spark://HOST:PORT`` or ``sc://HOST:PORT``; docs/decisions/spark-pulls.md). The
    connection is a façade over one session
    (`cache.engine.session.Session`, ``conn.session``) of an engine of its own
    (`cache.engine.engine.Engine`, ``conn.engine``).

    ``server`` (``"HOST:PORT"``, or a conninfo or URL): go through a running cache server
    (`mtcache serve`) instead of opening the cache file, so many processes share it; the
    session is the server's (`cache.dbapi.remote.ServerSession`), ``backend`` only names the
    user, database and password, and the options of the process (``result_memo_bytes``,
    ``background``, ``heartbeat``, ``stream_lag_limit``, ``stream_memory_limit``, ``plan_choice``,
    ``refresh_delays``, ``memory_limit``, ``threads``, ``cache_size_limit``,
    ``doorkeeper_seconds``, ``spark_master``) are the server's."""

    engine: Engine | None  # None: through a cache server
    session: Session | ServerSession

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
        stream_memory_limit: int | str | None = None,
        plan_choice: str = "cost",
        refresh_delays: t.Mapping[str, str | float | dt.timedelta] | None = None,
        context: psycopg.adapt.AdaptersMap | None = None,
        server: str | ServedAt | None = None,
        memory_limit: str | None = None,
        threads: int | None = None,
        cache_size_limit: int | str | None = None,
        doorkeeper_seconds: float | None = None,
        spark_master: str | None = None,
    ) -> None:
        # the backend and the cache file not given: the environment's, else the configuration
        # file's (MTCACHE_CONFIG), as the command line reads them (`cache.config`)
        backend = connection_setting("backend", backend or None)
        cache_path = connection_setting("cache", cache_path)
        # every option is checked before anything is opened
        options = SessionOptions.of(
            autocommit=autocommit,
            stale_ok=stale_ok,
            admit_on_miss=admit_on_miss,
            currency_bound=currency_bound,
            plan_choice=plan_choice,
            refresh_delays=refresh_delays,
            context=context,
        )
        self.closed = True
        if server is not None:
            own = {
                "result_memo_bytes": result_memo_bytes != DEFAULT_MEMO_BYTES,
                "background": background is not True,
                "heartbeat": heartbeat is not None,
                "stream_lag_limit": stream_lag_limit != DEFAULT_LAG_LIMIT,
                "stream_memory_limit": stream_memory_limit is not None,
                "plan_choice": plan_choice != "cost",
                "refresh_delays": bool(refresh_delays),
                "memory_limit": memory_limit is not None,
                "threads": threads is not None,
                "cache_size_limit": cache_size_limit is not None,
                "doorkeeper_seconds": doorkeeper_seconds is not None,
                "spark_master": spark_master is not None,
            }
            given = [name for name, changed in own.items() if changed]
            if given:
                raise _errors.ProgrammingError(
                    f"{given[0]} belongs to the cache server's process: give it to `mtcache "
                    "serve`, not to a connection through the server"
                )
            self.engine = None
            self.cache_path = Path(cache_path if cache_path is not None else DEFAULT_CACHE)
            self.backend = backend
            self.session = ServerSession(server_conninfo(server, backend), options)
            self.closed = False
            return
        self.engine = Engine(
            backend,
            cache_path,
            result_memo_bytes=result_memo_bytes,
            background=background,
            heartbeat=heartbeat,
            stream_lag_limit=stream_lag_limit,
            stream_memory_limit=stream_memory_limit,
            memory_limit=memory_limit,
            threads=threads,
            cache_size_limit=cache_size_limit,
            doorkeeper_seconds=doorkeeper_seconds,
            spark_master=spark_master,
        )
        self.cache_path = self.engine.cache_path
        self.backend = self.engine.backend
        try:
            self.session = Session(self.engine, options)
        except BaseException:
            self.engine.close()
            raise
        self.closed = False

    # -- PEP 249 ----------------------------------------------------------------------------

    def cursor(self) -> Cursor:
        self._check_open()
        return Cursor(self, self.session)

    def execute(self, operation: str, parameters: Params = None) -> Cursor:
        """psycopg's shortcut: a new cursor, executed."""
        return self.cursor().execute(operation, parameters)

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """psycopg's transaction block: commits on success, rolls back on an exception (a
        savepoint when nested or inside an open transaction). Writes inside count as
        uncommitted until the block's own COMMIT."""
        self._check_open()
        with self.session.transaction():
            yield self

    def commit(self) -> None:
        self._check_open()
        self.session.commit()

    def rollback(self) -> None:
        self._check_open()
        self.session.rollback()

    @_public
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.session.close()
        finally:
            if self.engine is not None:
                self.engine.close()

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
        return self.session.autocommit

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        self._check_open()
        self.session.autocommit = value

    # -- psycopg's connection interface (the SQLAlchemy dialect uses it: cache.sqla) ----------

    isolation_level: _BackendSetting[psycopg.IsolationLevel | None] = _BackendSetting()
    read_only: _BackendSetting[bool | None] = _BackendSetting()
    deferrable: _BackendSetting[bool | None] = _BackendSetting()

    @property
    def info(self) -> psycopg.ConnectionInfo:
        """The backend session's connection information (psycopg's), connecting if needed."""
        self._check_open()
        return self.session.info

    @property
    def broken(self) -> bool:
        """Whether the backend session was lost (the next statement connects again)."""
        return self.session.broken

    def add_notice_handler(self, handler: t.Callable[[t.Any], None]) -> None:
        """Call ``handler`` with each notice the backend sends (a psycopg ``Diagnostic``)."""
        self.session.add_notice_handler(handler)

    # -- session options -----------------------------------------------------------------------

    @property
    def stale_ok(self) -> bool:
        """Answer from stale local data when the backend is down, with a Warning."""
        return self.session.stale_ok

    @stale_ok.setter
    def stale_ok(self, value: bool) -> None:
        self.session.stale_ok = bool(value)

    @property
    def admit_on_miss(self) -> bool:
        """Admit a missed presence key in the background."""
        return self.session.admit_on_miss

    @admit_on_miss.setter
    def admit_on_miss(self, value: bool) -> None:
        self.session.admit_on_miss = bool(value)

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
        self.session.begin_timeordered()

    def end_timeordered(self) -> None:
        self.session.end_timeordered()

    @property
    def currency_bound(self) -> float | None:
        """The session's currency bound in seconds, for every SELECT block without a clause
        of its own (None: the strict default, bound 0)."""
        return self.session.currency_bound

    @currency_bound.setter
    def currency_bound(self, value: str | float | dt.timedelta | None) -> None:
        self._check_open()
        self.session.set_currency_bound(value)

    @property
    def clock(self) -> BackendClock:
        """The backend clock as this session estimates it now."""
        return self.session.clock

    @property
    def timeline_floor(self) -> dt.datetime | None:
        """The freshest data time read inside the current TIMEORDERED block (None outside)."""
        return self.session.timeline_floor

    # -- the cache ---------------------------------------------------------------------------

    @property
    def admin(self) -> Admin | ServerAdmin:
        """Administration of this connection's cache: DDL, admit, evict, refresh, status."""
        return self.session.admin

    def explain(self, operation: str, parameters: Params = None) -> Plan:
        """The plan a query runs with (the one EXPLAIN shows): planned now, or the cached
        plan of its shape."""
        self._check_open()
        return self.session.explain(operation, parameters)

    def wait_for_admissions(self) -> None:
        """Block until the background admissions queued so far are done."""
        self._in_process("background admissions").admissions.wait()

    @property
    def admission_errors(self) -> list[str]:
        """Failures of background admissions (their queries were answered remotely)."""
        return self._in_process("background admissions").admissions.errors

    def _in_process(self, what: str) -> Engine:
        if self.engine is None:
            raise _errors.NotSupportedError(
                f"{what} are the cache server's (this connection goes through it)"
            )
        return self.engine

    def _check_open(self) -> None:
        if self.closed:
            raise _errors.InterfaceError("the connection is closed")
