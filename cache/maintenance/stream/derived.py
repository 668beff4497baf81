"""A continuously maintained derived view's part of a batch (`apply_derived`): its tables'
changes applied to its auxiliary copies, and the view's delta, computed from them as
`optimizer.derived.delta` says, merged into its stored states - all inside the batch's DuckDB
transaction, with the stream position."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from cache.maintenance.stream.position import Applied, NeedsPull
from cache.maintenance.stream.staging import FLAG, Staged
from cache.maintenance.stream.views import apply_view, delete_where, not_pending
from control_tables.kinds import RegionKind
from control_tables.regions import Region
from control_tables.schema import CachedView, CacheSchema
from optimizer.derived.delta import (
    CURRENT,
    REDO,
    WEIGHT,
    Maintenance,
    copies,
    maintenance,
    tables_read,
)
from optimizer.derived.states import ROWS
from sql_ext.catalog import Catalog
from sql_ext.quoting import equal_columns, ident, idents, keys_in

# view's DDL -> the catalog it was made with and its maintenance
_PLANS: dict[str, tuple[Catalog, Maintenance]] = {}


def plan_of(view: CachedView, catalog: Catalog) -> Maintenance:
    """The view's maintenance, made again only when the stream applies with another catalog
    (the consumer keeps one until DDL or a reflect saves a new one)."""
    found = _PLANS.get(view.statement)
    if found is None or found[0] is not catalog:
        if len(_PLANS) > 64:
            _PLANS.clear()
        found = _PLANS[view.statement] = (catalog, maintenance(view, catalog))
    return found[1]


_COPIES: dict[tuple[str, ...], tuple[Catalog, dict[str, CachedView]]] = {}


def copies_of(views: Sequence[CachedView], catalog: Catalog) -> dict[str, CachedView]:
    """The copies of the tables the continuously maintained derived ``views`` read
    (`optimizer.derived.delta.copies`), made again only for other views or another catalog."""
    statements = tuple(sorted(v.statement for v in views if v.is_derived))
    found = _COPIES.get(statements)
    if found is None or found[0] is not catalog:
        if len(_COPIES) > 16:
            _COPIES.clear()
        found = _COPIES[statements] = (catalog, copies(views, catalog))
    return found[1]


def apply_derived(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    plans: Sequence[Maintenance],
    copies: Mapping[str, CachedView],
    staged: Mapping[str, Staged],
    truncated: set[str],
    skip: Mapping[str, list[str]],
    applied: Applied,
) -> None:
    """Carry the batch's changes (``staged`` by table; ``truncated`` tables) into the
    tables' ``copies`` (those the stream keeps now) and into the groups (rows) of each view
    ``plans`` keep that are present and not held by a pending pull (``skip``: its regions'
    predicates, by view). The tables go in the order of their names: each one's copy changes,
    then each view reading it takes its Z-set joined with the other copies as they are then
    (see `optimizer.derived.delta`); the views' items are merged last. What passes between
    statements is fetched as Arrow and registered, not made a table (a DuckDB table costs
    more to make than a small batch costs to apply)."""
    readers = {
        table: [p for p in plans if any(a.table == table for a in p.auxiliaries)]
        for table in copies
    }
    # (a view reading a truncated table is computed again from the copies, at the end)
    redo = {p.view.name for table in truncated & copies.keys() for p in readers[table]}
    items: dict[str, list[pa.Table]] = {p.view.name: [] for p in plans}
    for table, copy in copies.items():
        stage = staged[table]
        started = time.perf_counter()
        if table in truncated:
            delete_where(con, schema, copy, "true", Applied())
        if not stage.count:
            continue
        if table in truncated:
            apply_view(con, schema, copy, stage, [], Applied())
            continue
        stage.register(con)
        columns = idents(copy.columns)
        # the copy's rows of the keys the batch touches leave (as they were: weight -1)
        before = con.sql(
            f"DELETE FROM {ident(copy.name)} c "
            f"WHERE {keys_in(copy.key, 'c', stage.del_name)} RETURNING {columns}"
        ).to_arrow_table()
        con.register("mtcache_before", before)
        try:
            after = _after(con, schema, copy, stage)
            con.execute(f"INSERT INTO {ident(copy.name)} ({columns}) {after}")
            _spent(applied, copy.name, started)
            changes = (
                f"SELECT {columns}, -1 AS {WEIGHT} FROM mtcache_before UNION ALL "
                f"SELECT {columns}, 1 FROM ({after}) a"
            )
            for plan in readers[table]:
                if plan.view.name in redo:
                    continue
                started = time.perf_counter()
                aux = next(a for a in plan.auxiliaries if a.table == table)
                if plan.adds:  # (states that add up: whatever cancels, cancels in the sums)
                    sql = plan.items_sql({aux.alias: f"({changes})"}, aux.alias)
                    kept = _kept(plan, skip.get(plan.view.name, []))
                    items[plan.view.name].append(
                        con.sql(f"SELECT * FROM ({sql}) i WHERE {kept}").to_arrow_table()
                    )
                else:  # (consolidated on what the view reads: a row it sees as it was cancels)
                    read = idents(aux.copy.columns)
                    delta = (
                        f"SELECT {read}, sum({WEIGHT})::INTEGER AS {WEIGHT} FROM ({changes}) z "
                        f"GROUP BY ALL HAVING sum({WEIGHT}) <> 0"
                    )
                    sql = plan.items_sql({aux.alias: f"({delta})"}, aux.alias)
                    items[plan.view.name].append(con.sql(sql).to_arrow_table())
                _spent(applied, plan.view.name, started)
        finally:
            con.unregister("mtcache_before")
    for plan in plans:
        name = plan.view.name
        started = time.perf_counter()
        kept = _kept(plan, skip.get(name, []))
        if name in redo:
            _recompute(con, plan, kept)
        elif not items[name]:
            continue
        elif plan.adds:
            _add(con, plan, pa.concat_tables(items[name], promote_options="default"))
        else:
            _merge(con, plan, pa.concat_tables(items[name], promote_options="default"), kept)
        applied.views.add(name)
        _spent(applied, name, started)


def _spent(applied: Applied, name: str, started: float) -> None:
    applied.spent[name] = applied.spent.get(name, 0.0) + time.perf_counter() - started


def _add(con: duckdb.DuckDBPyConnection, plan: Maintenance, items: pa.Table) -> None:
    """Weighted items (of groups the view keeps) added to a view whose states all add up:
    their states summed by Arrow (no statement to plan), added to the groups the view holds
    by one UPDATE; a group it lacks inserted, one left with no rows deleted (both rare)."""
    delta = _added_states(plan, items)
    if not delta.num_rows:
        return
    con.register("mtcache_delta", delta)
    try:
        changed = con.execute(plan.add_sql("mtcache_delta")).fetchall()
        width = len(plan.group)
        held = {tuple(row[:width]) for row in changed}
        groups = zip(*(delta.column(g).to_pylist() for g in plan.group), strict=True)
        new = [tuple(g) not in held for g in groups] if plan.group else [not changed]
        if any(new):
            columns = idents(plan.stored_names)
            con.register("mtcache_new", delta.filter(pa.array(new)))
            try:
                kept = f"{ROWS} > 0" if plan.group else "true"
                con.execute(
                    f"INSERT INTO {ident(plan.view.name)} ({columns}) SELECT {columns} "
                    f"FROM mtcache_new WHERE {kept}"
                )
            finally:
                con.unregister("mtcache_new")
        if plan.group and any(row[width] == 0 for row in changed):
            con.execute(f"DELETE FROM {ident(plan.view.name)} WHERE {ROWS} = 0")
    finally:
        con.unregister("mtcache_delta")


def _added_states(plan: Maintenance, items: pa.Table) -> pa.Table:
    """The states each group's weighted items add (`optimizer.derived.delta.Added`), summed
    by Arrow as SQL sums (NULL over no values; NULL groups one group)."""
    weight = items.column(WEIGHT)
    summed: dict[str, pa.ChunkedArray] = {g: items.column(g) for g in plan.group}
    for state in plan.added:
        if state.rule == "rows":
            summed[state.name] = pc.cast(weight, pa.int64())
            continue
        assert state.argument is not None
        value = items.column(state.argument)
        if state.rule == "values":
            summed[state.name] = pc.cast(pc.if_else(pc.is_valid(value), weight, 0), pa.int64())
        else:
            positive = pc.greater(weight, 0)
            summed[state.name] = pc.if_else(positive, value, pc.negate_checked(value))
    table = pa.table(summed)
    names = [s.name for s in plan.added]
    if plan.group:
        table = table.group_by(list(plan.group), use_threads=False).aggregate(
            [(n, "sum") for n in names]
        )
        table = table.rename_columns(
            [c.removesuffix("_sum") if c.endswith("_sum") else c for c in table.column_names]
        )
    else:
        table = pa.table({n: [pc.sum(table.column(n)).as_py()] for n in names})
    return table.select(plan.stored_names)


def _merge(con: duckdb.DuckDBPyConnection, plan: Maintenance, items: pa.Table, kept: str) -> None:
    """A view's items merged into what it stores (of what it keeps)."""
    registered: list[str] = []

    def register(name: str, rows: pa.Table) -> None:
        con.register(name, rows)
        registered.append(name)

    try:
        register("mtcache_items", items)
        if plan.grouped:
            _merge_groups(con, plan, register, kept)
        else:
            _merge_rows(con, plan, register, kept)
    finally:
        for name in registered:
            con.unregister(name)


def _after(
    con: duckdb.DuckDBPyConnection, schema: CacheSchema, copy: CachedView, stage: Staged
) -> str:
    """SQL: the copy's rows of the touched keys after the batch (its final rows; a TOASTed
    value an update did not send, from the row as it was)."""
    assert stage.puts is not None
    unchanged = [c for c in copy.columns if FLAG + c in stage.puts.column_names]
    if not unchanged:
        return f"SELECT {idents(copy.columns)} FROM {stage.put_name}"
    merged = ", ".join(
        f"CASE WHEN p.{ident(FLAG + c)} THEN b.{ident(c)} ELSE p.{ident(c)} END AS {ident(c)}"
        if c in unchanged
        else f"p.{ident(c)}"
        for c in copy.columns
    )
    source = f"{stage.put_name} p LEFT JOIN mtcache_before b ON {equal_columns(copy.key, 'p', 'b')}"
    lacking = " OR ".join(f"p.{ident(FLAG + c)}" for c in unchanged)
    missing = con.execute(
        f"SELECT count(*) FROM {source} WHERE ({lacking}) AND b.{ident(copy.key[0])} IS NULL"
    ).fetchone()
    if missing and missing[0]:  # (the copy lacks the row: it is pulled anew, its views too)
        raise NeedsPull(
            {
                Region(name, RegionKind.VIEW)
                for name in schema.continuous_views()
                if schema.views[name].is_derived
                and schema.views[name].view_level
                and copy.table in tables_read(schema.views[name])
            }
        )
    return f"SELECT {merged} FROM {source}"


Register = Callable[[str, pa.Table], None]


def _kept(plan: Maintenance, skip: list[str]) -> str:
    """SQL over the view's columns: a group (row) the view keeps - present (its presence
    key listed) and in no region a pending pull holds."""
    parts = [not_pending(skip)]
    for edge in plan.view.presence:
        keys = ", ".join(ident(c) for c in edge.columns)
        listed = ", ".join(ident(c) for c in edge.control_columns)
        parts.append(f"({keys}) IN (SELECT {listed} FROM {ident(edge.control)})")
    return " AND ".join(f"({p})" for p in parts)


def _merge_groups(
    con: duckdb.DuckDBPyConnection, plan: Maintenance, register: Register, kept_groups: str
) -> None:
    """The items' states merged with the view's of the groups they touch (those it keeps);
    a group that lost a minimum's or maximum's value computed again from the copies."""
    name = ident(plan.view.name)
    stored = idents(plan.stored_names)
    current = (
        f"SELECT {stored}, true AS {CURRENT} FROM {name} v SEMI JOIN mtcache_states d "
        f"ON {plan.same_group('v', 'd')}"
    )
    both = f"{current} UNION ALL BY NAME SELECT *, false AS {CURRENT} FROM mtcache_states"
    states = plan.states_sql(f"SELECT * FROM mtcache_items WHERE {kept_groups}")
    following = con.sql(
        f"WITH mtcache_states AS ({states}) {plan.merged_sql(both)}"
    ).to_arrow_table()
    register("mtcache_next", following)
    kept = f"{ROWS} > 0" if plan.group else "true"  # (one group of all rows: always there)
    arriving = f"SELECT {stored} FROM mtcache_next WHERE NOT {REDO} AND {kept}"
    if pc.any(following.column(REDO)).as_py():
        items = plan.items_sql({}, None)
        if plan.group:
            items = (
                f"SELECT x.* FROM ({items}) x SEMI JOIN (SELECT * FROM mtcache_next "
                f"WHERE {REDO}) r ON {plan.same_group('x', 'r')}"
            )
        arriving += (
            f" UNION ALL SELECT {stored} FROM ({plan.states_sql(items, True)}) s WHERE {kept}"
        )
    # every group the items touch leaves (one computed again may have no rows left)
    con.execute(f"DELETE FROM {name} v USING mtcache_next d WHERE {plan.same_group('v', 'd')}")
    con.execute(f"INSERT INTO {name} ({stored}) {arriving}")


def _merge_rows(
    con: duckdb.DuckDBPyConnection, plan: Maintenance, register: Register, kept_rows: str
) -> None:
    """A join view's rows of weight -1 leave by its key, those of weight +1 arrive (of those
    it keeps)."""
    name = ident(plan.view.name)
    columns = idents(plan.stored_names)
    register(
        "mtcache_next",
        con.sql(
            f"SELECT {columns}, sum({WEIGHT}) AS {WEIGHT} FROM mtcache_items WHERE {kept_rows} "
            f"GROUP BY {columns} HAVING sum({WEIGHT}) <> 0"
        ).to_arrow_table(),
    )
    con.execute(
        f"DELETE FROM {name} v WHERE {keys_in(plan.group, 'v', f'mtcache_next WHERE {WEIGHT} < 0')}"
    )
    con.execute(
        f"INSERT INTO {name} ({columns}) SELECT {columns} FROM mtcache_next WHERE {WEIGHT} > 0"
    )


def _recompute(con: duckdb.DuckDBPyConnection, plan: Maintenance, kept: str) -> None:
    """The groups (rows) the view keeps computed again from its copies (after a TRUNCATE of
    a table it reads)."""
    name = ident(plan.view.name)
    columns = idents(plan.stored_names)
    con.execute(f"DELETE FROM {name} WHERE {kept}")
    items = f"SELECT * FROM ({plan.items_sql({}, None)}) i WHERE {kept}"
    if plan.grouped:
        kept = f" WHERE {ROWS} > 0" if plan.group else ""
        con.execute(
            f"INSERT INTO {name} ({columns}) SELECT {columns} FROM "
            f"({plan.states_sql(items, True)}) s{kept}"
        )
    else:
        con.execute(f"INSERT INTO {name} ({columns}) SELECT {columns} FROM ({items}) i")


__all__ = ["apply_derived", "copies_of", "plan_of"]
