"""Eviction: remove control-key values; for presence keys, their rows and,
transitively, the rows of the children they presence-control (no child row outlives its parent
region). Needs no backend; one DuckDB transaction."""

from __future__ import annotations

import time
import typing as t

import duckdb

from cache.maintenance import faults
from cache.maintenance.key_values import keys_listed
from cache.maintenance.report import NAMED_KEYS, Report
from cache.store.cache_file import CacheStore
from control_tables.kinds import RegionKind, Role
from control_tables.regions import in_list
from control_tables.schema import CachedView, CacheSchema
from sql_ext.errors import ProgrammingError
from sql_ext.quoting import equal_columns, ident, idents

Key = tuple[t.Any, ...]


def evict(
    store: CacheStore,
    schema: CacheSchema,
    view: CachedView,
    role: Role,
    control: str,
    columns: tuple[str, ...],
    values: list[Key],
    enabled_faults: frozenset[str],
) -> Report:
    started = time.monotonic()
    report = Report(operation=f"evict {control}", engine="none")
    if role == RegionKind.PRESENCE:
        _refuse_breaking_completeness(store, view, control, values)
    with store.transaction() as con:
        remove_keys(con, schema, view, role, control, columns, values, report)
        faults.hit("before_commit", enabled_faults)
        store.changed()
    report.name_regions([f"{control}{v}" for v in values[:NAMED_KEYS]], len(values))
    report.seconds = time.monotonic() - started
    return report


def _refuse_breaking_completeness(
    store: CacheStore, view: CachedView, control: str, values: list[Key]
) -> None:
    """A complete region holds all of its rows or none (§3.2.3): evicting one presence key
    inside it would leave it incomplete."""
    spec = view.completeness
    if spec is None:
        return
    edge = next(p for p in view.presence if p.control == control)
    rows = in_list(edge.columns, values).sql("duckdb")
    sql = f"SELECT DISTINCT {idents(spec.columns, 'v')} FROM {ident(view.name)} v WHERE ({rows})"
    if spec.control is not None:
        match = equal_columns(spec.columns, "c", "v")
        sql += f" AND EXISTS (SELECT 1 FROM {ident(spec.control)} c WHERE {match})"
    inside = store.con.execute(sql).fetchall()
    if inside:
        where = ", ".join(str(tuple(r)) for r in inside)
        fix = (
            f"evict {where} from {spec.control} first"
            if spec.control is not None
            else f"the view is complete on ({', '.join(spec.columns)}) for every value"
        )
        raise ProgrammingError(
            f"cannot evict {values} from {control}: the rows lie in complete region(s) "
            f"{where} of {view.name}, which must hold all of their rows or none; {fix}"
        )


def remove_keys(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    view: CachedView,
    role: Role,
    control: str,
    columns: tuple[str, ...],
    values: list[Key],
    report: Report,
) -> list[str]:
    """Inside a transaction: the control keys gone and, for presence keys, the rows no region
    holds any more with their cascade (`drop_unheld_rows`); the views rows left. (Many keys
    are an Arrow table joined: DuckDB parsing a million-value IN list took 20 s and
    gigabytes.)"""
    with keys_listed(con, "c", columns, values) as listed:
        con.execute(f"DELETE FROM {ident(control)} c WHERE {listed}")
    return drop_unheld_rows(con, schema, view, report) if role == RegionKind.PRESENCE else []


def drop_unheld_rows(
    con: duckdb.DuckDBPyConnection, schema: CacheSchema, view: CachedView, report: Report
) -> list[str]:
    """Delete rows no presence region holds any more, then cascade to the children: the
    views rows left."""
    pending = [view.name]
    touched: list[str] = []
    while pending:
        name = pending.pop(0)
        held = [
            f"({idents(edge.columns)}) IN "
            f"(SELECT {idents(edge.control_columns)} FROM {ident(edge.control)})"
            for edge in schema.views[name].presence
        ]
        predicate = " OR ".join(held) if held else "TRUE"
        [(removed,)] = con.execute(f"DELETE FROM {ident(name)} WHERE NOT ({predicate})").fetchall()
        report.rows_deleted[name] = report.rows_deleted.get(name, 0) + removed
        if removed:
            touched.append(name)
            pending += [c for c in schema.children(name) if c not in pending]
    return touched
