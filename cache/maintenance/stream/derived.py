"""A continuously maintained derived view's part of a batch (`apply_derived`): its tables'
changes applied to its auxiliary copies, and the view's delta, computed from them as
`optimizer.derived.delta` says, merged into its stored states - all inside the batch's DuckDB
transaction, with the stream position."""

from __future__ import annotations

import decimal
import functools
import time
import typing as t
from collections.abc import Callable, Mapping, Sequence

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from cache.maintenance.stream.arrangements import Arrangement, Arrangements, indexable
from cache.maintenance.stream.position import Applied, NeedsPull, StreamProblem
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
    copy_name,
    maintenance,
    tables_read,
)
from optimizer.derived.states import ROWS
from sql_ext.catalog import Catalog
from sql_ext.quoting import equal_columns, folded, ident, idents, keys_in

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
    (`optimizer.derived.delta.copies`; a base view among ``views`` may hold one), made again
    only for other views or another catalog."""
    statements = tuple(sorted(v.statement for v in views))
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
    arrangements: Arrangements | None = None,
    stamps: Mapping[str, t.Any] | None = None,
    arranged_plans: Sequence[Maintenance] | None = None,
) -> None:
    """Carry the batch's changes (``staged`` by table; ``truncated`` tables) into the
    tables' ``copies`` (those the stream keeps now) and into the groups (rows) of each view
    ``plans`` keep that are present and not held by a pending pull (``skip``: its regions'
    predicates, by view). The tables go in the order of their names: each one's copy changes,
    then each view reading it takes its Z-set joined with the other copies as they are then
    (see `optimizer.derived.delta`); the views' items are merged last. What passes between
    statements is fetched as Arrow and registered, not made a table (a DuckDB table costs
    more to make than a small batch costs to apply). With ``arrangements`` (and the copies'
    ``stamps``: which pull each is of), a view joins a table's changes with the other tables'
    arrangements, in Arrow (`_arrow_items`); those of the tables ``arranged_plans`` (default
    ``plans``: also the views waiting for a pull, whose other copies the batch keeps) read."""
    plans = [p.held_in(copies) for p in plans]  # (a base view may hold a table's copy)
    readers = {
        table: [p for p in plans if any(a.table == table for a in p.auxiliaries)]
        for table in copies
    }
    arranging = _Arranging(
        con, arrangements, plans if arranged_plans is None else arranged_plans, copies, stamps or {}
    )
    # (a view reading a truncated table is computed again from the copies, at the end)
    redo = {p.view.name for table in truncated & copies.keys() for p in readers[table]}
    items: dict[str, list[pa.Table]] = {p.view.name: [] for p in plans}
    # (the columns views read of a table a base view holds: its Arrow Z-set's; an unread
    # TOASTed value the batch did not send leaves that Z-set to Arrow)
    reads: dict[str, list[str]] = {}
    for plan in [*plans, *(arranged_plans or ())]:
        for aux in plan.auxiliaries:
            if aux.table in copies and copies[aux.table].name in schema.views:
                wanted = reads.setdefault(aux.table, list(copies[aux.table].key))
                wanted += [c for c in aux.copy.columns if c not in wanted]
    for table, copy in copies.items():
        stage = staged[table]
        started = time.perf_counter()
        # (a base view that is the copy counts its changes as the view's; a copy's count not)
        counted = applied if copy.name in schema.views else Applied()
        if table in truncated:
            delete_where(con, schema, copy, "true", counted)
            arranging.forget(table)
        if not stage.count:
            continue
        if table in truncated:
            apply_view(con, schema, copy, stage, [], counted)
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
            [inserted] = con.execute(
                f"INSERT INTO {ident(copy.name)} ({columns}) {after}"
            ).fetchall()
            if before.num_rows or inserted[0]:
                counted.views.add(copy.name)
            changes = (
                f"SELECT {columns}, -1 AS {WEIGHT} FROM mtcache_before UNION ALL "
                f"SELECT {columns}, 1 FROM ({after}) a"
            )
            arrow_changes = _arrow_changes(before, stage, reads.get(table, copy.columns))
            arranging.change(table, before, arrow_changes, after)
            _spent(applied, copy.name, started)
            for plan in readers[table]:
                if plan.view.name in redo:
                    continue
                started = time.perf_counter()
                aux = next(a for a in plan.auxiliaries if a.table == table)
                if plan.adds:  # (states that add up: whatever cancels, cancels in the sums)
                    found = None
                    if arrow_changes is not None and not skip.get(plan.view.name):
                        found = (
                            None
                            if plan.view.presence
                            else _arrow_items(con, plan, aux.alias, arrow_changes, arranging.get)
                        )
                    if found is None:
                        sql = plan.items_sql({aux.alias: f"({changes})"}, aux.alias)
                        kept = _kept(plan, skip.get(plan.view.name, []))
                        found = con.sql(f"SELECT * FROM ({sql}) i WHERE {kept}").to_arrow_table()
                    items[plan.view.name].append(found)
                else:  # (consolidated on what the view reads: a row it sees as it was cancels)
                    found = None
                    if arrow_changes is not None:
                        consolidated = _consolidated(arrow_changes, aux.copy.columns)
                        if consolidated is not None:
                            found = _arrow_items(con, plan, aux.alias, consolidated, arranging.get)
                    if found is None:
                        read = idents(aux.copy.columns)
                        delta = (
                            f"SELECT {read}, sum({WEIGHT})::INTEGER AS {WEIGHT} "
                            f"FROM ({changes}) z GROUP BY ALL HAVING sum({WEIGHT}) <> 0"
                        )
                        sql = plan.items_sql({aux.alias: f"({delta})"}, aux.alias)
                        found = con.sql(sql).to_arrow_table()
                    items[plan.view.name].append(found)
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
            _add(con, plan, _together(items[name]))
        else:
            found = _together(items[name])
            _merge(con, plan, found, kept, functools.partial(arranging.recomputed, plan))
        applied.views.add(name)
        _spent(applied, name, started)


_ARROW_OPS: dict[type[exp.Expr], str] = {
    exp.Add: "add_checked",
    exp.Sub: "subtract_checked",
    exp.Mul: "multiply_checked",
}
_COMPARISONS: dict[type[exp.Expr], t.Callable[..., t.Any]] = {
    exp.EQ: pc.equal,
    exp.NEQ: pc.not_equal,
    exp.GT: pc.greater,
    exp.GTE: pc.greater_equal,
    exp.LT: pc.less,
    exp.LTE: pc.less_equal,
}
_CONSTANTS: dict[str, tuple[t.Any, ...]] = {}  # constants' DuckDB SQL -> their values


def _arrow_items(
    con: duckdb.DuckDBPyConnection,
    plan: Maintenance,
    alias: str,
    changes: pa.Table,
    arranged: Callable[[str], Arrangement | None],
) -> pa.Table | None:
    """The items of a view from one table's Z-set (``alias``'s rows with their weights),
    computed by Arrow as DuckDB computes them: joined along the view's joins with the other
    tables' arrangements (``arranged``, by table), under the view's WHERE (a column compared
    with constants, which DuckDB evaluates once), its items columns and numbers by +, - and *
    (exact in both); None where Arrow cannot (the caller asks DuckDB)."""
    if any(i.node is None for i in plan.items):
        return None
    try:
        rows = changes.rename_columns(
            [c if c == WEIGHT else f"{alias}.{c}" for c in changes.column_names]
        )
        rows = _filtered(con, plan, alias, rows)
        joined = {alias}
        tables = {a.alias: a.table for a in plan.auxiliaries}
        while rows is not None and len(joined) < len(tables):
            # (the next table along a join: its rows of each row's key, from its arrangement)
            pairs = [
                (f"{a}.{x}", b, y) if a in joined else (f"{b}.{y}", a, x)
                for a, x, b, y in plan.links
                if (a in joined) != (b in joined)
            ]
            if not pairs:
                return None  # (not joined along its joins)
            other = pairs[0][1]
            arrangement = arranged(tables[other])
            values = rows.column(pairs[0][0])
            if arrangement is None or not indexable(values.type):
                return None
            which, found = arrangement.probe(pairs[0][2], values)
            rows = rows.take(which)
            for name in found.column_names:
                rows = rows.append_column(f"{other}.{name}", found.column(name))
            for mine, alias_, theirs in pairs[1:]:
                if alias_ == other:  # (a second equality with the same table)
                    if not indexable(rows.column(mine).type):
                        return None  # (NaN equals NaN to DuckDB, to Arrow nothing)
                    rows = rows.filter(
                        pc.equal(rows.column(mine), rows.column(f"{other}.{theirs}"))
                    )
            joined.add(other)
            rows = _filtered(con, plan, other, rows)
        if rows is None:
            return None
        columns = {}
        for item in plan.items:
            value = _arrow_value(t.cast(exp.Expr, item.node), rows)
            if value is None:
                return None
            if isinstance(value, pa.Scalar):
                value = pa.array([value.as_py()] * rows.num_rows, value.type)
            if pa.types.is_decimal256(value.type):  # (DuckDB's widest: 38 digits)
                value = value.cast(pa.decimal128(38, value.type.scale))
            columns[item.name] = value
        columns[WEIGHT] = rows.column(WEIGHT)
        return pa.table(columns)
    except (pa.ArrowException, ValueError, OverflowError):
        # (what Arrow cannot compute exactly: an overflow, a precision past 38 digits, a cast
        # it refuses; DuckDB computes those items as before)
        return None


def _filtered(
    con: duckdb.DuckDBPyConnection, plan: Maintenance, alias: str, rows: pa.Table
) -> pa.Table | None:
    """The rows that the conjuncts of the view's WHERE on ``alias``'s columns keep (None: one
    Arrow cannot evaluate as DuckDB does)."""
    keep = None
    for condition in plan.conditions:
        if not isinstance(condition.this, exp.Column):
            return None
        if condition.this.table != alias:
            continue
        found = _arrow_condition(con, condition, rows)
        if found is None:
            return None
        keep = found if keep is None else pc.and_kleene(keep, found)
    return rows if keep is None else rows.filter(keep)


def _arrow_value(node: exp.Expr, rows: pa.Table) -> t.Any:
    """An item's values (a column, or numbers and columns by +, - and *), or None."""
    if isinstance(node, exp.Paren):
        return _arrow_value(node.this, rows)
    if isinstance(node, exp.Column):
        return rows.column(f"{node.table}.{folded(node)}")
    if isinstance(node, exp.Literal) and not node.is_string:
        text = node.this
        if not text.replace(".", "", 1).isdigit():
            return None  # (1e-3: DuckDB's DOUBLE)
        if text.isdigit():
            if int(text) >= 2**63:
                return None  # (DuckDB's HUGEINT)
            return pa.scalar(int(text), pa.int32() if int(text) < 2**31 else pa.int64())
        number = decimal.Decimal(text)
        exponent = number.as_tuple().exponent
        scale = -exponent if isinstance(exponent, int) and exponent < 0 else 0
        return pa.scalar(number, pa.decimal128(max(len(text.replace(".", "")), scale + 1), scale))
    if isinstance(node, exp.Neg):
        inner = _arrow_value(node.this, rows)
        return None if inner is None else pc.negate_checked(inner)
    operation = _ARROW_OPS.get(type(node))
    if operation is None:
        return None
    left, right = _arrow_value(node.this, rows), _arrow_value(node.expression, rows)
    if left is None or right is None:
        return None
    operands = []
    for side in (left, right):
        kind = side.type
        if not (pa.types.is_integer(kind) or pa.types.is_decimal(kind)):
            return None  # (floating point: refused at DDL time; anything else: DuckDB's rules)
        # (room for a product's digits, cut to DuckDB's 38 at the end)
        wide = pa.types.is_decimal128(kind)
        operands.append(side.cast(pa.decimal256(kind.precision, kind.scale)) if wide else side)
    return getattr(pc, operation)(*operands)


def _arrow_condition(con: duckdb.DuckDBPyConnection, condition: exp.Expr, rows: pa.Table) -> t.Any:
    """Which rows a conjunct of the view's WHERE keeps (a column compared with constants that
    DuckDB evaluates, once), or None."""
    column = condition.this
    if not isinstance(column, exp.Column):
        return None
    values = rows.column(f"{column.table}.{folded(column)}")
    if pa.types.is_floating(values.type):
        return None  # (NaN is above every number to DuckDB and PostgreSQL, to Arrow no number)
    others = [v for k, v in condition.args.items() if k != "this" and v is not None]
    flat = [x for v in others for x in (v if isinstance(v, list) else [v])]
    key = "SELECT " + ", ".join(f.sql(dialect="duckdb") for f in flat)
    found = _CONSTANTS.get(key)
    if found is None:
        if len(_CONSTANTS) > 256:
            _CONSTANTS.clear()
        [row] = con.execute(key).fetchall()  # (all: DuckDB leaves no result open then)
        found = _CONSTANTS[key] = tuple(row)
    if any(isinstance(v, float) for v in found):
        return None  # (a DOUBLE constant: DuckDB's comparison, not an exact one)
    constants = [pa.scalar(v) for v in found]
    if any(c.type != values.type for c in constants if c.is_valid):
        target = next(c.type for c in constants if c.is_valid)
        if pa.types.is_date(values.type) and pa.types.is_timestamp(target):
            values = values.cast(target)  # (a date moved by an interval is a timestamp)
        else:
            constants = [c.cast(values.type) for c in constants]
    if isinstance(condition, exp.In):
        if any(not c.is_valid for c in constants):
            return None  # (IN with a NULL: three-valued, DuckDB's)
        return pc.is_in(values, value_set=pa.array([c.as_py() for c in constants], values.type))
    if isinstance(condition, exp.Between):
        low, high = constants
        return pc.and_kleene(pc.greater_equal(values, low), pc.less_equal(values, high))
    compare = _COMPARISONS.get(type(condition))
    if compare is None or len(constants) != 1:
        return None
    return compare(values, constants[0])


class _Arranging:
    """The arrangements a batch probes and keeps (`cache.maintenance.stream.arrangements`):
    of each table a view whose states add up joins with others, the columns those views
    read of it, indexed by its key's first column and by the columns they join it on."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        arrangements: Arrangements | None,
        plans: Sequence[Maintenance],
        copies: Mapping[str, CachedView],
        stamps: Mapping[str, t.Any],
    ) -> None:
        self.con = con
        self.arrangements = arrangements
        wanted: dict[str, tuple[list[str], list[str]]] = {}
        for plan in plans if arrangements is not None else ():
            seed = _seed(plan)
            if len(plan.auxiliaries) < 2 and seed is None:
                continue
            for aux in plan.auxiliaries:
                if aux.table not in copies:
                    continue
                columns, indexed = wanted.setdefault(aux.table, ([], [aux.copy.key[0]]))
                columns += [c for c in aux.copy.columns if c not in columns]
                links = [(a, x) for a, x, _, _ in plan.links] + [
                    (b, y) for _, _, b, y in plan.links
                ]
                if seed is not None:
                    links.append(seed[:2])
                for alias, column in links:
                    if alias == aux.alias and column not in indexed:
                        indexed.append(column)
        self.specs = {
            table: (stamps.get(copy_name(table)), tuple(columns), tuple(indexed))
            for table, (columns, indexed) in wanted.items()
        }
        self.copies = copies
        if arrangements is not None:
            arrangements.keep_only(self.specs)

    def get(self, table: str) -> Arrangement | None:
        """The table's arrangement (made from its copy as it is now), or None."""
        spec = self.specs.get(table)
        if spec is None or self.arrangements is None:
            return None
        copy = self.copies[table]
        return self.arrangements.arranged(
            self.con, table, copy.name, copy.key, spec, spec[1], spec[2]
        )

    def change(self, table: str, before: pa.Table, changes: pa.Table | None, after: str) -> None:
        """The table's arrangement, if it has one, changed as its copy was: the ``before``
        rows leave, the rows ``after`` (SQL; in ``changes``, weighted +1) arrive."""
        if self.arrangements is None:
            return
        spec = self.specs.get(table)
        if spec is None:  # (no view of this batch probes it: not kept, so forgotten)
            self.arrangements.forget(table)
            return
        found = self.arrangements.kept(table, spec)
        if found is None:
            return
        if changes is not None:
            arriving = changes.filter(pc.greater(changes.column(WEIGHT), 0)).drop_columns(WEIGHT)
        else:
            arriving = self.con.sql(after).to_arrow_table()
        self.arrangements.touched = True
        if not found.remove(before.select(list(found.key))):
            self.arrangements.forget(table)  # (not the copy: made again when next probed)
            return
        if not found.takes(arriving):  # (a text too long to index: joined by DuckDB)
            self.arrangements.forget(table, refuse=True)
            return
        found.add(arriving)

    def forget(self, table: str) -> None:
        if self.arrangements is not None:
            self.arrangements.forget(table)

    def recomputed(self, plan: Maintenance, groups: pa.Table) -> pa.Table | None:
        """The items of the view's ``groups`` (that lost a minimum's or a maximum's value), as
        the copies hold them now: the rows of the group's first plain column probed in its
        table's arrangement, joined along the view's joins (`_arrow_items`), those of other
        groups left out; None where the arrangements cannot (DuckDB computes them)."""
        seed = _seed(plan)
        if seed is None:
            return None
        alias, column, item = seed
        table = next(a.table for a in plan.auxiliaries if a.alias == alias)
        arrangement = self.get(table)
        values = groups.column(item)
        if (
            arrangement is None
            or not indexable(values.type)
            or any(groups.column(g).null_count for g in plan.group)  # (NULL: one group)
            # (DuckDB's groups hold 0 and -0 as one, Arrow's join not)
            or any(pa.types.is_floating(groups.column(g).type) for g in plan.group)
        ):
            return None
        try:
            _, rows = arrangement.probe(column, pc.unique(values))
        except ValueError:
            return None
        rows = rows.append_column(WEIGHT, pa.array([1] * rows.num_rows, pa.int32()))
        found = _arrow_items(self.con, plan, alias, rows, self.get)
        if found is None:
            return None
        try:
            wanted = groups.select(list(plan.group)).cast(found.select(list(plan.group)).schema)
            return found.join(wanted, list(plan.group), join_type="left semi")
        except (pa.ArrowException, ValueError):
            return None


def _seed(plan: Maintenance) -> tuple[str, str, str] | None:
    """Of a view with a minimum or a maximum (whose groups that lose one are computed again):
    its first grouping column that is a table's column (alias, column, the view's name for
    it), by which the groups are probed; else None."""
    if dict(plan.merges).get(REDO, "false") == "false":
        return None
    for item in plan.items:
        if item.name in plan.group and isinstance(item.node, exp.Column):
            return item.node.table, folded(item.node), item.name
    return None


def _together(items: list[pa.Table]) -> pa.Table:
    """A view's items from each table, some computed by Arrow and some by DuckDB: the types
    each gives made one (Arrow's products are 38-digit decimals, DuckDB's as narrow as the
    factors allow)."""
    return pa.concat_tables(items, promote_options="permissive")


def _consolidated(changes: pa.Table, columns: Sequence[str]) -> pa.Table | None:
    """A Z-set consolidated on the ``columns`` a view reads (a row it sees as it was cancels),
    by Arrow; None where Arrow cannot group them."""
    try:
        summed = changes.group_by(list(columns), use_threads=False).aggregate([(WEIGHT, "sum")])
    except (pa.ArrowException, ValueError):
        return None
    weight = summed.column(f"{WEIGHT}_sum")
    summed = summed.drop_columns(f"{WEIGHT}_sum").append_column(WEIGHT, weight.cast(pa.int32()))
    return summed.filter(pc.not_equal(summed.column(WEIGHT), 0))


def _spent(applied: Applied, name: str, started: float) -> None:
    applied.spent[name] = applied.spent.get(name, 0.0) + time.perf_counter() - started


def _add(con: duckdb.DuckDBPyConnection, plan: Maintenance, items: pa.Table) -> None:
    """Weighted items (of groups the view keeps) added to a view whose states all add up:
    their states summed by Arrow (no statement to plan), added to the groups the view holds
    by one UPDATE; a group it lacks inserted, one left with no rows deleted (both rare, and
    found by DuckDB: its matching of groups, not Python's equality of their values)."""
    if not items.num_rows:  # (no item: nothing changes, even the one group of all rows)
        return
    delta = _added_states(plan, items)
    name = ident(plan.view.name)
    con.register("mtcache_delta", delta)
    try:
        changed = con.execute(plan.add_sql("mtcache_delta")).fetchall()
        if len(changed) < delta.num_rows:  # (groups the view did not hold)
            columns = idents(plan.stored_names)
            con.execute(
                f"INSERT INTO {name} ({columns}) SELECT {columns} FROM mtcache_delta d "
                f"ANTI JOIN {name} t ON {plan.same_group('t', 'd')} WHERE d.{ROWS} > 0"
            )
        if plan.group and any(row[0] == 0 for row in changed):
            con.execute(f"DELETE FROM {name} WHERE {ROWS} = 0")
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
        if pa.types.is_integer(value.type):  # (Arrow's int64 sum wraps around, and negating
            wide = value.type.bit_width == 64  # an integer's minimum overflows its type)
            value = value.cast(pa.decimal128(38, 0) if wide else pa.int64())
        if state.rule == "values":
            summed[state.name] = pc.cast(pc.if_else(pc.is_valid(value), weight, 0), pa.int64())
        else:
            positive = pc.greater(weight, 0)
            summed[state.name] = pc.if_else(positive, value, pc.negate_checked(value))
    names = [s.name for s in plan.added]
    # (the sums under names of their own: Arrow names each <column>_sum beside the groups)
    inputs = [f"mtcache_s{i}" for i in range(len(names))]
    table = pa.table(
        {
            **{g: summed[g] for g in plan.group},
            **dict(zip(inputs, (summed[n] for n in names), strict=True)),
        }
    )
    if plan.group:
        table = table.group_by(list(plan.group), use_threads=False).aggregate(
            [(n, "sum") for n in inputs]
        )
        table = table.rename_columns(
            [names[inputs.index(c[:-4])] if c[:-4] in inputs else c for c in table.column_names]
        )
    else:
        table = pa.table(
            {n: [pc.sum(table.column(i)).as_py()] for n, i in zip(names, inputs, strict=True)}
        )
    return table.select(plan.stored_names)


Recompute = Callable[[pa.Table], pa.Table | None]


def _merge(
    con: duckdb.DuckDBPyConnection,
    plan: Maintenance,
    items: pa.Table,
    kept: str,
    recompute: Recompute,
) -> None:
    """A view's items merged into what it stores (of what it keeps); ``recompute`` gives the
    items of groups that lost an extreme, from the arrangements (None: DuckDB computes them
    from the copies)."""
    registered: list[str] = []

    def register(name: str, rows: pa.Table) -> None:
        con.register(name, rows)
        registered.append(name)

    try:
        register("mtcache_items", items)
        if plan.grouped:
            _merge_groups(con, plan, register, kept, recompute)
        else:
            _merge_rows(con, plan, register, kept)
    finally:
        for name in registered:
            con.unregister(name)


def _arrow_changes(before: pa.Table, stage: Staged, columns: Sequence[str]) -> pa.Table | None:
    """A table's Z-set as Arrow, of the copy's ``columns`` the views read: the copy's rows
    the batch replaces (-1) and its final rows (+1), when every value of those was sent
    (else DuckDB merges them with the copy's, `_after`) and the final rows read as the
    copy's types (None otherwise)."""
    assert stage.puts is not None
    if any(FLAG + c in stage.puts.column_names for c in columns):
        return None
    before = before.select(list(columns))
    try:
        after = stage.puts.select(list(columns)).cast(before.schema)
    except (pa.ArrowException, ValueError):  # (final rows not of the copy's types: DuckDB's)
        return None
    return pa.concat_tables(
        [
            before.append_column(WEIGHT, pa.array([-1] * before.num_rows, pa.int32())),
            after.append_column(WEIGHT, pa.array([1] * after.num_rows, pa.int32())),
        ]
    )


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
    [missing] = con.execute(
        f"SELECT count(*) FROM {source} WHERE ({lacking}) AND b.{ident(copy.key[0])} IS NULL"
    ).fetchall()
    if missing[0]:  # (the copy lacks the row: it is pulled anew with every view reading it)
        readers = [
            schema.views[name]
            for name in schema.continuous_views()
            if schema.views[name].is_derived and copy.table in tables_read(schema.views[name])
        ]
        if all(v.view_level for v in readers):  # (all pulled whole: the copy comes with them;
            held = [copy] if copy.name in schema.views else []  # a base view holding it too)
            raise NeedsPull({Region(v.name, RegionKind.VIEW) for v in [*readers, *held]})
        raise StreamProblem(
            f"the copy of table {copy.table} lacks a row an update changed: continuous "
            "maintenance stopped; recreate the cached views reading it (DROP CACHED VIEW, "
            "CREATE CACHED VIEW)"
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
    con: duckdb.DuckDBPyConnection,
    plan: Maintenance,
    register: Register,
    kept_groups: str,
    recompute: Recompute,
) -> None:
    """The items' states merged with the view's of the groups they touch (those it keeps);
    a group that lost a minimum's or maximum's value computed again: from the arrangements
    (probed by the group), or else from the copies."""
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
        found = recompute(following.filter(following.column(REDO)))
        if found is not None:
            register("mtcache_redo_items", found)
            items = "SELECT * FROM mtcache_redo_items"
        elif plan.group:
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
