"""A session on a running cache server (`mtcache serve`), over PostgreSQL's protocol: what
``cache.connect(server=...)`` uses instead of opening the cache file, so many processes share
one cache. It offers the calls the DB-API connection and cursor make of an engine session
(`cache.engine.session.Session`): statements run on the server's session, which says where
each one's rows came from in a NOTICE (``mtcache.provenance``, on from the start) that becomes
the result's provenance; the session's bound and options are the server session's settings
(``mtcache.*``). `ServerAdmin` administers the served cache with the cache's statements.

What stays on the server: plans as objects (`explain`; EXPLAIN is a statement), the backend
clock and the TIMEORDERED floor as values, and the background admissions' queue.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
import typing as t
from collections.abc import Iterable, Iterator

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from sqlglot import exp

from cache.defaults import DEFAULT_ENGINE
from cache.engine.advice import Advice
from cache.engine.engine import SessionOptions, bound_seconds
from cache.engine.inspect import PROVENANCE_NOTICE, Notice, status_document
from cache.engine.result import NO_PROVENANCE, Result, of_cursor
from cache.engine.settings import show_flag
from cache.execution.provenance import Provenance
from cache.maintenance.report import Report
from cache.store.cache_file import DdlResult
from cache.store.served import ServedAt
from sql_ext import CreateCachedView, CreateControlTable, DropCacheObject, parse
from sql_ext.errors import (
    Error,
    InterfaceError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    first_line,
    translate,
    translating,
)
from sql_ext.params import Params
from sql_ext.quoting import ident


def server_conninfo(server: str | ServedAt, backend: str | None) -> str:
    """The conninfo of a cache server: ``server`` is a conninfo or URL of it, ``host:port``,
    or where it was found serving the file; the user, database and password not given there
    are the ``backend`` DSN's (the server fronts that database, as that role)."""
    if isinstance(server, ServedAt):
        given: dict[str, t.Any] = {"host": server.host, "port": server.port}
        if not backend:
            given.update({"user": server.user, "dbname": server.database})
    elif "=" in server or "://" in server:
        given = conninfo_to_dict(server)
    else:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise ProgrammingError(
                f"server={server!r}: give HOST:PORT, or a PostgreSQL "
                "conninfo or URL of the cache server"
            )
        given = {"host": host, "port": port}
    identity = conninfo_to_dict(backend) if backend else {}
    for name in ("user", "dbname", "password"):
        if name not in given and name in identity:
            given[name] = identity[name]
    return make_conninfo("", **given)


class _Flag:
    """A flag of the server session's settings (``mtcache.<name>``), read with SHOW and set
    with SET on the server."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, session: ServerSession | None, owner: type) -> t.Any:
        if session is None:
            return self
        return session._setting(self.name) == show_flag(True)

    def __set__(self, session: ServerSession, value: bool) -> None:
        session._set(self.name, show_flag(bool(value)))


class ServerSession:
    """A session of a cache server (see the module)."""

    def __init__(self, conninfo: str, options: SessionOptions) -> None:
        self.lock = threading.RLock()  # one call at a time, as an engine session
        self.closed = True
        given = conninfo_to_dict(conninfo)
        startup = {
            "provenance": show_flag(True),
            "stale_ok": show_flag(options.stale_ok),
            "admit_on_miss": show_flag(options.admit_on_miss),
        }
        if options.currency_bound is not None:
            startup["currency_bound"] = repr(options.currency_bound)
        ours = " ".join(f"-c mtcache.{name}={value}" for name, value in startup.items())
        given["options"] = f"{given.get('options', '')} {ours}".strip()
        extra: dict[str, t.Any] = {"autocommit": options.autocommit}
        if options.context is not None:
            extra["context"] = options.context
        self._provenance: Provenance | None = None
        self._notices: list[str] = []
        self._handlers: list[t.Callable[[t.Any], None]] = []
        try:
            self._conn = psycopg.connect(make_conninfo("", **given), **extra)
        except psycopg.Error as exc:
            raise translate(exc, unreachable="is `mtcache serve` running there?") from exc
        self._conn.add_notice_handler(self._on_notice)
        self._cursor = self._conn.cursor()
        self.closed = False

    # -- statements -----------------------------------------------------------------------------

    def execute(self, sql: str, params: Params = None) -> Result:
        with self.lock:
            self._check_open()
            self._provenance, self._notices = None, []
            try:
                self._cursor.execute(sql, params)  # type: ignore[arg-type]
            except psycopg.Error as exc:
                raise self._translated(exc) from exc
            result = of_cursor(self._cursor, notices=self._notices)
            result.set_provenance(self._provenance or NO_PROVENANCE)
            return result

    def _on_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        message, detail = diag.message_primary or "", diag.message_detail
        if message.startswith(PROVENANCE_NOTICE) and detail:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self._provenance = Provenance.from_json(json.loads(detail))
                return
        self._notices.append(Notice(message, detail))
        for handler in self._handlers:
            handler(diag)

    def commit(self) -> None:
        with self.lock:
            self._check_open()
            try:
                self._conn.commit()
            except psycopg.Error as exc:
                raise self._translated(exc) from exc

    def rollback(self) -> None:
        with self.lock:
            self._check_open()
            try:
                self._conn.rollback()
            except psycopg.Error as exc:
                raise self._translated(exc) from exc

    def _translated(self, exc: psycopg.Error) -> Error:
        """The error of a statement through the server: the connection's loss as such
        (psycopg gives some losses other classes, by the call that saw it), else the error
        the server sent."""
        if self._conn.closed:
            lost = OperationalError(
                f"the connection to the cache server was lost ({first_line(exc)}): connect again"
            )
            lost.sqlstate = "08006"
            return lost
        return translate(exc, unreachable="the cache server went away")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[ServerSession]:
        with self.lock:
            self._check_open()
            try:
                with self._conn.transaction():
                    yield self
            except psycopg.Error as exc:
                raise translate(exc) from exc

    @property
    def autocommit(self) -> bool:
        return self._conn.autocommit

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        translating(lambda: setattr(self._conn, "autocommit", bool(value)))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._conn.close()

    # -- the session's settings, the server session's (mtcache.*) --------------------------------

    def _setting(self, name: str) -> str:
        row = self.execute(f"SHOW mtcache.{name}").rows or [("",)]
        return str(row[0][0])

    def _set(self, name: str, value: str) -> None:
        self.execute(f"SET mtcache.{name} = {exp.Literal.string(value).sql('postgres')}")

    @property
    def currency_bound(self) -> float | None:
        shown = self._setting("currency_bound")
        return None if shown == "none" else bound_seconds(shown)

    def set_currency_bound(self, value: str | float | dt.timedelta | None) -> None:
        seconds = bound_seconds(value)
        if seconds is None:
            self._set("currency_bound", "none")
        else:
            self._set("currency_bound", repr(seconds))

    stale_ok = _Flag()
    admit_on_miss = _Flag()

    def backend_setting(self, name: str) -> t.Any:
        return getattr(self._conn, name)

    def set_backend_setting(self, name: str, value: t.Any) -> None:
        translating(lambda: setattr(self._conn, name, value))

    @property
    def info(self) -> psycopg.ConnectionInfo:
        """The connection to the server (its ParameterStatus values are the backend's)."""
        return self._conn.info

    @property
    def broken(self) -> bool:
        return self._conn.broken

    def add_notice_handler(self, handler: t.Callable[[t.Any], None]) -> None:
        self._handlers.append(handler)

    def begin_timeordered(self) -> None:
        self.execute("BEGIN TIMEORDERED")

    def end_timeordered(self) -> None:
        self.execute("END TIMEORDERED")

    # -- what stays on the server -----------------------------------------------------------------

    def explain(self, sql: str, params: Params = None) -> t.NoReturn:
        raise NotSupportedError(
            "a plan stays on the cache server: run EXPLAIN (or EXPLAIN "
            "(CACHE, FORMAT JSON)) as a statement"
        )

    @property
    def clock(self) -> t.NoReturn:
        raise NotSupportedError(
            "the backend clock is the cache server's: SHOW CACHE STATUS gives its estimate"
        )

    @property
    def timeline_floor(self) -> t.NoReturn:
        raise NotSupportedError("the TIMEORDERED floor is kept by the cache server's session")

    @property
    def admin(self) -> ServerAdmin:
        return ServerAdmin(self)

    def _check_open(self) -> None:
        if self.closed:
            raise InterfaceError("the connection is closed")


class ServerAdmin:
    """Administration of a served cache, as `cache.engine.admin.Admin` offers it: the cache's
    statements on a session of the server."""

    def __init__(self, session: ServerSession) -> None:
        self._session = session

    @classmethod
    @contextlib.contextmanager
    def open(cls, conninfo: str) -> Iterator[ServerAdmin]:
        session = ServerSession(conninfo, SessionOptions(autocommit=True))
        try:
            yield cls(session)
        finally:
            session.close()

    def status(self, views: t.Collection[str] = ()) -> dict[str, t.Any]:
        statement = "SHOW CACHE STATUS"
        if views:  # (these views' regions listed, however many)
            statement += " FOR VIEW " + ", ".join(ident(v) for v in views)
        return status_document(t.cast(list[tuple[str, str]], self._session.execute(statement).rows))

    def advice(self) -> list[Advice]:
        """What to cache (`cache.engine.advice`), as the server gives it (SHOW CACHE ADVICE)."""
        return [Advice(*row) for row in self._session.execute("SHOW CACHE ADVICE").rows or ()]

    def control_key(self, control: str) -> tuple[str, ...]:
        keys = self.status()["control_keys"]
        if control not in keys:
            raise ProgrammingError(
                f"{control} is not a control table (there are: {', '.join(keys) or 'none'})"
            )
        return tuple(keys[control])

    def apply_ddl(self, script: str | Iterable[t.Any]) -> DdlResult:
        """Cache DDL, all or nothing: sent as one script (the server applies it together)."""
        statements = parse(script) if isinstance(script, str) else list(script)
        result = self._session.execute(";\n".join(s.text for s in statements))
        created = [
            s.name for s in statements if isinstance(s, CreateControlTable | CreateCachedView)
        ]
        dropped = [s.name for s in statements if isinstance(s, DropCacheObject)]
        filled = [  # (the server filled the views it created: their reports' notices)
            Report.from_json(json.loads(detail))
            for notice in result.notices
            if (detail := getattr(notice, "detail", None))
        ]
        return DdlResult(created, dropped, filled)

    def admit(self, control: str, keys: Iterable[t.Any], *, allow_empty: bool = False) -> Report:
        self._session.execute(f"SET mtcache.admit_empty = {show_flag(allow_empty)}")
        try:
            return self._report(f"INSERT INTO {ident(control)} VALUES {_tuples(keys)}")
        finally:
            self._session.execute("RESET mtcache.admit_empty")

    def evict(self, control: str, keys: Iterable[t.Any]) -> Report:
        columns = ", ".join(ident(c) for c in self.control_key(control))
        return self._report(f"DELETE FROM {ident(control)} WHERE ({columns}) IN ({_tuples(keys)})")

    def refresh(
        self,
        view: str | None = None,
        keys: Iterable[t.Any] | None = None,
        *,
        engine: str = DEFAULT_ENGINE,
        spark_master: str | None = None,
    ) -> Report:
        session = self._session
        session.execute(f"SET mtcache.refresh_engine = {_literal(engine)}")
        session.execute(f"SET mtcache.spark_master = {_literal(spark_master or '')}")
        statement = "REFRESH CACHED VIEWS" if view is None else f"REFRESH CACHED VIEW {ident(view)}"
        if keys is not None:
            statement += f" KEY {_tuples(keys)}"
        return self._report(statement)

    def wait_for_admissions(self) -> t.NoReturn:
        raise NotSupportedError(
            "background admissions are the cache server's: its status "
            "shows the regions once they are admitted"
        )

    def _report(self, statement: str) -> Report:
        result = self._session.execute(statement)
        for notice in result.notices:
            detail = getattr(notice, "detail", None)
            if detail:
                return Report.from_json(json.loads(detail))
        word = statement.split(maxsplit=1)[0]
        raise InterfaceError(f"the cache server gave no report for its {word}")


def _tuples(keys: Iterable[t.Any]) -> str:
    """Control keys (values, or tuples of them) as SQL: (1, 'a'), (2, 'b')."""
    rows = [key if isinstance(key, tuple) else (key,) for key in keys]
    return ", ".join(f"({', '.join(_literal(v) for v in row)})" for row in rows)


def _literal(value: t.Any) -> str:
    if isinstance(value, bool) or value is None:
        raise ProgrammingError(f"a control-key value is a string or a number, not {value!r}")
    if isinstance(value, int | float):
        return repr(value)
    return exp.Literal.string(str(value)).sql("postgres")


__all__ = ["ServerAdmin", "ServerSession", "server_conninfo"]
