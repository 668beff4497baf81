"""SQLAlchemy over the cache: the ``postgresql+mtcache`` dialect (`cache.sqla.dialect`), and
the cache's own answers reached from SQLAlchemy objects::

    from sqlalchemy import create_engine, select
    from cache.sqla import admin, provenance

    engine = create_engine("postgresql+mtcache://app@db/shop?cache_path=cache.duckdb")
    with admin(engine) as cache_admin:
        cache_admin.admit("authorlist_pct", [1, 2])
    with engine.connect() as conn:
        result = conn.execute(select(authors).execution_options(currency_bound="10 min"))
        rows, where = result.all(), provenance(result)
"""

from __future__ import annotations

import typing as t
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from sqlalchemy.engine import URL

from cache.dbapi.connection import Connection as CacheConnection
from cache.dbapi.remote import ServerAdmin
from cache.engine.admin import Admin
from cache.execution.provenance import Provenance
from cache.sqla.currency import with_currency
from sql_ext.errors import InterfaceError

__all__ = ["admin", "engine_url", "provenance", "with_currency"]


def engine_url(backend: str | None, cache_path: str | Path, **options: t.Any) -> URL:
    """The ``postgresql+mtcache`` URL of a backend given as `cache.connect` takes it (a libpq
    DSN or URL; None: the embedded cluster), with the cache file and connection options."""
    query = {"cache_path": str(cache_path)}
    for name, value in options.items():
        query[name] = str(value).lower() if isinstance(value, bool) else str(value)
    if backend is None:
        return URL.create("postgresql+mtcache", query=query)
    info: dict[str, t.Any] = psycopg.conninfo.conninfo_to_dict(backend)
    port = info.get("port")
    return URL.create(
        "postgresql+mtcache",
        info.get("user"),
        info.get("password"),
        info.get("host"),
        int(port) if port else None,
        info.get("dbname"),
        query=query,
    )


def provenance(result: t.Any) -> Provenance:
    """Where a result's rows came from (`cache.Provenance`: per table, local with its view,
    regions and currency, or remote), for a Core or ORM result of a ``postgresql+mtcache``
    engine, also after its rows are read (the DB-API cursor keeps it when closed)."""
    cursor_result = result
    while True:  # scalars() and mappings() filter a result, an ORM result wraps the cursor's
        inner = getattr(cursor_result, "_real_result", None) or getattr(cursor_result, "raw", None)
        if inner is None:
            break
        cursor_result = inner
    cursor = getattr(getattr(cursor_result, "context", None), "cursor", None)
    found = getattr(cursor, "provenance", None)
    if found is None:
        raise InterfaceError(
            "not a result of a postgresql+mtcache engine: its cursor has no provenance"
        )
    return t.cast(Provenance, found)


@contextmanager
def admin(engine: t.Any) -> Iterator[Admin | ServerAdmin]:
    """The cache's administration API (`cache.Admin`: DDL, admit, evict, refresh, status) of
    an engine, through one of its pooled DB-API connections (returned to the pool on exit);
    through a cache server (``?server=``), the server's (`cache.dbapi.remote.ServerAdmin`)."""
    with engine.connect() as conn:
        dbapi = conn.connection.driver_connection
        if not isinstance(dbapi, CacheConnection):
            raise InterfaceError(
                "not a postgresql+mtcache engine: its connections are "
                f"{type(dbapi).__module__}.{type(dbapi).__name__}"
            )
        yield dbapi.admin
