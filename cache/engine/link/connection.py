"""A session's link to the backend: its one backend connection (its own, or one of a pool's,
a transaction at a time), and the books of what reaches the backend on it.

Both front ends reach PostgreSQL only through a link: the DB-API's statements (`run`), the
engine's own questions on the session's connection (`for_own_statement`: which relations the
backend resolves, the clock, a remote leaf while the session writes), and the server's
passed-through messages. Whatever reaches the backend is read for what it may leave in the
backend session (`left`, `cache.engine.link.effects`): the role asked again, a pooled session
pinned to its connection or its settings (custom ones by name) read before the connection is
given back and replayed on the next (`cache.backend.session_pool`).

A connection is *lost* when libpq saw it end, or when the server found its socket unusable
(`lose`): the next statement that needs the backend connects again (the DB-API's choice;
the server ends such a session instead, as PostgreSQL would).
"""

from __future__ import annotations

import contextlib
import threading
import typing as t
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping

import psycopg
from psycopg import pq

from cache.backend.reflect import connect_backend, connection_parameters
from cache.backend.session_pool import Pooled, PoolKey, SessionPool
from cache.engine.link.effects import BackendEffects
from cache.engine.result import Result, of_cursor
from cache.execution.provenance import Executed
from sql_ext.errors import BackendUnavailableError, translate, translating
from sql_ext.params import Params


class BackendLink:
    """One session's backend connection and its books (see the module)."""

    def __init__(
        self,
        backend: str,
        owner_role: str,
        *,
        autocommit: bool = False,
        context: psycopg.adapt.AdaptersMap | None = None,
        parameters: Mapping[str, str] | None = None,
        credentials: Mapping[str, str] | None = None,
        pool: SessionPool | None = None,
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:
        """``parameters``: the backend session's startup parameters (user, application_name,
        options, settings such as DateStyle); ``credentials``: what logs it in as that user
        (libpq's password or SCRAM keys: secret, never shown); ``pool``: take the connection
        from this pool and give it back between transactions (`release`); ``on_lost``: called
        when a lost connection is replaced (a transaction open on it ended with it)."""
        self.backend = backend
        self._autocommit = autocommit
        self._context = context  # psycopg's type adapters for the backend sessions
        self._parameters = dict(parameters or {})
        self._credentials = dict(credentials or {})
        self._on_lost = on_lost
        self.notices: list[str] = []  # backend NOTICEs, handed to the statement's result
        # psycopg's session settings and notice handlers the application gave (kept for the
        # next backend connection, if this one is lost)
        self._notice_handlers: list[Callable[[t.Any], None]] = []
        self._pg_settings: dict[str, t.Any] = {}
        self._notice_sink = lambda d: self.notices.append(d.message_primary or "")
        # the backend connection; None while the backend is unreachable (the cache still
        # answers what its guards allow; the next statement that needs the backend connects)
        self._pg: psycopg.Connection[t.Any] | None = None
        self._cursor: psycopg.Cursor[t.Any] | None = None  # reused for `run`
        self._lost: psycopg.Connection[t.Any] | None = None  # `lose`
        # transaction pooling: the pool, the connection taken from it now, why the session
        # keeps it until it ends (None: it gives it back between transactions), the
        # session-level settings its backend session holds (replayed on the next connection),
        # and whether a statement may have changed them since they were read
        self._pool = pool
        self._pooled: Pooled | None = None
        self.pinned: str | None = None
        self._settings: tuple[tuple[str, str], ...] = ()
        self._settings_unknown = False
        # the custom settings (placeholders) the session's statements may have defined: read
        # by name with its settings (pg_settings does not list them), and a pooled connection
        # that defined others is never the session's (`cache.backend.session_pool`)
        self._custom_settings: frozenset[str] = frozenset()
        self._lock = threading.Lock()  # `_pooled` against a cancel from another thread
        # statements the session ran on that connection itself (not its caller's, through
        # `connection`): each may have taken the backend's unnamed statement
        self.statements = 0
        self._pool_key = PoolKey(
            self._parameters.get("user") or owner_role, tuple(sorted(self._parameters.items()))
        )
        # the role the backend checks the session's reads as (None: to be asked, after a
        # statement that may have changed it: `Session._reader`)
        self.login = self._parameters.get("user") or owner_role  # (its backend user)
        self.role: str | None = self.login

    # -- the connection ------------------------------------------------------------------------

    @property
    def pg(self) -> psycopg.Connection[t.Any] | None:
        """The connection the session holds (None: none yet; it may be lost)."""
        return self._pg

    def if_open(self) -> psycopg.Connection[t.Any] | None:
        """The connection, if one is open and not lost."""
        return self._pg if not self.lost else None

    def connection(self) -> psycopg.Connection[t.Any]:
        """The connection, connected again if the backend had gone (a transaction open on
        the lost connection ended with it: `on_lost`); a `BackendUnavailableError` while it
        is still unreachable. The caller may use it between statements, and leaves it idle."""
        pg = self._pg
        if pg is not None and not self.lost:
            return pg
        if pg is not None:
            self._on_lost()
            pooled = self._pooled
            if pooled is not None:
                assert self._pool is not None
                self._pool.discard(self._detach(pooled))
            elif not pg.closed:  # (`lose`)
                pg.close()
        return self.connect()

    def for_own_statement(self) -> psycopg.Connection[t.Any]:
        """The connection for a statement of the engine's own (counted: `statements`)."""
        self.ran_own()
        return self.connection()

    def ran_own(self) -> None:
        self.statements += 1

    def connect(self) -> psycopg.Connection[t.Any]:
        """Open the connection (or take one from the pool, the session's settings replayed)."""
        pool = self._pool
        if pool is None:
            pg = self._open()
            self._adopt(pg)
            self._pg = pg
            return pg
        pooled = pool.acquire(self._pool_key, self._open, self._custom_settings)
        pg = pooled.conn
        try:
            if pooled.settings != self._settings:
                _replay_settings(pg, pooled.settings, self._settings)
                pooled.settings = self._settings
                pooled.defined |= self._custom_settings
            self._adopt(pg)
        except psycopg.Error as exc:
            pool.discard(pooled)
            raise BackendUnavailableError(f"the backend connection failed: {exc}") from exc
        self.ran_own()  # (its unnamed statement is not the one the session left elsewhere)
        with self._lock:
            self._pooled = pooled
            self._pg = pg
        return pg

    def _open(self) -> psycopg.Connection[t.Any]:
        options: dict[str, object] = {"autocommit": self._autocommit}
        if self._context is not None:
            options["context"] = self._context
        options.update(connection_parameters(self._parameters))
        options.update(self._credentials)
        return connect_backend(self.backend, **options)

    def _adopt(self, pg: psycopg.Connection[t.Any]) -> None:
        """The session's handlers and psycopg settings on the connection it now uses."""
        self.role = pg.info.user  # (a new backend session, or a pooled one: its login role)
        pg.add_notice_handler(self._notice_sink)
        for handler in self._notice_handlers:
            pg.add_notice_handler(handler)
        if pg.autocommit != self._autocommit:
            pg.autocommit = self._autocommit
        for name, value in self._pg_settings.items():
            setattr(pg, name, value)

    def _detach(self, pooled: Pooled) -> Pooled:
        """The pooled connection the session holds is no longer its own (a cancel from
        another thread then finds none), its handlers taken off."""
        with self._lock:
            self._pooled = None
            self._pg = None
        pg = pooled.conn
        for handler in (self._notice_sink, *self._notice_handlers):
            with contextlib.suppress(ValueError):
                pg.remove_notice_handler(handler)
        cursor, self._cursor = self._cursor, None
        if cursor is not None:
            cursor.close()
        return pooled

    def close(self) -> None:
        pooled = self._pooled
        if pooled is not None:  # given back if it can be, else closed (a pinned session's)
            assert self._pool is not None
            self._detach(pooled)
            if self.pinned is not None or self._settings_unknown:
                self._pool.discard(pooled)
            else:
                self._pool.release(pooled)
            return
        if self._cursor is not None:
            self._cursor.close()
        if self._pg is not None:
            self._pg.close()

    # -- pooling ---------------------------------------------------------------------------------

    @property
    def pooled(self) -> bool:
        """Whether the connection is taken from a pool (`release`)."""
        return self._pool is not None

    @property
    def prepared(self) -> OrderedDict[bytes, None] | None:
        """The server's prepared statement names parsed on the pooled connection the session
        holds, least recently used first (None: not pooled, or none held)."""
        pooled = self._pooled
        return pooled.prepared if pooled is not None else None

    def release(self) -> None:
        """Give the pooled connection back when its session is idle (no transaction, nothing
        running) and not pinned to it: the client was sent ReadyForQuery. The session-level
        settings a statement may have changed are read first, for the next connection.
        Nothing happens to a session that is not pooled."""
        pooled = self._pooled
        if pooled is None or self.pinned is not None or self.lost:
            return
        pg = pooled.conn
        if pg.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            return
        if self._settings_unknown:
            try:
                self._settings = pooled.settings = _session_settings(pg, self._custom_settings)
                self.ran_own()
            except psycopg.Error:
                self.pinned = "its settings could not be read"
                return
            self._settings_unknown = False
        assert self._pool is not None
        self._pool.release(self._detach(pooled))

    # -- the books -------------------------------------------------------------------------------

    def left(self, effects: BackendEffects) -> None:
        """What a statement that reached the backend may have left in its backend session
        (`cache.engine.link.effects`), whichever route sent it: the role is asked again; a pooled
        session is pinned to its connection by what cannot follow it, and its settings (the
        custom ones by name) are read before the connection is given back."""
        if effects.may_change_role:
            self.role = None  # (`Session._reader` asks the backend)
        pooled = self._pooled
        if pooled is None:
            return
        if self.pinned is None and effects.pins is not None:
            self.pinned = effects.pins
        if effects.may_change_settings:
            self._settings_unknown = True
        if effects.unprepares:
            pooled.prepared.clear()
        custom = effects.custom_settings
        if custom:
            self._custom_settings |= custom
            pooled.defined |= custom

    # -- statements ------------------------------------------------------------------------------

    def run(self, executed: Executed, params: Params) -> Result:
        """Send a statement to PostgreSQL (``executed``: its SQL, as the result reports it),
        its notices handed to the result."""
        notices: list[str] = []
        try:
            pg = self.for_own_statement()
            cur = self._cursor
            if cur is None or cur.closed or cur.connection is not pg:
                cur = self._cursor = pg.cursor()
            cur.execute(executed.backend_sql, params)  # type: ignore[arg-type]
            return of_cursor(cur, executed=executed, notices=notices)
        except psycopg.Error as exc:
            raise translate(
                exc, unreachable="the statement needs it: reconnect when it is back"
            ) from exc
        finally:
            while self.notices:
                notices.append(self.notices.pop(0))

    def commit(self) -> None:
        if self._pg is not None:  # with no backend session there is nothing to commit
            translating(self._pg.commit)

    def rollback(self) -> None:
        if self._pg is not None:
            translating(self._pg.rollback)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """psycopg's transaction block on the connection."""
        with self.for_own_statement().transaction():
            yield

    # -- state -----------------------------------------------------------------------------------

    @property
    def lost(self) -> bool:
        """Whether the session had a connection and lost it (until its next statement that
        needs the backend connects again)."""
        pg = self._pg
        return pg is not None and (pg.closed or pg is self._lost)

    def lose(self) -> None:
        """The caller found the connection unusable (it read the connection's socket itself):
        lost from now on, as if libpq had seen it end. It is closed when the session is, or
        when the next statement that needs the backend replaces it (the caller may still be
        watching its socket)."""
        self._lost = self._pg

    def transaction_status(self) -> pq.TransactionStatus:
        """The backend session's transaction status (IDLE while it has no connection)."""
        pg = self.if_open()
        if pg is None:
            return pq.TransactionStatus.IDLE
        return pq.TransactionStatus(pg.pgconn.transaction_status)

    def cancel(self) -> None:
        """Cancel the backend statement, if one runs (from another thread; the backend
        ignores a cancel that comes before its statement)."""
        with self._lock:  # (a pooled connection is not given back meanwhile)
            pg = self.if_open()
            if pg is None:
                return
            if self._pooled is not None:
                self._pooled.cancelled = True  # (the cancel could reach another session's)
            with contextlib.suppress(psycopg.Error):
                pg.pgconn.get_cancel().cancel()

    @property
    def pid(self) -> int | None:
        """The backend process of the connection (None: none is open)."""
        pg = self._pg
        return pg.info.backend_pid if pg is not None and not pg.closed else None

    @property
    def broken(self) -> bool:
        return self._pg is not None and self._pg.broken

    def parameter_status(self, name: str) -> str | None:
        """A setting the backend reports (TimeZone, ...), None with no connection."""
        pg = self._pg
        return pg.info.parameter_status(name) if pg is not None and not pg.closed else None

    # -- psycopg's settings and handlers ---------------------------------------------------------

    @property
    def autocommit(self) -> bool:
        return self._autocommit

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        pg = self._pg
        if pg is not None and not pg.closed:
            translating(lambda: setattr(pg, "autocommit", value))
        self._autocommit = bool(value)

    def setting(self, name: str) -> t.Any:
        """A psycopg session setting (``isolation_level``, ``read_only``, ``deferrable``)."""
        pg = self._pg
        if pg is not None and not pg.closed:
            return getattr(pg, name)
        return self._pg_settings.get(name)

    def set_setting(self, name: str, value: t.Any) -> None:
        """Set it on the backend session, and keep it for the next one if this is lost."""
        pg = self._pg
        if pg is not None and not pg.closed:
            translating(lambda: setattr(pg, name, value))
        self._pg_settings[name] = value

    def add_notice_handler(self, handler: Callable[[t.Any], None]) -> None:
        """Call ``handler`` with each notice the backend sends (a psycopg ``Diagnostic``)."""
        self._notice_handlers.append(handler)
        if self._pg is not None and not self._pg.closed:
            self._pg.add_notice_handler(handler)


def _session_settings(
    pg: psycopg.Connection[t.Any], custom: frozenset[str]
) -> tuple[tuple[str, str], ...]:
    """The settings the backend session changed by SET (or set_config), as it holds them,
    and the custom ones named (placeholders, which pg_settings does not list: each as
    current_setting gives it, empty after a RESET; one it never defined is left out)."""
    with pg.cursor() as cur:
        cur.execute(
            "SELECT name, setting FROM pg_settings WHERE source = 'session' "
            "AND NOT lower(name) = ANY(%(custom)s::text[]) "
            "UNION ALL SELECT name, current_setting(name, true) "
            "FROM unnest(%(custom)s::text[]) name "
            "WHERE current_setting(name, true) IS NOT NULL ORDER BY 1",
            {"custom": sorted(custom)},
        )
        return tuple((str(n), str(v)) for n, v in cur.fetchall())


def _replay_settings(
    pg: psycopg.Connection[t.Any],
    held: tuple[tuple[str, str], ...],
    wanted: tuple[tuple[str, str], ...],
) -> None:
    """A pooled connection's settings (``held``) made the session's (``wanted``)."""
    with pg.cursor() as cur:
        if held:
            cur.execute("RESET ALL")
        if wanted:
            cur.execute(
                "SELECT " + ", ".join(["set_config(%s, %s, false)"] * len(wanted)),
                [v for pair in wanted for v in pair],
            )


__all__ = ["BackendLink"]
