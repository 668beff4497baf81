"""PostgreSQL's types as far as the cache's local answers depend on them: values
the type inference (`optimizer.postgres.expression_types`) and the allowlist of what DuckDB may
compute (`optimizer.postgres.allowlist`) speak in.

A type is a *kind* with what else matters for computing it exactly: the n of ``char(n)``, the
bytes of an integer or floating-point type, a numeric's *display scale* (PostgreSQL keeps one per
value: ``1.50`` and ``1.5`` are equal numerics printed differently), whether text is collated
by bytes as DuckDB orders it, and whether an interval may hold months (which psycopg and DuckDB
turn into days differently). An array (array_agg's output, which the cache gives only as a
statement's output column) is typed by its elements.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

Kind = t.Literal[
    "bool",
    "integer",
    "numeric",
    "float",
    "char",
    "varchar",
    "text",
    "string",
    "date",
    "timestamp",
    "timestamptz",
    "time",
    "interval",
    "bytea",
    "uuid",
    "array",
    "null",
    "other",
    "unknown",
]
DECIMAL_DIGITS = 38  # DuckDB's widest DECIMAL (its largest scale too)
STRINGS = frozenset({"char", "varchar", "text", "string"})
NUMBERS = frozenset({"integer", "numeric", "float"})
DATETIMES = frozenset({"date", "timestamp", "timestamptz"})


@dataclass(frozen=True)
class PgType:
    kind: Kind
    # char: n, when every value is a char(n) value of that one n; integer and float: bytes
    width: int | None = None
    # numeric: the display scale of every value (None: it varies from value to value, or
    # the inference cannot tell)
    scale: int | None = None
    byte_order: bool = True  # strings: collated by bytes (C), as DuckDB compares text
    deterministic: bool = True  # strings: equal only when byte-equal
    months: bool = False  # interval: may hold months or years
    digits: int | None = None  # numeric: the declared precision of a column's values
    # strings: under a collation of its own (a column's, a COLLATE clause's), whose ctype maps
    # case instead of the database's
    collated: bool = False
    element: PgType | None = None  # array: its elements' type (array_agg's output only)

    @property
    def is_string(self) -> bool:
        return self.kind in STRINGS

    @property
    def is_number(self) -> bool:
        return self.kind in NUMBERS

    def as_numeric(self) -> PgType:
        """The type a value takes where PostgreSQL converts it to numeric (an integer: scale
        0)."""
        if self.kind == "integer":
            return NUMERIC0
        return self if self.kind == "numeric" else UNKNOWN


NULL = PgType("null")
OTHER = PgType("other")
UNKNOWN = PgType("unknown")
BOOL = PgType("bool")
NUMERIC = PgType("numeric")
NUMERIC0 = PgType("numeric", scale=0)
FLOAT = FLOAT8 = PgType("float", 8)
FLOAT4 = PgType("float", 4)
INT2, INT4, INT8 = PgType("integer", 2), PgType("integer", 4), PgType("integer", 8)
DATE = PgType("date")
TIMESTAMP = PgType("timestamp")
TIMESTAMPTZ = PgType("timestamptz")
TIME = PgType("time")
INTERVAL = PgType("interval")
BYTEA = PgType("bytea")

_INTEGER_NAMES = {
    "smallint": INT2,
    "int2": INT2,
    "integer": INT4,
    "int": INT4,
    "int4": INT4,
    "bigint": INT8,
    "int8": INT8,
}
_FLOAT_NAMES = {
    "real": FLOAT4,
    "float4": FLOAT4,
    "double precision": FLOAT8,
    "float8": FLOAT8,
    "double": FLOAT8,
    "float": FLOAT8,
}
_OTHER_NAMES = {
    "boolean": BOOL,
    "bool": BOOL,
    "date": DATE,
    "timestamp": TIMESTAMP,
    "timestamp without time zone": TIMESTAMP,
    "timestamp with time zone": TIMESTAMPTZ,
    "timestamptz": TIMESTAMPTZ,
    "time": TIME,
    "time without time zone": TIME,
    "interval": PgType("interval", months=True),
    "bytea": BYTEA,
    "uuid": PgType("uuid"),
}


def declared(name: str, byte_order: bool = True, deterministic: bool = True) -> PgType:
    """A type as PostgreSQL names it (``format_type``'s text, or a cast's target)."""
    text = " ".join(name.strip().lower().split())
    base, _, rest = text.partition("(")
    base = base.strip()
    inside = rest.rstrip(")").split(",")
    if base in ("character", "char", "bpchar"):
        width = int(inside[0]) if inside[0].strip().isdigit() else (1 if not rest else None)
        return PgType("char", width=width, byte_order=byte_order, deterministic=deterministic)
    if base in ("character varying", "varchar"):
        return PgType("varchar", byte_order=byte_order, deterministic=deterministic)
    if base in ("text", "name"):
        return PgType("text", byte_order=byte_order, deterministic=deterministic)
    if base in _INTEGER_NAMES:
        return _INTEGER_NAMES[base]
    if base in ("numeric", "decimal"):
        scale = inside[1].strip() if len(inside) == 2 else ("0" if rest else "")
        digits = inside[0].strip() if rest else ""
        return PgType(
            "numeric",
            scale=int(scale) if scale.lstrip("-").isdigit() else None,
            digits=int(digits) if digits.isdigit() else None,
        )
    if base in _FLOAT_NAMES:
        return _FLOAT_NAMES[base]
    found = _OTHER_NAMES.get(base) or _OTHER_NAMES.get(text)
    if found is None and (base.startswith(("timestamp", "time")) and rest):
        # timestamp(3) [with/without time zone], time(3)
        found = _OTHER_NAMES.get(f"{base}{rest.partition(')')[2]}".strip())
    return found or OTHER


def combine(types: list[PgType]) -> PgType:
    """The type of a value that may come from any of several expressions (COALESCE arguments,
    UNION branches, CASE's ELSE and then its branches: PostgreSQL's order), as PostgreSQL's
    select_common_type resolves it; unknown when the inference cannot tell. Strings take the
    first typed input's type (every string type converts to every other implicitly, so
    PostgreSQL keeps the first). A numeric's scale is kept only when every branch has the
    same one."""
    known = [t_ for t_ in types if t_.kind != "null"]
    if not known:
        return NULL
    kinds = {t_.kind for t_ in known}
    byte_order = all(t_.byte_order for t_ in known)
    deterministic = all(t_.deterministic for t_ in known)
    collated = any(t_.collated for t_ in known)
    if "unknown" in kinds:
        return UNKNOWN
    if kinds <= STRINGS:
        typed = [t_ for t_ in known if t_.kind != "string"]
        if not typed:  # PostgreSQL resolves untyped strings alone to text
            return PgType("text", byte_order=byte_order, collated=collated)
        kind = typed[0].kind
        width = None
        if kind == "char" and kinds == {"char"}:
            widths = {t_.width for t_ in known}
            width = widths.pop() if len(widths) == 1 else None
        return PgType(
            kind,
            width=width,
            byte_order=byte_order,
            deterministic=deterministic,
            collated=collated,
        )
    if kinds <= NUMBERS | {"string"} and kinds & NUMBERS:
        if "float" in kinds:
            return FLOAT4 if all(t_.width == 4 for t_ in known) else FLOAT8
        if "numeric" in kinds:
            scales = {t_.as_numeric().scale if t_.kind != "string" else None for t_ in known}
            return PgType("numeric", scale=scales.pop() if len(scales) == 1 else None)
        if "string" in kinds:
            return UNKNOWN  # an untyped literal among integers: its value decides
        return PgType("integer", max(t_.width or 8 for t_ in known))
    if kinds <= {"date", "timestamp"}:
        return TIMESTAMP if "timestamp" in kinds else DATE
    if len(kinds) == 1 and kinds <= {"bool", "timestamptz", "time", "bytea", "uuid"}:
        return known[0]
    if kinds == {"array"} and len(set(known)) == 1:
        return known[0]
    if kinds == {"interval"}:
        return PgType("interval", months=any(t_.months for t_ in known))
    if kinds == {"other"}:
        return OTHER
    return UNKNOWN


def byte_order_name(collation: str) -> bool:
    """Does a collation name (of a COLLATE clause) order by bytes?"""
    return collation.lower() in ("c", "posix", "ucs_basic", "pg_c_utf8")


def literal_scale(text: str) -> int | None:
    """The scale PostgreSQL gives a numeric literal's text (``1.50`` 2, ``1.5e-3`` 4,
    ``1e3`` 0); None when it is not a number."""
    try:
        exponent = Decimal(text.strip()).as_tuple().exponent
    except InvalidOperation:
        return None
    return max(0, -exponent) if isinstance(exponent, int) else None
