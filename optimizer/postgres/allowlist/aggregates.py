"""Aggregate functions: count, sum, avg, min / max, bool_and / bool_or / every and an ordered
string_agg or array_agg."""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from optimizer.postgres.allowlist.base import Call, Family, Result, _string_literal, _strings, _text
from optimizer.postgres.types import BOOL, INT4, INT8, PgType

FAMILY = Family()
entry = FAMILY.entry


def _count(call: Call) -> Result:
    return INT8


entry(
    "count",
    exp.Count,
    _count,
    proofs=(
        "SELECT count(*), count(e.c), count(DISTINCT e.c) FROM edge e",
        "SELECT e.b, count(e.i4) FROM edge e GROUP BY e.b",
        # FILTER (WHERE ...): folded into the aggregate (optimizer.postgres.folds)
        "SELECT count(*) FILTER (WHERE e.i4 > 0), count(e.c) FILTER (WHERE e.b), "
        "count(DISTINCT e.c1) FILTER (WHERE e.i4 IS NOT NULL) FROM edge e WHERE e.id > 0",
        "SELECT e.b, count(*) FILTER (WHERE e.n < 0) FROM edge e WHERE e.id > 0 GROUP BY e.b "
        "HAVING count(*) FILTER (WHERE e.i4 IS NULL) = 0",
    ),
)


def _sum(call: Call) -> Result:
    inner = call.type()
    if inner.kind == "integer":
        return INT8 if (inner.width or 8) < 8 else PgType("numeric", scale=0)
    if inner.kind == "numeric":
        return inner
    if inner.kind == "float":
        return (
            "it sums floating-point values (the order of additions changes the result's last bits)"
        )
    return f"it sums {inner.kind} values"


entry(
    "sum",
    exp.Sum,
    _sum,
    proofs=(
        "SELECT sum(e.i4), sum(e.i2), sum(e.n), sum(e.n4) FROM edge e",
        "SELECT sum(e.i8) FROM edge e WHERE e.i8 > 0",
        "SELECT e.b, sum(CASE WHEN e.i4 > 0 THEN e.n ELSE 0 END) FROM edge e GROUP BY e.b",
        "SELECT sum(e.n) FROM edge e WHERE e.id < 0",
        "SELECT e.b, sum(e.n) FILTER (WHERE e.i4 > 0), sum(e.i4) FILTER (WHERE e.n IS NULL), "
        "sum(e.n4) FILTER (WHERE false) FROM edge e WHERE e.id > 0 GROUP BY e.b",
        "sum(e.n) FILTER (WHERE e.i4 <> 0) OVER (PARTITION BY e.b)",
        "SELECT e.b, sum(e.n) FILTER (WHERE EXISTS (SELECT 1 FROM edge x WHERE x.i2 > e.i2)), "
        "sum(e.i4) FILTER (WHERE e.i4 IN (SELECT x.i2 FROM edge x)) FROM edge e GROUP BY e.b",
    ),
)


def _avg(call: Call) -> Result:
    inner = call.type()
    if inner.kind in ("integer", "numeric"):
        return PgType("numeric")  # divided by the cache (optimizer.postgres.divisions)
    return f"it averages {inner.kind} values"


entry(
    "avg",
    exp.Avg,
    _avg,
    proofs=(
        "SELECT avg(e.i4), avg(e.n), avg(e.n4), avg(e.i8) FROM edge e",
        "SELECT e.b, avg(e.n0) FROM edge e GROUP BY e.b",
        "SELECT avg(CASE WHEN e.i4 > 0 THEN e.n ELSE 0 END) FROM edge e",
        "SELECT e.b, avg(e.n) + 1, avg(e.i4) * 2 FROM edge e GROUP BY e.b",
        "SELECT e.b FROM edge e GROUP BY e.b HAVING avg(e.n4) > 0",
        "(SELECT avg(x.n) FROM edge x WHERE x.id <> e.id)",
        "avg(e.n) OVER (PARTITION BY e.b)",
        "avg(e.i2) OVER (ORDER BY e.id)",
        "SELECT count(*) FROM (SELECT avg(e.n4) AS a FROM edge e GROUP BY e.b) d WHERE d.a > 0",
        "SELECT d.a FROM (SELECT avg(e.n4) AS a FROM edge e GROUP BY e.b) d",
        "SELECT sum(d.a) FROM (SELECT e.b, avg(e.n) AS a FROM edge e GROUP BY e.b) d",
        "SELECT w.a, w.a + 1 FROM (SELECT e.b, avg(e.i4) AS a FROM edge e GROUP BY e.b) w",
        "SELECT avg(e.n4) FILTER (WHERE e.i4 < 0), avg(e.i8) FILTER (WHERE e.b), "
        "avg(e.n) FILTER (WHERE e.c IS NULL) FROM edge e WHERE e.id > 0",
        "SELECT e.b, avg(e.n) FILTER (WHERE e.i4 > 0) FROM edge e WHERE e.id > 0 GROUP BY e.b",
        "SELECT e.b, avg(e.n)::text, concat(avg(e.i4), '!'), (sum(e.n4) / 7)::varchar "
        "FROM edge e GROUP BY e.b",
    ),
)


def _spread(call: Call) -> Result:
    inner = call.type()
    if isinstance(call.node.this, exp.Distinct):
        return f"it computes {call.node.key} of DISTINCT values"
    if inner.kind in ("integer", "numeric"):
        # computed by the cache from exact sums (optimizer.postgres.divisions), at the
        # largest scale of the values where it varies (or at the backend, where the cache
        # cannot follow it)
        return PgType("numeric")
    if inner.kind == "float":
        return (
            f"it computes {call.node.key} of double precision values (PostgreSQL's running "
            "sums of doubles depend on the order of the rows)"
        )
    return f"it computes {call.node.key} of {inner.kind} values"


entry(
    "stddev / stddev_samp / stddev_pop / variance / var_samp / var_pop",
    (exp.Stddev, exp.StddevSamp, exp.StddevPop, exp.Variance, exp.VariancePop),
    _spread,
    proofs=(
        "SELECT stddev(e.n), variance(e.i4), var_pop(e.n4), stddev_pop(e.i2), "
        "var_samp(e.n0), stddev_samp(e.i8) FROM edge e",
        "SELECT e.b, stddev(e.n4), variance(e.i2), var_pop(e.n) FROM edge e GROUP BY e.b",
        "SELECT stddev(e.n), var_pop(e.n), variance(e.i4) FROM edge e WHERE e.id = 3",
        "SELECT stddev(e.n), variance(e.n4) FROM edge e WHERE e.id < 0",
        "SELECT stddev(e.n0 * 1000), variance(e.n * 3), stddev_pop(e.i4 - 1) FROM edge e",
        "SELECT e.b, stddev(e.i2) FILTER (WHERE e.i4 > 0) FROM edge e WHERE e.id > 0 GROUP BY e.b",
        "SELECT e.b, round(stddev(e.n), 2), variance(e.i4) + 1, stddev_pop(e.n4)::text "
        "FROM edge e GROUP BY e.b ORDER BY var_pop(e.i2), e.b",
        "SELECT d.b, d.s, d.s * 2 FROM (SELECT e.b, stddev(e.n4) AS s FROM edge e GROUP BY e.b) d",
        "SELECT e.b FROM edge e GROUP BY e.b HAVING variance(e.n) > 1",
        # values of several scales: PostgreSQL's sums keep the largest
        "SELECT e.b, stddev(CASE WHEN e.i4 > 0 THEN e.n ELSE e.n4 END), "
        "var_pop(coalesce(e.n0, e.n)), variance(CASE WHEN e.id < 4 THEN e.n END) "
        "FROM edge e WHERE e.id NOT IN (5, 6) GROUP BY e.b",
        "SELECT round(stddev(CASE WHEN e.id = 3 THEN 1.5 ELSE e.i2 END), 3) FROM edge e "
        "WHERE e.id NOT IN (5, 6) HAVING variance(CASE WHEN e.b THEN e.n4 ELSE e.n END) > 0",
    ),
)


def _extremum(call: Call) -> Result:
    inner = call.type()
    if inner.kind in ("unknown", "other"):
        return f"it takes min/max of {inner.kind}"
    if inner.kind == "varchar":  # (PostgreSQL has no min(varchar): min(text) gives text)
        return replace(inner, kind="text")
    return inner


entry(
    "min / max",
    (exp.Min, exp.Max),
    _extremum,
    proofs=(
        "SELECT min(e.i4), max(e.n), min(e.c), max(e.v), min(e.d), max(e.f8), "
        "max(e.ts), min(e.f4) FROM edge e",
        "SELECT e.b, max(e.c1) FROM edge e GROUP BY e.b",
        "SELECT min(e.c) FILTER (WHERE e.i4 > 0), max(e.n) FILTER (WHERE e.b IS NULL), "
        "max(e.t) FILTER (WHERE e.i4 < 0) FROM edge e WHERE e.id > 0",
    ),
)


def _bool_aggregate(call: Call) -> Result:
    node = call.node
    args = node.expressions if isinstance(node, exp.Anonymous) else [node.this]
    if len(args) != 1 or call.of(args[0]).kind not in ("bool", "null"):
        return "it aggregates something other than a boolean"
    return BOOL


entry(
    "bool_and / bool_or / every",
    (exp.LogicalAnd, exp.LogicalOr, "every"),
    _bool_aggregate,
    rewrite=lambda node: (
        exp.LogicalAnd(this=node.expressions[0]) if isinstance(node, exp.Anonymous) else node
    ),
    proofs=(
        "SELECT bool_and(e.b), bool_or(e.i4 > 5), every(e.b) FROM edge e",
        "SELECT bool_and(e.b) FILTER (WHERE e.i4 > 0), bool_or(e.b) FILTER (WHERE e.i4 < 0), "
        "every(e.i4 > 0) FILTER (WHERE e.b) FROM edge e WHERE e.id > 0",
    ),
)


def _grouping(call: Call) -> Result:
    node = call.node
    if not node.expressions or len(node.expressions) > 31:
        return "it calls grouping() with no argument or more than 31"
    return INT4


entry(
    "grouping(...)",
    exp.Grouping,
    _grouping,
    # PostgreSQL's is an integer; DuckDB's a bigint (the same bits)
    rewrite=lambda node: exp.Cast(this=node, to=exp.DataType.build("INTEGER")),
    proofs=(
        "SELECT e.b, e.c1, count(*), sum(e.n), grouping(e.b), grouping(e.b, e.c1) "
        "FROM edge e GROUP BY ROLLUP (e.b, e.c1)",
        "SELECT e.b, e.c1, avg(e.n4), min(e.t), grouping(e.c1, e.b) "
        "FROM edge e GROUP BY CUBE (e.b, e.c1)",
        "SELECT e.b, e.c1, count(*), grouping(e.c1) FROM edge e "
        "GROUP BY GROUPING SETS ((e.b), (e.c1), (), (e.b))",
        "SELECT e.b, e.c1, count(e.i4), grouping(e.c1) FROM edge e GROUP BY e.b, ROLLUP (e.c1) "
        "HAVING count(*) > 0",
        # a constant grouped by: NULL as the output column it is, a constant anywhere else
        "SELECT e.b, DATE '2000-01-01', CASE WHEN e.b THEN DATE '2000-01-01' + 1 END, 'x' || e.c1, "
        "grouping(e.b), count(*) FROM edge e GROUP BY GROUPING SETS ((e.b, DATE '2000-01-01'), "
        "(DATE '2000-01-01'), (), (e.b, e.c1)) HAVING DATE '2000-01-01' IS NOT NULL",
    ),
)


def _string_agg(call: Call) -> Result:
    node = call.node
    value = node.this
    if not isinstance(value, exp.Order):
        return "it aggregates strings without ORDER BY (the order is the engine's)"
    separator = node.args.get("separator")
    if _string_literal(separator) is None:
        return "its string_agg separator is not a literal"
    if not _strings(call.of(value.this)):
        return "it aggregates something other than strings with string_agg"
    problem = _tied(call, value, "string_agg", skips_nulls=True)
    if problem is not None:
        return problem
    return _text(call.of(value.this))


def _constant(node: exp.Expr) -> bool:
    return node.find(exp.Column, exp.Query, exp.Placeholder) is None


def _tied(call: Call, order: exp.Order, name: str, skips_nulls: bool = False) -> str | None:
    """Why an ordered aggregate's order may leave values that print differently tied on
    every key (their order among themselves is each engine's own), or None: its keys hold a
    key of each table it reads, or its value is a constant, or one of its keys, or reads
    only columns that are keys themselves - each of a type whose equal values print alike
    (not a double, whose 0 and -0 are equal, nor a numeric whose scale may differ from value
    to value). Rows tied on every key then hold the same value. An aggregate that
    ``skips_nulls`` (string_agg) compares ``v`` of a FILTER folded into its value (``CASE WHEN
    c THEN v END``, `optimizer.postgres.folds`): the rows it filters out add nothing."""
    keys = [o.this for o in order.expressions]
    values = [order.this]
    if skips_nulls and isinstance(order.this, exp.Case):
        ifs = order.this.args.get("ifs") or []
        if len(ifs) == 1 and not order.this.args.get("default") and not order.this.args.get("this"):
            values.append(ifs[0].args["true"])
    if any(_constant(v) for v in values):
        return None
    if all(_constant(k) for k in keys):
        return f"it orders {name} by constants only (the order is the engine's)"
    if call.identifies_rows(call.node, keys):
        return None  # (no two rows tie on every key)
    columns = [k for k in keys if isinstance(k, exp.Column) and _prints_alike(call.of(k))]
    for value in values:
        if value.find(exp.Query, exp.Placeholder) is not None:
            continue
        if any(k == value for k in keys) and _prints_alike(call.of(value)):
            return None
        if all(any(c == k for k in columns) for c in value.find_all(exp.Column)):
            return None
    return (
        f"it orders {name} by keys on which values that differ may tie (their order is the "
        "engine's): order by the value too, or by a key of each table"
    )


def _prints_alike(found: PgType) -> bool:
    """Whether equal values of a type are the same value (print alike)."""
    if found.is_string:
        return found.byte_order and found.deterministic
    if found.kind == "numeric":
        return found.scale is not None
    return found.kind in ("integer", "bool", "date", "timestamp", "timestamptz", "time")


def _drop_constant_keys(node: exp.Expr) -> exp.Expr:
    """Keys that are constants order nothing (DuckDB refuses them): dropped."""
    order = node.this
    kept = [o for o in order.expressions if not _constant(o.this)]
    if not kept:
        node.set("this", order.this)
    else:
        order.set("expressions", kept)
    return node


entry(
    "string_agg(text, literal ORDER BY ...)",
    exp.GroupConcat,
    _string_agg,
    rewrite=_drop_constant_keys,
    proofs=(
        "SELECT string_agg('x', ',' ORDER BY 'x'), string_agg(e.t, ';' ORDER BY 1, e.t) "
        "FROM edge e",
        "SELECT string_agg(e.t, ',' ORDER BY e.t) FROM edge e",
        "SELECT string_agg(e.c, '' ORDER BY e.c DESC) FROM edge e",
        "SELECT string_agg(e.t, '|' ORDER BY e.t, e.id) FILTER (WHERE e.i4 > 0) FROM edge e "
        "WHERE e.id > 0",
    ),
)


# the element types an array_agg is answered for: those whose values the cache converts and
# the server prints one by one (not an interval, whose months psycopg reads as 30 days)
_ELEMENT_KINDS = frozenset(
    {"integer", "float", "bool", "varchar", "text", "date", "timestamp", "timestamptz", "time"}
)


def _array_agg(call: Call) -> Result:
    value = call.node.this
    if isinstance(value, exp.Distinct):
        return "it aggregates DISTINCT values with array_agg (the order is the engine's)"
    if not isinstance(value, exp.Order):
        return "it aggregates into an array without ORDER BY (the order is the engine's)"
    problem = _tied(call, value, "array_agg")
    if problem is not None:
        return problem
    element = call.of(value.this)
    if element.kind == "numeric" and element.scale is None:
        return "its array_agg's numerics have display scales that vary from value to value"
    if element.kind == "char" and element.width is None:
        return "its array_agg's char values have lengths that vary from value to value"
    if element.kind not in _ELEMENT_KINDS | {"numeric", "char"}:
        return f"it aggregates {element.kind} values into an array"
    return PgType("array", element=element)


entry(
    "array_agg(value ORDER BY ...)",
    exp.ArrayAgg,
    _array_agg,
    rewrite=_drop_constant_keys,
    proofs=(
        "SELECT array_agg(e.i4 ORDER BY e.i4), array_agg(e.i2 ORDER BY e.i2 DESC, e.id), "
        "array_agg(e.i8 ORDER BY e.id, e.i8 NULLS FIRST) FROM edge e",
        "SELECT array_agg(e.n ORDER BY e.n), array_agg(e.n0 ORDER BY e.n0 DESC), "
        "array_agg(e.n4 ORDER BY e.n4, e.id) FROM edge e",
        "SELECT array_agg(e.f4 ORDER BY e.id), array_agg(e.f8 ORDER BY e.id DESC) FROM edge e",
        "SELECT array_agg(e.c ORDER BY e.c), array_agg(e.c1 ORDER BY e.c1 DESC), "
        "array_agg(e.v ORDER BY e.v, e.id), array_agg(e.t ORDER BY e.t NULLS FIRST) FROM edge e",
        "SELECT array_agg(e.d ORDER BY e.d), array_agg(e.ts ORDER BY e.ts DESC), "
        "array_agg(e.tz ORDER BY e.tz), array_agg(e.tm ORDER BY e.tm, e.id), "
        "array_agg(e.b ORDER BY e.b) FROM edge e",
        "SELECT e.b, array_agg(e.i4 + 1 ORDER BY e.i4 + 1), array_agg(e.t || 'x' ORDER BY 1, "
        "e.t || 'x') FROM edge e WHERE e.id NOT IN (5, 6) GROUP BY e.b ORDER BY e.b",
        "SELECT array_agg(e.n ORDER BY e.n) FROM edge e WHERE e.id < 0",
        # ties on every key hold the same value: the value reads only keys
        "SELECT array_agg(e.i4 * 2 + e.i2 ORDER BY e.i2, e.i4 DESC) FROM edge e "
        "WHERE e.id NOT IN (5, 6)",
    ),
)
