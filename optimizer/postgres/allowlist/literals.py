"""Literals: numbers (as PostgreSQL types them: integer, bigint or numeric of the written
scale), strings, long constant lists, NULL, booleans and intervals."""

from __future__ import annotations

import re
import typing as t

from sqlglot import exp

from optimizer.postgres.allowlist.base import Call, Family, Result, _string_literal
from optimizer.postgres.types import BOOL, DECIMAL_DIGITS, INT4, INT8, PgType, literal_scale
from sql_ext.long_lists import LONG_LIST
from sql_ext.nodes import ConstantList

FAMILY = Family()
entry = FAMILY.entry


def _number_literal(call: Call) -> Result:
    node = t.cast(exp.Literal, call.node)
    if node.is_string:
        return PgType("string")
    text = node.this
    digits = len(text.lower().partition("e")[0].replace(".", "").lstrip("-+0"))
    if digits > DECIMAL_DIGITS:
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
