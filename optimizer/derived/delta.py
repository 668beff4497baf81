"""Incremental maintenance of a derived cached view kept ``REFRESH CONTINUOUSLY``: the
DuckDB statements that carry a batch of the stream's changes into the view's stored states,
with work that follows the change (DBSP's and DBToaster's delta rules).

The stream sends an update's new row and only the old row's key, and the delta of a sum or
of a join needs the old values. So the cache keeps, per table such views read, one *copy*
(`copies`, DBToaster's auxiliary views): the table's key and the union of the columns its
readers need, in the cache file, kept exact by the stream as a base view is, and shared by
every view that reads the table (`Auxiliary`: a view's use of it).

A batch's changes to a table are a Z-set: the copy's rows of the keys it touches as they
were (weight -1) and as they are after it (+1), consolidated, so a row the batch leaves as
it was cancels out. The batch goes through the tables in the order of their names, and a
view's delta is the sum over the tables it reads, in that order, of the table's Z-set joined
with the other tables' copies: those before it as they are after the batch, those after it
as before (the sequential form of ΔA ⋈ B' + A ⋈ ΔB, true in any order of the tables; along
keys, each change meets at most one row of the keyed side). Its rows, each with its weight,
are the *items*: the view's grouping columns and its aggregates' arguments.

- A grouped view's states change by weighted sums, as each state's delta rule says
  (`sql_ext.aggregates.Delta`): a count by the weights, a sum by the values signed by them,
  each sum with the count of its non-NULL values kept beside it (a sum of none is NULL) and
  every group with its row count (``mtcache_rows``: a group of no rows leaves). Minimum and
  maximum take the new values; a group that loses a value is computed again from the copies
  (DBToaster's recompute of the affected groups).
- A join view without aggregates deletes its rows of weight -1 by the view's key and inserts
  those of weight +1.
- A TRUNCATE of a table it reads computes the view again from the copies.

What DuckDB evaluates must read as PostgreSQL does, so a continuously maintained view is
refused at DDL time (`maintenance` says why) unless its WHERE compares columns with constants as the
matcher's filters do (`optimizer.derived.match`), its sums and averages are of integers and
numerics computed by +, - and * (exact in both), its minimums and maximums of numbers and
dates, and every table it reads has a primary key and is read once.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field, replace

from sqlglot import exp

from control_tables.schema import CachedView
from optimizer.derived.match import Ref, filter_conjunct
from optimizer.derived.states import ROWS, Layout, definition, layout
from optimizer.postgres.types import DECIMAL_DIGITS, declared
from sql_ext import DerivedOutput
from sql_ext.aggregates import AGGREGATES, Delta
from sql_ext.blocks import split_and
from sql_ext.catalog import Catalog
from sql_ext.errors import NotSupportedError
from sql_ext.quoting import folded, ident

AUX_PREFIX = "mtcache_aux."
WEIGHT = "mtcache_w"
REDO = "mtcache_redo"  # a merged group computed again from the copies
CURRENT = "mtcache_current"  # a group's states as the view holds them (not a delta's)
_ARITHMETIC = (
    exp.Column,
    exp.Identifier,
    exp.Literal,
    exp.Add,
    exp.Sub,
    exp.Mul,
    exp.Paren,
    exp.Neg,
)
_ORDERED = ("integer", "numeric", "float", "date", "timestamp", "timestamptz")
# the value kinds whose states each delta rule (`sql_ext.aggregates.Delta`) keeps in DuckDB as
# PostgreSQL computes them, of expressions of columns by +, - and *, and else why not (a count
# counts any values)
_EXACT: dict[Delta, tuple[tuple[str, ...], str]] = {
    "extreme": (_ORDERED, "not of a number or a date, whose order DuckDB shares with PostgreSQL"),
    "sum": (
        ("integer", "numeric"),
        "not of integers or numerics computed by +, - and * (a floating-point sum depends on "
        "the order it adds in)",
    ),
}


def copy_name(table: str) -> str:
    """The DuckDB name of the copy of a backend table."""
    return AUX_PREFIX + table


def tables_read(view: CachedView) -> set[str]:
    """The backend tables a derived view reads."""
    derivation = view.derivation
    assert derivation is not None
    return {s.table for s in derivation.sources}


def copy_table(name: str) -> str | None:
    """The backend table a DuckDB table is the copy of (None: not a copy)."""
    if not name.startswith(AUX_PREFIX):
        return None
    return name[len(AUX_PREFIX) :] or None


@dataclass(frozen=True)
class Auxiliary:
    """A view's use of the copy of one table it reads (``copy``: the columns it reads of it,
    keyed by the table's primary key, under the shared copy's name)."""

    alias: str
    table: str  # the backend table's name
    copy: CachedView


@dataclass(frozen=True)
class Item:
    """A column of the items: a grouping column (named as the view's) or an aggregate's
    argument (``mtcache_a<n>``), as DuckDB computes it."""

    name: str
    sql: str
    node: exp.Expr | None = field(default=None, compare=False)  # (the view's expression)


@dataclass(frozen=True)
class Added:
    """A stored state that adds up, as a sum over a group's weighted items: the weights of
    its ``rows``, of its non-NULL ``values`` of the item ``argument``, or the ``sum`` of
    that item's values signed by the weights."""

    name: str
    rule: t.Literal["rows", "values", "sum"]
    argument: str | None = None


@dataclass(frozen=True)
class Maintenance:
    """How the stream's changes reach one continuously maintained derived view."""

    view: CachedView
    stored: Layout
    auxiliaries: tuple[Auxiliary, ...]  # in the order the view reads its tables
    items: tuple[Item, ...]
    where: str  # the joins and the view's WHERE, in DuckDB's SQL
    group: tuple[str, ...]  # the grouping columns (a join view: its key)
    states: tuple[tuple[str, str], ...]  # (stored column, its state over weighted items)
    merges: tuple[tuple[str, str], ...]  # (stored column, merging states of one group)
    # a grouped view whose states all add up (no minimum or maximum), else none: each state
    # as a sum of weighted items (`Added`), and its value from the view's row ``t`` and a
    # delta's ``d`` of one group
    added: tuple[Added, ...] = ()
    adds: tuple[tuple[str, str], ...] = ()
    conditions: tuple[exp.Expr, ...] = ()  # the view's WHERE: its conjuncts (`where` has them)
    # the joins' column equalities: (alias, column, alias, column)
    links: tuple[tuple[str, str, str, str], ...] = ()
    # (alias, the DuckDB table holding its copy) where that is not the copy's own table: a
    # base view holding all of the table (`copies`; `held_in` says so)
    held: tuple[tuple[str, str], ...] = ()

    @property
    def grouped(self) -> bool:
        derivation = self.view.derivation
        assert derivation is not None
        return derivation.aggregates

    def items_sql(self, relations: t.Mapping[str, str], weighted: str | None) -> str:
        """The view's items over ``relations`` (alias -> DuckDB relation; the others read
        their copies), each with the weight of the ``weighted`` alias's rows (None: 1)."""
        held = dict(self.held)
        sources = ", ".join(
            f"{relations.get(a.alias, ident(held.get(a.alias, a.copy.name)))} AS {ident(a.alias)}"
            for a in self.auxiliaries
        )
        weight = f"{ident(weighted)}.{WEIGHT}" if weighted is not None else "1"
        columns = ", ".join(
            [*(f"{i.sql} AS {ident(i.name)}" for i in self.items), f"{weight} AS {WEIGHT}"]
        )
        return f"SELECT {columns} FROM {sources} WHERE {self.where}"

    def held_in(self, copies: t.Mapping[str, CachedView]) -> Maintenance:
        """This maintenance reading each table's copy where ``copies`` (by table, `copies`)
        holds it."""
        held = tuple(
            (a.alias, copies[a.table].name)
            for a in self.auxiliaries
            if a.table in copies and copies[a.table].name != a.copy.name
        )
        return self if held == self.held else replace(self, held=held)

    def states_sql(self, items: str, stored_only: bool = False) -> str:
        """The stored states of weighted items (and, unless ``stored_only``, the extremes of
        the values they remove)."""
        names = set(self.stored_names)
        columns = [
            f"{sql} AS {ident(name)}"
            for name, sql in self.states
            if not stored_only or name in names
        ]
        sql = f"SELECT {', '.join(columns)} FROM ({items}) i"
        if self.group:
            sql += f" GROUP BY {', '.join(f'i.{ident(g)}' for g in self.group)}"
        return sql

    def merged_sql(self, states: str) -> str:
        """States of one group merged into one row (the view's and a delta's)."""
        columns = [f"{sql} AS {ident(name)}" for name, sql in self.merges]
        sql = f"SELECT {', '.join(columns)} FROM ({states}) s"
        if self.group:
            sql += f" GROUP BY {', '.join(f's.{ident(g)}' for g in self.group)}"
        return sql

    def add_sql(self, delta: str) -> str:
        """One statement adding the states of the registered ``delta`` (a group's states of
        weighted items, `added`) to the view's groups it touches, returning the rows left in
        each (a view whose states all add up: `adds`)."""
        assert self.adds
        update = ", ".join(f"{ident(column)} = {sql}" for column, sql in self.adds)
        return (
            f"UPDATE {ident(self.view.name)} t SET {update} FROM {delta} d "
            f"WHERE {self.same_group('t', 'd')} RETURNING t.{ROWS}"
        )

    def same_group(self, left: str, right: str) -> str:
        """SQL: the rows ``left`` and ``right`` are of one group (NULL the same as NULL)."""
        return (
            " AND ".join(
                f"{left}.{ident(g)} IS NOT DISTINCT FROM {right}.{ident(g)}" for g in self.group
            )
            or "true"
        )

    @property
    def stored_names(self) -> list[str]:
        return [c.name for c in self.stored.columns]


def maintenance(view: CachedView, catalog: Catalog) -> Maintenance:
    """The maintenance of ``view`` (a continuously maintained derived view), or
    `NotSupportedError` saying what the cache cannot maintain exactly and what to do."""
    derivation = view.derivation
    assert derivation is not None
    _, select = definition(view)
    aliases = {s.alias: s.table for s in derivation.sources}
    if len(set(aliases.values())) != len(aliases):
        raise _refused(view, "it reads one table twice (its changes would have to meet themselves)")
    tables = {}
    for source in derivation.sources:
        table = catalog.table(source.table, source.schema)
        if table is None:  # (checked at DDL time: dropped at the backend since)
            raise _refused(view, f"{source.table} is no longer at the backend; drop the view")
        if not table.primary_key:
            raise _refused(
                view,
                f"{source.table} has no primary key (the stream identifies rows by it); add one",
            )
        tables[source.alias] = table

    def owner(column: exp.Column) -> str:
        if column.table:
            return folded(column.args["table"])
        name = folded(column)
        return next(a for a, table in tables.items() if table.has_column(name))

    def qualified(node: exp.Expr) -> exp.Expr:
        """The expression with each column named by its table's alias (`Item.node`)."""
        return node.transform(
            lambda n: (
                exp.column(folded(n), table=owner(n), quoted=True)
                if isinstance(n, exp.Column)
                else n
            )
        )

    needed: dict[str, list[str]] = {a: list(tables[a].primary_key) for a in tables}
    for column in select.find_all(exp.Column):
        alias, name = owner(column), folded(column)
        if name not in needed[alias]:
            needed[alias].append(name)

    where = [
        f"{left.sql(dialect='duckdb')} = {right.sql(dialect='duckdb')}"
        for left, right in derivation.joins
    ]
    conditions: list[exp.Expr] = []  # (the view's WHERE, each conjunct of a column)
    if select.args.get("where") is not None:
        every: dict[Ref, exp.Expr] = {
            (aliases[owner(c)], folded(c)): exp.column(folded(c), table=owner(c), quoted=True)
            for c in select.args["where"].find_all(exp.Column)
        }
        for conjunct in split_and(select.args["where"].this):
            made = filter_conjunct(conjunct, aliases, every, catalog, {})
            if made is None:
                raise _refused(
                    view,
                    f"DuckDB would not read its condition "
                    f"{conjunct.sql(dialect='postgres')} as PostgreSQL does "
                    "(a column compared with constants of its own type is "
                    "maintained; = and IN only on text)",
                )
            where.append(made.sql(dialect="duckdb"))
            conditions.append(made)

    stored = layout(view, catalog)
    items: list[Item] = []
    states: list[tuple[str, str]] = []
    merges: list[tuple[str, str]] = []
    adds: list[tuple[str, str]] = []
    added: list[Added] = []
    group: list[str] = []
    redo: list[str] = []
    weight = f"i.{WEIGHT}"
    rows = f"coalesce(sum({weight}), 0)"
    for index, output in enumerate(derivation.outputs):
        if output.aggregate is None:
            assert output.expression is not None
            items.append(
                Item(
                    output.name,
                    output.expression.sql(dialect="duckdb"),
                    qualified(output.expression),
                )
            )
            states.append((output.name, f"i.{ident(output.name)}"))
            merges.append((output.name, f"s.{ident(output.name)}"))
            group.append(output.name)
            continue
        aggregate = AGGREGATES[output.aggregate]
        value = None  # (count(*): the rows, no argument)
        # (of NOT NULL columns by +, - and *, in a view whose groups leave with their last
        # row: one group of all rows stays, with a sum of none)
        never_null = any(o.aggregate is None for o in derivation.outputs) and (
            output.expression is None
            or all(
                not next(c for c in tables[owner(x)].columns if c.name == folded(x)).nullable
                for x in output.expression.find_all(exp.Column)
            )
        )
        if output.expression is not None:
            argument = f"mtcache_a{index}"
            value = f"i.{ident(argument)}"
            items.append(
                Item(
                    argument, output.expression.sql(dialect="duckdb"), qualified(output.expression)
                )
            )
            _check_exact(view, output, stored)
        for state in aggregate.states:
            name, merge = output.name + state.suffix, state.merge.key
            if state.delta == "count":  # (the weights of the rows, or of the non-NULL values)
                counted = (
                    rows
                    if value is None
                    else f"coalesce(sum(CASE WHEN {value} IS NULL THEN 0 ELSE {weight} END), 0)"
                )
                states.append((name, counted))
                merges.append((name, f"{merge}(s.{ident(name)})::BIGINT"))
                adds.append((name, f"t.{ident(name)} + d.{ident(name)}"))
                added.append(
                    Added(name, "rows")
                    if value is None
                    else Added(name, "values", f"mtcache_a{index}")
                )
            elif state.delta == "sum":  # (signed values; none left: NULL, as a sum of none)
                count = output.name + next(s.suffix for s in aggregate.states if s.delta == "count")
                duck = next(c.duckdb_type for c in stored.columns if c.name == name)
                signed = f"CASE WHEN {weight} > 0 THEN {value} ELSE -{value} END"
                states.append((name, f"CAST(sum({signed}) AS {duck})"))
                added.append(Added(name, "sum", f"mtcache_a{index}"))
                # (a group left with rows has values of a NOT NULL argument, and so has the
                # delta touching it: neither sum is NULL)
                adds.append(
                    (name, f"t.{ident(name)} + d.{ident(name)}")
                    if never_null
                    else (
                        name,
                        f"CASE WHEN t.{ident(count)} + d.{ident(count)} = 0 THEN NULL ELSE "
                        f"CAST(coalesce(t.{ident(name)}, 0) + coalesce(d.{ident(name)}, 0) "
                        f"AS {duck}) END",
                    )
                )
                merges.append(
                    (
                        name,
                        f"CASE WHEN {merge}(s.{ident(count)}) = 0 THEN NULL ELSE "
                        f"CAST({merge}(s.{ident(name)}) AS {duck}) END",
                    )
                )
            else:  # an extreme: the added values' (hierarchical: see `recompute`)
                function = state.function.key
                states.append((name, f"{function}({value}) FILTER (WHERE {weight} > 0)"))
                merges.append((name, f"{merge}(s.{ident(name)})"))
                # the group's extreme among the values it loses: at the view's, it goes again
                lost = f"mtcache_lost{index}"
                states.append((lost, f"{function}({value}) FILTER (WHERE {weight} < 0)"))
                redo.append(
                    f"{merge}(s.{lost}) {aggregate.recompute} {merge}("
                    f"s.{ident(name)}) FILTER (WHERE s.{CURRENT})"
                )
    if derivation.aggregates:
        states.append((ROWS, rows))
        merges.append((ROWS, f"sum(s.{ident(ROWS)})::BIGINT"))
        adds.append((ROWS, f"t.{ident(ROWS)} + d.{ident(ROWS)}"))
        added.append(Added(ROWS, "rows"))
        merges.append((REDO, f"coalesce({' OR '.join(redo)}, false)" if redo else "false"))
    else:
        group = list(view.key)
    # (DuckDB matches a group of 0 and one of -0 as one, which Arrow's grouping tells apart:
    # floating-point groups merge by DuckDB's GROUP BY)
    adding = (
        derivation.aggregates
        and not redo
        and not any(declared(c.pg_type).kind == "float" for c in stored.columns if c.name in group)
    )
    order = {name: i for i, name in enumerate(c.name for c in stored.columns)}
    states.sort(key=lambda s: order.get(s[0], len(order)))
    merges.sort(key=lambda s: order.get(s[0], len(order)))

    auxiliaries = tuple(
        Auxiliary(
            alias,
            tables[alias].name,
            _copy(tables[alias].name, tuple(needed[alias]), tables[alias].primary_key),
        )
        for alias in aliases
    )
    return Maintenance(
        view,
        stored,
        auxiliaries,
        tuple(items),
        " AND ".join(where) or "true",
        tuple(group),
        tuple(states),
        tuple(merges),
        tuple(added) if adding else (),
        tuple(adds) if adding else (),
        tuple(conditions),
        tuple((owner(a), folded(a), owner(b), folded(b)) for a, b in derivation.joins),
    )


def copies(views: t.Iterable[CachedView], catalog: Catalog) -> dict[str, CachedView]:
    """The copy of each table the continuously maintained derived ``views`` read, by table:
    its key and the union of the columns they read of it (in the order the views, by name,
    first read them), in the order of the tables' names. A table's cached base view among
    ``views`` that holds all of it (`_shares_copy`) is its copy, when every derived view
    reading it keeps all its groups (its name is then the copy's; `copy_name` still names
    the copy's pull in the view states)."""
    views = sorted(views, key=lambda v: v.name)
    columns: dict[str, list[str]] = {}
    keys: dict[str, tuple[str, ...]] = {}
    whole: dict[str, bool] = {}
    for view in views:
        if not (view.is_derived and view.continuous):
            continue
        for aux in maintenance(view, catalog).auxiliaries:
            found = columns.setdefault(aux.table, [])
            found += [c for c in aux.copy.columns if c not in found]
            keys[aux.table] = aux.copy.key
            whole[aux.table] = whole.get(aux.table, True) and not view.presence
    controls = {edge.control for view in views for edge in view.presence}
    found_copies = {}
    for table, read in sorted(columns.items()):
        shared = [
            v
            for v in views
            if whole[table]
            and v.table == table
            and v.name not in controls
            and _shares_copy(v, tuple(read), keys[table])
        ]
        found_copies[table] = shared[0] if shared else _copy(table, tuple(read), keys[table])
    return found_copies


def _shares_copy(view: CachedView, columns: tuple[str, ...], key: tuple[str, ...]) -> bool:
    """Can ``view`` be the copy of its table holding ``columns`` under ``key``: a base view
    the stream keeps, holding every row of the table (no WHERE, PRESENCE, CONSISTENCY or
    COMPLETENESS clause: never evicted, pulled whole) and those columns under that key?
    (Its children, views whose presence it controls, are checked by `copies`.)"""
    return (
        not view.is_derived
        and view.continuous
        and view.where is None
        and not view.presence
        and view.consistency is None
        and view.completeness is None
        and tuple(view.key) == tuple(key)
        and set(columns) <= set(view.columns)
    )


def _copy(table: str, columns: tuple[str, ...], key: tuple[str, ...]) -> CachedView:
    """The copy of ``table`` as a fully materialized base view of it (the stream keeps it as
    it keeps any)."""
    return CachedView(
        name=copy_name(table),
        table=table,
        columns=columns,
        key=key,
        where=None,
        presence=(),
        consistency=None,
        completeness=None,
        refresh_seconds=None,
        statement="",
        continuous=True,
    )


def _check_exact(view: CachedView, output: DerivedOutput, stored: Layout) -> None:
    """`NotSupportedError` unless DuckDB keeps each state of the aggregate ``output`` as
    PostgreSQL computes it (`_EXACT`)."""
    assert output.aggregate is not None and output.expression is not None
    kind = _kind(stored, output.name)
    for state in AGGREGATES[output.aggregate].states:
        if state.delta in _EXACT:
            kinds, why = _EXACT[state.delta]
            if kind not in kinds or not _arithmetic(output.expression):
                raise _refused(view, f"its {output.aggregate}({output.expression.sql()}) is {why}")


def _arithmetic(value: exp.Expr) -> bool:
    """Columns and numbers by +, - and *, each number as exact in DuckDB as in PostgreSQL (not
    1e-3 or more than 38 digits: DuckDB reads those as a DOUBLE)."""
    return all(
        isinstance(node, _ARITHMETIC)
        and (
            not isinstance(node, exp.Literal)
            or (
                (digits := node.this.replace(".", "", 1)).isdigit()
                and len(digits) <= DECIMAL_DIGITS
            )
        )
        for node in value.walk()
    )


def _kind(stored: Layout, name: str) -> str:
    """The kind of an aggregate's value, from what the cache stores of it."""
    columns = stored.outputs[name]
    pg_type = next(c.pg_type for c in stored.columns if c.name == columns[0])
    return declared(pg_type).kind


def _refused(view: CachedView, why: str) -> NotSupportedError:
    return NotSupportedError(
        f"cached view {view.name}: REFRESH CONTINUOUSLY cannot keep it exact: {why}; or use "
        "REFRESH EVERY, whose refresh the backend computes"
    )


__all__ = [
    "AUX_PREFIX",
    "CURRENT",
    "REDO",
    "WEIGHT",
    "Added",
    "Auxiliary",
    "Maintenance",
    "copies",
    "copy_name",
    "copy_table",
    "maintenance",
    "tables_read",
]
