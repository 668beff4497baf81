"""An in-memory index of the cache's regions, so a guard costs dictionary lookups, not queries.

Built from the control tables, the view-level state and the rows of views that
presence-control other views; rebuilt when the cache file changes (every admission, eviction,
refresh or DDL of this process bumps the store's version).
"""

from __future__ import annotations

import datetime as dt
import typing as t
from dataclasses import dataclass, field

from cache.store.cache_file import CacheStore
from control_tables.schema import CacheSchema
from optimizer.accesses import Access
from optimizer.match_views import Match, match_access

Stamp = tuple[dt.datetime | None, int | None]  # (refreshed_at, snapshot_id)
Key = tuple[t.Any, ...]


@dataclass
class RegionIndex:
    version: int
    schema: CacheSchema
    controls: dict[str, dict[Key, Stamp]] = field(default_factory=dict)
    views: dict[str, Stamp] = field(default_factory=dict)  # view-level regions
    # (parent view, its control columns) -> control-key value -> stamp of the parent's region
    parents: dict[tuple[str, tuple[str, ...]], dict[Key, Stamp]] = field(default_factory=dict)
    # view matches per table access, found once per index (the schema is fixed for its life)
    _matches: dict[int, tuple[Access, list[Match]]] = field(default_factory=dict, repr=False)

    def matches(self, access: Access) -> list[Match]:
        """The cached views that can answer the access (optimizer.match_views), memoized."""
        known = self._matches.get(id(access))
        if known is not None and known[0] is access:
            return known[1]
        found = match_access(access, self.schema)
        self._matches[id(access)] = (access, found)
        return found

    @classmethod
    def build(cls, store: CacheStore) -> RegionIndex:
        schema = store.load_schema()
        index = cls(version=store.version, schema=schema)
        con = store.con
        for name, control in schema.control_tables.items():
            columns = ", ".join(f'"{c}"' for c in control.column_names)
            index.controls[name] = {
                tuple(row[:-2]): (_utc(row[-2]), row[-1])
                for row in con.execute(
                    f'SELECT {columns}, refreshed_at, snapshot_id FROM "{name}"'
                ).fetchall()
            }
        for view, refreshed_at, snapshot_id in con.execute(
            "SELECT view, refreshed_at, snapshot_id FROM mtcache.view_state"
        ).fetchall():
            index.views[view] = (_utc(refreshed_at), snapshot_id)
        for name in schema.topological_order():
            for child, edge in schema.edges_from(name):
                del child
                index.parents[(name, edge.control_columns)] = index._parent_keys(
                    store, name, edge.control_columns
                )
        return index

    def _parent_keys(
        self, store: CacheStore, view: str, columns: tuple[str, ...]
    ) -> dict[Key, Stamp]:
        """Each control-key value present in the parent view, with the stamp of the parent
        region holding that row (its presence region, or the view-level one)."""
        parent = self.schema.views[view]
        select = ", ".join(f'"{c}"' for c in columns)
        found: dict[Key, Stamp] = {}
        if parent.view_level:
            stamp = self.views.get(view, (None, None))
            for row in store.con.execute(f'SELECT DISTINCT {select} FROM "{view}"').fetchall():
                found[tuple(row)] = stamp
            return found
        edge = parent.presence[0]
        lookup = (
            self.controls.get(edge.control, {})
            if edge.control in self.schema.control_tables
            else self.parents.get((edge.control, edge.control_columns), {})
        )
        keys = ", ".join(f'"{c}"' for c in edge.columns)
        for row in store.con.execute(f'SELECT {select}, {keys} FROM "{view}"').fetchall():
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
