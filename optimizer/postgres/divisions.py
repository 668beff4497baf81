"""Divisions DuckDB cannot do as PostgreSQL does. PostgreSQL divides numerics with
a result scale of its own (`optimizer.postgres.numeric`), and `avg` of integers or numerics is
such a division; DuckDB answers them as doubles. Integer division is alike in both (DuckDB is
set to truncate). So:

* a division whose operands are all integers, or doubles and integers, stays in DuckDB;
* one that is a whole output column of the outermost SELECT is computed by the cache: DuckDB
  returns its exact numerator and denominator (sum and count for an average), the cache
  divides as PostgreSQL does (`rewritable`);
* any other (in WHERE, HAVING, a subquery, inside a larger expression, under ORDER BY or
  DISTINCT, over a window) DuckDB computes with the cache's own function, PostgreSQL's
  division given the operands' display scales (`optimizer.postgres.allowlist.numeric_division`);
* variance and standard deviation of integers and numerics of one scale, as a whole output
  column, are computed by the cache too: DuckDB returns the exact ``N * sum(x*x) - sum(x)^2``
  and ``N * (N - 1)`` (``N * N`` for the population's), the cache divides them as PostgreSQL
  does and takes the square root of the rounded variance (`optimizer.postgres.numeric.spread`);
  anywhere else DuckDB computes it with the cache's own function of the same two; over
  doubles, over a window, and correlation keep the statement remote.
"""

from __future__ import annotations

import typing as t

from sqlglot import exp

from optimizer.postgres.expression_types import ExpressionTypes
from sql_ext import Query
from sql_ext.params import NODE_ID

Kind = t.Literal["avg", "divide", "var_samp", "var_pop", "stddev_samp", "stddev_pop"]
# the statistics the cache computes from exact sums, by their kind
SPREADS: dict[type[exp.Expr], Kind] = {
    exp.Stddev: "stddev_samp",
    exp.StddevSamp: "stddev_samp",
    exp.StddevPop: "stddev_pop",
    exp.Variance: "var_samp",
    exp.VariancePop: "var_pop",
}
_STATISTICS = (
    exp.Stddev,
    exp.StddevPop,
    exp.StddevSamp,
    exp.Variance,
    exp.VariancePop,
    exp.Corr,
    exp.CovarPop,
    exp.CovarSamp,
)


def analyze_divisions(
    query: Query, types: ExpressionTypes
) -> tuple[dict[int, Kind], dict[int, Kind], str | None]:
    """(output column index -> "avg" | "divide" for the divisions the cache does itself, node
    number -> "avg" | "divide" for those DuckDB does with the cache's function
    (`optimizer.postgres.allowlist.numeric_division`), why the statement cannot run locally or
    None)."""
    outputs: dict[int, Kind] = {}
    inner: dict[int, Kind] = {}
    rewritable = _rewritable_outputs(query)
    for node in query.tree.find_all(exp.Div, exp.Avg, *_STATISTICS):
        if isinstance(node, _STATISTICS):
            spread = SPREADS.get(type(node))
            if spread is None or isinstance(node.parent, exp.Window):
                return outputs, inner, f"it computes {node.key} (over a window: not followed)"
            index = rewritable.get(id(node))
            if index is None:
                inner[node.meta[NODE_ID]] = spread  # by the cache's own function
            else:
                outputs[index] = spread
            continue
        if types.block_of(node) is None:
            continue
        if isinstance(node, exp.Div):
            kinds = {types.of(node.this).kind, types.of(node.expression).kind}
            if kinds <= {"integer", "null"}:
                continue  # integer / integer truncates in both engines
            if "float" in kinds:
                continue  # a division of doubles, IEEE's in both engines
        elif types.of(node.this).kind not in ("integer", "numeric", "null"):
            continue  # an average of doubles: the allowlist keeps it remote
        kind: Kind = "avg" if isinstance(node, exp.Avg) else "divide"
        index = rewritable.get(id(node))
        if index is None:
            inner[node.meta[NODE_ID]] = kind
        else:
            outputs[index] = kind
    return outputs, inner, None


def _rewritable_outputs(query: Query) -> dict[int, int]:
    """id(node) -> output index, for divisions and averages that make a whole output column
    of the outermost SELECT, where the cache can divide: not under DISTINCT, not ordered by,
    not a window function."""
    top = query.tree
    if not isinstance(top, exp.Select) or top.args.get("distinct"):
        return {}
    found = {}
    for index, projection in enumerate(top.expressions):
        node = projection.this if isinstance(projection, exp.Alias) else projection
        if isinstance(node, (exp.Avg, exp.Div, *SPREADS)) and not _ordered_by(
            top, index, projection
        ):
            found[id(node)] = index
    return found


def spread_operands(node: exp.Expr, scale: int, kind: str) -> tuple[exp.Expr, exp.Expr]:
    """The exact numerator and denominator of a variance (`SPREADS`) over values of display
    scale ``scale``: ``N * sum(x*x) - sum(x) * sum(x)`` and ``N * (N - 1)``, or ``N * N`` for
    the population's, as PostgreSQL's numeric_stddev_internal has them."""
    value = exp.Cast(this=node.this.copy(), to=exp.DataType.build(f"DECIMAL(38, {scale})"))
    count = exp.Count(this=node.this.copy())
    square = exp.Sum(this=exp.Mul(this=value.copy(), expression=value.copy()))
    total = exp.Sum(this=value)
    numerator = exp.Sub(
        this=exp.Mul(this=count.copy(), expression=square),
        expression=exp.Mul(this=total.copy(), expression=total),
    )
    other = (
        exp.Paren(this=exp.Sub(this=count.copy(), expression=exp.Literal.number(1)))
        if kind.endswith("_samp")
        else count.copy()
    )
    return numerator, exp.Mul(this=count, expression=other)


def _ordered_by(top: exp.Select, index: int, projection: exp.Expr) -> bool:
    order = top.args.get("order")
    if order is None:
        return False
    inner = projection.this if isinstance(projection, exp.Alias) else projection
    for ordered in order.expressions:
        key = ordered.this
        if isinstance(key, exp.Literal) and key.is_int and int(key.this) == index + 1:
            return True
        if isinstance(key, exp.Column) and not key.table and key.name == projection.alias_or_name:
            return True
        if key == inner:
            return True
    return False
