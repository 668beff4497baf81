"""Comparisons and predicates: = <> < <= > >=, IS [NOT] DISTINCT FROM, BETWEEN, IN (of values,
of a subquery, of a row), IS [NOT] NULL / TRUE / FALSE, AND OR NOT, EXISTS."""

from __future__ import annotations

import typing as t

from sqlglot import exp

from optimizer.postgres.allowlist.base import NOT_MINE, Call, Family, Result
from optimizer.postgres.types import BOOL, DATETIMES, NUMBERS, STRINGS, PgType

FAMILY = Family()
entry = FAMILY.entry


_ORDERED_KINDS = NUMBERS | STRINGS | DATETIMES | {"bool", "time", "null", "interval"}


def _comparable(a: PgType, b: PgType) -> bool:
    kinds = {a.kind, b.kind} - {"null"}
    if not kinds:
        return True
    if "unknown" in kinds or not kinds <= _ORDERED_KINDS:
        return False
    if kinds <= NUMBERS:
        return True  # a real compared with anything but a real is widened to a double
    if kinds <= STRINGS:
        return True
    if kinds <= {"date", "timestamp", "timestamptz", "string"}:
        return True  # a date or timestamp meets a timestamp with time zone in the session's zone
    if "interval" in kinds:
        return kinds == {"interval"} and not (a.months or b.months)
    return len(kinds - {"string"}) == 1


def _compare(call: Call) -> Result:
    a, b = call.type(), call.type("expression")
    if not _comparable(a, b):
        return f"it compares {a.kind} with {b.kind}"
    return BOOL


entry(
    "= <> < <= > >=",
    (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE),
    _compare,
    proofs=(
        # (a, b) IN ((...), ...): folded into ORs of ANDs of = (optimizer.postgres.folds)
        "(e.i4, e.c1) IN ((7, 'A'), (0, ''), (NULL, 'z'))",
        "(e.i4, e.b) NOT IN ((7, true), (-7, NULL))",
        "(e.n, e.t) IN ((2.50, 'Ab '), (1.00, NULL))",
        "e.i4 = 7",
        "e.i2 < e.i8",
        "e.n >= 2.5",
        "e.n = e.i4",
        "e.f8 > e.n",
        "e.f8 = 0.1",
        "e.c = 'ab'",
        "e.c = e.v",
        "e.v <> 'ab  '",
        "e.t < 'B'",
        "e.d < DATE '1995-01-31'",
        "e.d <= e.ts",
        "e.d > '1995-01-01'",
        "e.b = TRUE",
        "e.tm < '12:00'",
        "e.tz < e.ts",
        "e.tz >= e.d",
        "e.tz = '1995-01-31 10:20:30.5'",
        "date_trunc('month', e.d) > e.ts",
        "e.ts - e.ts > interval '1 hour'",
    ),
)
entry(
    "IS [NOT] DISTINCT FROM",
    (exp.NullSafeEQ, exp.NullSafeNEQ),
    _compare,
    proofs=(
        "e.i4 IS DISTINCT FROM 7",
        "e.c IS NOT DISTINCT FROM 'ab'",
        "e.n IS DISTINCT FROM NULL",
    ),
)


def _between(call: Call) -> Result:
    a = call.type()
    for key in ("low", "high"):
        if not _comparable(a, call.type(key)):
            return f"it compares {a.kind} with {call.type(key).kind}"
    if call.node.args.get("symmetric"):
        return "it takes BETWEEN SYMMETRIC"
    return BOOL


entry(
    "BETWEEN",
    exp.Between,
    _between,
    proofs=(
        "e.i4 BETWEEN 0 AND 10",
        "e.c BETWEEN 'a' AND 'b'",
        "e.d NOT BETWEEN DATE '1992-01-01' AND DATE '1995-12-31'",
        "e.n BETWEEN e.i4 AND 3.5",
        # SYMMETRIC: folded into the OR of both ranges (optimizer.postgres.folds)
        "e.i4 BETWEEN SYMMETRIC 10 AND 0",
        "e.n NOT BETWEEN SYMMETRIC e.n4 AND 0",
        "e.c BETWEEN SYMMETRIC 'b' AND 'a'",
        "e.d BETWEEN SYMMETRIC DATE '1995-12-31' AND e.d",
        "e.i8 BETWEEN SYMMETRIC e.i4 AND e.i2",
    ),
)


def _in(call: Call) -> Result:
    node = t.cast(exp.In, call.node)
    a = call.type()
    if isinstance(node.this, exp.Tuple):
        return _row_in(call)
    if node.args.get("unnest") or node.args.get("field"):
        return "it takes IN UNNEST"
    query = node.args.get("query")
    others = [query] if query is not None else node.expressions
    for other in others:
        if not _comparable(a, call.of(other)):
            return f"it compares {a.kind} with {call.of(other).kind} in IN"
    return BOOL


def _row_in(call: Call) -> Result:
    """``(a, b) IN (SELECT x, y ...)``: DuckDB counts the NULLs of row comparisons otherwise
    (`_row_in_rewrite` spells PostgreSQL's three-valued logic out)."""
    node = t.cast(exp.In, call.node)
    query = node.args.get("query")
    select = query.this if isinstance(query, exp.Subquery) else query
    if not isinstance(select, exp.Select) or node.expressions:
        return "it compares a row of values with IN (NULLs count differently in DuckDB)"
    left = node.this.expressions
    right = select.expressions
    if len(left) != len(right) or any(isinstance(p, exp.Star) for p in right):
        return "it compares rows of different widths with IN"
    for a, b in zip(left, right, strict=True):
        ta, tb = call.of(a), call.of(b.this if isinstance(b, exp.Alias) else b)
        if not _comparable(ta, tb) or "char" in (ta.kind, tb.kind):
            return f"it compares a row of {ta.kind} and {tb.kind} with IN"
    return BOOL


def _row_in_rewrite(node: exp.Expr) -> exp.Expr:
    """Row IN as PostgreSQL decides it: true if a row of the subquery equals, else NULL if a
    comparison with one is NULL, else false."""
    if not isinstance(node.this, exp.Tuple):
        return node
    query = node.args["query"]
    select = query.this if isinstance(query, exp.Subquery) else query
    name = f"mtcache_in_{node.meta.get('mt_id', 0)}"
    columns = [f"c{i}" for i in range(len(node.this.expressions))]

    def matching(condition: t.Callable[[exp.Expr], exp.Expr]) -> exp.Expr:
        equal = exp.and_(
            *[
                exp.EQ(this=value.copy(), expression=exp.column(c, table=name))
                for value, c in zip(node.this.expressions, columns, strict=True)
            ]
        )
        source = exp.Subquery(
            this=select.copy(),
            alias=exp.TableAlias(
                this=exp.to_identifier(name), columns=[exp.to_identifier(c) for c in columns]
            ),
        )
        return exp.Exists(this=exp.select("1").from_(source).where(condition(equal)))

    return exp.Case(
        ifs=[
            exp.If(this=matching(lambda e: e), true=exp.true()),
            exp.If(
                this=matching(lambda e: exp.Is(this=exp.Paren(this=e), expression=exp.Null())),
                true=exp.Null(),
            ),
        ],
        default=exp.false(),
    )


entry(
    "(row) IN (subquery)",
    exp.In,
    lambda call: _row_in(call) if isinstance(call.node.this, exp.Tuple) else NOT_MINE,
    rewrite=_row_in_rewrite,
    proofs=(
        "(e.i4, e.i2) IN (SELECT x.i4, x.i2 FROM edge x WHERE x.id < 5)",
        "(e.i4, e.i2) NOT IN (SELECT x.i4, nullif(x.i2, 1) FROM edge x)",
        "(e.d, e.i8) IN (SELECT x.d, x.i8 FROM edge x WHERE x.id <> e.id)",
        "SELECT count(*) FROM edge e WHERE (e.i4, e.n) NOT IN "
        "(SELECT x.i4, x.n FROM edge x WHERE x.id IN (2, 3))",
    ),
)
entry(
    "IN",
    exp.In,
    _in,
    proofs=(
        "e.i4 IN (1, 7, NULL)",
        "e.i4 NOT IN (1, NULL)",
        "e.c IN ('ab', 'x')",
        "e.v IN ('ab', 'Q R')",
        "e.c IN (e.v, 'x')",
        "e.v IN (e.c, 'ab  ')",
        "e.v NOT IN (e.c, e.c1, 'x y')",
        "e.t IN ('Ab', e.t)",
        "e.n IN (2.5, 0)",
        "e.d IN (DATE '2000-01-01')",
        "e.i4 IN (SELECT x.i2 FROM edge x WHERE x.id < 4)",
        "e.i4 NOT IN (SELECT x.i4 FROM edge x)",
    ),
)


def _is(call: Call) -> Result:
    target = call.node.args.get("expression")
    if isinstance(target, exp.Null):
        return BOOL
    if isinstance(target, exp.Boolean) and call.type().kind in ("bool", "null"):
        return BOOL
    return "it takes IS with something other than NULL, TRUE or FALSE"


entry(
    "IS [NOT] NULL / TRUE / FALSE",
    exp.Is,
    _is,
    proofs=(
        "e.i4 IS NULL",
        "e.c IS NOT NULL",
        "e.b IS TRUE",
        "e.b IS NOT FALSE",
        "(e.i4 > 1) IS UNKNOWN",
    ),
)


def _boolean(call: Call) -> Result:
    for key in ("this", "expression"):
        if key in call.node.args and call.type(key).kind not in ("bool", "null"):
            return f"it applies {call.node.key.upper()} to {call.type(key).kind}"
    return BOOL


entry(
    "AND OR NOT",
    (exp.And, exp.Or, exp.Not),
    _boolean,
    proofs=("e.b AND e.i4 > 1", "e.b OR NULL", "NOT e.b", "NOT (e.i4 > 1 AND e.b)"),
)
entry(
    "EXISTS",
    exp.Exists,
    lambda call: BOOL,
    proofs=("EXISTS (SELECT 1 FROM edge x WHERE x.i4 = e.i4 + 1)",),
)
