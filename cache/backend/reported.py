"""What the backend reports to a new session (ParameterStatus): read from a connection, or
asked of the backend on a connection of its own."""

from __future__ import annotations

import psycopg

from cache.backend.pool import PROBE_SECONDS
from sql_ext.errors import BackendUnavailableError, first_line

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


def asked_defaults(dsn: str) -> dict[str, str]:
    """What the backend reports to a new session of ``dsn``: a connection of its own, made
    within PROBE_SECONDS and closed (a busy pool is no outage, and a backend that accepts but
    never answers is one); `BackendUnavailableError` when it cannot be reached."""
    try:
        with psycopg.connect(dsn, connect_timeout=PROBE_SECONDS, autocommit=True) as conn:
            return reported_by(conn.info)
    except psycopg.OperationalError as exc:
        raise BackendUnavailableError(f"the backend is unreachable ({first_line(exc)})") from exc


__all__ = ["REPORTED", "asked_defaults", "reported_by"]
