"""What the backend reports to a session (ParameterStatus), and the backend's description of a
statement, kept for a server's sessions."""

from __future__ import annotations

import logging
import threading
import typing as t
from collections.abc import Mapping

import duckdb
import psycopg
from psycopg import pq

from cache.backend.describe import describe_statement
from cache.backend.pool import pooled
from cache.backend.reported import asked_defaults, reported_by
from cache.engine.link.relay import BackendRefused, diagnostic_message, fields_of
from cache.engine.session import Session
from cache.store.cache_file import CacheStore
from cache.wire.protocol import Field
from sql_ext.errors import BackendUnavailableError

log = logging.getLogger("mtcache.server")

# a statement's parameter types and result columns (None: it returns no rows)
Description = tuple[tuple[int, ...], list[Field] | None]


class BackendDefaults:
    """The parameters the backend reports to a new session (for sessions that have not
    needed a backend connection yet): asked of the backend (`probe`, which also tells
    whether it is reachable) and kept in the cache file, whose copy serves while the backend
    is unreachable, so that a server starts and answers locally during an outage."""

    def __init__(self, dsn: str, store: CacheStore) -> None:
        self.dsn = dsn
        self._store = store  # a handle of its own, used under the lock
        self._lock = threading.Lock()
        self._asked: dict[str, str] | None = None  # as the backend last reported them
        self._unsaved = False  # the file refused them (said once)

    def probe(self) -> None:
        """Ask the backend (`asked_defaults`); `BackendUnavailableError` when it cannot be
        reached. Keeping the answer in the cache file is best effort: a file that cannot take
        it is said once in the log, and is no backend outage."""
        asked = asked_defaults(self.dsn)
        with self._lock:
            if asked != self._asked and self._store.con is not None:
                try:
                    self._store.save_reported(asked)
                except duckdb.Error as exc:
                    if not self._unsaved:
                        log.warning("cannot keep the backend's session defaults: %s", exc)
                    self._unsaved = True
            self._asked = asked

    def current(self) -> dict[str, str]:
        """The backend's defaults: as the last probe asked them (the server's watch probes at
        start and on), else (not reached since) those the cache file kept; none:
        `BackendUnavailableError`. A login never waits for a probe of its own."""
        if self._asked is not None:
            return self._asked
        with self._lock:
            kept = self._store.load_reported() if self._store.con is not None else None
        if kept is None:
            raise BackendUnavailableError(
                "the backend is unreachable, and this cache file keeps no record of what it "
                "reports to a session: connect again once the cache server has reached it"
            )
        return kept

    def close(self) -> None:
        with self._lock:
            self._store.close()


def reported_to(
    session: Session, defaults: Mapping[str, str], parameters: Mapping[str, str]
) -> dict[str, str]:
    """The ParameterStatus values of a new session: its backend connection's, or (none open
    yet) the backend's defaults with the client's application name."""
    conn = session.link.if_open()
    if conn is not None:
        return reported_by(conn.info)
    reported = dict(defaults)
    reported["application_name"] = parameters.get("application_name", "")
    return reported


class Describer:
    """The backend's descriptions of statements (parameter types and result columns), kept
    for the sessions of one engine while the cache schema stands."""

    def __init__(self, backend: str, store: CacheStore) -> None:
        self.backend = backend
        self.store = store
        self._kept: dict[tuple[str, tuple[int, ...], int], Description] = {}

    def __call__(
        self, sql: str, types: tuple[int, ...], conn: psycopg.Connection[t.Any] | None = None
    ) -> Description:
        """A statement's description (on ``conn``, a session's own connection, which sees
        its temporary tables, when given: not kept)."""
        key = (sql, types, self.store.schema_version)
        found = self._kept.get(key) if conn is None else None
        if found is None:
            if conn is None:
                with pooled(self.backend) as shared:
                    result = describe_statement(shared, sql.encode(), types)
            else:
                result = describe_statement(conn, sql.encode(), types)
            if result.status != pq.ExecStatus.COMMAND_OK:
                raise BackendRefused(diagnostic_message(result))
            found = (
                tuple(result.param_type(i) for i in range(result.nparams)),
                fields_of(result) if result.nfields else None,
            )
            if conn is not None:
                return found
            if len(self._kept) > 4096:
                self._kept.clear()
            self._kept[key] = found
        return found


__all__ = ["BackendDefaults", "Describer", "reported_by", "reported_to"]
