"""The statement DuckDB runs for a guarded plan once its guards have chosen: the
query without extensions, in DuckDB's dialect, each table reference rebound to the cached view
its SwitchUnion chose or to its remote leaf's rows (registered under a name of their own), and
its placeholders as DuckDB named parameters. Pure: the executor compiles it once per choice.
"""

from __future__ import annotations

import typing as t
from collections.abc import Mapping

import sqlglot
from sqlglot import exp

from optimizer.plan import LocalStatement, Output, Plan, ScaleOf
from optimizer.postgres.allowlist import BY_NAME, ZONE_PARAMETER
from optimizer.postgres.divisions import SPREADS, spread_operands
from optimizer.postgres.semantics import Semantics
from sql_ext.dialect import LocalDuckDB
from sql_ext.nodes import ConstantList, strip_extensions
from sql_ext.params import NODE_ID, duckdb_name


def leaf_name(instance_id: int) -> str:
    return f"mtcache_leaf_{instance_id}"


def local_statement(plan: Plan, choice: Mapping[int, str | None]) -> LocalStatement:
    """The statement for a choice: instance id -> the cached view read (None: the leaf)."""
    analysis = plan.analysis
    copy = strip_extensions(analysis.query.tree)  # (with parameters, %% was read as %)
    _add_derived_scales(copy, analysis.derived_scales)
    _add_values_scales(copy, analysis.values_scales)
    scale_columns = _add_scale_columns(copy, analysis)
    _divide_inside(copy, analysis.inner_divisions)
    _print_at_scales(copy, analysis.semantics.printed_scales)
    by_id: dict[int, list[exp.Expr]] = {}
    for node in copy.walk():
        if NODE_ID in node.meta:
            by_id.setdefault(node.meta[NODE_ID], []).append(node)
    leaves = []
    for access in plan.accesses:
        view = choice.get(access.instance.id)
        if view is None:
            target = leaf_name(access.instance.id)
            leaves.append((target, access.leaf))
        else:
            target = view
        for node in by_id[access.access.node.meta[NODE_ID]]:
            node.replace(
                exp.Table(
                    this=exp.to_identifier(target),
                    alias=exp.TableAlias(this=exp.to_identifier(access.alias)),
                )
            )
    _compute_as_postgres(by_id, analysis.semantics)
    for index in analysis.semantics.printed_intervals:
        for branch in _branches(copy):
            projection = branch.expressions[index]
            inner = projection.this if isinstance(projection, exp.Alias) else projection
            _wrap(inner, lambda n: _as_type(n, "VARCHAR"))
    for mark in list(copy.find_all(exp.Placeholder)):
        if NODE_ID not in mark.meta:
            continue  # a parameter of the cache's own (the session's time zone)
        key = analysis.parameter_keys[mark.meta[NODE_ID]]
        mark.replace(exp.Placeholder(this=exp.to_identifier(duckdb_name(key))))
    lists = _bind_lists(copy)
    outputs = (
        _outputs(copy, analysis, scale_columns) if analysis.divisions or scale_columns else None
    )
    keys = analysis.keys
    # (before the SQL is made: making it rearranges some nodes, string_agg's ORDER BY value)
    zone = any(m.name == ZONE_PARAMETER for m in copy.find_all(exp.Placeholder))
    sql = copy.sql(dialect=LocalDuckDB, copy=False)  # our own copy
    typed = tuple(
        sorted(
            {
                (analysis.parameter_keys[n], kind)
                for n, kind in analysis.semantics.parameters.items()
            },
            key=str,
        )
    )
    return LocalStatement(
        sql, keys, tuple(map(duckdb_name, keys)), tuple(leaves), outputs, typed, zone, lists
    )


def _bind_lists(copy: exp.Expr) -> tuple[tuple[str, list[int] | list[str]], ...]:
    """Each long constant list as a DuckDB parameter, read by ``x IN (SELECT unnest($list))``:
    the same answer as the list written out (its constants are never NULL), without DuckDB
    parsing megabytes of SQL. Its values are those PostgreSQL reads
    (`optimizer.postgres.semantics` lets only integers meet integers and strings meet text)."""
    lists: list[tuple[str, list[int] | list[str]]] = []
    for node in list(copy.find_all(ConstantList)):
        in_list = node.parent
        assert isinstance(in_list, exp.In) and in_list.expressions == [node]
        name = f"mtcache_list_{len(lists)}"
        element = "VARCHAR" if node.is_string else "BIGINT"
        query = sqlglot.parse_one(f"SELECT unnest(CAST(${name} AS {element}[]))", read="duckdb")
        in_list.set("expressions", None)
        in_list.set("query", exp.Subquery(this=query))
        lists.append((name, node.python_values()))
    return tuple(lists)


def _add_derived_scales(
    copy: exp.Expr, wanted: Mapping[int, tuple[tuple[str, exp.Expr], ...]]
) -> None:
    """The scale columns derived tables' bodies get
    (optimizer.postgres.numeric_scales.DerivedScales), before the rewrites: their expressions
    are rewritten like the values'."""
    if not wanted:
        return
    for select in [n for n in copy.walk() if isinstance(n, exp.Select)]:
        for name, scale in wanted.get(select.meta.get(NODE_ID, -1), ()):
            select.set("expressions", [*select.expressions, exp.alias_(scale.copy(), name)])


def _add_values_scales(
    copy: exp.Expr, wanted: Mapping[int, tuple[tuple[str, tuple[int, ...]], ...]]
) -> None:
    """The scale columns VALUES lists get (DerivedScales.values): a literal per row, and the
    column's name in the list's alias."""
    if not wanted:
        return
    for values in [n for n in copy.walk() if isinstance(n, exp.Values)]:
        for name, scales in wanted.get(values.meta.get(NODE_ID, -1), ()):
            for row, scale in zip(values.expressions, scales, strict=True):
                row.set("expressions", [*row.expressions, exp.Literal.number(scale)])
            alias = values.args["alias"]
            alias.set("columns", [*alias.columns, exp.to_identifier(name)])


def _print_at_scales(copy: exp.Expr, printed: Mapping[int, tuple[exp.Expr, int]]) -> None:
    """Each numeric printed as text whose values' display scales vary, as PostgreSQL prints
    it: DuckDB's text of it at the largest scale any value may have, cut to the value's own
    (its digits beyond are zeros; at scale 0 the point goes too). Before the rewrites: the
    value and its scale's expression are rewritten like any other part."""
    if not printed:
        return
    for node in [n for n in copy.walk() if n.meta.get(NODE_ID) in printed]:
        scale, bound = printed[node.meta[NODE_ID]]
        text = exp.cast(exp.cast(node.copy(), f"DECIMAL(38, {bound})"), "VARCHAR")
        point = exp.Case(
            ifs=[
                exp.If(
                    this=exp.EQ(this=scale.copy(), expression=exp.Literal.number(0)),
                    true=exp.Literal.number(1 if bound else 0),
                )
            ],
            default=exp.Literal.number(0),
        )
        cut = exp.Add(
            this=exp.Sub(this=exp.Literal.number(bound), expression=scale.copy()),
            expression=point,
        )
        end = exp.Sub(this=exp.Neg(this=exp.Paren(this=cut)), expression=exp.Literal.number(1))
        node.replace(
            exp.Bracket(
                this=text, expressions=[exp.Slice(this=exp.Literal.number(1), expression=end)]
            )
        )


def _divide_inside(copy: exp.Expr, divisions: Mapping[int, exp.Expr]) -> None:
    """Each division inside the statement as PostgreSQL's (optimizer.postgres.divisions), before the
    rewrites: its operands are rewritten like any other part."""
    while divisions:  # again for divisions inside the operands just put in
        found = [
            n for n in copy.walk() if n.meta.get(NODE_ID) in divisions and not n.meta.get(_DIVIDED)
        ]
        if not found:
            return
        for node in found:
            replacement = divisions[node.meta[NODE_ID]].copy()
            replacement.meta.update({NODE_ID: node.meta[NODE_ID], _DIVIDED: True})
            node.replace(replacement)


_DIVIDED = "mt_divided"  # meta of a division already put in as PostgreSQL's


def _add_scale_columns(copy: exp.Expr, analysis: t.Any) -> dict[t.Any, int]:
    """Append a projection computing the display scale of each value where it varies (of an
    output, or of a numerator or denominator the cache divides), before the rewrites: the
    scale is computed from the same, rewritten, branches as the value. The key -> the
    projection's index: an output index, or (output index, 0 | 1) for a division's operand."""
    wanted: dict[t.Any, exp.Expr] = {}
    for index, scale in analysis.semantics.scale_columns.items():
        wanted[index] = scale
    for index, scales in analysis.division_scales.items():
        for side, scale in enumerate(scales):
            if isinstance(scale, exp.Expr):
                wanted[(index, side)] = scale
    if not wanted:
        return {}
    if not isinstance(copy, exp.Select):
        # a UNION ALL: each branch gets its own scale column (optimizer.postgres.semantics
        # gives a tuple of them, in the branches' order)
        branches = _branches(copy)
        found: dict[t.Any, int] = {}
        for key, scale in wanted.items():
            assert isinstance(scale, exp.Tuple) and len(scale.expressions) == len(branches)
            for branch, part in zip(branches, scale.expressions, strict=True):
                name = f"mtcache_scale_{len(found) + 1}"
                branch.set("expressions", [*branch.expressions, exp.alias_(part.copy(), name)])
            found[key] = len(branches[0].expressions) - 1
        return found
    found = {}
    projections = list(copy.expressions)
    for key, scale in wanted.items():
        found[key] = len(projections)
        projections.append(exp.alias_(scale.copy(), f"mtcache_scale_{len(found)}"))
    copy.set("expressions", projections)
    return found


def _outputs(
    select: exp.Expr, analysis: t.Any, scale_columns: dict[t.Any, int]
) -> tuple[Output, ...]:
    """Each output average or division becomes its numerator and denominator (sum and count
    for an average), which DuckDB computes exactly, and the cache divides; a
    numeric whose scale varies is given its scale column. Scale columns were appended last;
    they move after the numerators and denominators."""
    count = len(analysis.query.tree.selects)
    if not isinstance(select, exp.Select):  # a UNION ALL whose outputs' scales vary
        return tuple(
            ("scaled", index, scale_columns[index]) if index in scale_columns else index
            for index in range(count)
        )
    divisions = analysis.divisions
    originals, scales = select.expressions[:count], select.expressions[count:]
    projections: list[exp.Expr] = []
    outputs: list[t.Any] = []
    for index, projection in enumerate(originals):
        kind = divisions.get(index)
        if kind is None:
            outputs.append(len(projections))
            projections.append(projection)
            continue
        node = projection.this if isinstance(projection, exp.Alias) else projection
        if kind == "avg":
            numerator: exp.Expr = exp.Sum(this=node.this.copy())
            denominator: exp.Expr = exp.Count(this=node.this.copy())
        elif kind in SPREADS.values():
            numerator, denominator = spread_operands(node, analysis.spread_scales[index], kind)
        else:
            numerator, denominator = node.this.copy(), node.expression.copy()
        outputs.append((kind, len(projections), len(projections) + 1))
        projections += [
            exp.alias_(numerator, f"mtcache_numerator_{index}"),
            exp.alias_(denominator, f"mtcache_denominator_{index}"),
        ]
    moved = len(projections) - count  # scale columns shift by the extra division columns

    def scale_of(key: t.Any, static: t.Any) -> ScaleOf:
        return ("column", scale_columns[key] + moved) if key in scale_columns else static

    for index, output in enumerate(outputs):
        if isinstance(output, tuple):
            kind, top, bottom = output
            static = analysis.division_scales.get(index, (0, 0))
            outputs[index] = (
                kind,
                top,
                bottom,
                scale_of((index, 0), static[0]),
                scale_of((index, 1), static[1]),
            )
        elif index in scale_columns:
            outputs[index] = ("scaled", output, scale_columns[index] + moved)
    select.set("expressions", projections + scales)
    return tuple(outputs)


def _compute_as_postgres(by_id: Mapping[int, list[exp.Expr]], semantics: Semantics) -> None:
    """The rewrites that make DuckDB compute what PostgreSQL computes
    (optimizer.postgres.semantics). First the wrappers around single nodes, each keeping the
    node itself (not a copy), so the rewrites of nodes inside it still apply; then the
    allowlist's rewrites, innermost first, each over its rewritten arguments (a copy it makes
    holds them all)."""

    def each(numbers: t.Iterable[int]) -> t.Iterator[tuple[int, exp.Expr]]:
        for number in numbers:
            for node in by_id.get(number, ()):
                yield number, node

    for _, node in each(semantics.constant_reads):
        _wrap(node, lambda n: exp.Subquery(this=exp.Select(expressions=[n])))
    for _, node in each(semantics.rtrim):
        # char(n) is stored without its trailing blanks: so are what it is compared with
        _wrap(node, lambda n: exp.Anonymous(this="RTRIM", expressions=[n, exp.Literal.string(" ")]))
    for number, node in each(semantics.rpad):
        # ... but patterns and printing see them: pad the value again for those
        _wrap(
            node,
            lambda n, w=semantics.rpad[number]: exp.Anonymous(  # type: ignore[misc]
                this="RPAD", expressions=[n, exp.Literal.number(w), exp.Literal.string(" ")]
            ),
        )
    for number, node in each(semantics.decimal_scales):
        digits = semantics.decimal_digits.get(number, 38)
        scale = semantics.decimal_scales[number]
        node.set("to", exp.DataType.build(f"DECIMAL({digits}, {scale})"))
    for _, node in each(semantics.doubles):
        _wrap(node, lambda n: _as_type(n, "DOUBLE"))
    for number, node in each(semantics.exact_numbers):
        exact = sqlglot.parse_one(semantics.exact_numbers[number], read="duckdb")
        exact.meta.update(node.meta)
        node.replace(exact)
    for number, node in each(semantics.text_scales):
        # a numeric printed as text shows PostgreSQL's display scale
        _wrap(
            node,
            lambda n, s=semantics.text_scales[number]: _as_type(  # type: ignore[misc]
                n, f"DECIMAL(38, {s})"
            ),
        )
    zone = exp.Placeholder(this=exp.to_identifier(ZONE_PARAMETER))
    for _, node in each(semantics.zoned):
        _wrap(
            node,
            lambda n: exp.Anonymous(
                this="timezone", expressions=[zone.copy(), _as_type(n, "TIMESTAMP")]
            ),
        )
    for _, node in each(semantics.localized):
        _wrap(node, lambda n: exp.Anonymous(this="timezone", expressions=[zone.copy(), n]))
    for number, node in each(semantics.widen):
        # numerics of several scales in one column: one type DuckDB combines without rounding
        _wrap(
            node,
            lambda n, s=semantics.widen[number]: _as_type(  # type: ignore[misc]
                n, f"DECIMAL(38, {s})"
            ),
        )
    rewritten = sorted(each(semantics.rewrites), key=lambda found: -_depth(found[1]))
    for number, node in rewritten:
        rewrite = BY_NAME[semantics.rewrites[number]].rewrite
        assert rewrite is not None
        _wrap(node, rewrite)


def _branches(query: exp.Expr) -> list[exp.Select]:
    """The SELECT blocks whose rows a query expression returns (each branch of a UNION)."""
    if isinstance(query, exp.SetOperation):
        return _branches(query.this) + _branches(query.expression)
    if isinstance(query, exp.Subquery):
        return _branches(query.this)
    return [query] if isinstance(query, exp.Select) else []


def _depth(node: exp.Expr) -> int:
    depth = 0
    while node.parent is not None:
        node, depth = node.parent, depth + 1
    return depth


def _as_type(node: exp.Expr, name: str) -> exp.Expr:
    """``CAST(node AS name)`` over the node itself (`_wrap`: sqlglot's ``exp.cast`` copies)."""
    return exp.Cast(this=node, to=exp.DataType.build(name))


def _wrap(node: exp.Expr, make: t.Callable[[exp.Expr], exp.Expr]) -> None:
    """Put ``make(node)`` where ``node`` is (``make`` must not copy ``node``: sqlglot's
    ``exp.cast`` and ``exp.func`` do, and a copy would lose the rewrites still to come inside
    it)."""
    hole = exp.Null()
    node.replace(hole)
    hole.replace(make(node))
