"""The Maintenance Rule's second step (§3.4.1): apply one operation's pulled rows in one DuckDB
transaction - delete the rows of AC(U) and the rows whose keys reappear, insert the pulled rows,
admit new control keys and stamp every refreshed region with ``refreshed_at`` and
``snapshot_id``. A failure anywhere inside rolls the whole transaction back."""

from __future__ import annotations

import contextlib
import typing as t
from collections.abc import Collection, Iterable, Mapping

import duckdb
import pyarrow as pa

from cache.maintenance import faults
from cache.maintenance.budget import within_budget
from cache.maintenance.engines import Snapshot
from cache.maintenance.key_values import keys_listed
from cache.maintenance.pull import distinct_rows
from cache.maintenance.report import Report
from cache.store.cache_file import CacheStore
from control_tables.kinds import RegionKind
from control_tables.regions import Region, region_predicate
from control_tables.schema import CachedView, CacheSchema
from optimizer.derived.delta import copy_table
from sql_ext.quoting import ident, idents, keys_in

Key = tuple[t.Any, ...]


def apply_pull(
    store: CacheStore,
    schema: CacheSchema,
    omega: set[Region],
    staged: Mapping[str, pa.Table],
    admitted: Mapping[str, list[Key]],
    snapshot: Snapshot,
    engine: str,
    enabled_faults: frozenset[str],
    report: Report,
    age: t.Callable[[], float] = lambda: 0.0,
    then: t.Callable[[duckdb.DuckDBPyConnection, int], None] | None = None,
    strict_budget: bool = True,
    copies: Mapping[str, str] = {},
) -> None:
    """``age``: how old the snapshot is now, in seconds (recorded at the commit as the
    operation's delay d); ``then(con, snapshot_id)`` runs inside the transaction, before the
    size budget is kept (`within_budget`; ``strict_budget``: refuse, rather than land over
    it, when evicting cannot make room); ``copies``: see `apply_rows`."""
    with store.transaction() as con:
        snapshot_id = begin_apply(con, snapshot, engine)
        changed = apply_rows(
            con,
            schema,
            omega,
            staged,
            admitted,
            [snapshot.backend_time, snapshot_id],
            report,
            copies,
        )
        end_apply(
            store,
            schema,
            snapshot_id,
            changed,
            enabled_faults,
            report,
            admitted,
            age,
            then,
            strict_budget,
        )
    report.snapshot_id = snapshot_id
    report.backend_time = snapshot.backend_time


def begin_apply(con: duckdb.DuckDBPyConnection, snapshot: Snapshot, engine: str) -> int:
    """Inside the apply transaction: the operation's snapshot recorded; its id."""
    [(snapshot_id,)] = con.execute(
        "SELECT coalesce(max(snapshot_id), 0) + 1 FROM mtcache.snapshots"
    ).fetchall()
    con.execute(
        "INSERT INTO mtcache.snapshots (snapshot_id, backend_time, pg_snapshot, engine, "
        "applied_at) VALUES (?, ?, ?, ?, now())",
        [snapshot_id, snapshot.backend_time, snapshot.pg_snapshot, engine],
    )
    return int(snapshot_id)


def apply_rows(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    omega: set[Region],
    staged: Mapping[str, pa.Table],
    admitted: Mapping[str, list[Key]],
    stamp: list[t.Any],
    report: Report,
    copies: Mapping[str, str] = {},
) -> list[str]:
    """Inside the apply transaction: the Maintenance Rule for one pull (``stamp``: its
    backend time and snapshot id); the views whose rows it changed. Several pulls of one
    snapshot may be applied one after the other (an admission in pieces). ``copies``: the
    copies of tables the pull brings (`Pull.copies`), each stamped in its view state (the
    stream keeps it from then on), those held by a base view too (the view's rows are the
    copy's)."""
    for control, values in admitted.items():
        _insert_control_rows(
            con, control, schema.control_tables[control].column_names, values, stamp
        )
    changed = []
    for name in schema.topological_order():
        view = schema.views[name]
        regions = {r for r in omega if r.view == name}
        rows = staged.get(name)
        if not regions and rows is None:
            continue
        changed.append(name)
        deleted = _delete_rows(con, view, regions, rows)
        report.rows_deleted[name] = report.rows_deleted.get(name, 0) + deleted
        report.rows_inserted.setdefault(name, 0)
        if rows is not None and rows.num_rows:
            con.register("mtcache_staged", rows)
            columns = idents(rows.column_names)  # (a derived view's: what it stores)
            con.execute(
                f"INSERT INTO {ident(name)} ({columns}) SELECT {columns} FROM mtcache_staged"
            )
            con.unregister("mtcache_staged")
            report.rows_inserted[name] += rows.num_rows
        _stamp_regions(con, schema, view, regions, rows, stamp)
        if view.view_level and Region(name, RegionKind.VIEW) in regions:
            con.execute(
                "INSERT OR REPLACE INTO mtcache.view_state VALUES (?, ?, ?)", [name, *stamp]
            )
    for name, rows in staged.items():  # the copies of tables continuously maintained
        if copy_table(name) is None:  # derived views read, pulled whole
            continue
        con.execute(f"DELETE FROM {ident(name)}")
        con.register("mtcache_staged", rows)
        con.execute(
            f"INSERT INTO {ident(name)} ({idents(rows.column_names)}) SELECT * FROM mtcache_staged"
        )
        con.unregister("mtcache_staged")
        # (its view state says when: the stream keeps it from then on)
        con.execute("INSERT OR REPLACE INTO mtcache.view_state VALUES (?, ?, ?)", [name, *stamp])
    for name, held in copies.items():
        if held != name:  # (a base view holds it: pulled whole above, with its readers)
            con.execute(
                "INSERT OR REPLACE INTO mtcache.view_state VALUES (?, ?, ?)", [name, *stamp]
            )
    return changed


def end_apply(
    store: CacheStore,
    schema: CacheSchema,
    snapshot_id: int,
    changed: Iterable[str],
    enabled_faults: frozenset[str],
    report: Report,
    admitted: Mapping[str, Collection[Key]],
    age: t.Callable[[], float] = lambda: 0.0,
    then: t.Callable[[duckdb.DuckDBPyConnection, int], None] | None = None,
    strict_budget: bool = True,
) -> None:
    """Inside the apply transaction, last: the snapshot's views and delay, the change
    counted, ``then``, and the size budget kept (`apply_pull`'s)."""
    con = store.con
    changed = list(dict.fromkeys(changed))  # (in the order applied; pieces repeat views)
    faults.hit("before_commit", enabled_faults)
    con.execute(
        "UPDATE mtcache.snapshots SET views = ?, delay_seconds = ?, engine_reason = ? "
        "WHERE snapshot_id = ?",
        [changed, age(), report.engine_reason, snapshot_id],
    )
    store.changed(changed)
    if then is not None:
        then(con, snapshot_id)
    within_budget(store, schema, report, admitted, strict_budget)


def _insert_control_rows(
    con: duckdb.DuckDBPyConnection,
    control: str,
    columns: tuple[str, ...],
    keys: Iterable[Key],
    stamp: list[t.Any],
) -> None:
    """Admit the keys (those listed already stay as they are) in one statement: rows moved
    through Arrow, or - values Arrow cannot type - bound row by row."""
    rows = list(dict.fromkeys(keys))
    if not rows:
        return
    target = f"INSERT INTO {ident(control)} ({idents(columns)}, refreshed_at, snapshot_id)"
    try:
        staged = pa.table({f"k{i}": [r[i] for r in rows] for i in range(len(columns))})
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        marks = ", ".join("?" for _ in columns)
        con.executemany(
            f"{target} VALUES ({marks}, ?, ?) ON CONFLICT DO NOTHING", [[*r, *stamp] for r in rows]
        )
        return
    con.register("mtcache_admitted", staged)
    try:
        names = ", ".join(f"k{i}" for i in range(len(columns)))
        con.execute(
            f"{target} SELECT {names}, ?, ? FROM mtcache_admitted ON CONFLICT DO NOTHING", stamp
        )
    finally:
        con.unregister("mtcache_admitted")


def _delete_rows(
    con: duckdb.DuckDBPyConnection, view: CachedView, regions: set[Region], rows: pa.Table | None
) -> int:
    """Delete the rows of the regions and the rows whose keys the pull brings again."""
    deleted = 0
    if regions:
        columns = {r.columns for r in regions}
        listed: t.ContextManager[str]
        if len(columns) == 1 and all(r.kind == RegionKind.PRESENCE for r in regions):
            listed = keys_listed(con, "v", next(iter(columns)), [r.values for r in regions])
        else:
            listed = contextlib.nullcontext(region_predicate(regions).sql("duckdb"))
        with listed as predicate:
            row = con.execute(f"DELETE FROM {ident(view.name)} v WHERE {predicate}").fetchone()
        deleted += int(row[0]) if row else 0
    if rows is not None and rows.num_rows and view.key:
        con.register("mtcache_keys", rows.select(list(view.key)))
        row = con.execute(
            f"DELETE FROM {ident(view.name)} v WHERE {keys_in(view.key, 'v', 'mtcache_keys')}"
        ).fetchone()
        con.unregister("mtcache_keys")
        deleted += int(row[0]) if row else 0
    return deleted


def _stamp_regions(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    view: CachedView,
    regions: set[Region],
    rows: pa.Table | None,
    stamp: list[t.Any],
) -> None:
    """Set refreshed_at and snapshot_id on the control rows of refreshed regions, and admit the
    presence keys that arrived with a completeness pull."""
    stamped: dict[tuple[str, tuple[str, ...]], list[Key]] = {}
    for region in regions:
        if region.control is None or region.control not in schema.control_tables:
            continue
        stamped.setdefault((region.control, _control_columns(view, region)), []).append(
            region.values
        )
    for (control, columns), values in stamped.items():  # one statement per control key
        with keys_listed(con, "c", columns, values) as listed:
            con.execute(
                f"UPDATE {ident(control)} c SET refreshed_at = ?, snapshot_id = ? WHERE {listed}",
                stamp,
            )
    if rows is None or rows.num_rows == 0:
        return
    for edge in view.presence:
        if edge.control in schema.control_tables:
            _insert_control_rows(
                con, edge.control, edge.control_columns, distinct_rows(rows, edge.columns), stamp
            )


def _control_columns(view: CachedView, region: Region) -> tuple[str, ...]:
    if region.kind == RegionKind.PRESENCE:
        edge = next(
            p for p in view.presence if p.control == region.control and p.columns == region.columns
        )
        return edge.control_columns
    return region.columns
