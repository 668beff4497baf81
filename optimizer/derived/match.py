"""View matching of a whole query against a derived cached view (`control_tables.derived`,
`optimizer.derived.states`): when the view answers the query, the DuckDB statement that
answers it from the view's stored states or rows.

A grouped view answers a query block that
- reads the same tables (each once) joined by the same column equalities, in its FROM's
  JOIN ... ON or its WHERE;
- filters by every conjunct of the view's WHERE, and besides by comparisons of the view's
  grouping columns with constants or parameters (=, <>, <, <=, >, >=, BETWEEN, IN; a range
  only over a number or a date, whose order DuckDB shares with PostgreSQL);
- groups by some of the view's grouping columns (or by none: one group), a coarser grouping
  than the view's;
- projects grouping columns and aggregates the view keeps (the same function of the same
  argument; an average also from the sum and count the view keeps for it), one operation
  (+, -, *, /) of kept numeric aggregates and numbers (`_arithmetic`: PostgreSQL's numeric
  result, a quotient divided as it divides), count(DISTINCT) of a grouping column, keeps
  groups by comparisons of such aggregates with constants (HAVING; an average divided as
  PostgreSQL divides it), and orders by its output columns, with a constant LIMIT or OFFSET;
- or selects DISTINCT grouping columns (a grouping by them, with no aggregate).

The statement merges the view's groups, each state as `sql_ext.aggregates` says: counts and
sums are summed (a count of no rows is 0), minimums and maximums taken again, an average the
quotient of its summed sum and count, divided as PostgreSQL divides (`Output` "avg":
`cache.execution.convert`). A query that
groups as the view does reads the view's rows as they are (no GROUP BY).

A join view (no aggregates) answers a query block that joins the same tables by the same
equalities, filters by the view's WHERE and by comparisons of the view's columns with
constants or parameters (as above), projects view columns (or DISTINCT ones), and neither
groups nor aggregates: the view's rows are the join's, one for each combination (the view
keeps every table's key), so the statement selects them with its filters, order and limit.

Anything else is not matched (None): the statement is planned as before.
"""

from __future__ import annotations

import decimal
import typing as t
from dataclasses import dataclass

from sqlglot import exp

from control_tables.schema import CachedView
from optimizer.derived.states import Layout, layout
from optimizer.derived.states import definition as view_definition
from optimizer.plan import Output
from optimizer.postgres.allowlist import DIVISION_SCALE, NUMERIC_DIVIDE, reads_alike
from optimizer.postgres.types import declared
from sql_ext import Query
from sql_ext.aggregates import Aggregate, aggregate_of
from sql_ext.blocks import split_and
from sql_ext.catalog import Catalog
from sql_ext.params import NODE_ID, Key, duckdb_name
from sql_ext.quoting import folded, ident

Ref = tuple[str, str]  # (table, column): a column of the query or view, by its table's name
_RANGES = (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Between)
_ORDERED_TYPES = (
    "smallint",
    "integer",
    "bigint",
    "numeric",
    "real",
    "double precision",
    "date",
    "timestamp",
    "timestamp with time zone",
)


@dataclass(frozen=True)
class DerivedMatch:
    """A query answered from a derived view: the DuckDB statement over the view's table,
    and how each of the query's columns is made from its result (`optimizer.plan.Output`)."""

    view: str
    sql: str
    outputs: tuple[Output, ...]
    # the display scale of each numeric column DuckDB returns, by the query's column (every
    # value of a stored numeric state has its column's scale, and so have their merges)
    scales: dict[int, int]


def match_derived(
    query: Query,
    view: CachedView,
    catalog: Catalog,
    parameter_keys: t.Mapping[int, Key] | None = None,
) -> DerivedMatch | None:
    """The statement that answers ``query`` from ``view`` (see the module), or None;
    ``parameter_keys``: each placeholder's key by node number (`optimizer.analysis.analyze`), when
    the query has parameters (compared with grouping columns, they become the statement's
    DuckDB parameters)."""
    derivation = view.derivation
    if derivation is None:
        return None
    tree = query.tree
    if not isinstance(tree, exp.Select) or _unsupported(tree):
        return None
    # a join view (no aggregates) answers a query of its rows: no grouping, no aggregate
    rows_only = not derivation.aggregates
    if rows_only and (
        tree.args.get("group")
        or tree.args.get("having")
        or any(p.find(exp.AggFunc) is not None for p in tree.expressions)
    ):
        return None
    tables = _tables(tree)
    if tables is None:
        return None
    view_tables = {s.alias: s.table for s in derivation.sources}
    if sorted(tables.values()) != sorted(view_tables.values()) or len(
        set(view_tables.values())
    ) != len(view_tables):
        return None

    def ref(column: exp.Column, aliases: t.Mapping[str, str]) -> Ref | None:
        return _ref(column, aliases, catalog)

    # the view's joins and filters, and its grouping columns, by table
    view_pairs = set()
    for left, right in derivation.joins:
        a, b = ref(left, view_tables), ref(right, view_tables)
        if a is None or b is None:
            return None
        view_pairs.add(frozenset((a, b)))
    _, definition = view_definition(view)
    view_filters = (
        {_normal(c, view_tables, catalog) for c in split_and(definition.args["where"].this)}
        if definition.args.get("where")
        else set()
    )
    stored = layout(view, catalog)
    grouped: dict[Ref, str] = {}
    for output in derivation.outputs:
        if output.aggregate is None:
            found = ref(t.cast(exp.Column, output.expression), view_tables)
            if found is None:
                return None
            grouped[found] = output.name
    aggregates = {
        _aggregate_key(o.aggregate, o.expression, view_tables, catalog): o.name
        for o in derivation.outputs
        if o.aggregate is not None
    }

    # the query's conjuncts: its joins, the view's filters, and its own over grouping columns
    conjuncts = [
        c
        for join in tree.args.get("joins") or []
        if join.args.get("on") is not None
        for c in split_and(join.args["on"])
    ]
    if tree.args.get("where"):
        conjuncts += split_and(tree.args["where"].this)
    pairs, extra, seen_filters = set(), [], set()
    for conjunct in conjuncts:
        if (
            isinstance(conjunct, exp.EQ)
            and isinstance(conjunct.this, exp.Column)
            and isinstance(conjunct.expression, exp.Column)
        ):
            a, b = ref(conjunct.this, tables), ref(conjunct.expression, tables)
            if a is None or b is None:
                return None
            if a[0] != b[0]:
                pairs.add(frozenset((a, b)))
                continue
        normal = _normal(conjunct, tables, catalog)
        if normal in view_filters:
            seen_filters.add(normal)
            continue
        extra.append(conjunct)
    if pairs != view_pairs or seen_filters != view_filters:
        return None
    where = []
    for conjunct in extra:
        rewritten = filter_conjunct(conjunct, tables, grouped, catalog, parameter_keys or {})
        if rewritten is None:
            return None
        where.append(rewritten)
    placed = sum(1 for c in where for _ in c.find_all(exp.Placeholder))
    if placed != sum(1 for _ in tree.find_all(exp.Placeholder)):
        return None  # (a parameter anywhere but compared with a grouping column)

    # its grouping and its columns (DISTINCT over grouping columns: a grouping by them; over a
    # join view's columns: its rows' distinct values)
    group: list[str] = []
    distinct = tree.args.get("distinct") is not None
    if distinct and any(p.find(exp.AggFunc) is not None for p in tree.expressions):
        return None
    keys = tree.args["group"].expressions if tree.args.get("group") else []
    if distinct and not rows_only:
        keys = [p.this if isinstance(p, exp.Alias) else p for p in tree.expressions]
    for column in keys:
        found = ref(column, tables) if isinstance(column, exp.Column) else None
        if found is None or found not in grouped:
            return None
        if distinct and not _distinct_alike(found, catalog):
            return None
        group.append(grouped[found])
    if distinct and rows_only:
        for projection in tree.expressions:
            target = projection.this if isinstance(projection, exp.Alias) else projection
            found = ref(target, tables) if isinstance(target, exp.Column) else None
            if found is None or not _distinct_alike(found, catalog):
                return None
    # the query's groups are the view's rows when it groups as the view does (or neither
    # groups): the stored states are read as they are, with no GROUP BY
    merging = not rows_only and set(group) != set(grouped.values())
    source = _States(tables, catalog, aggregates, stored, not group, merging)
    projections: list[exp.Expr] = []
    outputs: list[Output] = []
    scales: dict[int, int] = {}
    names: list[str] = []
    for projection in tree.expressions:
        target = projection.this if isinstance(projection, exp.Alias) else projection
        names.append(projection.alias_or_name)
        if isinstance(target, exp.Column):
            found = ref(target, tables)
            if (
                found is None
                or found not in grouped
                or (not rows_only and grouped[found] not in group)
            ):
                return None
            scale = _scale(stored, grouped[found])
            if scale is not None:
                scales[len(outputs)] = scale
            outputs.append(len(projections))
            projections.append(exp.column(grouped[found], quoted=True))
            continue
        if isinstance(target, exp.Paren):
            target = target.unnest()
        if isinstance(target, _ARITHMETIC):  # (kept aggregates and numbers, one operation)
            arithmetic = _arithmetic(target, source)
            if arithmetic is None:
                return None
            made_columns, quotient, scale = arithmetic
            if isinstance(quotient, int):
                if scale is not None:
                    scales[len(outputs)] = scale
                outputs.append(len(projections))
            else:
                outputs.append(quotient(len(projections)))
            projections += made_columns
            continue
        counted = _counted_distinct(target, tables, grouped, catalog, merging)
        if counted is not None:
            outputs.append(len(projections))
            projections.append(counted)
            continue
        made = _merged(target, source)
        if made is None:
            return None
        aggregate, columns, scale = made
        if aggregate.final == "state":
            if scale is not None:
                scales[len(outputs)] = scale
            outputs.append(len(projections))
        else:  # (an average: its sum over its count, as PostgreSQL's avg divides them)
            outputs.append((aggregate.final, len(projections), len(projections) + 1, scale or 0, 0))
        projections += columns
    having = []
    if tree.args.get("having"):
        for conjunct in split_and(tree.args["having"].this):
            kept = _having(conjunct, source)
            if kept is None:
                return None
            having.append(kept)
    statement = exp.select(*projections).from_(exp.to_table(ident(view.name)))
    if distinct and rows_only:
        statement = statement.distinct()
    if not merging:  # (the groups are the view's rows: a condition on them is a WHERE)
        where += having
    if where:
        statement = statement.where(exp.and_(*where))
    if group and merging:
        statement = statement.group_by(*(exp.column(g, quoted=True) for g in group))
    if merging and having:
        statement = statement.having(exp.and_(*having))
    order = _order(tree, names, outputs)
    if order is False:
        return None
    if order:
        statement = statement.order_by(*t.cast(list[exp.Ordered], order))
    for arg in ("limit", "offset"):
        node = tree.args.get(arg)
        if node is not None:
            value = node.expression if isinstance(node, exp.Limit | exp.Offset) else node
            if not isinstance(value, exp.Literal) or value.is_string:
                return None
            statement.set(arg, node.copy())
    return DerivedMatch(view.name, statement.sql(dialect="duckdb"), tuple(outputs), scales)


def _unsupported(tree: exp.Select) -> bool:
    distinct = tree.args.get("distinct")
    if distinct is not None and (distinct.args.get("on") or tree.args.get("group")):
        return True  # (DISTINCT ON, or DISTINCT after a grouping)
    for arg in ("with_", "qualify", "windows", "into", "locks"):
        if tree.args.get(arg):
            return True
    if any(isinstance(n, exp.Select) for n in tree.walk() if n is not tree):
        return True
    if tree.find(exp.Window) is not None:
        return True
    return any(not isinstance(star.parent, exp.Count) for star in tree.find_all(exp.Star))


def _tables(tree: exp.Select) -> dict[str, str] | None:
    """The query's tables by alias (None: anything but tables joined by inner joins)."""
    source = tree.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table):
        return None
    found = {}
    items = [source.this]
    for join in tree.args.get("joins") or []:
        # (inner joins, and tables listed by commas or CROSS JOIN with their equalities in
        # the WHERE: the same rows)
        if (
            join.args.get("side")
            or join.args.get("kind") not in (None, "INNER", "CROSS")
            or join.args.get("using")
            or not isinstance(join.this, exp.Table)
        ):
            return None
        items.append(join.this)
    for table in items:
        if table.args.get("db") and folded(table.args["db"]) != "public":
            return None
        alias = folded(table.args["alias"].this) if table.args.get("alias") else folded(table)
        if alias in found:
            return None
        found[alias] = folded(table)
    return found


def _ref(column: exp.Column, aliases: t.Mapping[str, str], catalog: Catalog) -> Ref | None:
    """The (table, column) a column reference reads, by its qualifier or the one table of
    ``aliases`` that has it."""
    name = folded(column)
    if column.table:
        table = aliases.get(folded(column.args["table"]))
        found = catalog.table(table) if table is not None else None
        return (
            (table, name)
            if table is not None and found is not None and found.has_column(name)
            else None
        )
    having = [
        table
        for table in aliases.values()
        if (known := catalog.table(table)) is not None and known.has_column(name)
    ]
    return (having[0], name) if len(having) == 1 else None


def _normal(node: exp.Expr, aliases: t.Mapping[str, str], catalog: Catalog) -> str:
    """A conjunct's text with each column qualified by its table's name (so a view's
    conjunct and a query's compare alike whatever their aliases)."""
    unresolved = []

    def qualified(part: exp.Expr) -> exp.Expr:
        if not isinstance(part, exp.Column):
            return part
        found = _ref(part, aliases, catalog)
        if found is None:
            unresolved.append(part)
            return part
        return exp.column(found[1], table=found[0])

    text = node.copy().transform(qualified).sql(dialect="postgres")
    return f"unresolved:{text}" if unresolved else text


def _aggregate_key(
    kind: str | None, value: exp.Expr | None, aliases: t.Mapping[str, str], catalog: Catalog
) -> tuple[str, str]:
    return (t.cast(str, kind), "*" if value is None else _normal(value, aliases, catalog))


def _kept(
    target: exp.Expr,
    aliases: t.Mapping[str, str],
    catalog: Catalog,
    aggregates: t.Mapping[tuple[str, str], str],
) -> tuple[Aggregate, str] | None:
    """An aggregate of the query and the view's column keeping it, or None."""
    aggregate = aggregate_of(target)
    if aggregate is None:
        return None
    value = target.this
    if isinstance(value, exp.Distinct) or target.find(exp.Filter) is not None:
        return None
    name = aggregates.get(
        _aggregate_key(
            aggregate.name, None if isinstance(value, exp.Star) else value, aliases, catalog
        )
    )
    return None if name is None else (aggregate, name)


@dataclass(frozen=True)
class _States:
    """What a query's aggregates are made from: its tables (by alias), the view's kept
    aggregates (by function and argument) and stored states; whether the query has one group
    (none of its own), and whether its groups merge several of the view's."""

    aliases: t.Mapping[str, str]
    catalog: Catalog
    aggregates: t.Mapping[tuple[str, str], str]
    stored: Layout
    one_group: bool
    merging: bool


def _merged(
    target: exp.Expr, source: _States
) -> tuple[Aggregate, list[exp.Expr], int | None] | None:
    """How an aggregate of the query is made from the view's states: its entry, the DuckDB
    expressions (one per state its value is read from: an average's sum and count) and the
    display scale of its first. ``source.merging``: several of the view's groups make one of the
    query's (a floating-point sum added up in another order may differ in its last digits:
    not matched then)."""
    found = _kept(target, source.aliases, source.catalog, source.aggregates)
    if found is None:
        return None
    aggregate, name = found
    states = source.stored.outputs[name]
    if source.merging and any(
        state.merge is exp.Sum and _duckdb_type(source.stored, column) in ("FLOAT", "DOUBLE")
        for state, column in zip(aggregate.stored, states, strict=True)
    ):
        return None
    scale = _scale(source.stored, states[0])
    if not source.merging:  # (each of the query's groups is one of the view's rows: its states)
        return aggregate, [exp.column(n, quoted=True) for n in states], scale
    if aggregate.final != "state":  # (its states merged as they are: the converter divides)
        return (
            aggregate,
            [
                s.merge(this=exp.column(n, quoted=True))
                for s, n in zip(aggregate.stored, states, strict=True)
            ],
            scale,
        )
    (state,) = aggregate.stored
    merged: exp.Expr = state.merge(this=exp.column(name, quoted=True))
    if state.merge is not exp.Sum:  # (an extreme of extremes: the stored type and scale)
        return aggregate, [merged], scale
    if aggregate.zero_when_empty and source.one_group:  # (a count of no rows is 0)
        merged = exp.Coalesce(this=merged, expressions=[exp.Literal.number(0)])
    duck = _duckdb_type(source.stored, name)
    if duck == "BIGINT":  # (DuckDB sums bigints into a hugeint; PostgreSQL's is bigint)
        return aggregate, [exp.Cast(this=merged, to=exp.DataType.build("BIGINT"))], None
    if duck.startswith("DECIMAL"):  # (DuckDB widens a sum's precision; keep the scale)
        return aggregate, [exp.Cast(this=merged, to=exp.DataType.build(duck))], scale
    return aggregate, [merged], None


_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div)


def _arithmetic(
    target: exp.Expr, source: _States
) -> tuple[list[exp.Expr], int | t.Callable[[int], Output], int | None] | None:
    """An operation over kept numeric aggregates (a sum, minimum or maximum of numerics) and
    numeric or integer literals, at least one an aggregate: +, - and * computed by DuckDB,
    exact as PostgreSQL's numeric arithmetic, at its display scale (the larger operand scale;
    a product's, their sum); / as PostgreSQL divides numerics (`Output` "divide", an operand
    a count or an integer sum too). The DuckDB columns, the output (a column, or how a
    quotient is made from the index of its first column) and the display scale."""
    operands: list[tuple[exp.Expr, int, bool]] = []  # (DuckDB expression, scale, numeric)
    for written in (target.this, target.expression):
        side = written.unnest()
        if isinstance(side, exp.Literal) and not side.is_string:
            text = side.this
            if not text.replace(".", "", 1).isdigit() or "e" in text.lower():
                return None
            scale = len(text.split(".")[1]) if "." in text else 0
            operands.append((exp.Literal.number(text), scale, "." in text))
            continue
        found = _kept(side, source.aliases, source.catalog, source.aggregates)
        if found is None or found[0].final != "state":
            return None
        made = _merged(side, source)
        if made is None:
            return None
        pg_type = next(c.pg_type for c in source.stored.columns if c.name == found[1])
        kind = declared(pg_type)
        if kind.kind not in ("numeric", "integer") or (kind.kind == "integer" and kind.width == 2):
            return None
        operands.append((made[1][0], made[2] or 0, kind.kind == "numeric"))
    (left, left_scale, left_numeric), (right, right_scale, right_numeric) = operands
    aggregated = [isinstance(s.unnest(), exp.AggFunc) for s in (target.this, target.expression)]
    if not any(aggregated):
        return None
    if not (left_numeric or right_numeric):
        return None  # (integers: PostgreSQL's bigint arithmetic overflows where DuckDB's may not)
    if isinstance(target, exp.Mul) and all(aggregated):
        return None  # (a product of two sums may pass DuckDB's 38 digits, not PostgreSQL's)
    divisor = target.expression.unnest()
    if isinstance(target, exp.Div) and not (
        (isinstance(divisor, exp.Count) and isinstance(divisor.this, exp.Star))
        or (isinstance(divisor, exp.Literal) and decimal.Decimal(divisor.this) != 0)
    ):
        # (PostgreSQL divides every group before a LIMIT keeps some: a divisor that may be 0
        # raises there, and the cache divides only the rows DuckDB returns)
        return None
    if isinstance(target, exp.Div):
        return (
            [left, right],
            lambda at: ("divide", at, at + 1, left_scale, right_scale),
            None,
        )
    scale = (
        left_scale + right_scale if isinstance(target, exp.Mul) else max(left_scale, right_scale)
    )
    if scale > 38:
        return None
    computed = type(target)(this=left.copy(), expression=right.copy())
    return [exp.Cast(this=computed, to=exp.DataType.build(f"DECIMAL(38, {scale})"))], 0, scale


def _counted_distinct(
    target: exp.Expr,
    aliases: t.Mapping[str, str],
    grouped: t.Mapping[Ref, str],
    catalog: Catalog,
    merging: bool,
) -> exp.Expr | None:
    """count(DISTINCT g) of a grouping column of the view, over the view's groups a query
    group merges (each holds a row), as DuckDB counts it (a group alone: 1, 0 for a NULL g);
    None otherwise."""
    if not (isinstance(target, exp.Count) and isinstance(target.this, exp.Distinct)):
        return None
    values = target.this.expressions
    if len(values) != 1 or not isinstance(values[0], exp.Column):
        return None
    found = _ref(values[0], aliases, catalog)
    if found is None or found not in grouped or not _distinct_alike(found, catalog):
        return None
    column = exp.column(grouped[found], quoted=True)
    if not merging:
        return exp.Cast(
            this=exp.If(
                this=column.is_(exp.null()), true=exp.Literal.number(0), false=exp.Literal.number(1)
            ),
            to=exp.DataType.build("BIGINT"),
        )
    return exp.Count(this=exp.Distinct(expressions=[column]))


def _distinct_alike(found: Ref, catalog: Catalog) -> bool:
    """Whether DuckDB tells a column's values apart as PostgreSQL does (not floats, whose 0
    and -0 are one value printed either way; not text under a nondeterministic collation)."""
    table = catalog.table(found[0])
    assert table is not None
    column = next(c for c in table.columns if c.name == found[1])
    kind = declared(column.type)
    return kind.kind != "float" and (not kind.is_string or column.deterministic)


def _duckdb_type(stored: Layout, name: str) -> str:
    return next(c.duckdb_type for c in stored.columns if c.name == name)


def _scale(stored: Layout, name: str) -> int | None:
    """The display scale of every value of a stored numeric column (None: not a numeric;
    an integer's is 0)."""
    duck = _duckdb_type(stored, name)
    if duck.startswith("DECIMAL"):
        return int(duck.rstrip(")").split(",")[1])
    return 0 if duck in ("SMALLINT", "INTEGER", "BIGINT") else None


def filter_conjunct(
    conjunct: exp.Expr,
    aliases: t.Mapping[str, str],
    grouped: t.Mapping[Ref, str | exp.Expr],
    catalog: Catalog,
    keys: t.Mapping[int, Key],
) -> exp.Expr | None:
    """A conjunct comparing a column of ``grouped`` with constants, as DuckDB reads it as
    PostgreSQL does, over what ``grouped`` maps the column to (a name of the view's: a query's
    own conjunct over its grouping columns; an expression: a continuously maintained view's
    WHERE, `optimizer.derived.delta`), a parameter as the DuckDB parameter of its key; else
    None."""
    if not isinstance(conjunct, (exp.EQ, exp.NEQ, exp.In, *_RANGES)):
        return None
    column = conjunct.this
    if not isinstance(column, exp.Column):
        return None
    found = _ref(column, aliases, catalog)
    if found is None or found not in grouped:
        return None
    others = [v for k, v in conjunct.args.items() if k != "this" and v is not None]
    flat = [x for v in others for x in (v if isinstance(v, list) else [v])]
    table = catalog.table(found[0])
    assert table is not None  # (`_ref` found the column in it)
    column_info = next(c for c in table.columns if c.name == found[1])
    kind = declared(column_info.type)
    real = column_info.type == "real"
    if not flat or not all(_reads_alike(v, kind.kind, keys, real) for v in flat):
        return None
    if isinstance(conjunct, _RANGES) and not column_info.type.startswith(_ORDERED_TYPES):
        return None
    if kind.is_string and (isinstance(conjunct, _RANGES) or not column_info.deterministic):
        return None  # (an order, or equality under a collation, DuckDB does not share)
    copy = conjunct.copy()
    target = grouped[found]
    copy.set("this", exp.column(target, quoted=True) if isinstance(target, str) else target.copy())
    for mark in list(copy.find_all(exp.Placeholder)):
        mark.replace(exp.Placeholder(this=exp.to_identifier(duckdb_name(keys[mark.meta[NODE_ID]]))))
    if kind.kind == "char":  # (stored without its blank padding, which = ignores: so must
        for value in [v for k, v in copy.args.items() if k != "this"]:  # the values')
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, exp.Literal | exp.Placeholder):
                    item.replace(
                        exp.Anonymous(
                            this="RTRIM", expressions=[item.copy(), exp.Literal.string(" ")]
                        )
                    )
    return copy


def _having(conjunct: exp.Expr, source: _States) -> exp.Expr | None:
    """A HAVING conjunct comparing an aggregate the view keeps with constants of its type,
    over the merged states (an average as PostgreSQL divides its sum by its count, by the
    cache's function DuckDB calls)."""
    if not isinstance(conjunct, (exp.EQ, exp.NEQ, *_RANGES)):
        return None
    target: exp.Expr = conjunct.this
    found = _kept(target, source.aliases, source.catalog, source.aggregates)
    if found is None:
        return None
    made = _merged(target, source)
    if made is None:
        return None
    pg_type = next(
        c.pg_type for c in source.stored.columns if c.name == source.stored.outputs[found[1]][0]
    )
    kind = declared(pg_type).kind  # (a count's: bigint's, integer)
    value = made[1][0]
    if found[0].final == "avg":
        if kind not in ("integer", "numeric"):
            return None
        kind = "numeric"
        total, count = made[1]
        value = exp.Case(
            ifs=[
                exp.If(
                    this=exp.EQ(this=count.copy(), expression=exp.Literal.number(0)),
                    true=exp.null(),
                )
            ],
            default=exp.Cast(
                this=exp.Anonymous(
                    this=NUMERIC_DIVIDE,
                    expressions=[
                        exp.Cast(this=total.copy(), to=exp.DataType.build("VARCHAR")),
                        exp.Literal.number(made[2] or 0),
                        exp.Cast(this=count.copy(), to=exp.DataType.build("VARCHAR")),
                        exp.Literal.number(0),
                    ],
                ),
                to=exp.DataType.build(f"DECIMAL(38, {DIVISION_SCALE})"),
            ),
        )
    if kind not in ("integer", "numeric", "float", "date"):
        return None  # (text ordered by a collation DuckDB does not share, ...)
    values = [v for k, v in conjunct.args.items() if k != "this" and v is not None]
    if not all(_reads_alike(v, kind, {}, pg_type == "real") for v in values):
        return None
    copy = conjunct.copy()
    copy.set("this", value)
    return copy


def _reads_alike(value: exp.Expr, kind: str, keys: t.Mapping[int, Key], real: bool = False) -> bool:
    """Whether DuckDB compares a grouping column of this kind with ``value`` as PostgreSQL
    does: a literal of the column's own kind (a date's or timestamp's text as DuckDB reads
    it too), NULL, or a parameter (its reading is checked per execution)."""
    if isinstance(value, exp.Placeholder):
        return NODE_ID in value.meta and value.meta[NODE_ID] in keys
    if isinstance(value, exp.Null):
        return True
    if isinstance(value, exp.Add | exp.Sub) and isinstance(value.expression, exp.Interval):
        # a date or timestamp constant moved by whole days, weeks, months or years: both
        # compute a timestamp (`date '1998-12-01' - interval '90 days'`, TPC-H Q1's)
        interval = value.expression
        unit = interval.args.get("unit")
        amount = interval.this
        return (
            kind in ("date", "timestamp")
            and unit is not None
            and unit.name.upper().rstrip("S") in ("DAY", "WEEK", "MONTH", "YEAR")
            and isinstance(amount, exp.Literal)
            and amount.this.isdigit()
            and _reads_alike(value.this, kind, keys, real)
        )
    if isinstance(value, exp.Neg):
        value = value.this
    if isinstance(value, exp.Cast) and isinstance(value.this, exp.Literal):
        return (
            kind in ("date", "timestamp", "timestamptz")
            and declared(value.to.sql(dialect="postgres")).kind == kind
        )
    if not isinstance(value, exp.Literal):
        return False
    if value.is_string:
        if kind in ("char", "varchar", "text"):
            return True
        return kind in ("date", "timestamp") and reads_alike(kind, value.this)
    if kind == "integer":
        return value.this.isdigit()
    digits = value.this.replace(".", "", 1)
    if not digits.isdigit() or len(digits) > 38:
        return False  # (DuckDB reads 1e-3, and more than 38 digits, as a DOUBLE)
    if real:  # (PostgreSQL compares a real with a numeric as doubles, DuckDB as reals)
        return value.this.isdigit() and len(digits) <= 7
    return kind in ("numeric", "float")


def _order(
    tree: exp.Select, names: list[str], outputs: list[Output]
) -> list[exp.Expr] | t.Literal[False]:
    """The ORDER BY over the statement's columns: by an output's name or position (of a
    column DuckDB returns as it is; an average is ordered by no rule here), or False."""
    order = tree.args.get("order")
    if order is None:
        return []
    written = [(p.this if isinstance(p, exp.Alias) else p).sql() for p in tree.expressions]
    found: list[exp.Expr] = []
    for item in order.expressions:
        key = item.this
        if isinstance(key, exp.Literal) and not key.is_string:
            index = int(key.this) - 1
        elif isinstance(key, exp.Column) and not key.table and folded(key) in names:
            index = names.index(folded(key))
        elif key.sql() in written:  # (an output's expression as the select list writes it)
            index = written.index(key.sql())
        else:
            return False
        if not 0 <= index < len(outputs) or not isinstance(outputs[index], int):
            return False
        copy = item.copy()
        copy.set("this", exp.Literal.number(t.cast(int, outputs[index]) + 1))
        found.append(copy)
    return found


__all__ = ["DerivedMatch", "filter_conjunct", "match_derived"]
