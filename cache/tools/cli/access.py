"""How a command reaches the cache file: in this process, or through the server of `mtcache
serve` while one owns the file (`open_admin`, `open_connection`), and the refusal of a command
that needs the file itself while it is served (`not_served`)."""

from __future__ import annotations

import typing as t

import cache
from cache.dbapi.remote import ServerAdmin, server_conninfo
from cache.engine.admin import Admin
from cache.store.served import served_at
from cache.tools.settings import Settings
from sql_ext.errors import OperationalError


def open_admin(settings: Settings) -> t.ContextManager[Admin | ServerAdmin]:
    """The cache file's administration; the backend is started or reached only if needed.
    While `mtcache serve` owns the file, the server's (through its protocol)."""
    served = served_at(settings.cache_path)
    if served is not None:
        return ServerAdmin.open(server_conninfo(served, settings.backend))
    return Admin.open(
        settings.cache_path,
        backend=settings.backend_dsn,
        memory_limit=settings.memory_limit,
        threads=settings.threads,
        cache_size_limit=settings.cache_size_limit,
    )


def open_connection(settings: Settings) -> cache.Connection:
    """A session on the cache: through its server while one owns the file."""
    served = served_at(settings.cache_path)
    if served is not None:
        return cache.connect(settings.backend, settings.cache_path, server=served)
    return cache.connect(
        settings.backend_dsn(),
        settings.cache_path,
        background=False,
        memory_limit=settings.memory_limit,
        threads=settings.threads,
        cache_size_limit=settings.cache_size_limit,
    )


def not_served(settings: Settings, advice: str) -> None:
    """Refuse a command that needs the file itself while a server owns it."""
    served = served_at(settings.cache_path)
    if served is not None:
        raise OperationalError(
            f"the cache file {settings.cache_path} is served by `mtcache serve` (pid "
            f"{served.pid}) at {served.address}: {advice}"
        )
