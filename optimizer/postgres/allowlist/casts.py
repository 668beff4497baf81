"""Casts, and the texts both engines read alike as a value of a type (`reads_alike`: typed
literals, and parameters cast to a type)."""

from __future__ import annotations

import re
import typing as t

from sqlglot import exp

from optimizer.postgres.allowlist.base import NOT_MINE, Call, Family, Result, _string_literal
from optimizer.postgres.types import DATE, TIMESTAMP, PgType, declared, literal_scale

FAMILY = Family()
entry = FAMILY.entry


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
        # values of several scales: each printed at its own
        "(CASE WHEN e.i4 > 0 THEN e.n ELSE e.n4 END)::text",
        "(coalesce(e.n0, e.n * 1.5))::varchar || '|'",
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
