"""The SQLAlchemy dialect ``postgresql+mtcache``: SQLAlchemy's own PostgreSQL dialect for
psycopg 3, over the cache's DB-API (`cache`), which is shaped like psycopg.

    engine = create_engine("postgresql+mtcache://app:pw@db:5432/shop"
                           "?cache_path=/var/lib/app/cache.duckdb&currency_bound=10+min")

The URL's user, password, host, port and database name the backend (with no host: the
embedded cluster beside the cache file, as the CLI does); its query parameters and
``connect_args`` are the DB-API connection's options (``cache_path``, ``currency_bound``,
``stale_ok``, ``admit_on_miss``, ...). Everything else - reflection, types, RETURNING,
insertmanyvalues, savepoints, isolation levels - is SQLAlchemy's PostgreSQL dialect.

A bound given as an execution option (``currency_bound="10 min"`` on a statement, a
connection, a session or the engine) ends the statement's outer block as its currency clause
(`MTCacheDialect.do_execute`).
"""

from __future__ import annotations

import typing as t
from types import ModuleType

from psycopg.conninfo import make_conninfo
from sqlalchemy import util
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import URL
from sqlalchemy.sql.selectable import CompoundSelect, Select

from cache.dbapi.connection import Connection
from cache.sqla.currency import duration, has_currency_clause
from sql_ext.errors import ProgrammingError


class MTCacheDialect(PGDialect_psycopg):
    driver = "mtcache"
    supports_statement_cache = True
    # the cache's cursors are client-side: a server-side cursor would read around the cache
    supports_server_side_cursors = False

    def __init__(self, **kwargs: t.Any) -> None:
        kwargs.setdefault("use_native_hstore", False)  # its lookup needs a psycopg connection
        super().__init__(**kwargs)

    def retrieve_dbapi_version(self, dbapi: t.Any) -> t.Any:
        """psycopg's version: the cache's sessions and result types are psycopg's."""
        import psycopg

        return util.parse_version_string(psycopg.__version__)

    @classmethod
    def import_dbapi(cls) -> ModuleType:
        import cache

        return cache

    def create_connect_args(self, url: URL) -> tuple[list[t.Any], dict[str, t.Any]]:
        options: dict[str, t.Any] = {}
        for name, value in url.query.items():
            text = value if isinstance(value, str) else value[-1]
            options[name] = _option(name, text)
        backend = None
        if url.host is not None:
            backend = URL.create(
                "postgresql", url.username, url.password, url.host, url.port, url.database
            ).render_as_string(hide_password=False)
        elif "server" in options:
            # through a cache server (``postgresql+mtcache://app@/shop?server=HOST:PORT``):
            # the URL's role and database are those asked of the server, no host needed
            identity = {"user": url.username, "password": url.password, "dbname": url.database}
            backend = make_conninfo("", **{k: v for k, v in identity.items() if v}) or None
        elif url.database or url.username:
            raise ProgrammingError(
                "a postgresql+mtcache URL without a host uses the embedded backend, which "
                "names its own database and user: give a host, or leave them out"
            )
        options["backend"] = backend
        if self._psycopg_adapters_map is not None:  # the engine's JSON (de)serializers, ...
            options["context"] = self._psycopg_adapters_map
        return [], options

    def do_execute(
        self, cursor: t.Any, statement: str, parameters: t.Any, context: t.Any = None
    ) -> None:
        if context is not None and context.compiled is not None:
            bound = context.execution_options.get("currency_bound")
            if bound is not None and _bounded_read(context.compiled.statement):
                statement = f"{statement.rstrip()} CURRENCY BOUND {duration(bound)}"
        cursor.execute(statement, parameters)


def _bounded_read(statement: t.Any) -> bool:
    """Whether a compiled statement is a read an execution option's bound applies to: a
    SELECT (or a UNION of them) that locks no rows and has no clause of its own
    (`cache.sqla.with_currency`)."""
    if isinstance(statement, CompoundSelect):
        return all(_bounded_read(s) for s in statement.selects)
    return (
        isinstance(statement, Select)
        and statement._for_update_arg is None
        and not has_currency_clause(statement)
    )


def _option_kinds() -> dict[str, type]:
    """The connection options (`cache.Connection`) a URL gives as text that are flags or
    numbers, with their type."""
    kinds: dict[str, type] = {}
    for name, hint in t.get_type_hints(Connection.__init__).items():
        accepted = t.get_args(hint) or (hint,)
        kind = next((k for k in (bool, int, float) if k in accepted), None)  # bool: not a number
        if kind is not None and str not in accepted:
            kinds[name] = kind
    return kinds


_KINDS = _option_kinds()


def _option(name: str, text: str) -> t.Any:
    kind = _KINDS.get(name)
    if kind is None:
        return text
    try:
        return util.asbool(text) if kind is bool else kind(text)
    except ValueError:
        what = "true or false" if kind is bool else f"a number ({kind.__name__})"
        raise ProgrammingError(f"{name} must be {what}, not {text!r}") from None
