"""mtcache: a currency-and-consistency-aware mid-tier cache in front of PostgreSQL.

The DB-API 2.0 (PEP 249) module, shaped like psycopg::

    import cache
    with cache.connect(backend="postgresql://app@db/shop", cache_path="mt.duckdb") as conn:
        cur = conn.cursor()
        cur.execute("SELECT * FROM books b WHERE b.isbn = %s CURRENCY BOUND 10 MIN", ["x"])
        cur.fetchall(), cur.provenance
"""

from __future__ import annotations

import datetime as _dt
import time as _time
import typing as _t
from pathlib import Path
from typing import Any

from cache.dbapi.types import BINARY, DATETIME, NUMBER, ROWID, STRING
from sql_ext.errors import (
    BackendUnavailableError,
    CatalogError,
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    SqlSyntaxError,
    Warning,
)

if _t.TYPE_CHECKING:
    from psycopg import IsolationLevel
    from psycopg.adapt import AdaptersMap

    from cache.dbapi.connection import Connection
    from cache.dbapi.cursor import Cursor
    from cache.engine.admin import Admin
    from cache.execution.provenance import AccessProvenance, Provenance
    from optimizer.plan import Plan

    adapters: AdaptersMap

# The names that bring in the engine (and psycopg, DuckDB, ...) are imported when first used:
# a program that imports `cache` for its errors, or the command line's --help, does not pay
# for them (PEP 562).
_LAZY = {
    "Connection": ("cache.dbapi.connection", "Connection"),
    "Cursor": ("cache.dbapi.cursor", "Cursor"),
    "Admin": ("cache.engine.admin", "Admin"),
    "AccessProvenance": ("cache.execution.provenance", "AccessProvenance"),
    "Provenance": ("cache.execution.provenance", "Provenance"),
    "Plan": ("optimizer.plan", "Plan"),
    # psycopg's module attributes the PostgreSQL dialects of SQLAlchemy read (cache.sqla): the
    # type adapters the backend sessions use, and the isolation levels
    "adapters": ("psycopg", "adapters"),
    "IsolationLevel": ("psycopg", "IsolationLevel"),
}


def __getattr__(name: str) -> Any:
    found = _LAZY.get(name)
    if found is None:
        raise AttributeError(f"module 'cache' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(found[0]), found[1])
    globals()[name] = value  # (asked once)
    return value


apilevel = "2.0"
threadsafety = 2  # threads may share connections (their calls are serialized), as psycopg
paramstyle = "pyformat"


def connect(
    backend: str | None = None, cache_path: str | Path | None = None, **options: Any
) -> Connection:
    """Open a session: ``backend`` is a libpq DSN or URL (default: ``MTCACHE_BACKEND``, else
    the embedded cluster beside the cache file), ``cache_path`` the DuckDB file (default:
    ``MTCACHE_CACHE``, else ``.mtcache/cache.duckdb``), as the command line reads them.
    Options: ``autocommit`` (default False), ``stale_ok`` (default False), and the others of
    `Connection` (``background=False``: no refresh scheduler in this process)."""
    from cache.dbapi.connection import Connection

    return Connection(backend, cache_path, **options)


Date = _dt.date
Time = _dt.time
Timestamp = _dt.datetime


def DateFromTicks(ticks: float) -> _dt.date:
    return Date(*_time.localtime(ticks)[:3])


def TimeFromTicks(ticks: float) -> _dt.time:
    return Time(*_time.localtime(ticks)[3:6])


def TimestampFromTicks(ticks: float) -> _dt.datetime:
    return Timestamp(*_time.localtime(ticks)[:6])


def Binary(value: bytes | bytearray | memoryview) -> bytes:
    return bytes(value)


__all__ = [
    "BINARY",
    "DATETIME",
    "NUMBER",
    "ROWID",
    "STRING",
    "AccessProvenance",
    "Admin",
    "BackendUnavailableError",
    "Binary",
    "CatalogError",
    "Connection",
    "Cursor",
    "DataError",
    "DatabaseError",
    "Date",
    "DateFromTicks",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "IsolationLevel",
    "NotSupportedError",
    "OperationalError",
    "Plan",
    "ProgrammingError",
    "Provenance",
    "SqlSyntaxError",
    "Time",
    "TimeFromTicks",
    "Timestamp",
    "TimestampFromTicks",
    "Warning",
    "adapters",
    "apilevel",
    "connect",
    "paramstyle",
    "threadsafety",
]
