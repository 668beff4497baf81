"""A continuously maintained derived view's part of a batch (`apply_derived`): its tables'
changes applied to its auxiliary copies, and the view's delta, computed from them as
`optimizer.derived_delta` says, merged into its stored states - all inside the batch's DuckDB
transaction, with the stream position."""

from __future__ import annotations

from collections.abc import Mapping

import duckdb

from cache.maintenance.stream.position import Applied
from cache.maintenance.stream.staging import Staged
from cache.maintenance.stream.views import apply_view, delete_where
from control_tables.schema import CachedView, CacheSchema
from optimizer.derived_delta import CURRENT, REDO, WEIGHT, Maintenance, maintenance
from optimizer.derived_states import ROWS
from sql_ext.catalog import Catalog
from sql_ext.quoting import equal_columns, ident, idents

_PLANS: dict[tuple[str, int], Maintenance] = {}  # (view's DDL, catalog) -> its maintenance


def plan_of(view: CachedView, catalog: Catalog) -> Maintenance:
    """The view's maintenance, made once per catalog the stream applies with."""
    key = (view.statement, id(catalog))
    found = _PLANS.get(key)
    if found is None:
        if len(_PLANS) > 64:
            _PLANS.clear()
        found = _PLANS[key] = maintenance(view, catalog)
    return found


def apply_derived(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    plan: Maintenance,
    staged: Mapping[str, Staged],
    truncated: set[str],
    applied: Applied,
) -> None:
    """Carry the batch's changes (``staged`` by table; ``truncated`` tables) into the view."""
    changing = [a for a in plan.auxiliaries
                if a.table in truncated or staged[a.table].count]  # fmt: skip
    if not changing:
        return
    if any(a.table in truncated for a in changing):
        for aux in changing:
            _apply_copy(con, schema, aux.copy, staged[aux.table], aux.table in truncated)
        _recompute(con, plan)
        applied.views.add(plan.view.name)
        return
    con.execute(f"CREATE OR REPLACE TEMP TABLE mtcache_items AS "
                f"{plan.items_sql({}, None)} LIMIT 0")  # fmt: skip
    try:
        for aux in changing:
            stage = staged[aux.table]
            stage.register(con)
            copy = aux.copy
            columns = idents(copy.columns)
            touched = (f"EXISTS (SELECT 1 FROM {stage.del_name} d WHERE "
                       f"{equal_columns(copy.key, 'c', 'd')})")  # fmt: skip
            con.execute(f"CREATE OR REPLACE TEMP TABLE mtcache_change AS SELECT {columns}, -1 "
                        f"AS {WEIGHT} FROM {ident(copy.name)} c WHERE {touched}")  # fmt: skip
            _apply_copy(con, schema, copy, stage, False)
            con.execute(f"INSERT INTO mtcache_change SELECT {columns}, 1 FROM "
                        f"{ident(copy.name)} c WHERE {touched}")  # fmt: skip
            # (a row the batch left as the view sees it cancels out)
            con.execute(f"CREATE OR REPLACE TEMP TABLE mtcache_delta AS SELECT {columns}, "
                        f"sum({WEIGHT})::INTEGER AS {WEIGHT} FROM mtcache_change GROUP BY "
                        f"{columns} HAVING sum({WEIGHT}) <> 0")  # fmt: skip
            con.execute(f"INSERT INTO mtcache_items "
                        f"{plan.items_sql({aux.alias: 'mtcache_delta'}, aux.alias)}")
        if plan.grouped:
            _merge_groups(con, plan)
        else:
            _merge_rows(con, plan)
    finally:
        for table in ("mtcache_items", "mtcache_change", "mtcache_delta", "mtcache_states",
                      "mtcache_next", "mtcache_redo_groups"):  # fmt: skip
            con.execute(f"DROP TABLE IF EXISTS {table}")
    applied.views.add(plan.view.name)


def _apply_copy(con: duckdb.DuckDBPyConnection, schema: CacheSchema, copy: CachedView,
                stage: Staged, truncated: bool) -> None:  # fmt: skip
    """The batch's changes to one auxiliary copy (as to a base view of its table)."""
    if truncated:
        delete_where(con, schema, copy, "true", Applied())
    if stage.count:
        apply_view(con, schema, copy, stage, [], Applied())


def _merge_groups(con: duckdb.DuckDBPyConnection, plan: Maintenance) -> None:
    """The items' states merged with the view's of the groups they touch; a group that lost
    a minimum's or maximum's value computed again from the copies."""
    name = ident(plan.view.name)
    stored = idents(plan.stored_names)
    con.execute(f"CREATE TEMP TABLE mtcache_states AS "
                f"{plan.states_sql('SELECT * FROM mtcache_items')}")  # fmt: skip
    current = (f"SELECT {stored}, true AS {CURRENT} FROM {name} v WHERE EXISTS (SELECT 1 "
               f"FROM mtcache_states d WHERE {plan.same_group('v', 'd')})")  # fmt: skip
    both = f"{current} UNION ALL BY NAME SELECT *, false AS {CURRENT} FROM mtcache_states"
    con.execute(f"CREATE TEMP TABLE mtcache_next AS {plan.merged_sql(both)}")
    redo = con.execute(f"SELECT count(*) FROM mtcache_next WHERE {REDO}").fetchone()
    if redo and redo[0]:
        if plan.group:
            groups = idents(plan.group)
            con.execute(f"CREATE TEMP TABLE mtcache_redo_groups AS SELECT {groups} FROM "
                        f"mtcache_next WHERE {REDO}")  # fmt: skip
            items = (f"SELECT * FROM ({plan.items_sql({}, None)}) x WHERE EXISTS (SELECT 1 "
                     f"FROM mtcache_redo_groups r WHERE {plan.same_group('x', 'r')})")
        else:
            items = plan.items_sql({}, None)
        con.execute(f"DELETE FROM mtcache_next WHERE {REDO}")
        con.execute(f"INSERT INTO mtcache_next BY NAME {plan.states_sql(items, True)}")
    # every group the items touch leaves (one computed again may have no rows left)
    con.execute(f"DELETE FROM {name} v WHERE EXISTS (SELECT 1 FROM mtcache_states d WHERE "
                f"{plan.same_group('v', 'd')})")  # fmt: skip
    kept = f" WHERE {ROWS} > 0" if plan.group else ""  # (one group of all rows: always there)
    con.execute(f"INSERT INTO {name} ({stored}) SELECT {stored} FROM mtcache_next{kept}")


def _merge_rows(con: duckdb.DuckDBPyConnection, plan: Maintenance) -> None:
    """A join view's rows of weight -1 leave by its key, those of weight +1 arrive."""
    name = ident(plan.view.name)
    columns = idents(plan.stored_names)
    con.execute(f"CREATE TEMP TABLE mtcache_next AS SELECT {columns}, sum({WEIGHT}) AS "
                f"{WEIGHT} FROM mtcache_items GROUP BY {columns} HAVING sum({WEIGHT}) <> 0")
    con.execute(f"DELETE FROM {name} v WHERE EXISTS (SELECT 1 FROM mtcache_next n WHERE "
                f"n.{WEIGHT} < 0 AND {equal_columns(plan.group, 'v', 'n')})")  # fmt: skip
    con.execute(f"INSERT INTO {name} ({columns}) SELECT {columns} FROM mtcache_next "
                f"WHERE {WEIGHT} > 0")  # fmt: skip


def _recompute(con: duckdb.DuckDBPyConnection, plan: Maintenance) -> None:
    """The view computed again from its copies (after a TRUNCATE of a table it reads)."""
    name = ident(plan.view.name)
    columns = idents(plan.stored_names)
    con.execute(f"DELETE FROM {name}")
    items = plan.items_sql({}, None)
    if plan.grouped:
        kept = f" WHERE {ROWS} > 0" if plan.group else ""
        con.execute(f"INSERT INTO {name} ({columns}) SELECT {columns} FROM "
                    f"({plan.states_sql(items, True)}) s{kept}")  # fmt: skip
    else:
        con.execute(f"INSERT INTO {name} ({columns}) SELECT {columns} FROM ({items}) i")


__all__ = ["apply_derived", "plan_of"]
