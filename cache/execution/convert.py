"""Local answers in PostgreSQL's types (SPEC §5.11): each value of a DuckDB result becomes the
Python value psycopg would give for the column PostgreSQL describes (`cache.backend.describe`).

Only conversions that are exact are allowed - an integer to a numeric's Decimal, an integer to
a float, a char(n) value (stored without its padding) padded again to n - and a result column
DuckDB computes in a type that cannot be made exactly PostgreSQL's (a double where PostgreSQL
answers numeric) makes the statement unfit for local execution: `converter` says why, and the
planner sends it to the backend instead.
"""

from __future__ import annotations

import decimal
import typing as t
from collections.abc import Callable, Mapping, Sequence

import duckdb
import psycopg
import pyarrow as pa

from cache.backend.copy_arrow import arrow_type
from cache.execution import pg_numeric
from optimizer.local_statement import LocalStatement, Output
from sql_ext.errors import DataError

Row = tuple[t.Any, ...]
Convert = Callable[[t.Any], t.Any]

_INTEGERS = frozenset({"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT",
                       "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT"})  # fmt: skip
_FLOATS = frozenset({"FLOAT", "DOUBLE"})


def _oid(name: str) -> int:
    info = psycopg.postgres.types.get(name)
    assert info is not None
    return info.oid


NUMERIC, BPCHAR = _oid("numeric"), _oid("bpchar")
_INTEGER_OIDS = frozenset(_oid(n) for n in ("int2", "int4", "int8", "oid"))
_FLOAT_OIDS = frozenset(_oid(n) for n in ("float4", "float8"))
_TEXT_OIDS = frozenset(_oid(n) for n in ("text", "varchar", "name"))
_SAME = {  # PostgreSQL type -> DuckDB types whose Python values psycopg's equal as they are
    _oid("bool"): {"BOOLEAN"},
    _oid("date"): {"DATE"},
    _oid("time"): {"TIME"},
    _oid("timestamp"): {"TIMESTAMP"},
    _oid("timestamptz"): {"TIMESTAMP WITH TIME ZONE"},
    _oid("uuid"): {"UUID"},
    _oid("bytea"): {"BLOB"},
}


def _identity(value: t.Any) -> t.Any:
    return value


def _to_decimal(value: t.Any) -> t.Any:
    return value if value is None else decimal.Decimal(value)


def _to_float(value: t.Any) -> t.Any:
    return value if value is None else float(value)


def _padder(width: int) -> Convert:
    def pad(value: t.Any) -> t.Any:
        return value if value is None else value.ljust(width)

    return pad


def column_converter(
    oid: int, modifier: int, duck_type: str, width: int | None = None
) -> Convert | None:
    """How a DuckDB value of ``duck_type`` becomes the value psycopg gives for PostgreSQL's
    (``oid``, ``modifier``); None when that cannot be done exactly. ``width``: the n of the
    char(n) values of a char column PostgreSQL types without n, if they have one."""
    base = duck_type.split("(", maxsplit=1)[0].upper()
    if oid == NUMERIC:
        if base == "DECIMAL":
            return _identity
        return _to_decimal if base in _INTEGERS else None
    if oid in _INTEGER_OIDS:
        return _identity if base in _INTEGERS else None
    if oid in _FLOAT_OIDS:
        if base in _FLOATS:
            return _identity
        return _to_float if base in _INTEGERS else None
    if oid == BPCHAR:
        if base != "VARCHAR":
            return None
        # char(n): stored without its padding (control_tables.types.BPCHAR), padded to n
        if modifier >= 4:
            return _padder(modifier - 4)
        if width is None:
            return None
        return _padder(width) if width else _identity  # 0: padded by the statement itself
    if oid in _TEXT_OIDS:
        return _identity if base == "VARCHAR" else None
    return _identity if base in _SAME.get(oid, ()) else None


def converter(
    pg_types: Sequence[tuple[int, int]],
    names: Sequence[str],
    duck_types: Sequence[str],
    outputs: Sequence[Output] | None = None,
    char_widths: Mapping[int, int] | None = None,
) -> Callable[[list[Row]], list[Row]] | str:
    """The row converter for a result, or why there is none. ``outputs``: how each of
    PostgreSQL's columns is made from DuckDB's (`optimizer.local_statement.Output`);
    ``char_widths``: n for the char columns whose values are all char(n) values (0: the
    statement pads them itself)."""
    if outputs is None:
        outputs = tuple(range(len(duck_types)))
    if len(pg_types) != len(outputs):
        return (f"DuckDB's result has {len(outputs)} columns, PostgreSQL's "
                f"{len(pg_types)}")  # fmt: skip
    makers: list[Callable[[Row], t.Any]] = []
    plain = True
    for index, ((oid, modifier), name, output) in enumerate(
        zip(pg_types, names, outputs, strict=True)
    ):
        if isinstance(output, int):
            convert = column_converter(oid, modifier, duck_types[output],
                                       (char_widths or {}).get(index))  # fmt: skip
            if convert is None:
                info = psycopg.postgres.types.get(oid)
                return (f"DuckDB computes {name} as {duck_types[output]}, which cannot be "
                        f"made exactly PostgreSQL's {info.name if info else oid}")  # fmt: skip
            plain = plain and convert is _identity and output == len(makers)
            makers.append(_column(output, convert))
        else:
            kind, numerator, denominator = output
            made = _division(oid, kind, numerator, denominator,
                             (duck_types[numerator], duck_types[denominator]))  # fmt: skip
            if made is None:
                return f"the cache cannot divide {name} as PostgreSQL does"
            plain = False
            makers.append(made)
    if plain and len(makers) == len(duck_types):
        return lambda rows: rows

    def convert_rows(rows: list[Row]) -> list[Row]:
        return [tuple(make(row) for make in makers) for row in rows]

    return convert_rows


def _column(index: int, convert: Convert) -> Callable[[Row], t.Any]:
    return lambda row: convert(row[index])


def _division(
    oid: int, kind: str, numerator: int, denominator: int, duck_types: tuple[str, str]
) -> Callable[[Row], t.Any] | None:
    """An output the cache divides: numeric division as PostgreSQL's (`pg_numeric`), or a
    floating-point one; None when DuckDB's operands are not exact for it."""
    bases = {d.split("(", maxsplit=1)[0].upper() for d in duck_types}
    if oid == NUMERIC:
        if not bases <= _INTEGERS | {"DECIMAL"}:
            return None

        def numeric(row: Row) -> t.Any:
            top, bottom = row[numerator], row[denominator]
            if kind == "avg":
                return pg_numeric.average(top, bottom)
            if top is None or bottom is None:
                return None
            return _checked(pg_numeric.divide, top, bottom)

        return numeric
    if oid in _FLOAT_OIDS:
        if not bases <= _INTEGERS | _FLOATS | {"DECIMAL"}:
            return None

        def floating(row: Row) -> t.Any:
            top, bottom = row[numerator], row[denominator]
            if top is None or bottom is None or (kind == "avg" and bottom == 0):
                return None
            return _checked(lambda a, b: float(a) / float(b), top, bottom)

        return floating
    return None


def _checked(divide: Callable[[t.Any, t.Any], t.Any], top: t.Any, bottom: t.Any) -> t.Any:
    try:
        return divide(top, bottom)
    except (ZeroDivisionError, pg_numeric.DivisionByZero):
        error = DataError("division by zero")
        error.sqlstate = "22012"  # as PostgreSQL reports it
        raise error from None


def duckdb_result_types(
    con: duckdb.DuckDBPyConnection, statement: LocalStatement, named: dict[str, t.Any]
) -> list[str]:
    """The column types DuckDB gives a local statement's result (without running it; its
    remote leaves stand in empty)."""
    registered = []
    con.complete()  # a result some fetchone() left open would block register() (DuckDB 2)
    try:
        for name, leaf in statement.leaves:
            schema = pa.schema([(c, arrow_type(kind)) for c, kind in leaf.columns])
            con.register(name, schema.empty_table())
            registered.append(name)
        values = {k: v for k, v in named.items() if k in statement.names}
        rows = con.execute(f"DESCRIBE {statement.sql}", values).fetchall()
    finally:
        for name in registered:
            con.unregister(name)
    return [str(row[1]) for row in rows]
