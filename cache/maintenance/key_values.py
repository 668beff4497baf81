"""Control-key values typed exactly as their control table's columns (admission, eviction and
refresh take them from applications and from the command line, where they are text).

A value is read as PostgreSQL reads a literal of the column's type, except that nothing is
ever rounded: '6.5' or 6.5 for an integer key is an error (PostgreSQL's ``'6.5'::integer`` is
one too, but DuckDB's cast would give 7), as is 2.345 for a numeric(10,2) key (PostgreSQL
would round it). Whitespace around a number and a leading sign are accepted, as PostgreSQL
accepts them. Types other than integers and decimals are cast by DuckDB, whose casts of text
to dates, times, booleans and uuids reject what they cannot read.
"""

from __future__ import annotations

import decimal
import re
import typing as t

import duckdb

from sql_ext.errors import DataError, first_line

Key = tuple[t.Any, ...]

_INTEGERS = {"TINYINT": "smallint", "SMALLINT": "smallint", "INTEGER": "integer",
             "BIGINT": "bigint", "HUGEINT": "integer", "UTINYINT": "integer",
             "USMALLINT": "integer", "UINTEGER": "integer", "UBIGINT": "integer"}  # fmt: skip
_INTEGER_TEXT = re.compile(r"\s*[+-]?\d+\s*")
_DECIMAL_TYPE = re.compile(r"DECIMAL\((\d+),\s*(\d+)\)")


def column_types(con: duckdb.DuckDBPyConnection, table: str) -> dict[str, str]:
    """column -> DuckDB type of a table in the cache file."""
    rows = con.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'main' AND table_name = ?",
        [table],
    ).fetchall()
    return {name: str(kind) for name, kind in rows}


def exact_key(
    con: duckdb.DuckDBPyConnection,
    control: str,
    columns: tuple[str, ...],
    types: t.Mapping[str, str],
    value: Key,
) -> Key:
    """``value`` typed as the control table's key columns, or a `DataError` naming the column,
    its type and what was given."""
    typed = [_exact(v, types[c], f"{control}.{c}") for c, v in zip(columns, value, strict=True)]
    casts = ", ".join(f"CAST(? AS {types[c]})" for c in columns)
    try:
        row = con.execute(f"SELECT {casts}", typed).fetchone()
    except duckdb.Error as exc:
        raise DataError(
            f"{control}: cannot read {value!r} as its control key "
            f"({', '.join(f'{c} {_pg_name(types[c])}' for c in columns)}): {first_line(exc)}"
        ) from None
    assert row is not None
    return tuple(row)


def _exact(value: t.Any, duck_type: str, where: str) -> t.Any:
    """The value to cast: for integers and decimals the exact number (checked here), else the
    value itself."""
    kind = duck_type.upper()
    if kind in _INTEGERS:
        number = _integer(value)
        if number is None:
            raise DataError(
                f"{where} is {_INTEGERS[kind]}: {value!r} is not an integer (control keys are "
                "read exactly, never rounded)"
            )
        return number
    match = _DECIMAL_TYPE.fullmatch(kind)
    if match:
        precision, scale = int(match[1]), int(match[2])
        exact = _decimal(value)
        if exact is None or not exact.is_finite():
            raise DataError(f"{where} is numeric({precision},{scale}): {value!r} is not a number")
        if exact != exact.quantize(decimal.Decimal(1).scaleb(-scale), context=_WIDE):
            raise DataError(
                f"{where} is numeric({precision},{scale}): {value!r} has more than {scale} "
                "decimal place(s) (control keys are read exactly, never rounded)"
            )
        return exact
    return value


_WIDE = decimal.Context(prec=1000)


def _integer(value: t.Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if (
        isinstance(value, decimal.Decimal)
        and value.is_finite()
        and value == value.to_integral_value()
    ):
        return int(value)
    return None


def _decimal(value: t.Any) -> decimal.Decimal | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, decimal.Decimal):
        return value
    if isinstance(value, int):
        return decimal.Decimal(value)
    if isinstance(value, float):
        return decimal.Decimal(repr(value))  # the shortest text that reads back as the float
    if isinstance(value, str):
        try:
            return decimal.Decimal(value.strip())
        except decimal.InvalidOperation:
            return None
    return None


def _pg_name(duck_type: str) -> str:
    kind = duck_type.upper()
    if kind in _INTEGERS:
        return _INTEGERS[kind]
    match = _DECIMAL_TYPE.fullmatch(kind)
    return f"numeric({match[1]},{match[2]})" if match else duck_type.lower()
