"""A numeric's display scale, value by value. PostgreSQL keeps a scale per numeric
value - ``coalesce(price, 0)`` is ``12.50`` for a row with a price and ``0`` for one without -
while DuckDB gives a column one decimal type. Where the scale is not the same for every value,
the cache has DuckDB compute it beside the value, from the same branches PostgreSQL takes, and
gives each value its own scale (`cache.execution.convert`).

`scale_expression` gives a number when every value has the same scale, a DuckDB expression
over the row when it varies in a way the cache can follow, and None when it cannot (a minimum
of values of different scales keeps whichever it met first, for instance).
"""

from __future__ import annotations

import typing as t
from collections.abc import Callable

from sqlglot import exp

from optimizer.postgres.allowlist import DIVISION_SCALE, numeric_division, numeric_spread
from optimizer.postgres.divisions import SPREADS, spread_operands
from optimizer.postgres.types import DECIMAL_DIGITS, PgType
from sql_ext.params import NODE_ID
from sql_ext.quoting import output_name

Scale = int | exp.Expr | None


def division_operands(
    node: exp.Expr,
    type_of: Callable[[exp.Expr], PgType],
    column: ColumnScale | None = None,
) -> tuple[exp.Expr, Scale, exp.Expr, Scale] | None:
    """An average or a numeric division as numerator, its scale, denominator, its scale
    (an average: the sum and the count of its values, over its window if it has one)."""
    if isinstance(node, exp.Div):
        return (
            node.this,
            scale_expression(node.this, type_of, column),
            node.expression,
            scale_expression(node.expression, type_of, column),
        )
    if isinstance(node, (*SPREADS,)):
        found = scale_expression(node.this, type_of, column)
        if isinstance(found, int) and 2 * found <= DECIMAL_DIGITS:
            numerator, denominator = spread_operands(node, found, SPREADS[type(node)])
            return numerator, 2 * found, denominator, 0
        bound = scale_bound(node.this, type_of)
        if not isinstance(found, exp.Expr) or bound is None or 2 * bound > DECIMAL_DIGITS:
            return None  # (the squares' scale: beyond DuckDB's DECIMAL)
        # values of several scales: PostgreSQL's sums keep the largest (NumericAggState's
        # maxScale), of which the exact numerator has twice; each value is read at the
        # largest scale it may have, which changes no value
        numerator, denominator = spread_operands(node, bound, SPREADS[type(node)])
        largest = exp.Max(this=_where_not_null(node.this, found))
        twice = exp.cast(exp.Mul(this=exp.Literal.number(2), expression=largest), "INTEGER")
        return numerator, twice, denominator, 0
    if isinstance(node, exp.Avg):
        value = node.this
        found = scale_expression(value, type_of, column)
        if isinstance(found, exp.Expr):  # the sum's: the largest of its values'
            found = exp.Max(this=_where_not_null(value, found))
        window = node.parent if isinstance(node.parent, exp.Window) else None
        if window is not None and isinstance(found, exp.Expr):
            return None  # a windowed sum's scale: not followed
        total: exp.Expr = exp.Sum(this=value.copy())
        count: exp.Expr = exp.Count(this=value.copy())
        if window is not None:
            total = _windowed(window, total)
            count = _windowed(window, count)
        return total, found, count, 0
    return None


def _where_not_null(value: exp.Expr, scale: exp.Expr) -> exp.Expr:
    """``scale`` where ``value`` is not NULL (what an aggregate of it counts), else NULL."""
    return exp.Case(
        ifs=[
            exp.If(this=exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())), true=scale)
        ]
    )


def _windowed(window: exp.Window, function: exp.Expr) -> exp.Expr:
    """``function`` over the average's window (a new node: not the window's number)."""
    copy = window.copy()
    copy.meta.pop(NODE_ID, None)
    copy.set("this", function)
    return copy


ColumnScale = Callable[[exp.Column], "Scale"]


def scale_expression(
    node: exp.Expr, type_of: Callable[[exp.Expr], PgType], column: ColumnScale | None = None
) -> Scale:
    """The display scale of each value of ``node`` (an integer has scale 0; ``column``: the
    scale of a derived table's column, `DerivedScales.column`)."""
    found = type_of(node)
    if found.kind == "integer":
        return 0
    if found.kind == "null":
        return 0
    if found.kind != "numeric":
        return None
    if found.scale is not None:
        return found.scale
    return _varying(node, type_of, column)


def _varying(
    node: exp.Expr, type_of: Callable[[exp.Expr], PgType], column: ColumnScale | None
) -> Scale:
    def of(child: exp.Expr) -> Scale:
        return scale_expression(child, type_of, column)

    if _grouped_by_sets(node):
        return None
    if isinstance(node, exp.Column):
        return column(node) if column is not None else None
    if isinstance(node, exp.Paren | exp.Alias):
        return of(node.this)
    if isinstance(node, exp.Window) and isinstance(node.this, exp.Avg):
        return of(node.this)  # the average's own (its operands are windowed)
    if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Select):
        return _subquery_scale(node, type_of, column)
    if isinstance(node, (*SPREADS,)) and not isinstance(node.parent, exp.Window):
        operands = division_operands(node, type_of, column)
        if operands is None:
            return None
        numerator, a, denominator, _ = operands
        root = SPREADS[type(node)].startswith("stddev")
        return numeric_spread(numerator, t.cast("int | exp.Expr", a), denominator, root, scale=True)
    if isinstance(node, exp.Div | exp.Avg):
        operands = division_operands(node, type_of, column)
        if operands is None or operands[1] is None or operands[3] is None:
            return None
        numerator, a, denominator, b = operands
        return numeric_division(
            numerator.copy(),
            _sql(t.cast("int | exp.Expr", a)),
            denominator.copy(),
            _sql(t.cast("int | exp.Expr", b)),
            scale=True,
        )
    if isinstance(node, exp.Cast) and not node.to.expressions:
        return of(node.this)  # ::numeric keeps each value's scale
    if isinstance(node, exp.Case):
        ifs = []
        for branch in node.args.get("ifs") or []:
            value = of(branch.args["true"])
            if value is None:
                return None
            condition = branch.this.copy()
            if node.args.get("this") is not None:
                condition = exp.EQ(this=node.this.copy(), expression=condition)
            ifs.append(exp.If(this=condition, true=_sql(value)))
        default = node.args.get("default")
        fallback = of(default) if default is not None else 0
        if fallback is None:
            return None
        return exp.Case(ifs=ifs, default=_sql(fallback))
    if isinstance(node, exp.Coalesce):
        values = [node.this, *node.expressions]
        first = node.this
        while isinstance(first, exp.Paren | exp.Neg):
            first = first.this
        if isinstance(first, exp.Literal):
            return of(node.this)  # never NULL: always the first value
        scales = [of(v) for v in values]
        if any(s is None for s in scales):
            return None
        known = t.cast(list["int | exp.Expr"], scales)
        ifs = [
            exp.If(this=exp.Not(this=exp.Is(this=v.copy(), expression=exp.Null())), true=_sql(s))
            for v, s in zip(values[:-1], known[:-1], strict=True)
        ]
        return exp.Case(ifs=ifs, default=_sql(known[-1]))
    if isinstance(node, exp.Nullif):
        return of(node.this)
    if isinstance(node, exp.Greatest | exp.Least) and not node.expressions[1:]:
        a, b = node.this, node.expressions[0]
        sa, sb = of(a), of(b)
        if sa is None or sb is None:
            return None
        # PostgreSQL keeps the first value unless a later one is strictly beyond it
        beyond = exp.GT if isinstance(node, exp.Greatest) else exp.LT
        return exp.Case(
            ifs=[
                exp.If(this=exp.Is(this=a.copy(), expression=exp.Null()), true=_sql(sb)),
                exp.If(this=exp.Is(this=b.copy(), expression=exp.Null()), true=_sql(sa)),
                exp.If(this=beyond(this=b.copy(), expression=a.copy()), true=_sql(sb)),
            ],
            default=_sql(sa),
        )
    if isinstance(node, exp.Add | exp.Sub | exp.Mod):
        return _combine(of(node.this), of(node.expression), "greatest")
    if isinstance(node, exp.Mul):
        return _combine(of(node.this), of(node.expression), "add")
    if isinstance(node, exp.Neg | exp.Abs):
        return of(node.this)
    if isinstance(node, exp.Min | exp.Max) and not isinstance(node.parent, exp.Window):
        inner = of(node.this)
        # values all of one scale: so is their minimum (of several, whichever it met first)
        return inner if isinstance(inner, int) else None
    if (
        isinstance(node, exp.Sum)
        and not isinstance(node.this, exp.Distinct)
        and not isinstance(node.parent, exp.Window)
    ):
        inner = of(node.this)
        if inner is None:
            return None
        if isinstance(inner, int):
            return inner
        # the sum's scale is the largest of the values it added (NULLs add nothing)
        return exp.Max(this=_where_not_null(node.this, inner))
    return None


def _grouped_by_sets(node: exp.Expr) -> bool:
    """Whether a value is computed per output row of a SELECT grouped by ROLLUP, CUBE or
    GROUPING SETS (not inside an aggregate): its columns may be NULL in a set that groups by
    the value itself, so an expression of them would not give the value's scale (found by a
    review)."""
    if isinstance(node, exp.AggFunc):
        return False  # (its scale is an aggregate of its values', per group of each set)
    found = node.find_ancestor(exp.AggFunc, exp.Select)
    if not isinstance(found, exp.Select):
        return False
    group = found.args.get("group")
    return group is not None and group.find(exp.Rollup, exp.Cube, exp.GroupingSets) is not None


def _subquery_scale(
    node: exp.Subquery, type_of: Callable[[exp.Expr], PgType], column: ColumnScale | None
) -> Scale:
    """A scalar subquery's value's scale: the same subquery, computing the scale instead."""
    select = node.this
    if len(select.expressions) != 1 or select.args.get("distinct"):
        return None
    projection = select.expressions[0]
    value = projection.this if isinstance(projection, exp.Alias) else projection
    inner = scale_expression(value, type_of, column)
    if not isinstance(inner, exp.Expr):
        return inner
    copy = select.copy()
    copy.set("expressions", [inner])
    return exp.Subquery(this=copy)


def _combine(a: Scale, b: Scale, how: t.Literal["greatest", "add"]) -> Scale:
    if a is None or b is None:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b) if how == "greatest" else a + b
    if how == "add":
        return exp.Add(this=_sql(a), expression=_sql(b))
    return exp.Greatest(this=_sql(a), expressions=[_sql(b)])


def _sql(scale: int | exp.Expr) -> exp.Expr:
    return exp.Literal.number(scale) if isinstance(scale, int) else scale


def scale_bound(node: exp.Expr, type_of: Callable[[exp.Expr], PgType]) -> int | None:
    """The largest display scale any value of ``node`` may have (None: the cache cannot
    tell, as for a numeric division's quotient)."""
    found = type_of(node)
    if found.kind in ("integer", "null"):
        return 0
    if found.kind != "numeric":
        return None
    if found.scale is not None:
        return found.scale

    def bounds(children: list[exp.Expr]) -> list[int] | None:
        scales = [scale_bound(c, type_of) for c in children]
        return None if any(s is None for s in scales) else t.cast(list[int], scales)

    children: list[exp.Expr]
    if isinstance(node, exp.Div | exp.Avg):
        return DIVISION_SCALE
    if isinstance(
        node,
        exp.Paren
        | exp.Alias
        | exp.Nullif
        | exp.Neg
        | exp.Abs
        | exp.Sum
        | exp.Min
        | exp.Max
        | exp.Window,
    ) or (isinstance(node, exp.Cast) and not node.to.expressions):
        children = [node.this]
    elif isinstance(node, exp.Case):
        children = [i.args["true"] for i in node.args.get("ifs") or []]
        if node.args.get("default") is not None:
            children.append(node.args["default"])
    elif isinstance(node, exp.Coalesce | exp.Greatest | exp.Least):
        children = [node.this, *node.expressions]
    elif isinstance(node, exp.Add | exp.Sub | exp.Mod | exp.Mul):
        children = [node.this, node.expression]
    else:
        return None
    found_bounds = bounds(children)
    if found_bounds is None:
        return None
    return sum(found_bounds) if isinstance(node, exp.Mul) else max(found_bounds, default=0)


SCALE_PREFIX = "mtcache_scale_"


class DerivedScales:
    """Scales of derived tables' and CTEs' columns: a column whose values' scales vary reads
    its scale from a column the cache adds to the derived table's body, computed there
    (``projections``: body SELECT node number -> (that column's name, its expression)).
    A body under DISTINCT, a UNION that removes duplicates, or a query with a star anywhere
    (which would show the added column) cannot take one."""

    def __init__(
        self,
        query_tree: exp.Expr,
        type_of: Callable[[exp.Expr], PgType],
        source_of: Callable[[exp.Column], t.Any],
    ) -> None:
        self.type_of = type_of
        self.source_of = source_of  # column -> (Source, name) or None
        self.projections: dict[int, list[tuple[str, exp.Expr]]] = {}
        # VALUES lists' added columns: VALUES node number -> (name, each row's scale)
        self.values: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
        self._starred = any(
            isinstance(n, exp.Star) and not isinstance(n.parent, exp.Count)
            for n in query_tree.walk()
        )

    def scale(self, node: exp.Expr) -> Scale:
        """`scale_expression`, following columns into derived tables."""
        return scale_expression(node, self.type_of, self.column)

    def column(self, column: exp.Column) -> Scale:
        found = self.source_of(column)
        if found is None or self._starred:
            return None
        source, name = found
        if isinstance(source.node, exp.Values):
            return self._values_column(source, name)
        if not source.body or source.is_table:
            return None
        scales: list[tuple[exp.Select, Scale]] = []
        for branch in source.body:
            select = branch.select
            if select.args.get("distinct") or not _all_kept(select):
                return None
            projection = _projection(source, select, name)
            if projection is None:
                return None
            scales.append((select, self.scale(projection)))
        values = [s for _, s in scales]
        if any(s is None for s in values):
            return None
        if all(isinstance(s, int) for s in values) and len(set(values)) == 1:
            return t.cast(int, values[0])
        added = f"{SCALE_PREFIX}{name}"
        for select, scale in scales:
            number = select.meta[NODE_ID]
            wanted = self.projections.setdefault(number, [])
            if all(n != added for n, _ in wanted):
                wanted.append((added, _sql(t.cast("int | exp.Expr", scale))))
        return exp.column(added, table=source.name)

    def _values_column(self, source: t.Any, name: str) -> Scale:
        """A VALUES list's column: each row's value has its own scale, given by a column the
        local statement adds to the list (a literal per row) where they differ."""
        aliases = source.column_aliases
        if name not in aliases:
            return None
        position = aliases.index(name)
        scales = []
        for row in source.node.expressions:
            if not isinstance(row, exp.Tuple) or position >= len(row.expressions):
                return None
            value = row.expressions[position]
            found = 0 if isinstance(value, exp.Null) else self.scale(value)
            if not isinstance(found, int):
                return None  # a scale varying within a row's expression: not followed
            scales.append(found)
        if len(set(scales)) == 1:
            return scales[0]
        added = f"{SCALE_PREFIX}{name}"
        wanted = self.values.setdefault(source.node.meta[NODE_ID], [])
        if all(n != added for n, _ in wanted):
            wanted.append((added, tuple(scales)))
        return exp.column(added, table=source.name)


def _all_kept(select: exp.Select) -> bool:
    """A body whose rows a UNION, INTERSECT or EXCEPT above it compares whole (an added column
    would change which are equal): only UNION ALL keeps every row as it is."""
    node: exp.Expr | None = select
    while node is not None and isinstance(node.parent, exp.SetOperation | exp.Subquery):
        node = node.parent
        if isinstance(node, exp.SetOperation) and not (
            isinstance(node, exp.Union) and not node.args.get("distinct")
        ):
            return False
    return True


def _projection(source: t.Any, select: exp.Select, name: str) -> exp.Expr | None:
    aliases = source.column_aliases
    for position, projection in enumerate(select.expressions):
        if isinstance(projection, exp.Star):
            return None
        label = aliases[position] if position < len(aliases) else output_name(projection)
        if label == name:
            return projection.this if isinstance(projection, exp.Alias) else projection
    return None
