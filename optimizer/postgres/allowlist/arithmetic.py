"""Arithmetic operators (+ - * / % and unary -) on integers, numerics, floating-point numbers,
dates, timestamps and intervals, and PostgreSQL's numeric division inside a local statement
(`numeric_division`, by the cache's own DuckDB functions)."""

from __future__ import annotations

import typing as t
from collections.abc import Callable

from sqlglot import exp

from optimizer.postgres.allowlist.base import (
    NOT_MINE,
    Call,
    Family,
    Result,
    _error_if,
    _exact,
    _floating,
    _func,
    _integers,
    _scale,
    _wider_integer,
)
from optimizer.postgres.types import DATE, INT4, NUMBERS, TIMESTAMP, PgType

FAMILY = Family()
entry = FAMILY.entry


# PostgreSQL's numeric division inside a local statement: the cache's own DuckDB functions
# (`cache.store.functions`), giving the quotient at PostgreSQL's scale (at most
# DIVISION_SCALE digits: DuckDB holds it as a DECIMAL(38, DIVISION_SCALE)) and that scale
NUMERIC_DIVIDE, NUMERIC_DIVIDE_SCALE = "mtcache_numeric_div", "mtcache_numeric_div_scale"
# ... an interval holding months times a fraction (optimizer.postgres.intervals)
INTERVAL_MULTIPLY = "mtcache_interval_mul"
# ... and a variance or standard deviation from its exact numerator and denominator
NUMERIC_SPREAD, NUMERIC_SPREAD_SCALE = "mtcache_numeric_spread", "mtcache_numeric_spread_scale"
DIVISION_SCALE = 24


def _add(call: Call) -> Result:
    a, b = call.type(), call.type("expression")
    sub = isinstance(call.node, exp.Sub)
    if _integers(a, b):
        return _wider_integer(a, b)
    if _exact(a, b):
        return PgType("numeric", scale=_scale(a, b, rule=max))
    floating = _floating(a, b)
    if floating is not None:
        return floating
    if a.kind == "date" and b.kind in ("integer", "null"):
        return DATE
    if not sub and b.kind == "date" and a.kind == "integer":
        return DATE
    if sub and a.kind == "date" and b.kind == "date":
        return INT4
    if a.kind in ("date", "timestamp") and b.kind == "interval":
        return TIMESTAMP
    if not sub and b.kind in ("date", "timestamp") and a.kind == "interval":
        return TIMESTAMP
    if not sub and {a.kind, b.kind} == {"date", "time"}:
        return TIMESTAMP
    if sub and a.kind == "timestamp" and b.kind == "timestamp":
        return PgType("interval")
    if a.kind == "interval" and b.kind == "interval" and not (a.months or b.months):
        return PgType("interval")
    return f"it computes {a.kind} {'-' if sub else '+'} {b.kind}"


def _floating_only(signature: Callable[[Call], Result]) -> Callable[[Call], Result]:
    """The entry of an operator for floating-point operands only."""

    def only(call: Call) -> Result:
        if _floating(call.type(), call.type("expression")) is None:
            return NOT_MINE
        return signature(call)

    return only


def _isinf(node: exp.Expr) -> exp.Expr:
    return _func("isinf", node)


def _nonzero(node: exp.Expr) -> exp.Expr:
    return exp.NEQ(this=node, expression=exp.Literal.number(0))


def _float_checked(node: exp.Expr) -> exp.Expr:
    """PostgreSQL raises where floating-point arithmetic overflows to infinity from finite
    operands, or underflows to zero from nonzero ones (float.h's float_overflow_error,
    float_underflow_error); DuckDB gives infinity and zero. The operands are computed once,
    into a pair the checks read (a lambda over a one-element list): checks that copied them
    would grow a chain of n operations as 7^n."""
    pair = exp.Struct(
        expressions=[
            exp.PropertyEQ(this=exp.to_identifier("a"), expression=node.this),
            exp.PropertyEQ(this=exp.to_identifier("b"), expression=node.expression),
        ]
    )

    def a() -> exp.Expr:
        return exp.column("a", table=_PAIR)

    def b() -> exp.Expr:
        return exp.column("b", table=_PAIR)

    def result() -> exp.Expr:
        return type(node)(this=a(), expression=b())

    overflow = exp.and_(_isinf(result()), exp.Not(this=_isinf(a())), exp.Not(this=_isinf(b())))
    checks = [(overflow, "value out of range: overflow")]
    if isinstance(node, exp.Mul):
        checks.append(
            (
                exp.and_(
                    exp.EQ(this=result(), expression=exp.Literal.number(0)),
                    _nonzero(a()),
                    _nonzero(b()),
                ),
                "value out of range: underflow",
            )
        )
    if isinstance(node, exp.Div):
        checks.append(
            (
                exp.and_(
                    exp.EQ(this=result(), expression=exp.Literal.number(0)),
                    _nonzero(a()),
                    exp.Not(this=_isinf(b())),
                ),
                "value out of range: underflow",
            )
        )
    ifs = [
        exp.If(this=condition, true=_func("error", exp.Literal.string(message)))
        for condition, message in checks
    ]
    checked = exp.Lambda(
        this=exp.Case(ifs=ifs, default=result()), expressions=[exp.to_identifier(_PAIR)]
    )
    applied = _func("list_transform", exp.Array(expressions=[pair]), checked)
    return _func("list_extract", applied, exp.Literal.number(1))


_PAIR = "mtcache_pair"  # the lambda's parameter: the two operands


entry(
    "+ - * / of double precision",
    (exp.Add, exp.Sub, exp.Mul, exp.Div),
    _floating_only(lambda call: t.cast(PgType, _floating(call.type(), call.type("expression")))),
    rewrite=_float_checked,
    proofs=(
        "e.f8 + 1",
        "e.f8 - e.n",
        "e.f8 * 1.5",
        "e.f8 * e.i4",
        "e.f4 * 3",
        "e.f4 * e.f4",
        "e.f4 * 0.1",
        "e.f8 / 4",
        "e.i4 / 2.5::float8",
        "e.f8 * -1",
        "-0.0::float8 * 1",
    ),
    raises=(
        "e.f8 * 0 + 1e308::float8 * 10",
        "(e.f8 * 0 + 5e-324::float8) / 4",
        "(e.f8 * 0 + 1e-300::float8) * 1e-300::float8",
        "e.f8 / 0",
        "(e.f4 * '0'::real + '3.4e38'::real) * '10'::real",
    ),
)


entry(
    "+ and -",
    (exp.Add, exp.Sub),
    _add,
    proofs=(
        "e.i4 + 1",
        "e.i2 + e.i2",
        "e.i4 - e.i8",
        "e.n + e.n4",
        "e.n - 1",
        "e.n0 + 0.5",
        "e.d + 7",
        "e.d - 30",
        "7 + e.d",
        "e.d - DATE '1992-01-01'",
        "e.d + interval '1 month'",
        "e.ts - interval '36 hours'",
        "e.ts - TIMESTAMP '1992-01-01 10:00'",
        "e.d + time '10:15'",
        "interval '1 day' + interval '2 hours'",
    ),
    raises=("e.i4 + 2147483647 + 2147483647", "e.i2 + 32767::smallint + 32767::smallint"),
)


def _instant_difference(call: Call) -> Result:
    a, b = call.type(), call.type("expression")
    kinds = {a.kind, b.kind}
    if "timestamptz" not in kinds or not kinds <= {"timestamptz", "timestamp", "date"}:
        return NOT_MINE
    if kinds != {"timestamptz"}:
        # (a date or timestamp would be placed in the session's zone by DuckDB's zone data,
        # whose history before 1970 differs from PostgreSQL's for some zones)
        return f"it computes {a.kind} - {b.kind} (only two timestamps with time zone locally)"
    return PgType("interval")


_DAY_US = 86_400_000_000


def _instant_difference_rewrite(node: exp.Expr) -> exp.Expr:
    """PostgreSQL's timestamptz_mi: the microseconds between the two instants, as whole days
    and the rest (interval_justify_hours, both truncated toward zero)."""
    micros = exp.Paren(
        this=exp.Sub(
            this=_func("epoch_us", node.this), expression=_func("epoch_us", node.expression)
        )
    )
    whole = exp.IntDiv(this=micros.copy(), expression=exp.Literal.number(_DAY_US))
    days = _func("to_days", exp.Cast(this=whole, to=exp.DataType.build("INTEGER")))
    rest = _func("to_microseconds", exp.Mod(this=micros, expression=exp.Literal.number(_DAY_US)))
    infinite = exp.or_(_isinf(node.this.copy()), _isinf(node.expression.copy()))
    return _error_if(
        infinite, "cannot subtract infinite timestamps", exp.Add(this=days, expression=rest)
    )


entry(
    "timestamptz - timestamptz",
    exp.Sub,
    _instant_difference,
    rewrite=_instant_difference_rewrite,
    proofs=(
        "e.tz - e.tz",
        "e.tz - date_trunc('month', e.d)",
        "(e.tz - (SELECT min(x.tz) FROM edge x)) < interval '3 days'",
        "SELECT x.id, y.id, x.tz - y.tz FROM edge x, edge y",
    ),
    raises=("e.tz - e.tz + ('infinity'::timestamptz - e.tz)",),
)


def _mul(call: Call) -> Result:
    a, b = call.type(), call.type("expression")
    if _integers(a, b):
        return _wider_integer(a, b)
    if _exact(a, b):
        return PgType("numeric", scale=_scale(a, b, rule=sum))
    kinds = {a.kind, b.kind} - {"null"}
    floating = _floating(a, b)
    if floating is not None:
        return floating
    if "interval" in kinds and len(kinds) == 2 and kinds - {"interval"} <= NUMBERS:
        if not (a.months or b.months):
            return PgType("interval")
        if kinds - {"interval"} == {"integer"}:
            return PgType("interval", months=True)  # months times an integer: whole months
    return f"it multiplies {a.kind} by {b.kind}"


_INTERVAL_SIDE = "mtcache_interval_side"  # meta: which operand is the interval


def _months_by_fraction(call: Call) -> Result:
    a, b = call.type(), call.type("expression")
    interval, factor = (a, b) if a.kind == "interval" else (b, a)
    if interval.kind != "interval" or not interval.months:
        return NOT_MINE
    if factor.kind not in ("numeric", "float"):
        return NOT_MINE
    # (the rewrite sees no types: it reads the side here, kept with the node's copies)
    call.node.meta[_INTERVAL_SIDE] = "this" if a.kind == "interval" else "expression"
    return PgType("interval", months=True)


def _months_by_fraction_rewrite(node: exp.Expr) -> exp.Expr:
    """PostgreSQL's interval_mul by the cache's own function, over the interval's months,
    days and microseconds (read from DuckDB's interval) and the factor as a double (a numeric
    through its text, as PostgreSQL's float8(numeric)); its three units made an interval
    again, the function called once (a lambda over its result)."""
    a, b = node.this, node.expression
    interval, factor = (a, b) if node.meta.get(_INTERVAL_SIDE) == "this" else (b, a)

    def part(name: str) -> exp.Expr:
        return _func("datepart", exp.Literal.string(name), interval.copy())

    months = exp.Add(
        this=exp.Mul(this=exp.Literal.number(12), expression=part("year")),
        expression=part("month"),
    )
    micros = exp.Add(
        this=exp.Add(
            this=exp.Mul(this=exp.Literal.number(3_600_000_000), expression=part("hour")),
            expression=exp.Mul(this=exp.Literal.number(60_000_000), expression=part("minute")),
        ),
        expression=part("microseconds"),
    )
    double = exp.cast(exp.cast(factor, "VARCHAR"), "DOUBLE")
    call = _func(
        INTERVAL_MULTIPLY,
        exp.cast(months, "INTEGER"),
        exp.cast(part("day"), "INTEGER"),
        exp.cast(micros, "BIGINT"),
        double,
    )
    unit = "mtcache_units"
    whole = exp.Add(
        this=exp.Add(
            this=_func("to_months", exp.column("months", table=unit)),
            expression=_func("to_days", exp.column("days", table=unit)),
        ),
        expression=_func("to_microseconds", exp.column("micros", table=unit)),
    )
    applied = _func(
        "list_transform",
        exp.Array(expressions=[call]),
        exp.Lambda(this=whole, expressions=[exp.to_identifier(unit)]),
    )
    return _func("list_extract", applied, exp.Literal.number(1))


entry(
    "interval * fraction",
    exp.Mul,
    _months_by_fraction,
    rewrite=_months_by_fraction_rewrite,
    proofs=(
        "interval '3 months' * 0.5",
        "interval '1 year 2 days' * 0.5",
        "0.5 * interval '1 month 36 hours'",
        "interval '1 mon 1 day 01:02:03.000005' * 1.7",
        "interval '1 year' * (-0.3)",
        "interval '7 months' * e.n4",
        "(e.d + interval '3 months' * 0.5)::date",
        "interval '2 months' * 0.1::float8",
        "interval '11 months 29 days' * 1.0001",
    ),
)


entry(
    "*",
    exp.Mul,
    _mul,
    proofs=(
        "e.i4 * 3",
        "e.i2 * e.i2",
        "e.n * e.n4",
        "e.n * 2",
        "e.n0 * 0.25",
        "interval '36 hours' * 2",
        "interval '1 day' * 1.5",
        "e.i4 * interval '1 hour'",
        "interval '90 minutes' * e.f8",
        "interval '1 day' * 0.3",
        "e.d + interval '1 month' * e.i2",
        "e.ts - 2 * interval '1 year 1 month'",
    ),
    raises=("(e.i4 + 2147483647) * 2", "(e.i8 + 9223372036854775807) * 2"),
)


def _div(call: Call) -> Result:
    a, b = call.type(), call.type("expression")
    if _integers(a, b):
        return _wider_integer(a, b)
    floating = _floating(a, b)
    if floating is not None:
        return floating
    if _exact(a, b):
        # the cache divides numerics itself (optimizer.postgres.divisions): PostgreSQL's scale
        # per value
        return PgType("numeric")
    return f"it divides {a.kind} by {b.kind}"


entry(
    "/",
    exp.Div,
    _div,
    proofs=(
        "e.i4 / 2",
        "-7 / 2",
        "e.i8 / e.i4",
        "SELECT e.n / 3 FROM edge e",
        "SELECT e.n4 / e.n FROM edge e WHERE e.n <> 0",
        "e.n / 3 + 1",
        "e.n4 / 7 > 0.1",
        "round(e.n / 3, 2)",
        "(e.n / e.i4::numeric) * 2",
        "coalesce(e.n / 7, 0)",
        "e.n0 / 3 = 1",
        "e.i4 / 7.0",
    ),
    raises=("e.i4 / 0", "e.i4 / (e.i4 - e.i4)", "e.n / 0"),
)


def _integer_div(call: Call) -> Result:
    a, b = call.type(), call.type("expression")
    if _integers(a, b):
        return PgType("numeric", scale=0)
    return (
        f"it takes div() of {a.kind} and {b.kind} (only integers are divided locally: "
        "PostgreSQL's numeric quotient is truncated at its full precision)"
    )


def _integer_div_rewrite(node: exp.Expr) -> exp.Expr:
    """div(a, b) of integers: PostgreSQL casts them to numeric and truncates the quotient
    toward zero (the minimum's quotient by -1 does not overflow); DuckDB's integer division
    of 128-bit integers does the same, and raises for a zero divisor as for any."""
    wide = exp.DataType.build("HUGEINT")
    quotient = exp.Div(
        this=exp.Cast(this=node.this, to=wide.copy()),
        expression=exp.Cast(this=node.args["expression"], to=wide.copy()),
    )
    return exp.Cast(this=quotient, to=exp.DataType.build("DECIMAL(38, 0)"))


entry(
    "div(integer, integer)",
    exp.IntDiv,
    _integer_div,
    rewrite=_integer_div_rewrite,
    proofs=(
        "div(e.i4, 3)",
        "div(-7, 2)",
        "div(7, -2)",
        "div(e.i8, e.i4)",
        "div(e.i2, -1)",
        "div(e.i8, -1)",
        "div(e.i4, 7) > 1",
    ),
    raises=("div(e.i4, 0)", "div(e.i8, e.i4 - e.i4)"),
)


def _mod(call: Call) -> Result:
    a, b = call.type(), call.type("expression")
    if _integers(a, b):
        return _wider_integer(a, b)
    if _exact(a, b):
        return PgType("numeric", scale=_scale(a, b, rule=max))
    return f"it takes {a.kind} modulo {b.kind}"


entry(
    "% and mod()",
    exp.Mod,
    _mod,
    proofs=(
        "e.i4 % 3",
        "-7 % 3",
        "7 % -3",
        "mod(e.i8, 5)",
        "e.n % 2",
        "mod(e.n4, 0.7)",
        "e.n0 % e.i2",
    ),
    raises=("e.i4 % 0", "mod(e.n, 0)"),
)


def _neg(call: Call) -> Result:
    inner = call.type()
    if inner.kind in ("integer", "numeric", "float", "null") or (
        inner.kind == "interval" and not inner.months
    ):
        return inner
    return f"it negates {inner.kind}"


entry(
    "unary -",
    exp.Neg,
    _neg,
    proofs=("-e.i4", "-e.n", "-e.f8", "-e.n4"),
    raises=("-(e.i2 * 0 - 32768)::smallint",),
)


def numeric_spread(
    numerator: exp.Expr,
    numerator_scale: int | exp.Expr,
    denominator: exp.Expr,
    root: bool,
    scale: bool,
) -> exp.Expr:
    """PostgreSQL's variance (``root``: standard deviation) of its exact numerator and
    denominator (optimizer.postgres.divisions.spread_operands), in DuckDB: the value (a
    DECIMAL(38, DIVISION_SCALE)) or, with ``scale``, its display scale."""
    call = _func(
        NUMERIC_SPREAD_SCALE if scale else NUMERIC_SPREAD,
        exp.cast(numerator, "VARCHAR"),
        numerator_scale
        if isinstance(numerator_scale, exp.Expr)
        else exp.Literal.number(numerator_scale),
        exp.cast(denominator, "VARCHAR"),
        exp.Literal.number(1 if root else 0),
    )
    if scale:
        return call
    return exp.cast(call, exp.DataType.build(f"DECIMAL(38, {DIVISION_SCALE})"))


def numeric_division(
    numerator: exp.Expr,
    numerator_scale: exp.Expr,
    denominator: exp.Expr,
    denominator_scale: exp.Expr,
    scale: bool = False,
) -> exp.Expr:
    """PostgreSQL's numeric division of two exact operands, given their display scales, in
    DuckDB: the quotient (a DECIMAL(38, DIVISION_SCALE)) or, with ``scale``, its display
    scale."""
    call = _func(
        NUMERIC_DIVIDE_SCALE if scale else NUMERIC_DIVIDE,
        exp.cast(numerator, "VARCHAR"),
        numerator_scale,
        exp.cast(denominator, "VARCHAR"),
        denominator_scale,
    )
    if scale:
        return call
    return exp.cast(call, exp.DataType.build(f"DECIMAL(38, {DIVISION_SCALE})"))
