"""What DuckDB may compute for a local answer: every function, operator, cast and
literal form that may run in DuckDB is listed here, with the argument types it is listed for,
the type PostgreSQL gives its result, and the rewrite DuckDB needs to compute exactly what
PostgreSQL computes (or none). Anything not listed keeps the statement at the backend, and
EXPLAIN's ``reason`` names it.

Each entry carries its proofs: expressions over the edge-value table of
tests/test_allowlist.py (NULLs, empty strings, trailing blanks in char(n), negative and zero
scales, extremes, out-of-range arguments) whose answers the test compares with PostgreSQL's,
values and types, and expressions PostgreSQL raises an error for, which the cache must raise
with the same SQLSTATE. An entry without a proof fails that test.

Entries speak in `optimizer.postgres.types` types; the type inference
(`optimizer.postgres.expression_types`) asks `resolve` for the type of every node that computes
a value.
"""

from __future__ import annotations

import re
import typing as t
from collections.abc import Callable
from dataclasses import dataclass, replace

from sqlglot import exp

from optimizer.postgres.types import (
    BOOL,
    DATE,
    DATETIMES,
    FLOAT4,
    FLOAT8,
    INT4,
    INT8,
    NUMBERS,
    STRINGS,
    TIMESTAMP,
    UNKNOWN,
    PgType,
    combine,
    declared,
    literal_scale,
)
from sql_ext.long_lists import LONG_LIST
from sql_ext.nodes import ConstantList

Result = PgType | str  # the result's type, or why the entry does not take these arguments
# an entry's answer that it is not the one for these arguments (another entry may be; it is not
# the reason given when none is)
NOT_MINE = ""

_DIGITS = 38  # DuckDB's widest decimal
# PostgreSQL's numeric division inside a local statement: the cache's own DuckDB functions
# (`cache.store.functions`), giving the quotient at PostgreSQL's scale (at most
# DIVISION_SCALE digits: DuckDB holds it as a DECIMAL(38, DIVISION_SCALE)) and that scale
NUMERIC_DIVIDE, NUMERIC_DIVIDE_SCALE = "mtcache_numeric_div", "mtcache_numeric_div_scale"
WIDTH_BUCKET = "mtcache_width_bucket"  # PostgreSQL's width_bucket over numerics
DIVISION_SCALE = 24


@dataclass(frozen=True)
class Settings:
    """What of the backend's configuration the entries depend on."""

    # the database's LC_CTYPE is C: upper, lower, ILIKE and ~* change ASCII letters only
    ascii_case: bool = True
    utf8: bool = True  # the server's encoding is UTF8 (octet_length counts UTF-8 bytes)


class Call:
    """A node to resolve, with the types of its arguments."""

    def __init__(
        self, node: exp.Expr, typer: Callable[[exp.Expr], PgType], settings: Settings
    ) -> None:
        self.node = node
        self.typer = typer
        self.settings = settings

    def type(self, key: str = "this") -> PgType:
        value = self.node.args.get(key)
        return self.typer(value) if isinstance(value, exp.Expr) else UNKNOWN

    def of(self, node: exp.Expr | None) -> PgType:
        return self.typer(node) if node is not None else UNKNOWN

    def arg(self, key: str = "this") -> exp.Expr | None:
        value = self.node.args.get(key)
        return value if isinstance(value, exp.Expr) else None


@dataclass(frozen=True)
class Entry:
    """One form DuckDB computes as PostgreSQL does."""

    name: str  # how documents and reasons name it: "substring(text, int, int)"
    forms: tuple[type[exp.Expr] | str, ...]  # sqlglot classes, or names of calls it leaves as is
    signature: Callable[[Call], Result]
    rewrite: Callable[[exp.Expr], exp.Expr] | None = None  # the DuckDB form (None: as it is)
    proofs: tuple[str, ...] = ()  # expressions over the edge table, answered as PostgreSQL does
    raises: tuple[str, ...] = ()  # expressions PostgreSQL raises for: the cache raises the same


# -- helpers for signatures ---------------------------------------------------------------------


def _literal_int(node: exp.Expr | None) -> int | None:
    """The value of an integer literal (negative ones included), else None."""
    if isinstance(node, exp.Neg):
        inner = _literal_int(node.this)
        return -inner if inner is not None else None
    if isinstance(node, exp.Paren):
        return _literal_int(node.this)
    if isinstance(node, exp.Literal) and node.is_int:
        return int(node.this)
    return None


def _string_literal(node: exp.Expr | None) -> str | None:
    if isinstance(node, exp.Paren):
        return _string_literal(node.this)
    return node.this if isinstance(node, exp.Literal) and node.is_string else None


def _text(*types: PgType) -> PgType:
    return PgType("text", byte_order=all(t_.byte_order for t_ in types if t_.is_string))


def _strings(*types: PgType) -> bool:
    return all(t_.kind in STRINGS | {"null"} for t_ in types)


def _integers(*types: PgType) -> bool:
    return all(t_.kind in ("integer", "null") for t_ in types)


def _wider_integer(a: PgType, b: PgType) -> PgType:
    """The integer type of an operator over two integers: the wider one (int4 at least)."""
    return PgType("integer", max(a.width or 4, b.width or 4))


def _exact(*types: PgType) -> bool:
    """Integers and numerics (and NULL)."""
    return all(t_.kind in ("integer", "numeric", "null") for t_ in types)


def _scale(*types: PgType, rule: Callable[[list[int]], int]) -> int | None:
    """A numeric result's display scale from its operands' (None if one is not known)."""
    scales = [t_.as_numeric().scale if t_.kind != "null" else 0 for t_ in types]
    if any(s is None for s in scales):
        return None
    return rule(t.cast(list[int], scales))


def _floating(a: PgType, b: PgType) -> PgType | None:
    """The type of arithmetic on two numbers one of which is floating point: real only when
    both are real (PostgreSQL widens a real to double precision for anything else, and the
    local statement does too: `optimizer.postgres.semantics`); None when neither is floating."""
    kinds = {a.kind, b.kind} - {"null"}
    if "float" not in kinds or not kinds <= NUMBERS:
        return None
    floats = [t_ for t_ in (a, b) if t_.kind == "float"]
    return FLOAT4 if len(floats) == 2 and all(t_.width == 4 for t_ in floats) else FLOAT8


def _func(name: str, *args: exp.Expr) -> exp.Expr:
    return exp.Anonymous(this=name, expressions=list(args))


def _error_if(condition: exp.Expr, message: str, value: exp.Expr) -> exp.Expr:
    """``CASE WHEN condition THEN error(message) ELSE value END``: DuckDB raises where
    PostgreSQL raises (the cache then asks the backend, which raises its own error)."""
    return exp.Case(
        ifs=[exp.If(this=condition, true=_func("error", exp.Literal.string(message)))],
        default=value,
    )


_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LOWER = _UPPER.lower()


def _ascii_map(node: exp.Expr, source: str, target: str) -> exp.Expr:
    return exp.Translate(this=node, from_=exp.Literal.string(source), to=exp.Literal.string(target))


# -- the entries, by family ---------------------------------------------------------------------

ENTRIES: list[Entry] = []


Forms = type[exp.Expr] | str | tuple[type[exp.Expr] | str, ...]


def entry(
    name: str,
    forms: Forms,
    signature: Callable[[Call], Result],
    *,
    rewrite: Callable[[exp.Expr], exp.Expr] | None = None,
    proofs: tuple[str, ...] = (),
    raises: tuple[str, ...] = (),
) -> None:
    ENTRIES.append(
        Entry(
            name,
            forms if isinstance(forms, tuple) else (forms,),
            signature,
            rewrite,
            proofs,
            raises,
        )
    )


# literals


def _number_literal(call: Call) -> Result:
    node = t.cast(exp.Literal, call.node)
    if node.is_string:
        return PgType("string")
    text = node.this
    digits = len(text.lower().partition("e")[0].replace(".", "").lstrip("-+0"))
    if digits > _DIGITS:
        return f"its number {text[:20]}... has more digits than DuckDB's decimals"
    if node.is_int and abs(int(text)) < 2**63:
        return INT4 if abs(int(text)) < 2**31 else INT8
    scale = literal_scale(text)
    if scale is None:
        return f"it writes the number {text!r} in a form the cache does not read"
    return PgType("numeric", scale=scale)


entry(
    "literal",
    exp.Literal,
    _number_literal,
    proofs=(
        "1",
        "0",
        "-7",
        "2147483648",
        "1.50",
        "0.0",
        "-0.001",
        "1e3",
        "2.5e-1",
        "1.5E+2",
        "'abc'",
        "''",
    ),
)


def _constant_list(call: Call) -> Result:
    """A long IN list's constants (`sql_ext.nodes.ConstantList`), typed as one: the type of
    its widest constant (PostgreSQL compares each in the type the list resolves to)."""
    node = t.cast(ConstantList, call.node)
    if node.is_string:
        return PgType("string")
    largest = max(int(c) for c in node.constants)
    if largest >= 2**63:
        return "it lists integers beyond bigint's range in IN"
    return INT4 if largest < 2**31 else INT8


def _listed(template: str, constants: t.Iterable[object]) -> str:
    """A proof with a long list: ``template``'s {} the constants, LONG_LIST of them at least."""
    return template.format(", ".join(map(str, constants)))


entry(
    "long constant list",
    ConstantList,
    _constant_list,
    proofs=(
        _listed("e.i4 IN ({})", range(LONG_LIST + 7)),
        _listed("e.i2 NOT IN ({})", range(LONG_LIST + 3)),
        _listed("e.i8 IN ({})", [*range(LONG_LIST), 9223372036854775807, 3000000000]),
        _listed("e.i4 IN ({})", [*range(LONG_LIST), 3000000000]),
        _listed("e.t IN ({})", [*(f"'k{i}'" for i in range(LONG_LIST)), "'Ab '", "'x y'", "''"]),
        _listed(
            "e.v NOT IN ({})", [*(f"'it''s {i}'" for i in range(LONG_LIST)), "'a%_'", "'ÄÖü€'"]
        ),
    ),
)
entry("NULL", exp.Null, lambda call: PgType("null"), proofs=("NULL::int",))
entry("TRUE / FALSE", exp.Boolean, lambda call: BOOL, proofs=("TRUE", "FALSE"))


def _interval_literal(call: Call) -> Result:
    node = t.cast(exp.Interval, call.node)
    text = (_string_literal(node.this) or "").lower()
    unit = node.text("unit").lower()
    words = f"{text} {unit}"
    if not re.fullmatch(
        r"[\s\d.+-]*(\s*(day|days|hour|hours|minute|minutes|second|seconds|"
        r"week|weeks|month|months|mon|mons|year|years)\s*[\d.+-]*)*\s*"
        r"(\d+:\d+(:\d+(\.\d+)?)?)?\s*",
        words,
    ):
        return f"it writes the interval {text!r}, which the cache does not read"
    if re.search(r"\d\.\d*\s*(month|mon|year)", words):
        return "it writes a fractional month or year interval"
    return PgType("interval", months=bool(re.search(r"(month|mon|year)", words)))


entry(
    "interval literal",
    exp.Interval,
    _interval_literal,
    proofs=(
        "interval '1 day'",
        "interval '36 hours'",
        "interval '-7 days'",
        "interval '90 minutes'",
        "e.ts + interval '1 year 2 days'",
        "e.d + interval '1 month'",
        "interval '1.5 days'",
        "interval '1 year 2 months 3 days 04:05:06'",
        "interval '-14 months'",
        "interval '-1 year -2 months -3 days'",
    ),
)


# casts


_INT_TEXT = re.compile(r"\s*[+-]?\d+\s*")
_DECIMAL_TEXT = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")
_DATE_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIMESTAMP_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?")
_TIME_TEXT = re.compile(r"\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?")
_FLOAT_WORDS = frozenset({"nan", "infinity", "-infinity", "+infinity", "inf", "-inf"})


def _cast(call: Call) -> Result:
    node = t.cast(exp.Cast, call.node)
    target = node.to
    name = target.sql(dialect="postgres").lower()
    to = declared(name)
    inner = call.type()
    literal = _string_literal(node.this)
    sized = bool(target.expressions)
    if inner.kind == "unknown":
        return inner
    if to.kind in ("char",) or (to.kind == "varchar" and sized):
        return f"it casts to {name} (PostgreSQL pads or cuts values to the length)"
    if literal is not None and inner.kind == "string":
        return _cast_literal(literal, to, name)
    if isinstance(node.this, exp.Placeholder):
        # a parameter: the executor checks that a string value reads alike in both engines
        # (`reads_alike`); values of other Python types are bound typed
        if to.kind in _PARAMETER_TARGETS:
            return to
        return f"it casts a parameter to {name}"
    kind = inner.kind
    if to.kind == "integer":
        if kind in ("integer", "numeric", "float", "null"):
            return to
        return f"it casts {kind} to {name}"
    if to.kind == "numeric":
        if kind == "integer":
            return PgType("numeric", scale=to.scale if sized else 0)
        if kind in ("numeric", "null"):
            return PgType("numeric", scale=to.scale if sized else inner.scale)
        if kind == "float":
            return f"it casts to {name} from a double (PostgreSQL converts it through its text)"
        return f"it casts {kind} to {name}"
    if to.kind == "float":
        if kind in ("integer", "numeric", "null"):
            return to  # a numeric through its text (`_cast_rewrite`), as PostgreSQL does
        if kind == "float" and (to.width == 8 or inner.width == 4):
            return to
        return f"it casts {kind} to {name}, which DuckDB may round differently"
    if to.kind in ("text", "varchar"):
        if kind in ("integer", "numeric", "date", "timestamp", "bool", "null") or inner.is_string:
            return PgType(to.kind, byte_order=inner.byte_order if inner.is_string else True)
        return f"it casts {kind} to {name} (another text form)"
    if to.kind == "date" and kind in ("date", "timestamp", "timestamptz", "null"):
        return DATE  # of a timestamp with time zone: its date in the session's zone
    if to.kind == "timestamp" and kind in ("date", "timestamp", "timestamptz", "null"):
        return TIMESTAMP
    if to.kind == kind and kind in ("bool", "time", "interval"):
        return inner
    return f"it casts {kind} to {name}"


def _cast_rewrite(node: exp.Expr) -> exp.Expr:
    """A numeric becomes a double or a real through its text in PostgreSQL (strtod: the
    nearest value); DuckDB divides its digits by a power of ten, which may round twice. Read
    from the text too."""
    assert isinstance(node, exp.Cast)
    target = node.to.this
    if target in (exp.DType.DOUBLE, exp.DType.FLOAT) and isinstance(node.this, exp.Expr):
        node.set("this", exp.cast(node.this, "VARCHAR"))
    return node


_PARAMETER_TARGETS = frozenset(
    {"integer", "numeric", "float", "text", "varchar", "date", "timestamp", "bool"}
)


def reads_alike(kind: str, text: str) -> bool:
    """Do DuckDB and PostgreSQL read ``text`` as the same value of a type of this kind?"""
    return {
        "integer": _INT_TEXT.fullmatch(text) is not None and abs(int(text)) < 2**63,
        "numeric": _DECIMAL_TEXT.fullmatch(text) is not None,
        "float": _DECIMAL_TEXT.fullmatch(text) is not None or text.strip().lower() in _FLOAT_WORDS,
        "date": _DATE_TEXT.fullmatch(text.strip()) is not None,
        "timestamp": _TIMESTAMP_TEXT.fullmatch(text.strip()) is not None,
        "time": _TIME_TEXT.fullmatch(text.strip()) is not None,
        "bool": text.strip().lower() in ("true", "false"),
        "text": True,
        "varchar": True,
    }.get(kind, False)


def _cast_literal(text: str, to: PgType, name: str) -> Result:
    """A typed literal (``DATE '1995-01-01'``, ``'12'::int``): only texts DuckDB reads as
    PostgreSQL does."""
    if not reads_alike(to.kind, text):
        return f"it reads the literal {text[:30]!r} as {name}, which the cache does not parse"
    if to.kind == "numeric" and to.scale is None:
        return PgType("numeric", scale=literal_scale(text))
    if to.kind == "numeric":
        return to
    return to


def _numeric_to_float(call: Call) -> Result:
    """Casts of numerics to double precision and real (`_cast_rewrite`)."""
    inner = call.type()
    to = declared(t.cast(exp.Cast, call.node).to.sql(dialect="postgres").lower())
    if inner.kind != "numeric" or to.kind != "float":
        return NOT_MINE
    return to


entry(
    "CAST numeric AS double precision / real",
    exp.Cast,
    _numeric_to_float,
    rewrite=_cast_rewrite,
    proofs=(
        "e.n::float8",
        "e.n4::double precision",
        "e.n0::real",
        "e.n4::real",
        "(e.n * e.n4)::float8",
        "0.1::float8",
        "123456789012345678.9::float8",
    ),
)
entry(
    "CAST",
    exp.Cast,
    _cast,
    proofs=(
        "e.i4::bigint",
        "e.i8::int",
        "e.n::int",
        "e.n4::bigint",
        "(e.f8 / 4)::int",
        "e.i4::numeric",
        "e.n::numeric",
        "e.i2::numeric(8,2)",
        "e.n4::numeric(20,1)",
        "e.n::numeric(14)",
        "e.i4::float8",
        "e.i8::float8",
        "e.i4::real",
        "e.f4::float8",
        "e.i4::text",
        "e.n::varchar",
        "e.n0::text",
        "e.d::text",
        "e.ts::text",
        "e.c::text",
        "e.v::text",
        "e.b::text",
        "e.ts::date",
        "e.d::timestamp",
        "e.tz::date",
        "e.tz::timestamp",
        "'12'::int",
        "' -3 '::bigint",
        "'1.250'::numeric",
        "'1e3'::numeric",
        "'NaN'::float8",
        "'-Infinity'::float8",
        "'1.5'::float8",
        "DATE '1995-01-22'",
        "DATE '1995-01-22'::varchar",
        "date '1994-06-27'::timestamp",
        "TIMESTAMP '1998-12-31 23:59:59.5'",
        "'10:15'::time",
        "'true'::boolean",
        "e.b::boolean",
        "e.f4::real",
    ),
    raises=(
        "(e.i8 * 0 + 3000000000)::int",
        "'abc'::int",
        "(e.n0 + 10)::numeric(3,2)",
        "'1995-02-30'::date",
    ),
)


# arithmetic


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
    float_underflow_error); DuckDB gives infinity and zero."""
    a, b, result = node.this, node.expression, node.copy()
    overflow = exp.and_(
        _isinf(result.copy()), exp.Not(this=_isinf(a.copy())), exp.Not(this=_isinf(b.copy()))
    )
    checks = [(overflow, "value out of range: overflow")]
    if isinstance(node, exp.Mul):
        checks.append(
            (
                exp.and_(
                    exp.EQ(this=result.copy(), expression=exp.Literal.number(0)),
                    _nonzero(a.copy()),
                    _nonzero(b.copy()),
                ),
                "value out of range: underflow",
            )
        )
    if isinstance(node, exp.Div):
        checks.append(
            (
                exp.and_(
                    exp.EQ(this=result.copy(), expression=exp.Literal.number(0)),
                    _nonzero(a.copy()),
                    exp.Not(this=_isinf(b.copy())),
                ),
                "value out of range: underflow",
            )
        )
    ifs = [
        exp.If(this=condition, true=_func("error", exp.Literal.string(message)))
        for condition, message in checks
    ]
    return exp.Case(ifs=ifs, default=node)


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


# comparisons and predicates


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
        "e.c IN (e.v)",
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


def _like(call: Call) -> Result:
    a, pattern = call.type(), call.type("expression")
    if not _strings(a, pattern):
        return f"it matches {a.kind} with LIKE"
    if isinstance(call.node, exp.ILike) and not call.settings.ascii_case:
        return "it takes ILIKE, whose case folding follows the database's ctype"
    text = _string_literal(call.arg("expression"))
    if text is None:
        return "it matches LIKE with a pattern that is not a literal"
    if "\\" in text:
        return "its LIKE pattern has a backslash (escapes are read differently)"
    return BOOL


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


def _ilike_rewrite(node: exp.Expr) -> exp.Expr:
    """ILIKE folds ASCII letters only under the C ctype: compare both sides lowered so."""
    like = exp.Like(
        this=_ascii_map(node.this, _UPPER, _LOWER),
        expression=_ascii_map(node.expression, _UPPER, _LOWER),
    )
    return exp.Not(this=like) if node.args.get("negate") else like


entry(
    "LIKE",
    exp.Like,
    _like,
    proofs=(
        "e.t LIKE 'A%'",
        "e.c LIKE 'ab'",
        "e.c LIKE 'ab%'",
        "e.c NOT LIKE '% '",
        "e.v LIKE '%b _'",
        "e.t LIKE ''",
        "e.v LIKE '%'",
        "e.t LIKE '_b%'",
    ),
)
entry(
    "ILIKE",
    exp.ILike,
    _like,
    rewrite=_ilike_rewrite,
    proofs=("e.t ILIKE 'a%'", "e.c ILIKE 'AB%'", "e.v NOT ILIKE '%Ä%'", "e.t ILIKE '%ö%'"),
)


def _similar_regex(pattern: str) -> str | None:
    """PostgreSQL's translation of a SQL regular expression (SIMILAR TO) into a POSIX one
    (``similar_to_escape``, src/backend/utils/adt/regexp.c) for the part both engines read
    alike; None for what the cache does not translate (escapes, brace ranges)."""
    out = []
    in_class = False
    for char in pattern:
        if char == "\\":
            return None
        if in_class:
            out.append(char)
            if char == "]":
                in_class = False
            continue
        if char == "[":
            in_class = True
            out.append(char)
        elif char == "%":
            out.append(".*")
        elif char == "_":
            out.append(".")
        elif char in ".^$":
            out.append("\\" + char)
        elif char in "{}":
            return None
        else:
            out.append(char)
    if in_class:
        return None
    return "^(?:" + "".join(out) + ")$"


def _similar(call: Call) -> Result:
    a = call.type()
    if not _strings(a, call.type("expression")):
        return f"it matches {a.kind} with SIMILAR TO"
    text = _string_literal(call.arg("expression"))
    if text is None or _similar_regex(text) is None:
        return "its SIMILAR TO pattern is not a literal the cache translates"
    return BOOL


def _similar_rewrite(node: exp.Expr) -> exp.Expr:
    """DuckDB reads SIMILAR TO's pattern as a regular expression: give it PostgreSQL's
    translation, matched in full."""
    regex = _similar_regex(node.expression.this) or ""
    return exp.RegexpLike(this=node.this, expression=exp.Literal.string(regex), full_match=True)


entry(
    "SIMILAR TO",
    exp.SimilarTo,
    _similar,
    rewrite=_similar_rewrite,
    proofs=(
        "e.t SIMILAR TO 'A%'",
        "e.c SIMILAR TO 'ab%'",
        "e.v SIMILAR TO '%(b|y)%'",
        "e.t SIMILAR TO '[A-C]%'",
        "e.t NOT SIMILAR TO '_%'",
        "e.v SIMILAR TO '%'",
        "e.t SIMILAR TO 'x.y'",
        "e.t SIMILAR TO '(Ab|x)%'",
        "e.v SIMILAR TO '%1*'",
    ),
)

# what both PostgreSQL's regular expressions and RE2 read alike
_SAFE_REGEX = re.compile(
    r"(?:[^\\\[\](){}|*+?.^$]|\\[.^$*+?()\[\]{}|\\]|[.^$|*+?()]"
    r"|\{\d+(,\d*)?\}|\[\^?\]?[^\]\[\\]*\])*"
)


def _regex(call: Call) -> Result:
    a = call.type()
    if not _strings(a, call.type("expression")):
        return f"it matches {a.kind} with a regular expression"
    if call.node.args.get("flag") is not None:
        return "it passes flags to a regular expression"
    if isinstance(call.node, exp.RegexpILike) and not call.settings.ascii_case:
        return "it takes ~*, whose case folding follows the database's ctype"
    text = _string_literal(call.arg("expression"))
    if text is None or not _SAFE_REGEX.fullmatch(text) or not text.isascii():
        return "its regular expression is not a literal both engines read alike"
    return BOOL


def _regex_i_rewrite(node: exp.Expr) -> exp.Expr:
    """~* folds ASCII letters only under the C ctype: match the value lowered so against the
    pattern lowered (a literal of ASCII, checked)."""
    return exp.RegexpLike(
        this=_ascii_map(node.this, _UPPER, _LOWER),
        expression=exp.Literal.string(node.expression.this.lower()),
    )


entry(
    "~",
    exp.RegexpLike,
    _regex,
    proofs=(
        "e.t ~ '^A'",
        "e.c ~ ' $'",
        "e.v ~ 'b +'",
        "e.t !~ '[0-9]{2}'",
        "e.t ~ '^(Ab|x)'",
        "e.v ~ '^$'",
        "e.t ~ 'a.c'",
    ),
)
entry(
    "~*",
    exp.RegexpILike,
    _regex,
    rewrite=_regex_i_rewrite,
    proofs=("e.t ~* '^a'", "e.v ~* 'B'", "e.t ~* 'X Y'"),
)


# conditionals


def _case(call: Call) -> Result:
    node = call.node
    values = [i.args["true"] for i in node.args.get("ifs") or []]
    if node.args.get("default") is not None:
        values.insert(0, node.args["default"])  # PostgreSQL resolves the ELSE first
    subject = node.args.get("this")
    for branch in node.args.get("ifs") or []:
        condition = call.of(branch.this)
        if subject is not None:
            if not _comparable(call.of(subject), condition):
                return "it compares CASE's value with another type"
        elif condition.kind not in ("bool", "null"):
            return f"its CASE tests a {condition.kind}"
    return _combined([call.of(v) for v in values])


def _combined(types: list[PgType]) -> Result:
    found = combine(types)
    if found.kind == "unknown":
        return "it mixes values of types the cache cannot resolve as PostgreSQL does"
    return found


entry(
    "CASE",
    exp.Case,
    _case,
    proofs=(
        "CASE WHEN e.i4 > 1 THEN e.n ELSE 0 END",
        "CASE e.c WHEN 'ab' THEN 1 END",
        "CASE WHEN e.b THEN e.c ELSE 'x' END",
        "CASE WHEN e.i4 IS NULL THEN 'none' END",
        "CASE WHEN e.b THEN e.v ELSE e.t END",
        "CASE WHEN e.b THEN e.c ELSE e.v END",
        "CASE WHEN e.b THEN e.v ELSE e.c END",
        "CASE WHEN e.b THEN e.c ELSE e.c1 END",
        "CASE WHEN e.i4 > 0 THEN 1.5 ELSE 2.25 END",
        "(CASE WHEN e.b THEN e.v ELSE e.c END) || '|'",
        "length(CASE WHEN e.b THEN e.t ELSE e.c END)",
        "CASE WHEN e.b THEN e.v ELSE e.c END = 'ab'",
    ),
)


def _coalesce(call: Call) -> Result:
    node = call.node
    return _combined([call.of(node.this), *map(call.of, node.expressions)])


entry(
    "coalesce",
    exp.Coalesce,
    _coalesce,
    proofs=(
        "coalesce(e.i4, 0)",
        "coalesce(e.n, 0)",
        "coalesce(e.c, 'none')",
        "coalesce(e.v, e.t)",
        "coalesce(e.d, DATE '1999-01-01')",
        "coalesce(e.n, e.n4)",
        "coalesce(e.c, e.v)",
        "coalesce(e.v, e.c)",
        "coalesce(e.c, e.t)",
        "coalesce(e.t, e.c1)",
        "coalesce(e.c1, e.c)",
        "SELECT u.x FROM (SELECT coalesce(e.n, 0) AS x FROM edge e UNION ALL "
        "SELECT 0.5 FROM edge e) u",
        "SELECT d.x + 1 FROM (SELECT coalesce(e.n4, e.n) AS x FROM edge e) d",
        "coalesce(e.c, e.v) || '|'",
        "coalesce(e.c, 'x  ') || '|'",
    ),
)


def _nullif(call: Call) -> Result:
    """NULLIF's value is its first argument, promoted to the type it is compared in (an
    integer compared with a numeric is a numeric, of scale 0)."""
    a, b = call.type(), call.type("expression")
    if not _comparable(a, b):
        return f"it compares {a.kind} with {b.kind} in NULLIF"
    common = _combined([a, b])
    if isinstance(common, PgType) and common.kind == "numeric":
        return PgType("numeric", scale=a.as_numeric().scale if a.kind != "null" else None)
    return common if isinstance(common, PgType) and common.kind == "float" else a


entry(
    "nullif",
    exp.Nullif,
    _nullif,
    proofs=(
        "nullif(e.i4, 7)",
        "nullif(e.c, 'ab')",
        "nullif(e.n, 0)",
        "nullif(e.v, '')",
        "nullif(1000, -0.5)",
        "nullif(e.i4, e.n)",
        "nullif(e.n, e.n4)",
        "nullif(e.i4, e.f8)",
    ),
)


def _extreme(call: Call) -> Result:
    node = call.node
    types = [call.of(node.this), *map(call.of, node.expressions)]
    for other in types[1:]:
        if not _comparable(types[0], other):
            return "it compares values of different types in GREATEST/LEAST"
    return _combined(types)


entry(
    "greatest / least",
    (exp.Greatest, exp.Least),
    _extreme,
    proofs=(
        "greatest(e.i4, 0)",
        "least(e.n, 1.5)",
        "greatest(e.v, e.t)",
        "least(e.c, 'b') = 'ab'",
        "least(e.c, e.c)",
        "greatest(e.c, e.v) = 'ab'",
        "least(e.v, e.c)",
        "greatest(e.v, e.c1)",
        "greatest(e.t, e.c)",
        "least(e.d, DATE '1995-01-01')",
        "greatest(e.n, e.i4::numeric)",
        "least(1.5, 2.25)",
        "greatest(e.n, NULL)",
    ),
)


# text


def _text_of(*keys: str, result: Callable[..., PgType] | None = None) -> Callable[[Call], Result]:
    """A function of string arguments ``keys`` (the rest integers) returning text."""

    def signature(call: Call) -> Result:
        types = [call.type(k) for k in keys if call.arg(k) is not None]
        if not _strings(*types):
            return f"it passes {'/'.join(t_.kind for t_ in types)} to {call.node.key}"
        others = [
            call.type(k)
            for k in call.node.args
            if k not in keys and call.arg(k) is not None and k not in ("position", "is_left")
        ]
        if not _integers(*others):
            return f"it passes {'/'.join(t_.kind for t_ in others)} to {call.node.key}"
        return result(*types) if result is not None else _text(*types)

    return signature


def _case_map(source: str, target: str) -> Callable[[exp.Expr], exp.Expr]:
    def rewrite(node: exp.Expr) -> exp.Expr:
        return _ascii_map(node.this, source, target)

    return rewrite


def _cased(call: Call) -> Result:
    if not call.settings.ascii_case:
        return f"it takes {call.node.key}, whose case mapping follows the database's ctype"
    return _text_of("this")(call)


entry(
    "upper",
    exp.Upper,
    _cased,
    rewrite=_case_map(_LOWER, _UPPER),
    proofs=("upper(e.t)", "upper(e.c)", "upper('äb')"),
)
entry(
    "lower",
    exp.Lower,
    _cased,
    rewrite=_case_map(_UPPER, _LOWER),
    proofs=("lower(e.t)", "lower(e.v)", "lower('ÄB')"),
)
entry(
    "length / char_length",
    exp.Length,
    _text_of("this", result=lambda *_: INT4),
    rewrite=lambda node: exp.Length(this=exp.cast(node.this, "VARCHAR")),
    proofs=("length(e.t)", "char_length(e.c)", "length('ab  ')", "length(e.v)"),
)


def _octet_length(call: Call) -> Result:
    args = [call.of(a) for a in call.node.expressions]
    if len(args) != 1 or not _strings(*args):
        return "it takes octet_length of something other than one string"
    if not call.settings.utf8:
        return "it takes octet_length, which counts bytes of the server's encoding (not UTF8)"
    return INT4


entry(
    "octet_length",
    "octet_length",
    _octet_length,
    rewrite=lambda node: _func("strlen", exp.cast(node.expressions[0], "VARCHAR")),
    proofs=("octet_length(e.t)", "octet_length(e.c)", "octet_length('ÄÖ')", "octet_length(e.v)"),
)
entry(
    "strpos / position",
    exp.StrPosition,
    _text_of("this", "substr", result=lambda *_: INT4),
    proofs=("strpos(e.t, 'b')", "position('' in e.v)", "position(' ' in e.c)", "strpos(e.v, e.c)"),
)


def _substring(call: Call) -> Result:
    found = _text_of("this")(call)
    if isinstance(found, str):
        return found
    start = call.arg("start")
    if start is not None and not _integers(call.of(start)):
        return "its substring start is not an integer"
    length = call.arg("length")
    if length is not None and not _integers(call.of(length)):
        return "its substring length is not an integer"
    return found


def _substring_rewrite(node: exp.Expr) -> exp.Expr:
    """PostgreSQL counts a start below 1 as characters before the string, which shorten the
    length (DuckDB counts a negative start from the end); a negative length raises (DuckDB
    would give '')."""
    start, length = node.args.get("start"), node.args.get("length")
    literal = _literal_int(start) if start is not None else 1
    fixed = _literal_int(length) if length is not None else None
    if length is not None and (fixed is None or fixed < 0):
        length = _error_if(
            exp.LT(this=length.copy(), expression=exp.Literal.number(0)),
            "negative substring length not allowed",
            length,
        )
        node.set("length", length)
    if start is None or (literal is not None and literal >= 1):
        return node
    one = exp.Literal.number(1)
    first = exp.Greatest(this=start.copy(), expressions=[one.copy()])
    node.set("start", first)
    if length is not None:  # the characters from start to start + length, of those from 1
        end = exp.Sub(this=exp.Add(this=start.copy(), expression=length), expression=first.copy())
        node.set("length", exp.Greatest(this=end, expressions=[exp.Literal.number(0)]))
    return node


entry(
    "substring / substr",
    exp.Substring,
    _substring,
    rewrite=_substring_rewrite,
    proofs=(
        "substring(e.t from 2 for 3)",
        "substr(e.c, 1, 2)",
        "substring(e.v from 3)",
        "substring(e.t, 1, e.i2 + 1)",
        "substr(e.v, 2, 0)",
        "substring(e.t from 0 for 3)",
        "substring(e.v from -2 for 4)",
        "substring(e.t from -5)",
        "substr(e.c, e.i2, 2)",
        "substring(e.v from e.i4 - 8)",
        "substr(e.t, -1, 1)",
    ),
    raises=("substring(e.t from 1 for -1)", "substr(e.v, 1, e.i4 - 100)"),
)


def _trim(call: Call) -> Result:
    node = call.node
    if node.args.get("collation"):
        return "it trims with a collation"
    return _text_of("this", "expression")(call)


entry(
    "trim / ltrim / rtrim / btrim",
    exp.Trim,
    _trim,
    proofs=(
        "trim(e.t)",
        "ltrim(e.v)",
        "rtrim(e.c)",
        "btrim(e.v, 'ab')",
        "trim(both 'x' from e.t)",
        "trim(leading from e.v)",
        "rtrim(e.t, ' b')",
    ),
)
entry(
    "replace",
    exp.Replace,
    _text_of("this", "expression", "replacement"),
    proofs=("replace(e.t, 'b', 'X')", "replace(e.c, 'a', '')", "replace(e.v, '', 'x')"),
)
entry(
    "left / right",
    (exp.Left, exp.Right),
    _text_of("this"),
    proofs=("left(e.t, 2)", "right(e.c, 1)", "left(e.v, -1)", "right(e.t, -2)", "left(e.v, e.i2)"),
)


def _pad(call: Call) -> Result:
    found = _text_of("this", "fill_pattern")(call)
    if isinstance(found, str):
        return found
    fill = call.arg("fill_pattern")
    if fill is not None and not _string_literal(fill):
        return "it pads with a fill that is not a literal of at least one character"
    return found


entry(
    "lpad / rpad",
    exp.Pad,
    _pad,
    proofs=(
        "lpad(e.t, 5, '*')",
        "rpad(e.v, 3)",
        "lpad(e.c, 2, 'xy')",
        "rpad(e.t, -1, '*')",
        "lpad(e.v, 0)",
    ),
)
entry(
    "repeat",
    exp.Repeat,
    _text_of("this"),
    proofs=("repeat(e.t, 2)", "repeat(e.c, 0)", "repeat(e.v, -1)"),
)
entry("reverse", exp.Reverse, _text_of("this"), proofs=("reverse(e.t)", "reverse(e.c)"))
entry("md5", exp.MD5, _text_of("this"), proofs=("md5(e.t)", "md5(e.c)", "md5('')"))


def _split_part(call: Call) -> Result:
    found = _text_of("this", "delimiter")(call)
    if isinstance(found, str):
        return found
    part = _literal_int(call.arg("part_index"))
    if part is None or part == 0:
        return "it takes split_part of a field that is not a nonzero literal"
    if not _string_literal(call.arg("delimiter")):
        return "it splits at a delimiter that is not a nonempty literal"
    return found


entry(
    "split_part",
    exp.SplitPart,
    _split_part,
    proofs=(
        "split_part(e.t, ' ', 2)",
        "split_part(e.v, 'b', 1)",
        "split_part(e.t, ' ', -1)",
        "split_part(e.c, 'b', 1)",
    ),
    raises=("split_part(e.t, ' ', 0)",),
)
entry(
    "translate",
    exp.Translate,
    _text_of("this", "from_", "to"),
    proofs=("translate(e.t, 'ab', 'XY')", "translate(e.c, 'a', '')", "translate(e.v, '', 'x')"),
)


def _to_hex(width: int) -> Callable[[Call], Result]:
    def signature(call: Call) -> Result:
        found = call.type()
        if found.kind == "integer" and (found.width or 4) != width:
            return NOT_MINE
        if found.kind != "integer":
            return f"it takes to_hex of {found.kind}"
        return PgType("text")

    return signature


def _to_hex_int4(node: exp.Expr) -> exp.Expr:
    """PostgreSQL prints lower case, and an integer's negative values as 32 bits (DuckDB:
    64)."""
    value = node.this
    negative = exp.LT(this=value.copy(), expression=exp.Literal.number(0))
    wrapped = exp.Add(this=exp.cast(value.copy(), "BIGINT"), expression=exp.Literal.number(2**32))
    unsigned = exp.Case(
        ifs=[exp.If(this=negative, true=wrapped)], default=exp.cast(value, "BIGINT")
    )
    return exp.Lower(this=exp.Hex(this=unsigned))


entry(
    "to_hex(integer)",
    exp.Hex,
    _to_hex(4),
    rewrite=_to_hex_int4,
    proofs=("to_hex(e.i4)", "to_hex(255)", "to_hex(-1)", "to_hex(e.i4 * 0 - 2147483647 - 1)"),
)
entry(
    "to_hex(bigint)",
    exp.Hex,
    _to_hex(8),
    rewrite=lambda node: exp.Lower(this=exp.Hex(this=node.this)),
    proofs=("to_hex(e.i8)", "to_hex(-1::bigint)", "to_hex(e.i8 * 0)"),
)


def _chr(call: Call) -> Result:
    args = call.node.expressions
    if len(args) != 1 or not _integers(call.of(args[0])) or call.node.args.get("charset"):
        return "it takes chr of something other than one integer"
    return PgType("text")


def _chr_rewrite(node: exp.Expr) -> exp.Expr:
    """chr(0) and code points that are not characters raise in PostgreSQL."""
    value = node.expressions[0]
    bad = exp.or_(
        exp.LTE(this=value.copy(), expression=exp.Literal.number(0)),
        exp.GT(this=value.copy(), expression=exp.Literal.number(1114111)),
        exp.Between(
            this=value.copy(), low=exp.Literal.number(55296), high=exp.Literal.number(57343)
        ),
    )
    return _error_if(bad, "requested character not valid", exp.Chr(expressions=[value]))


entry(
    "chr",
    exp.Chr,
    _chr,
    rewrite=_chr_rewrite,
    proofs=("chr(65)", "chr(e.i4 + 65)", "chr(228)", "chr(8364)"),
    raises=("chr(0)", "chr(e.i2 * 0)", "chr(-1)", "chr(55296)"),
)
entry(
    "ascii",
    exp.Ascii,
    _text_of("this", result=lambda *_: INT4),
    proofs=("ascii(e.t)", "ascii(e.c)", "ascii('')", "ascii('Ä')"),
)
entry(
    "starts_with",
    exp.StartsWith,
    _text_of("this", "expression", result=lambda *_: BOOL),
    proofs=("starts_with(e.t, 'A')", "starts_with(e.c, 'ab')", "starts_with(e.v, '')"),
)


_PRINTED = frozenset({"integer", "numeric", "date"}) | STRINGS | {"null"}


def _concat(call: Call) -> Result:
    node = call.node
    args = node.expressions
    types = [call.of(a) for a in args]
    for found in types:
        if found.kind not in _PRINTED:
            return f"it concatenates {found.kind}, which DuckDB prints differently"
    if isinstance(node, exp.ConcatWs) and not _strings(types[0]):
        return "its concat_ws separator is not a string"
    return _text(*types)


entry(
    "concat / concat_ws",
    (exp.Concat, exp.ConcatWs),
    _concat,
    proofs=(
        "concat(e.t, e.i4, e.c)",
        "concat(e.v, NULL, 'x')",
        "concat_ws('-', e.c, e.v, e.n)",
        "concat(e.d, e.n0)",
        "concat_ws(',', NULL, e.t)",
    ),
)


def _dpipe(call: Call) -> Result:
    a, b = call.type(), call.type("expression")
    if not (a.is_string or b.is_string) and not {a.kind, b.kind} & {"null"}:
        return "it applies || to values that are not text"
    for found in (a, b):
        if found.kind not in _PRINTED:
            return f"it concatenates {found.kind}, which DuckDB prints differently"
    return _text(a, b)


entry(
    "||",
    exp.DPipe,
    _dpipe,
    proofs=(
        "e.t || e.v",
        "e.c || '!'",
        "'<' || e.c || '>'",
        "e.t || e.i4",
        "e.n || 'x'",
        "e.d || ''",
        "e.t || NULL",
    ),
)


# numbers


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


def _extract(call: Call) -> Result:
    unit = call.node.this.name.lower() if isinstance(call.node.this, exp.Expr) else ""
    if unit not in _INTEGER_FIELDS:
        return f"it extracts {unit}, which PostgreSQL may give with a fraction"
    if call.type("expression").kind not in ("date", "timestamp", "null"):
        return f"it extracts {unit} from {call.type('expression').kind}"
    return PgType("numeric", scale=0)


_INTEGER_FIELDS = frozenset(
    {
        "year",
        "month",
        "day",
        "dow",
        "doy",
        "quarter",
        "week",
        "isodow",
        "isoyear",
        "decade",
        "century",
        "millennium",
        "hour",
        "minute",
    }
)
entry(
    "extract(field from date / timestamp)",
    exp.Extract,
    _extract,
    proofs=(
        "extract(year from e.d)",
        "extract(month from e.ts)",
        "extract(dow from e.d)",
        "extract(doy from e.d)",
        "extract(quarter from e.d)",
        "extract(week from e.d)",
        "extract(isodow from e.d)",
        "extract(isoyear from e.d)",
        "extract(hour from e.ts)",
        "extract(minute from e.ts)",
        "extract(century from e.d)",
    ),
)


def _date_part(call: Call) -> Result:
    args = call.node.expressions
    unit = _string_literal(args[0]) if args else None
    if unit is None or unit.lower() not in _INTEGER_FIELDS or len(args) != 2:
        return "it takes date_part of a field that may have a fraction"
    if call.of(args[1]).kind not in ("date", "timestamp", "null"):
        return f"it takes date_part of {call.of(args[1]).kind}"
    return FLOAT8


entry(
    "date_part(field, date / timestamp)",
    "date_part",
    _date_part,
    proofs=("date_part('year', e.d)", "date_part('dow', e.ts)", "date_part('doy', e.d)"),
)


def _date_trunc(call: Call) -> Result:
    unit = call.node.text("unit").lower()
    if unit not in ("year", "quarter", "month", "week", "day", "hour", "minute", "second"):
        return f"it truncates to {unit}"
    if call.type().kind in ("timestamp", "null"):
        return TIMESTAMP
    if call.type().kind == "date":
        return PgType("timestamptz")  # `_date_trunc_zoned`
    return f"it takes date_trunc of {call.type().kind}"


ZONE_PARAMETER = "mtcache_zone"  # the session's time zone, bound by the executor


def _date_trunc_zoned(node: exp.Expr) -> exp.Expr:
    """date_trunc of a date: PostgreSQL reads the date as midnight in the session's time zone
    (a timestamp with time zone) and truncates there; DuckDB truncates the timestamp and
    places it in that zone, a parameter the executor binds."""
    if not isinstance(node.this, exp.Expr) or node.args.get("zone") is not None:
        return node
    inner = node.this
    node.set("this", exp.cast(inner, "TIMESTAMP"))
    zone = exp.Placeholder(this=exp.to_identifier(ZONE_PARAMETER))
    return _func("timezone", zone, node)


def _date_trunc_date(call: Call) -> Result:
    found = _date_trunc(call)
    return found if isinstance(found, str) or found.kind == "timestamptz" else NOT_MINE


entry(
    "date_trunc(field, date)",
    exp.TimestampTrunc,
    _date_trunc_date,
    rewrite=_date_trunc_zoned,
    proofs=(
        "date_trunc('month', e.d)",
        "date_trunc('year', e.d)",
        "date_trunc('week', e.d)",
        "date_trunc('day', e.d)",
        "date_trunc('quarter', e.d) < e.tz",
    ),
)
entry(
    "date_trunc(field, timestamp)",
    exp.TimestampTrunc,
    _date_trunc,
    proofs=(
        "date_trunc('month', e.ts)",
        "date_trunc('year', e.d::timestamp)",
        "date_trunc('week', e.ts)",
        "date_trunc('quarter', e.ts)",
    ),
)


# to_char's template patterns the cache reads: (strftime, blank-padded width, case)
_TEMPLATE = {
    "YYYY": ("%Y", None, None),
    "YY": ("%y", None, None),
    "MM": ("%m", None, None),
    "DDD": ("%j", None, None),
    "DD": ("%d", None, None),
    "HH24": ("%H", None, None),
    "MI": ("%M", None, None),
    "SS": ("%S", None, None),
    "Month": ("%B", 9, None),
    "MONTH": ("%B", 9, "upper"),
    "month": ("%B", 9, "lower"),
    "Mon": ("%b", None, None),
    "MON": ("%b", None, "upper"),
    "mon": ("%b", None, "lower"),
    "Day": ("%A", 9, None),
    "DAY": ("%A", 9, "upper"),
    "day": ("%A", 9, "lower"),
    "Dy": ("%a", None, None),
    "DY": ("%a", None, "upper"),
    "dy": ("%a", None, "lower"),
    "Q": ("quarter", None, None),
}
_NUMERIC_PATTERNS = frozenset({"YYYY", "YY", "MM", "DDD", "DD", "HH24", "MI", "SS", "Q"})


def _template(text: str) -> list[tuple[str, str | None, bool]] | None:
    """A to_char template as pieces: ("literal", text) or (pattern, None) with its FM flag;
    None where it holds what the cache does not read."""
    pieces: list[tuple[str, str | None, bool]] = []
    at, fill_mode = 0, False
    patterns = sorted(_TEMPLATE, key=len, reverse=True)
    while at < len(text):
        if text.startswith("FM", at):
            fill_mode, at = True, at + 2
            continue
        if text[at] == '"':
            end = text.find('"', at + 1)
            if end < 0 or "\\" in text[at:end]:
                return None
            pieces.append(("literal", text[at + 1 : end], False))
            at = end + 1
            continue
        found = next((p for p in patterns if text.startswith(p, at)), None)
        if found is not None:
            pieces.append((found, None, fill_mode))
            fill_mode, at = False, at + len(found)
            continue
        if text[at].isalpha() or text[at] == "\\":
            return None  # another pattern (or a letter PostgreSQL may read as one)
        pieces.append(("literal", text[at], False))
        at += 1
    return pieces


def _to_char(call: Call) -> Result:
    args = call.node.expressions
    if len(args) != 2 or call.of(args[0]).kind not in ("date", "timestamp", "null"):
        return "it takes to_char of something other than a date or timestamp"
    template = _string_literal(args[1])
    if template is None or _template(template) is None:
        return "its to_char template holds patterns the cache does not translate"
    return PgType("text")


def _to_char_rewrite(node: exp.Expr) -> exp.Expr:
    value, template = node.expressions
    stamp = exp.cast(value, "TIMESTAMP")
    parts: list[exp.Expr] = []
    for pattern, literal, fill_mode in _template(template.this) or []:
        if pattern == "literal":
            parts.append(exp.Literal.string(literal or ""))
            continue
        code, width, case = _TEMPLATE[pattern]
        piece: exp.Expr
        if code == "quarter":
            piece = exp.cast(_func("quarter", stamp.copy()), "VARCHAR")
        else:
            piece = _func("strftime", stamp.copy(), exp.Literal.string(code))
        if fill_mode and pattern in _NUMERIC_PATTERNS:  # FM: no leading zeros
            piece = exp.cast(exp.cast(piece, "BIGINT"), "VARCHAR")
        if case == "upper":
            piece = exp.Upper(this=piece)
        elif case == "lower":
            piece = exp.Lower(this=piece)
        if width is not None and not fill_mode:
            piece = _func("rpad", piece, exp.Literal.number(width), exp.Literal.string(" "))
        parts.append(piece)
    if not parts:  # an empty template gives NULL in PostgreSQL
        return exp.cast(exp.Null(), "VARCHAR")
    result = parts[0]
    for part in parts[1:]:
        result = exp.DPipe(this=result, expression=part)
    # a literal-only template still gives NULL for a NULL value
    return exp.Case(
        ifs=[exp.If(this=exp.Is(this=value.copy(), expression=exp.Null()), true=exp.Null())],
        default=result,
    )


entry(
    "to_char(date / timestamp, literal template)",
    "to_char",
    _to_char,
    rewrite=_to_char_rewrite,
    proofs=(
        "to_char(e.d, 'YYYY-MM-DD')",
        "to_char(e.d, 'Mon YYYY')",
        "to_char(e.d, 'Day')",
        "to_char(e.ts, 'DD/MM/YY HH24:MI:SS')",
        "to_char(e.d, 'Month')",
        "to_char(e.d, 'FMMonth FMDD, YYYY')",
        "to_char(e.d, 'Q')",
        "to_char(e.d, 'DDD')",
        "to_char(e.d, 'MONTH-month-MON-mon-DY-dy')",
        'to_char(e.ts, \'"at" HH24"h"\')',
        "to_char(e.d, 'FMDay')",
        "to_char(e.d, '')",
    ),
)


def _age(call: Call) -> Result:
    args = call.node.expressions
    if len(args) != 2:
        return "it takes age of one timestamp (the current date: not repeatable)"
    kinds = {call.of(a).kind for a in args} - {"null"}
    if not kinds <= {"timestamp", "date"}:
        return f"it takes age of {'/'.join(sorted(kinds))}"
    return PgType("interval", months=True)


entry(
    "age(timestamp, timestamp)",
    "age",
    _age,
    rewrite=lambda node: _func("age", *(exp.cast(a, "TIMESTAMP") for a in node.expressions)),
    proofs=(
        "age(e.ts, TIMESTAMP '1994-01-01')",
        "age(TIMESTAMP '1994-01-01', e.ts)",
        "age(e.d, DATE '1992-02-29')",
        "age(e.ts, e.ts)",
        "age(TIMESTAMP '1995-03-31', TIMESTAMP '1995-02-28 23:00')",
    ),
)


def _make_date(call: Call) -> Result:
    args = call.node.expressions
    if len(args) != 3 or not _integers(*map(call.of, args)):
        return "it takes make_date of something other than three integers"
    return DATE


entry(
    "make_date",
    "make_date",
    _make_date,
    proofs=("make_date(1995, 2, 28)", "make_date(e.i2 + 2000, 1, 1)"),
    raises=("make_date(1995, 13, 1)", "make_date(1995, 2, 29 + e.i2 * 0)"),
)


# aggregates


def _count(call: Call) -> Result:
    return INT8


entry(
    "count",
    exp.Count,
    _count,
    proofs=(
        "SELECT count(*), count(e.c), count(DISTINCT e.c) FROM edge e",
        "SELECT e.b, count(e.i4) FROM edge e GROUP BY e.b",
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
    proofs=("SELECT bool_and(e.b), bool_or(e.i4 > 5), every(e.b) FROM edge e",),
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
    return _text(call.of(value.this))


entry(
    "string_agg(text, literal ORDER BY ...)",
    exp.GroupConcat,
    _string_agg,
    proofs=(
        "SELECT string_agg(e.t, ',' ORDER BY e.t) FROM edge e",
        "SELECT string_agg(e.c, '' ORDER BY e.c DESC) FROM edge e",
    ),
)


# window functions


entry(
    "row_number / rank / dense_rank",
    (exp.RowNumber, exp.Rank, exp.DenseRank),
    lambda call: INT8,
    proofs=(
        "row_number() OVER (ORDER BY e.id)",
        "rank() OVER (ORDER BY e.c)",
        "dense_rank() OVER (PARTITION BY e.b ORDER BY e.i4)",
    ),
)


def _offset_value(call: Call) -> Result:
    value = call.type()
    default = call.arg("default")
    if default is not None:
        return _combined([value, call.of(default)])
    offset = call.arg("offset")
    if offset is not None and _literal_int(offset) is None:
        return "it takes lag/lead with an offset that is not a literal"
    return value


entry(
    "lag / lead",
    (exp.Lag, exp.Lead),
    _offset_value,
    proofs=(
        "lag(e.i4) OVER (ORDER BY e.id)",
        "lead(e.c, 2) OVER (ORDER BY e.id)",
        "lead(e.t, 1, 'none') OVER (ORDER BY e.id)",
    ),
)
entry(
    "first_value / last_value",
    (exp.FirstValue, exp.LastValue),
    lambda call: call.type(),
    proofs=(
        "first_value(e.n) OVER (ORDER BY e.id)",
        "last_value(e.c) OVER (ORDER BY e.id "
        "ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)",
    ),
)


# -- lookup -------------------------------------------------------------------------------------

_BY_FORM: dict[type[exp.Expr] | str, list[Entry]] = {}
for _entry in ENTRIES:
    for _form in _entry.forms:
        _BY_FORM.setdefault(_form, []).append(_entry)
BY_NAME = {e.name: e for e in ENTRIES}


def entries_for(node: exp.Expr) -> list[Entry]:
    if isinstance(node, exp.Anonymous):
        return _BY_FORM.get(node.name.lower(), [])
    return _BY_FORM.get(type(node), [])


def resolve(
    node: exp.Expr, typer: Callable[[exp.Expr], PgType], settings: Settings
) -> tuple[Entry | None, Result]:
    """The entry that computes ``node`` and the type of its result, or (None, why no entry
    does)."""
    found = entries_for(node)
    if not found:
        return None, (
            f"it calls {name_of(node)}, which is not on the list of what DuckDB "
            "computes as PostgreSQL does"
        )
    call = Call(node, typer, settings)
    reason = ""
    for candidate in found:
        result = candidate.signature(call)
        if isinstance(result, PgType):
            return candidate, result
        reason = reason or result
    return None, reason or f"it applies {name_of(node)} to arguments the list does not take"


def name_of(node: exp.Expr) -> str:
    """A function's name as SQL writes it (an operator's node name)."""
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    return node.sql_name().lower() if isinstance(node, exp.Func) else node.key


def computes(node: exp.Expr) -> bool:
    """Does the node compute a value that an entry must cover (rather than structure a query:
    a column, a subquery, a clause)?"""
    return isinstance(node, _COMPUTING) and not isinstance(node, _STRUCTURAL)


_COMPUTING = (
    exp.Func,
    exp.Binary,
    exp.Unary,
    exp.Predicate,
    exp.Literal,
    ConstantList,
    exp.Null,
    exp.Boolean,
    exp.Interval,
    exp.Cast,
)
# nodes that are typed by the inference itself or only arrange a query
_STRUCTURAL = (
    exp.Paren,
    exp.Alias,
    exp.Column,
    exp.Subquery,
    exp.Window,
    exp.Distinct,
    exp.Ordered,
    exp.Order,
    exp.Star,
    exp.Tuple,
    exp.Dot,
    exp.If,
)

# the parts a query is made of, which compute nothing themselves (anything else - a lateral
# join, a grouping set, a TABLESAMPLE, a recursive CTE's search clause - keeps the statement
# at the backend)
QUERY_PARTS = (
    *_STRUCTURAL,
    exp.Select,
    exp.From,
    exp.Join,
    exp.Where,
    exp.Group,
    exp.Having,
    exp.Limit,
    exp.Offset,
    exp.Union,
    exp.Intersect,
    exp.Except,
    exp.With,
    exp.CTE,
    exp.TableAlias,
    exp.Table,
    exp.Identifier,
    exp.WindowSpec,
    exp.DataType,
    exp.DataTypeParam,
    exp.Var,
    exp.Placeholder,
    exp.Collate,
    exp.Values,
    exp.Qualify,
)
