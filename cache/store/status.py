"""What is in the cache: views, their regions with currency, and the counters.

Currency is measured on the backend's clock: the local clock plus the offset the last
connection measured (heartbeat.clock), erring towards older; the local clock when no
connection has measured one yet.
"""

from __future__ import annotations

import datetime as dt
import math
import time
import typing as t
from collections.abc import Collection

from cache.store.bound_asks import BoundAsks
from cache.store.budget import copy_tables
from cache.store.cache_file import CacheStore
from cache.store.counters import as_document
from cache.store.refresh_times import (
    AutoRefresh,
    Objective,
    auto_refreshes,
    last_engines,
    measured_delays,
    objectives,
    refresh_times,
)
from control_tables.kinds import RegionKind
from control_tables.regions import guarantees
from control_tables.schema import CachedView, CacheSchema
from heartbeat.clock import BackendClock
from optimizer.derived.delta import copies as delta_copies
from optimizer.derived.delta import copy_table, tables_read
from sql_ext.errors import NotSupportedError, ProgrammingError
from sql_ext.quoting import ident

REGIONS_LISTED = 1000  # a view with more regions lists them only when asked (``detail``)


def status(
    store: CacheStore, now: dt.datetime | None = None, detail: Collection[str] = ()
) -> dict[str, t.Any]:
    """The status document (docs/json-outputs.md). Each view's regions are summed up; they
    are listed for a view with at most REGIONS_LISTED of them, or one named in ``detail``
    (a million regions' entries took seconds to make)."""
    clock = store.load_clock()
    if now is None:
        # the backend's clock as last measured by a connection; the local clock if
        # none has connected yet
        now = (clock or BackendClock.local()).now()
    schema = store.load_schema()
    unknown = sorted(set(detail) - set(schema.views))
    if unknown:
        raise ProgrammingError(
            f"no cached view {', '.join(unknown)} (cached views: "
            f"{', '.join(sorted(schema.views)) or 'none'})"
        )
    delays = measured_delays(store)
    engines = last_engines(store)
    asks = store.load_asks()
    asks.fold(time.time())
    autos = auto_refreshes(store)
    goals = objectives(store, schema, now)
    held = set(copy_tables(store.con))
    # the DuckDB tables holding the copies a continuously maintained derived view reads (its
    # own, or a base view holding all of the table, `optimizer.derived.delta.copies`)
    stored: dict[str, str] = {}
    if any(v.is_derived and v.continuous for v in schema.views.values()):
        try:
            holders = delta_copies(schema.views.values(), store.load_catalog())
        except NotSupportedError:  # (the backend changed under a view: the copies in tables
            # of their own)
            holders = {}
        stored = {name_of: name for name in held if (name_of := copy_table(name))}
        stored |= {table: copy.name for table, copy in holders.items() if copy.name in schema.views}
    copies: dict[str, list[str]] = {}
    for name, cached in schema.views.items():
        if cached.is_derived and cached.continuous:
            copies[name] = sorted({stored[t] for t in tables_read(cached) if t in stored})
    sizes = stored_bytes(store, [*schema.views, *held])
    views = [
        _view_status(
            store,
            schema,
            schema.views[n],
            now,
            delays.get(n),
            sizes.get(n, 0),
            n in detail,
            engines.get(n, (None, None)),
            asks,
            autos.get(n),
            goals.get(n),
        )
        for n in schema.topological_order()
    ]
    for view in views:
        if view["name"] in copies:
            found = copies[view["name"]]
            counted = [
                store.con.execute(f"SELECT count(*) FROM {ident(c)}").fetchone() for c in found
            ]
            view["copies"] = {
                "rows": sum(int(c[0]) for c in counted if c),
                "bytes": sum(sizes.get(c, 0) for c in found),
                # (a base view's rows are the copy: counted here and as the view's)
                "views": [c for c in found if c in schema.views],
            }
    return {
        "cache": str(store.path),
        "clock": "backend" if clock is not None else "local",
        "backend_clock": clock.to_json() if clock is not None else None,
        "now": now.isoformat(),  # the moment currencies and refresh times are reckoned from
        "views": views,
        "control_tables": sorted(schema.control_tables),
        # each control table's key columns, in order (what admit and evict give values for)
        "control_keys": {
            name: list(schema.control_tables[name].column_names)
            for name in sorted(schema.control_tables)
        },
        "counters": as_document(store.counters()),
        # what the file's DuckDB may use and uses now
        "resources": store.resources(),
    }


def _view_status(
    store: CacheStore,
    schema: CacheSchema,
    view: CachedView,
    now: dt.datetime,
    delay: float | None,
    stored: int = 0,
    listed: bool = False,
    engine: tuple[str | None, str | None] = (None, None),
    asks: BoundAsks | None = None,
    auto: AutoRefresh | None = None,
    goal: Objective | None = None,
) -> dict[str, t.Any]:
    """A view's entry of the status document (``stored``: its bytes, `stored_bytes`; its
    regions listed if ``listed`` or few)."""
    con = store.con
    rows = con.execute(f"SELECT count(*) FROM {ident(view.name)}").fetchone()
    times = refresh_times(store, schema, view.name)
    stamps = times.stamps
    regions: list[dict[str, t.Any]] = []
    if view.view_level:
        state = con.execute(
            "SELECT refreshed_at, snapshot_id FROM mtcache.view_state WHERE view = ?", [view.name]
        ).fetchone()
        regions.append(
            _region(
                None,
                RegionKind.VIEW,
                [],
                state[0] if state else None,
                state[1] if state else None,
                int(rows[0]) if rows else 0,
                now,
            )
        )
    controls: list[tuple[RegionKind, str, tuple[str, ...], tuple[str, ...]]] = [
        (RegionKind.PRESENCE, p.control, p.columns, p.control_columns)
        for p in view.presence
        if p.control in schema.control_tables
    ]
    controls += [
        (kind, control, columns, columns)
        for kind, columns, control in guarantees(view)
        if control is not None and kind != RegionKind.VIEW
    ]
    count = len(regions) + sum(_count(con, control) for _, control, _, _ in controls)
    listed = listed or count <= REGIONS_LISTED
    for kind, control, columns, control_columns in controls if listed else []:
        # each region's rows counted in one statement (a statement per region took a minute
        # at 100,000 regions); a key is never NULL, so a row holding NULL is in no region
        keys = ", ".join(f"c.{ident(c)}" for c in control_columns)
        match = " AND ".join(
            f"v.{ident(v)} = c.{ident(c)}" for v, c in zip(columns, control_columns, strict=True)
        )
        for record in con.execute(
            f"SELECT {keys}, c.refreshed_at, c.snapshot_id, count(v.{ident(columns[0])}) "
            f"FROM {ident(control)} c LEFT JOIN {ident(view.name)} v ON {match} "
            f"GROUP BY ALL ORDER BY {keys}"
        ).fetchall():
            values = tuple(record[: len(control_columns)])
            regions.append(
                _region(control, kind, list(values), record[-3], record[-2], int(record[-1]), now)
            )
    due = times.due if times.due is None or times.due > now else now  # due at once: now
    return {
        "name": view.name,
        "table": view.table,
        "color": view.color,
        "consistency": "view" if view.view_level else "group",
        "root": schema.consistency_root(view.name),
        "parents": [p.control for p in view.presence],
        "refresh_seconds": view.refresh_seconds,
        "continuous": schema.continuous(view.name),  # kept current from the WAL
        # the newest region stamp; when the refresh scheduler refreshes the view next (None:
        # not scheduled - on demand, or waiting for admissions); a gray view follows its root
        "last_refresh": times.last.isoformat() if times.last else None,
        "next_refresh": due.isoformat() if due else None,
        "refresh_follows": times.follows,
        # d of §4.6, measured over its recent operations (None: none measured yet)
        "refresh_delay_seconds": round(delay, 6) if delay is not None else None,
        # the engine of its last refresh, and why (`auto` chooses by size)
        "last_engine": engine[0],
        "last_engine_reason": engine[1],
        "rows": int(rows[0]) if rows else 0,
        "bytes": stored,
        # its regions summed up: how many, how many never refreshed, the oldest one's age
        "region_count": count,
        "regions_never_refreshed": stamps.never,
        "oldest_region_seconds": (now - stamps.oldest).total_seconds()
        if stamps.oldest is not None
        else None,
        "regions": regions if listed else None,  # None: more than REGIONS_LISTED, not asked
        # REFRESH AUTO: the interval chosen from the bounds asked, the bounds it serves, why
        "refresh_auto": (_auto(view, auto, goal) if view.auto else None),
        # the bounds queries asked of it lately (`cache.store.bound_asks`), per hour
        "bounds_asked": _asked(asks, view.name) if asks is not None else [],
    }


def _bound(seconds: float) -> float | None:
    """A bound in a JSON document: None for any age."""
    return None if seconds == math.inf else seconds


def _auto(view: CachedView, auto: AutoRefresh | None, goal: Objective | None) -> dict[str, t.Any]:
    return {
        "interval_seconds": auto.interval if auto else None,
        "within_seconds": view.within_seconds,
        "bounds_served": [_bound(b) for b in auto.served] if auto else [],
        "reason": auto.reason if auto else "not chosen yet: the scheduler chooses at its next tick",
        "saves_per_hour": auto.saves if auto else 0.0,
        "chosen_at": auto.chosen_at.isoformat() if auto else None,
        # REFRESH AUTO WITHIN: the data's age, the age when the next refresh lands, the state
        "objective": goal.to_json() if goal is not None else None,
    }


def _asked(asks: BoundAsks, view: str) -> list[dict[str, t.Any]]:
    queries, saved = asks.rates(view, time.time())
    return [
        {
            "bound_seconds": _bound(bound),
            "queries_per_hour": round(queries[bound] * 3600, 3),
            "saves_per_hour": round(saved.get(bound, 0.0) * 3600, 3),
        }
        for bound in sorted(queries)
    ]


def _count(con: t.Any, table: str) -> int:
    row = con.execute(f"SELECT count(*) FROM {ident(table)}").fetchone()
    return int(row[0]) if row else 0


def stored_bytes(store: CacheStore, tables: list[str]) -> dict[str, int]:
    """The bytes each table's data takes in the cache file, by its checkpointed segments:
    a segment runs from its offset in its block to the next segment's there (of any table)
    or to the block's end (so a small table counts the rest of its last block: an upper
    bound); data not yet checkpointed (in the WAL) is not counted. Read again only after a
    change committed (`CacheStore.at_version`)."""
    found = store.at_version("stored bytes", lambda: _table_bytes(store))
    return {table: found.get(table, 0) for table in tables}


def _table_bytes(store: CacheStore) -> dict[str, int]:
    """`stored_bytes` of every table of the cache file."""
    con = store.con
    size = con.execute("SELECT block_size FROM pragma_database_size()").fetchone()
    block = int(size[0]) if size else 262144
    segments: list[tuple[int, int, str, int]] = []  # (block, offset, table, extra blocks)
    every = con.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() "
        "WHERE database_name = current_database()"
    ).fetchall()
    for schema, name in every:  # (every table's segments: where one ends, the next begins)
        table = name if schema == "main" else f"{schema}.{name}"
        for block_id, offset, extra in con.execute(
            "SELECT block_id, block_offset, additional_block_ids FROM "
            "pragma_storage_info(?) WHERE block_id >= 0",
            [f"{ident(schema)}.{ident(name)}"],
        ).fetchall():
            segments.append((int(block_id), int(offset), table, len(extra or ())))
    segments.sort()
    found: dict[str, int] = {}
    for i, (block_id, offset, table, extra) in enumerate(segments):
        following = segments[i + 1] if i + 1 < len(segments) else None
        end = following[1] if following is not None and following[0] == block_id else block
        found[table] = found.get(table, 0) + end - offset + extra * block
    return found


def _region(
    control: str | None,
    kind: RegionKind,
    key: list[t.Any],
    refreshed_at: dt.datetime | None,
    snapshot_id: int | None,
    rows: int,
    now: dt.datetime,
) -> dict[str, t.Any]:
    return {
        "control": control,
        "kind": kind.value,  # (the document holds plain text)
        "key": key,
        "refreshed_at": refreshed_at.isoformat() if refreshed_at else None,
        "currency_seconds": (now - refreshed_at).total_seconds() if refreshed_at else None,
        "snapshot_id": snapshot_id,
        "rows": rows,
    }
