"""How a command reaches the cache file: in this process, or through the server of `mtcache
serve` while one owns the file (`open_admin`, `open_connection`), and the refusal of a command
that needs the file itself while it is served (`not_served`)."""

from __future__ import annotations

import typing as t

import cache
from cache.dbapi.remote import ServerAdmin, server_conninfo
from cache.engine.admin import Admin
from cache.store.served import ServedAt, served_at
from cache.tools.settings import Settings
from sql_ext.errors import OperationalError, ProgrammingError


def server_of(settings: Settings) -> str | ServedAt | None:
    """The cache server a command goes through: the one ``--server`` names (from any machine
    that reaches it), else the one serving the cache file here, else none."""
    return _named_server(settings) if settings.server else served_at(settings.cache_path)


def server_target(settings: Settings) -> str:
    """The conninfo of the ``--server`` given (its role and database from it, else from
    ``--backend``)."""
    return server_conninfo(_named_server(settings), settings.backend)


def _named_server(settings: Settings) -> str:
    """``--server``, refused as a HOST:PORT alone with no backend (the server would be asked
    for the operating system user's database)."""
    server = settings.server or ""
    if "=" not in server and "://" not in server and not settings.backend:
        raise ProgrammingError(
            f"--server {server}: name the role and database too, as "
            "postgresql://ROLE@HOST:PORT/DATABASE (on the server's machine, `mtcache psql "
            "--server --dsn` prints it), or give --backend"
        )
    return server


def open_admin(settings: Settings) -> t.ContextManager[Admin | ServerAdmin]:
    """The cache file's administration; the backend is started or reached only if needed.
    While `mtcache serve` owns the file (or with ``--server``), the server's (through its
    protocol)."""
    served = server_of(settings)
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
    """A session on the cache: through its server while one owns the file (or ``--server``)."""
    served = server_of(settings)
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
    if settings.server:
        raise OperationalError(
            f"--server {settings.server}: this command needs the cache file itself; run it on "
            "the server's machine, without --server"
        )
    served = served_at(settings.cache_path)
    if served is not None:
        raise OperationalError(
            f"the cache file {settings.cache_path} is served by `mtcache serve` (pid "
            f"{served.pid}) at {served.address}: {advice}"
        )
