"""Mathematical functions: abs, round, trunc, ceil / floor / sign, sqrt, ln, power,
width_bucket and to_char of numbers (by the cache's own DuckDB functions, `WIDTH_BUCKET`,
`NUMERIC_TO_CHAR`)."""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from optimizer.postgres import number_text
from optimizer.postgres.allowlist.arithmetic import _isinf, _nonzero
from optimizer.postgres.allowlist.base import (
    NOT_MINE,
    Call,
    Family,
    Result,
    _error_if,
    _exact,
    _func,
    _integers,
    _literal_int,
    _string_literal,
)
from optimizer.postgres.types import FLOAT8, INT4, PgType

FAMILY = Family()
entry = FAMILY.entry


WIDTH_BUCKET = "mtcache_width_bucket"  # PostgreSQL's width_bucket over numerics
NUMERIC_TO_CHAR = "mtcache_to_char_numeric"  # PostgreSQL's to_char(numeric, template)


def _abs(call: Call) -> Result:
    inner = call.type()
    if inner.kind in ("integer", "numeric", "null") or (inner.kind == "float" and inner.width == 8):
        return inner
    return f"it takes abs of {inner.kind}"


entry(
    "abs",
    exp.Abs,
    _abs,
    proofs=("abs(e.i4)", "abs(e.n)", "abs(e.f8)", "abs(e.n4)"),
    raises=("abs(e.i4 * 0 - 2147483647 - 1)",),
)


def _round(call: Call) -> Result:
    inner = call.type()
    decimals = call.arg("decimals")
    digits = _literal_int(decimals) if decimals is not None else 0
    if call.node.args.get("truncate"):
        return "it rounds by truncation"
    if inner.kind == "integer" and decimals is None:
        return FLOAT8  # round(double precision): an integer is rounded as itself
    if inner.kind in ("integer", "numeric", "null"):
        if digits is None:
            return "it rounds to a number of digits that is not a literal"
        return PgType("numeric", scale=max(digits, 0))
    if inner.kind == "float":
        return NOT_MINE  # round(double precision)
    return f"it rounds {inner.kind}"


def _to_scale(node: exp.Expr) -> exp.Expr:
    """round() and trunc() to d digits give PostgreSQL's scale d even past the value's own
    (DuckDB keeps the value's): the result is cast to it (38 digits: casting never rounds)."""
    digits = _literal_int(node.args.get("decimals"))
    if digits is None or digits < 0:
        return node
    return exp.cast(node, exp.DataType.build(f"DECIMAL(38, {digits})"))


entry(
    "round(numeric[, int])",
    exp.Round,
    _round,
    rewrite=_to_scale,
    proofs=(
        "round(e.n)",
        "round(e.n4, 2)",
        "round(e.n, 1)",
        "round(e.n0, -1)",
        "round(e.i4, 1)",
        "round(e.i4 / 7, 1)",
        "round(2.5)",
        "round(-2.5)",
        "round(1234.5, -2)",
        "round(e.n4, 6)",
        "round(e.i8)",
    ),
)


def _round_double(call: Call) -> Result:
    inner = call.type()
    if inner.kind != "float" or inner.width != 8:
        return NOT_MINE
    if call.arg("decimals") is not None:
        return "it rounds a double to digits (PostgreSQL has no such function)"
    return FLOAT8


entry(
    "round(double precision)",
    exp.Round,
    _round_double,
    rewrite=lambda node: _func("round_even", node.this, exp.Literal.number(0)),
    proofs=(
        "round(e.f8)",
        "round(2.5::float8)",
        "round(-0.5::float8)",
        "round(3.5::float8)",
        "round(e.f8 * 10)",
        "round(4503599627370497::float8)",
    ),
)  # PostgreSQL: rint()


def _trunc(call: Call) -> Result:
    inner = call.type()
    digits = _literal_int(call.arg("decimals")) if call.arg("decimals") is not None else 0
    if inner.kind == "integer" and call.arg("decimals") is None:
        return FLOAT8
    if inner.kind in ("integer", "numeric", "null") and digits is not None:
        return PgType("numeric", scale=max(digits, 0))
    return f"it truncates {inner.kind}"


entry(
    "trunc(numeric[, int])",
    exp.Trunc,
    _trunc,
    rewrite=_to_scale,
    proofs=("trunc(e.n)", "trunc(e.n4, 2)", "trunc(e.n, -1)", "trunc(-2.567, 1)", "trunc(e.i4, 2)"),
)


def _integral(call: Call) -> Result:
    """ceil, floor, sign: numeric in, numeric of scale 0 out; an integer or a double in, a
    double out (PostgreSQL picks the double precision function for an integer)."""
    inner = call.type()
    if call.node.args.get("decimals") or call.node.args.get("to"):
        return f"it takes {call.node.key} with digits"
    if inner.kind in ("numeric", "null"):
        return PgType("numeric", scale=0)
    if inner.kind == "integer" or (inner.kind == "float" and inner.width == 8):
        return FLOAT8
    return f"it takes {call.node.key} of {inner.kind}"


entry(
    "ceil / ceiling / floor / sign",
    (exp.Ceil, exp.Floor, exp.Sign),
    _integral,
    proofs=(
        "ceil(e.n)",
        "floor(e.n4)",
        "ceiling(-2.5)",
        "floor(e.f8)",
        "ceil(e.f8)",
        "ceil(e.i4)",
        "sign(e.n)",
        "sign(e.f8)",
        "sign(e.n4)",
        "sign(0.0)",
        "sign(e.i2)",
        "floor(-0.5)",
    ),
)


def _float_function(call: Call) -> Result:
    for key in ("this", "expression"):
        if key in call.node.args and call.arg(key) is not None:
            found = call.type(key)
            if not (
                found.kind in ("null", "integer") or (found.kind == "float" and found.width == 8)
            ):
                return (
                    f"it takes {call.node.key} of {found.kind} (PostgreSQL computes it in numeric)"
                    if found.kind in ("numeric", "integer")
                    else f"it takes {call.node.key} of {found.kind}"
                )
    return FLOAT8


def _checked_float(
    name: str, condition: Callable[[exp.Expr], exp.Expr], message: str
) -> Callable[[exp.Expr], exp.Expr]:
    def rewrite(node: exp.Expr) -> exp.Expr:
        return _error_if(condition(node.this.copy()), message, node)

    return rewrite


entry(
    "sqrt(double)",
    exp.Sqrt,
    _float_function,
    rewrite=_checked_float(
        "sqrt",
        lambda v: exp.LT(this=v, expression=exp.Literal.number(0)),
        "cannot take square root of a negative number",
    ),
    proofs=("sqrt(abs(e.f8))", "sqrt(2::float8)", "sqrt(abs(e.i4))"),
    raises=("sqrt(-1::float8)", "sqrt(e.f8 * 0 - 1)"),
)
entry(
    "ln(double)",
    exp.Ln,
    _float_function,
    rewrite=_checked_float(
        "ln",
        lambda v: exp.LTE(this=v, expression=exp.Literal.number(0)),
        "cannot take logarithm of zero or a negative number",
    ),
    proofs=("ln(2::float8)", "ln(abs(e.f8) + 1)"),
    raises=("ln(0::float8)", "ln(e.f8 * 0)"),
)


def _power_checked(node: exp.Expr) -> exp.Expr:
    """power() raises on overflow and underflow in PostgreSQL (DuckDB: infinity, zero)."""
    a, b, result = node.this, node.expression, node.copy()
    overflow = exp.and_(
        _isinf(result.copy()), exp.Not(this=_isinf(a.copy())), exp.Not(this=_isinf(b.copy()))
    )
    underflow = exp.and_(
        exp.EQ(this=result.copy(), expression=exp.Literal.number(0)), _nonzero(a.copy())
    )
    negative_fraction = exp.and_(
        exp.LT(this=a.copy(), expression=exp.Literal.number(0)),
        exp.NEQ(this=b.copy(), expression=_func("floor", b.copy())),
    )
    zero_negative = exp.and_(
        exp.EQ(this=a.copy(), expression=exp.Literal.number(0)),
        exp.LT(this=b.copy(), expression=exp.Literal.number(0)),
    )
    ifs = [
        exp.If(this=c, true=_func("error", exp.Literal.string(m)))
        for c, m in (
            (negative_fraction, "a negative number raised to a non-integer power"),
            (zero_negative, "zero raised to a negative power is undefined"),
            (overflow, "value out of range: overflow"),
            (underflow, "value out of range: underflow"),
        )
    ]
    return exp.Case(ifs=ifs, default=node)


entry(
    "power(double, double)",
    exp.Pow,
    _float_function,
    rewrite=_power_checked,
    proofs=(
        "power(e.f8, 2)",
        "power(2::float8, 10)",
        "power(abs(e.f8), 0.5::float8)",
        "power(2, e.i2)",
        "power(e.f8, 0)",
    ),
    raises=(
        "power(e.f8 * 0 + 1e300::float8, 2)",
        "power(e.f8 * 0 - 8, 0.5::float8)",
        "power(e.f8 * 0, -1)",
    ),
)


def _width_bucket(call: Call) -> Result:
    node = call.node
    values = [node.this, node.args.get("min_value"), node.args.get("max_value")]
    count = node.args.get("num_buckets")
    if any(v is None for v in values) or count is None or node.args.get("threshold"):
        return "it takes width_bucket of other than four arguments"
    if not _exact(*map(call.of, values)) or not _integers(call.of(count)):
        return "it takes width_bucket of values that are not integers or numerics"
    return INT4


def _width_bucket_rewrite(node: exp.Expr) -> exp.Expr:
    """The cache's own width_bucket (`optimizer.postgres.numeric`): exact in numeric, as
    PostgreSQL's (DuckDB has none)."""
    values = [node.this, node.args["min_value"], node.args["max_value"]]
    return _func(WIDTH_BUCKET, *(exp.cast(v, "VARCHAR") for v in values), node.args["num_buckets"])


entry(
    "width_bucket(numeric, numeric, numeric, int)",
    exp.WidthBucket,
    _width_bucket,
    rewrite=_width_bucket_rewrite,
    proofs=(
        "width_bucket(e.n, 0, 10, 4)",
        "width_bucket(e.i4, -10, 10, 3)",
        "width_bucket(e.n4, 2, -2, 5)",
        "width_bucket(e.n, e.n0, 100.5, 7)",
        "width_bucket(5.5, 0, 10, 4)",
        "width_bucket(10, 0, 10, 4)",
        "width_bucket(e.n, 0, 1, 2147483646)",
    ),
    raises=(
        "width_bucket(e.n, 1, 1, 3)",
        "width_bucket(e.n, 0, 10, e.i4 * 0)",
        "width_bucket(e.n + 20, 0, 10, 2147483647)",
    ),
)


def _number_to_char(call: Call) -> Result:
    args = call.node.expressions
    if len(args) != 2 or call.of(args[0]).kind not in ("integer", "numeric", "null"):
        return NOT_MINE  # (a date's or timestamp's: date_time)
    template = _string_literal(args[1])
    if template is None or not number_text.number_template(template):
        return (
            "its to_char template of a number is not digits 9 and 0 with commas and a point, "
            "FM allowed (G and D follow lc_numeric; sign patterns: remote)"
        )
    return PgType("text")


def _number_to_char_rewrite(node: exp.Expr) -> exp.Expr:
    value, template = node.expressions
    return _func(NUMERIC_TO_CHAR, exp.cast(value, "VARCHAR"), template)


entry(
    "to_char(numeric / integer, literal template)",
    "to_char",
    _number_to_char,
    rewrite=_number_to_char_rewrite,
    proofs=(
        "to_char(e.n, '999999990.99')",
        "to_char(e.n4, '9,999.9')",
        "to_char(e.n0, '0000')",
        "to_char(e.i4, '9990')",
        "to_char(e.n, '99.9')",
        "to_char(e.n4, '999')",
        "to_char(e.i8, '999,999,999,999,999,999,999')",
        "to_char(e.n * 0.001, '0.999')",
        "to_char(e.n4 - 0.00004, '90.9999')",
        "to_char(e.i2, '9')",
        "to_char(e.n, 'FM9999999999.00')",
        "to_char(e.n4, 'FM999,999.99')",
        "to_char(e.n4, 'FM9.99')",
        "to_char(e.n * 0.01, 'FM9990.9')",
        "to_char(e.n4, 'FM0.999')",
        "to_char(e.i4, 'FM9999')",
        "to_char(e.n0, 'FM0000')",
        "to_char(e.n4, 'FM90.90')",
        "to_char(e.n4, 'FM9.09')",
        "to_char(e.n - 0.004, 'FM09.9')",
    ),
    raises=(),
)
