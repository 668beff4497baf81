"""Date and time functions: extract, date_part, date_trunc (of a date: in the session's time
zone, `ZONE_PARAMETER`), to_char with a literal template, age and make_date."""

from __future__ import annotations

from sqlglot import exp

from optimizer.postgres.allowlist.base import (
    NOT_MINE,
    Call,
    Family,
    Result,
    _func,
    _integers,
    _string_literal,
)
from optimizer.postgres.types import DATE, FLOAT8, TIMESTAMP, PgType

FAMILY = Family()
entry = FAMILY.entry


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
    if len(args) == 2 and call.of(args[0]).kind in ("integer", "numeric"):
        return NOT_MINE  # (a number's: math_functions)
    if len(args) != 2 or call.of(args[0]).kind not in ("date", "timestamp", "null"):
        return "it takes to_char of something other than a date, timestamp or number"
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
