"""Read the cache's region state (`control_tables.regions.RegionState`) from the cache file, so
a guard costs dictionary lookups, not queries: the control tables' rows, the view-level
regions, and the control-key values present in views that presence-control other views.
Read again whenever the file has changed (every admission, eviction, refresh or DDL bumps the
store's version).
"""

from __future__ import annotations

import datetime as dt

import duckdb

from cache.store.cache_file import CacheStore
from control_tables.regions import Key, RegionState, Stamp
from control_tables.schema import CacheSchema, ControlTable
from sql_ext.quoting import ident, idents


def control_regions(
    con: duckdb.DuckDBPyConnection, name: str, control: ControlTable
) -> dict[Key, Stamp]:
    """A control table's regions: each key's stamp, as the guards look them up."""
    return {
        tuple(row[:-2]): (_utc(row[-2]), row[-1])
        for row in con.execute(
            f"SELECT {idents(control.column_names)}, refreshed_at, snapshot_id FROM {ident(name)}"
        ).fetchall()
    }


def read_region_state(store: CacheStore) -> RegionState:
    version = store.version  # read first: a change committed meanwhile makes it stale, not wrong
    schema = store.load_schema()
    con = store.con
    controls = {name: control_regions(con, name, c) for name, c in schema.control_tables.items()}
    views: dict[str, Stamp] = {
        view: (_utc(refreshed_at), snapshot_id)
        for view, refreshed_at, snapshot_id in con.execute(
            "SELECT view, refreshed_at, snapshot_id FROM mtcache.view_state"
        ).fetchall()
    }
    parents: dict[tuple[str, tuple[str, ...]], dict[Key, Stamp]] = {}
    for name in schema.topological_order():
        for _child, edge in schema.edges_from(name):
            parents[(name, edge.control_columns)] = _parent_keys(
                store, schema, name, edge.control_columns, controls, views, parents
            )
    return RegionState(controls=controls, views=views, parents=parents, version=version)


def _parent_keys(
    store: CacheStore,
    schema: CacheSchema,
    view: str,
    columns: tuple[str, ...],
    controls: dict[str, dict[Key, Stamp]],
    views: dict[str, Stamp],
    parents: dict[tuple[str, tuple[str, ...]], dict[Key, Stamp]],
) -> dict[Key, Stamp]:
    """Each control-key value present in the parent view, with the stamp of the parent
    region holding that row (its presence region, or the view-level one)."""
    parent = schema.views[view]
    found: dict[Key, Stamp] = {}
    if parent.view_level:
        stamp = views.get(view, (None, None))
        for row in store.con.execute(
            f"SELECT DISTINCT {idents(columns)} FROM {ident(view)}"
        ).fetchall():
            found[tuple(row)] = stamp
        return found
    edge = parent.presence[0]
    lookup = controls.get(edge.control)
    if lookup is None:
        lookup = parents.get((edge.control, edge.control_columns), {})
    for row in store.con.execute(
        f"SELECT {idents(columns)}, {idents(edge.columns)} FROM {ident(view)}"
    ).fetchall():
        value, parent_key = tuple(row[: len(columns)]), tuple(row[len(columns) :])
        stamp = lookup.get(parent_key, (None, None))
        previous = found.get(value)
        # Two parent rows with one control value (not a key of the parent): keep the older.
        if previous is None or _older(stamp, previous):
            found[value] = stamp
    return found


def _utc(moment: dt.datetime | None) -> dt.datetime | None:
    """DuckDB hands out pytz-aware times; one plain UTC tzinfo keeps the guards' arithmetic
    on the fast path."""
    return moment.astimezone(dt.UTC) if moment is not None else None


def _older(a: Stamp, b: Stamp) -> bool:
    if a[0] is None:
        return True
    return b[0] is not None and a[0] < b[0]
