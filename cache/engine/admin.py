"""The cache's administration API: the cache schema, admission, eviction, refresh, status.

From a connection, ``conn.admin`` (it shares the connection's cache file and backend, and its
background admissions); without one - tools that need no backend, like ``mtcache status`` or
``mtcache evict`` - ``Admin.open(cache_path, backend=...)``::

    with Admin.open(".mtcache/cache.duckdb", backend=dsn) as admin:
        admin.apply_ddl(Path("cache/schemas/bookstore.sql").read_text())
        admin.admit("authorlist_pct", [4, 8])
        admin.refresh("authorcopy", engine="spark")
        admin.status()["views"]

Keys are tuples of control-key values, one per control-key column; a plain value stands for
a one-column key. Every operation pulls or removes whole regions by affected closure, in one
backend snapshot and one DuckDB transaction (`cache.maintenance`).
"""

from __future__ import annotations

import dataclasses
import threading
import typing as t
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cache.backend.reflect import fetch_catalog
from cache.defaults import DEFAULT_ENGINE
from cache.engine.admission import Admissions
from cache.engine.advice import Advice, advice, backend_statements
from cache.engine.boundary import public
from cache.maintenance.engines import Engine
from cache.maintenance.pipeline import Maintainer, make_engine
from cache.maintenance.report import Report
from cache.maintenance.stream.publication import publication_for
from cache.maintenance.stream.status import stream_status
from cache.store.cache_file import CacheStore, DdlResult, check_resources
from cache.store.counters import Counts, as_document
from cache.store.status import status
from control_tables.schema import control_role
from sql_ext import CreateCachedView, Statement, parse
from sql_ext.catalog import Catalog
from sql_ext.errors import Error, InterfaceError

Dsn = Callable[[], str]  # the backend, resolved when first needed (the embedded one starts)


# the public methods' edge (cache.engine.boundary), naming this cache file
_public = public(lambda self: self._store.path, lambda self: self._lock)


class Admin:
    def __init__(
        self,
        store: CacheStore,
        backend: Dsn,
        *,
        admissions: Admissions | None = None,
        on_catalog: Callable[[Catalog], None] | None = None,
        lock: threading.RLock | None = None,
        counters: Callable[[], Counts] | None = None,
    ) -> None:
        self._lock = lock or threading.RLock()  # the connection's, when reached through one
        self._store = store
        self._backend = backend
        self._admissions = admissions
        self._on_catalog = on_catalog
        self._counters = counters  # the running engine's (those saved in the file lag behind)

    @property
    def store(self) -> CacheStore:
        """The cache file this session administers (for reading its tables)."""
        return self._store

    @classmethod
    @contextmanager
    def open(
        cls,
        cache_path: str | Path,
        backend: str | Dsn | None = None,
        memory_limit: str | None = None,
        threads: int | None = None,
        cache_size_limit: int | str | None = None,
    ) -> Iterator[Admin]:
        """An administration session on a cache file (closed on exit). ``backend``: a DSN, or a
        callable giving one when an operation first needs the backend; ``memory_limit``,
        ``threads`` and ``cache_size_limit``: what the file's DuckDB may use and the cached
        data's budget (`cache.connect`'s)."""
        check_resources(memory_limit, threads, cache_size_limit)
        store = CacheStore(cache_path)
        store.limit_resources(memory_limit, threads, cache_size_limit)
        if backend is None:
            resolve: Dsn = _no_backend
        elif isinstance(backend, str):
            dsn = backend
            resolve = lambda: dsn  # noqa: E731
        else:
            resolve = backend
        try:
            yield cls(store, resolve)
        finally:
            store.close()

    # -- the cache schema ------------------------------------------------------------------------

    @_public
    def reflect(self) -> Catalog:
        """Read the backend's catalog (tables, keys, statistics) into the cache file."""
        catalog = fetch_catalog(self._backend())
        self._store.save_catalog(catalog)
        return self._adopt(catalog)

    @_public
    def apply_ddl(self, script: str | Iterable[Statement]) -> DdlResult:
        """Apply cache DDL (a script's text or parsed statements) all or nothing, checked
        against the backend's current catalog and Rules 1-5; then fill the fully
        materialized views it created (`fill`)."""
        statements = parse(script) if isinstance(script, str) else list(script)
        dsn = self._backend()
        catalog = fetch_catalog(dsn)
        # the replication slot kept in step; the store saves the catalog if the DDL applies
        with publication_for(self._store, dsn, statements, catalog) as record:
            result = self._store.apply_ddl(statements, catalog, then=record)
        self._adopt(catalog)
        empty = {s.name for s in statements if isinstance(s, CreateCachedView) and not s.with_data}
        return self.fill(result, set(result.created) - empty)

    def fill(self, applied: DdlResult, created: set[str]) -> DdlResult:
        """The owner of the file fills what it creates: each fully materialized view of
        ``created`` (whatever its refresh mode: one refreshed only on demand would otherwise
        wait for a person) is pulled now, as `refresh` pulls it, unless an earlier pull of
        the fill brought it whole (a copy's readers come with it: its report names them). A
        view that cannot be filled stays created and empty (its guard sends its reads to the
        backend; EXPLAIN and status say so), with why."""
        schema = self._store.load_schema()
        filled, unfilled = [], []
        done: set[str] = set()  # (a pull brings other views whole too: a copy's readers)
        for name in schema.topological_order():
            view = schema.views[name] if name in created else None
            if view is None or not view.is_fully_materialized or view.is_gray or name in done:
                continue
            try:
                report = self.refresh(name)
            except Error as exc:
                unfilled.append((name, str(exc)))
                continue
            filled.append(report)
            done |= report.rows_inserted.keys()
        return dataclasses.replace(applied, filled=filled, unfilled=unfilled)

    @_public
    def control_key(self, control: str) -> tuple[str, ...]:
        """The control-key columns of a control table (an error naming the control tables
        there are, if it is none)."""
        return control_role(self._store.load_schema(), control)[2]

    # -- regions -----------------------------------------------------------------------------

    @_public
    def admit(self, control: str, keys: Iterable[t.Any], *, allow_empty: bool = False) -> Report:
        """Add control-key values and pull the regions they define (and their closure). A
        presence key the backend has no rows for is an error unless ``allow_empty``."""
        return self._maintainer().admit(control, _keys(keys), allow_empty=allow_empty)

    @_public
    def evict(self, control: str, keys: Iterable[t.Any]) -> Report:
        """Remove control-key values and their rows, cascading to presence-controlled
        children. Needs no backend."""
        return Maintainer(self._store, "").evict(control, _keys(keys))

    @_public
    def refresh(
        self,
        view: str | None = None,
        keys: Iterable[t.Any] | None = None,
        *,
        engine: str | Engine = DEFAULT_ENGINE,
        spark_master: str | None = None,
    ) -> Report:
        """Refresh a view's regions (all, or those of the given presence keys), or every
        white view; on the ``auto`` engine (inline unless a pull is large enough for Spark to
        pay and Spark is installed), ``inline`` or ``spark``."""
        chosen = make_engine(engine, spark_master) if isinstance(engine, str) else engine
        return self._maintainer(chosen).refresh(view, _keys(keys) if keys is not None else None)

    def wait_for_admissions(self) -> None:
        """Block until the background admissions requested so far (presence misses) are done."""
        if self._admissions is not None:
            self._admissions.wait()

    @property
    def admission_errors(self) -> list[str]:
        return self._admissions.errors if self._admissions is not None else []

    # -- status ----------------------------------------------------------------------------------

    @_public
    def status(self, views: t.Collection[str] = ()) -> dict[str, t.Any]:
        """Views, their regions with currency, and the counters('s document); the
        replication stream of continuously maintained views, if any (its lag in bytes when
        the backend answers). A view's regions are listed when it has few, or is named in
        ``views``; else summed up."""
        document = status(self._store, detail=views)
        if self._counters is not None:
            document["counters"] = as_document(self._counters())
        document["stream"] = stream_status(self._store, self._backend)
        return document

    @_public
    def advice(self, backend: bool = True) -> list[Advice]:
        """What to cache: the statement shapes the backend answered, why, and the cache DDL
        that would answer them (`cache.engine.advice`); with pg_stat_statements on the
        backend (``backend``: asked, as the cache's own role), also what reached it without
        the cache planning it."""
        catalog = self._store.load_catalog()
        found = advice(self._store, catalog)
        if not backend:
            return found
        try:
            dsn = self._backend()
        except Error:  # (no backend to ask: what the cache counted)
            return found
        return found + backend_statements(dsn, catalog, found)

    def _adopt(self, catalog: Catalog) -> Catalog:
        """Plan against a catalog just read and kept (the connection's planner, if any)."""
        if self._on_catalog is not None:
            self._on_catalog(catalog)
        return catalog

    def _maintainer(self, engine: Engine | None = None) -> Maintainer:
        if not self._store.has_catalog():
            self.reflect()
        return Maintainer(self._store, self._backend(), engine)


def _keys(values: Iterable[t.Any]) -> list[tuple[t.Any, ...]]:
    return [v if isinstance(v, tuple) else (v,) for v in values]


def _no_backend() -> str:
    raise InterfaceError("this administration session has no backend: open it with backend=...")
