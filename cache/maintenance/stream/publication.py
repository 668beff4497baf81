"""The cache DDL's side of continuous maintenance: one publication and one slot per cache file
over the continuously maintained views' tables and the heartbeat table, kept in step with the
DDL that creates and drops those views."""

from __future__ import annotations

import contextlib
import json
import secrets
import typing as t
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import duckdb
import psycopg

from cache.backend.reflect import connect_backend
from cache.backend.replication import (
    check_stream,
    create_publication,
    create_slot,
    drop_publication,
    drop_slot,
)
from cache.maintenance.stream.position import SLOT_PREFIX, load_stream
from cache.store.cache_file import CacheStore, DdlResult
from control_tables.schema import CacheSchema
from control_tables.script import apply_script
from heartbeat.beat import TABLE as HEARTBEAT_TABLE
from heartbeat.beat import ensure_table
from optimizer.derived.delta import maintenance
from sql_ext import CreateCachedView, Statement
from sql_ext.catalog import Catalog
from sql_ext.errors import NotSupportedError, OperationalError

Record = t.Callable[[duckdb.DuckDBPyConnection], None]


@contextmanager
def publication_for(
    store: CacheStore, dsn: str, statements: Sequence[Statement], catalog: Catalog
) -> Iterator[Record | None]:
    """Keep the publication and the slot in step with cache DDL about to be applied: inside,
    the caller applies the DDL to the store (`CacheStore.apply_ddl`), passing the step this
    yields as its ``then`` (it records the stream's row in the same DuckDB transaction).
    Made before (the slot with the first continuously maintained view) and dropped again if
    the DDL fails; dropped after the commit that removes the last such view. The file's stream
    consumers wait meanwhile, their sessions ended (they start again from the file's position,
    with the relations as they are now)."""
    with store.stream_lock:
        current = load_stream(store.con)
        if current is not None:
            store.release_streams()
        after, _ = apply_script(store.load_schema(), statements, catalog)
        tables = _stream_tables(after, catalog)
        if not tables:  # no continuously maintained view left (or none yet)
            yield _forget_stream
            if current is not None:
                with contextlib.suppress(psycopg.Error, OperationalError):
                    drop_slot(dsn, current.slot)
                    drop_publication(dsn, current.publication)
            return
        created = [
            st.name
            for st in statements
            if isinstance(st, CreateCachedView) and after.continuous(st.name)
        ]
        if (
            current is not None
            and tables == _stream_tables(store.load_schema(), catalog)
            and not (current.problem and created)
        ):
            yield None  # the same tables: the stream goes on as it is
            return
        # (a stopped stream resumes once continuous views are created again: they are checked
        # against the backend's catalog of now, whose columns the stream is signed with anew)
        _check_replica_identity(after, catalog)
        if current is None:
            check_stream(dsn)  # (before the heartbeat table, the publication and the slot)
        relations, heartbeat = _signatures(dsn, tables)
        name = current.slot if current is not None else SLOT_PREFIX + secrets.token_hex(8)
        create_publication(dsn, name, [*tables, heartbeat])
        if current is not None:
            # the new tables' changes come from now on; the new views are empty until pulled
            # (the owning process's scheduler pulls a continuous view never populated)
            yield lambda con: _set_relations(con, relations)
            return
        try:
            with create_slot(dsn, name) as start:

                def record(con: duckdb.DuckDBPyConnection) -> None:
                    con.execute("DELETE FROM mtcache.stream_pulls")
                    con.execute(
                        "INSERT INTO mtcache.stream VALUES (?, ?, ?, NULL, now(), ?, NULL)",
                        [name, name, start.consistent_lsn, json.dumps(relations)],
                    )

                yield record
        except BaseException:
            with contextlib.suppress(psycopg.Error, OperationalError):
                drop_slot(dsn, name)
                drop_publication(dsn, name)
            raise


def _signatures(
    dsn: str, tables: list[tuple[str, str]]
) -> tuple[dict[str, list[list[t.Any]]], tuple[str, str]]:
    """The tables' signatures as the stream will describe them, and the heartbeat table (made
    in the backend's default schema, wherever that is)."""
    with connect_backend(dsn, autocommit=True) as conn:
        ensure_table(conn)
        row = conn.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = to_regclass(%s)",
            (HEARTBEAT_TABLE,),
        ).fetchone()
        assert row is not None
        return _relation_signatures(conn, tables), (row[0], HEARTBEAT_TABLE)


def apply_ddl(
    store: CacheStore, dsn: str, statements: Sequence[Statement], catalog: Catalog
) -> DdlResult:
    """Cache DDL applied to the store with the publication in step (what `Admin.apply_ddl`
    does, for callers that hold a store and no administration session)."""
    with publication_for(store, dsn, statements, catalog) as record:
        return store.apply_ddl(statements, catalog, then=record)


def _forget_stream(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("DELETE FROM mtcache.stream")
    con.execute("DELETE FROM mtcache.stream_pulls")


def _set_relations(con: duckdb.DuckDBPyConnection, relations: dict[str, t.Any]) -> None:
    con.execute("UPDATE mtcache.stream SET relations = ?, problem = NULL", [json.dumps(relations)])


def _stream_tables(schema: CacheSchema, catalog: Catalog) -> list[tuple[str, str]]:
    found = set()
    for name in schema.continuous_views():
        view = schema.views[name]
        sources = (
            [(s.table, s.schema) for s in view.derivation.sources]
            if view.derivation is not None
            else [(view.table, None)]
        )
        for source, in_schema in sources:
            table = catalog.table(source, in_schema)
            if table is not None:  # (else dropped at the backend: its view is being dropped)
                found.add((table.schema, table.name))
    return sorted(found)


def _check_replica_identity(schema: CacheSchema, catalog: Catalog) -> None:
    """The stream identifies a row by its table's primary key (PostgreSQL's default replica
    identity); a table without one cannot even be updated once it is published."""
    for name in schema.continuous_views():
        view = schema.views[name]
        if view.is_derived:  # (its tables' keys, and whether the cache can keep it exact)
            maintenance(view, catalog)
            continue
        table = catalog.table(view.table)
        assert table is not None
        if not table.primary_key:
            raise NotSupportedError(
                f"cached view {name}: REFRESH CONTINUOUSLY needs a primary key on {view.table} "
                "(the replication stream identifies rows by it); add one, or use REFRESH EVERY"
            )
        if tuple(view.key) != tuple(table.primary_key):
            raise NotSupportedError(
                f"cached view {name}: REFRESH CONTINUOUSLY needs {view.table}'s primary key "
                f"({', '.join(table.primary_key)}) among the view's columns"
            )


def _relation_signatures(
    conn: psycopg.Connection[t.Any], tables: Iterable[tuple[str, str]]
) -> dict[str, list[list[t.Any]]]:
    """Each table's columns and type ids as the stream will describe them."""
    found = {}
    for schema, name in tables:
        rows = conn.execute(
            "SELECT attname, atttypid::int FROM pg_attribute WHERE attrelid = "
            "(quote_ident(%s) || '.' || quote_ident(%s))::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            (schema, name),
        ).fetchall()
        found[f"{schema}.{name}"] = [list(r) for r in rows]
    return found
