"""What the backend reports to a session (ParameterStatus), and the backend's description of a
statement, kept for a server's sessions."""

from __future__ import annotations

import typing as t
from collections.abc import Mapping

import psycopg
from psycopg import pq

from cache.backend.describe import describe_statement
from cache.backend.pool import pooled
from cache.engine.link.relay import BackendRefused, diagnostic_message, fields_of
from cache.engine.session import Session
from cache.store.cache_file import CacheStore
from cache.wire.protocol import Field

# a statement's parameter types and result columns (None: it returns no rows)
Description = tuple[tuple[int, ...], list[Field] | None]

# the parameters PostgreSQL reports at startup (GUC_REPORT), in its order
REPORTED = (
    "in_hot_standby",
    "integer_datetimes",
    "TimeZone",
    "IntervalStyle",
    "is_superuser",
    "application_name",
    "default_transaction_read_only",
    "scram_iterations",
    "DateStyle",
    "standard_conforming_strings",
    "session_authorization",
    "client_encoding",
    "server_version",
    "server_encoding",
    "search_path",
)


def reported_by(info: psycopg.ConnectionInfo) -> dict[str, str]:
    """What a backend session reports in ParameterStatus, by name."""
    return {name: value for name in REPORTED if (value := info.parameter_status(name)) is not None}


def backend_defaults(dsn: str) -> dict[str, str]:
    """The parameters the backend reports to a new session (for sessions that have not
    needed a backend connection yet)."""
    with pooled(dsn) as conn:
        return reported_by(conn.info)


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


__all__ = ["REPORTED", "Describer", "backend_defaults", "reported_by", "reported_to"]
