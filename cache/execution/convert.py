"""Local answers in PostgreSQL's types: each value of a DuckDB result becomes the
Python value psycopg would give for the column PostgreSQL describes (`cache.backend.describe`).

Only conversions that are exact are allowed - an integer to a numeric's Decimal, an integer to
a float, a char(n) value (stored without its padding) padded again to n, a numeric given the
display scale PostgreSQL's values have (``1`` as ``1.0``, never dropping a digit that is not
zero), a real as the shortest decimal that reads back as it - and a result column
DuckDB computes in a type that cannot be made exactly PostgreSQL's (a double where PostgreSQL
answers numeric) makes the statement unfit for local execution: `converter` says why, and the
planner sends it to the backend instead.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
import typing as t
from collections.abc import Callable, Mapping, Sequence

import duckdb
import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from cache.backend.copy_arrow import arrow_type
from cache.wire.oids import OID, element_oid
from optimizer.plan import LocalStatement, Output
from optimizer.postgres import numeric as pg_numeric
from optimizer.postgres.allowlist import ZONE_PARAMETER
from optimizer.postgres.float_text import shortest_digits
from sql_ext.errors import DataError

Row = tuple[t.Any, ...]
Convert = Callable[[t.Any], t.Any]

_INTEGERS = frozenset(
    {
        "TINYINT",
        "SMALLINT",
        "INTEGER",
        "BIGINT",
        "HUGEINT",
        "UTINYINT",
        "USMALLINT",
        "UINTEGER",
        "UBIGINT",
        "UHUGEINT",
    }
)
_FLOATS = frozenset({"FLOAT", "DOUBLE"})


_INTEGER_OIDS = frozenset((OID.int2, OID.int4, OID.int8, OID.oid))
_FLOAT_OIDS = frozenset((OID.float4, OID.float8))
_TEXT_OIDS = frozenset((OID.text, OID.varchar, OID.name))
_SAME = {  # PostgreSQL type -> DuckDB types whose Python values psycopg's equal as they are
    OID.bool: {"BOOLEAN"},
    OID.date: {"DATE"},
    OID.time: {"TIME"},
    OID.timestamp: {"TIMESTAMP"},
    OID.timestamptz: {"TIMESTAMP WITH TIME ZONE"},
    OID.uuid: {"UUID"},
    OID.bytea: {"BLOB"},
    OID.interval: {"INTERVAL"},  # without months (optimizer.postgres.semantics keeps those remote)
}


_DATETIMES = frozenset((OID.date, OID.timestamp, OID.timestamptz, OID.time))
# what DuckDB's Python gives for infinity and -infinity: the same as for the extreme dates
# and times, which are real values (`infinite_among` tells them apart)
_EDGES = frozenset(
    {
        dt.date.max,
        dt.date.min,
        dt.datetime.max,
        dt.datetime.min,
        dt.datetime.max.replace(tzinfo=dt.UTC),
        dt.datetime.min.replace(tzinfo=dt.UTC),
    }
)


def _in_python_range(value: t.Any) -> t.Any:
    """A date or time as psycopg loads it. One Python's types cannot hold (BC, past year
    9999, 24:00:00), which DuckDB gives as a string, psycopg refuses to load (a DataError):
    the backend answers, so that the application gets that error as psycopg raises it.
    Infinity, which DuckDB gives as the extreme value of Python's type, is caught before
    (`infinite_among`)."""
    if isinstance(value, str):
        raise LocalUnfit(f"a date or time out of Python's range: {value!r}")
    return value


# DuckDB's types whose infinities its Python values cannot tell from their extreme values
_INFINITE_KINDS = frozenset(("DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE"))


def infinite_kinds(duck_types: Sequence[str]) -> tuple[int, ...]:
    """The columns (by index) of DuckDB types that may hold infinity (or arrays of them)."""
    return tuple(
        i for i, kind in enumerate(duck_types) if kind.upper().removesuffix("[]") in _INFINITE_KINDS
    )


def at_edges(rows: Sequence[Row], columns: Sequence[int]) -> bool:
    """Whether a value of these columns (or an element of an array among them) is the extreme
    date or time of Python's types: real (0001-01-01, 9999-12-31 23:59:59.999999) or
    infinity, which look alike."""
    return any(
        value in _EDGES if (value := row[i]).__class__ is not list else not _EDGES.isdisjoint(value)
        for row in rows
        for i in columns
    )


def infinite_among(table: pa.Table, columns: Sequence[int]) -> bool:
    """Whether these columns of DuckDB's Arrow answer hold infinity: the raw value (days,
    microseconds) DuckDB gives it is its type's extreme, which no real value has."""
    for i in columns:
        column = table.column(i)
        if pa.types.is_list(column.type):  # an array's elements
            column = pc.list_flatten(column)
        raw = pa.int32() if pa.types.is_date32(column.type) else pa.int64()
        extreme = 2 ** (raw.bit_width - 1) - 1
        infinities = pa.array([extreme, -extreme], raw)
        if pc.any(pc.is_in(column.cast(raw), value_set=infinities)).as_py():
            return True
    return False


_INTERVAL_TEXT = re.compile(
    r"(?:([-+]?\d+) years? ?)?(?:([-+]?\d+) months? ?)?(?:([-+]?\d+) days? ?)?"
    r"(?:([-+])?(\d+):(\d+):(\d+(?:\.\d+)?))?"
)


def _interval(value: t.Any) -> t.Any:
    """An interval holding months, as DuckDB prints it, turned into the timedelta psycopg
    makes of PostgreSQL's: a year is 365 days, a month 30 (DuckDB's own conversion counts a
    year as 360)."""
    if value is None:
        return None
    found = _INTERVAL_TEXT.fullmatch(value.strip())
    if found is None:
        raise LocalUnfit(f"an interval DuckDB prints as {value!r}")
    years, months, days, sign, hours, minutes, seconds = found.groups()
    total = 365 * int(years or 0) + 30 * int(months or 0) + int(days or 0)
    whole, micros = 0, 0
    if hours is not None:
        whole = 3600 * int(hours) + 60 * int(minutes)
        micros = round(float(seconds) * 1_000_000)
        if sign == "-":
            whole, micros = -whole, -micros
    try:
        return dt.timedelta(days=total, seconds=whole, microseconds=micros)
    except OverflowError:  # (beyond a timedelta: psycopg's own reading of PostgreSQL's decides)
        raise LocalUnfit(f"an interval beyond Python's timedelta: {value!r}") from None


def _in_zone(zone: dt.tzinfo) -> Convert:
    """A timestamp with time zone in the session's zone, with the tzinfo psycopg gives it."""

    def zoned(value: t.Any) -> t.Any:
        value = _in_python_range(value)
        return value.astimezone(zone) if value is not None else None

    return zoned


def _decimal_scale(duck_type: str) -> int:
    """The scale of DuckDB's ``DECIMAL(p,s)``."""
    inside = duck_type.partition("(")[2].rstrip(")").split(",")
    return int(inside[1]) if len(inside) == 2 else 0


class LocalUnfit(Exception):
    """DuckDB could not give PostgreSQL's answer to this statement (a result type that cannot
    be made exact, an overflow PostgreSQL's numerics would not have): the backend answers."""


def _identity(value: t.Any) -> t.Any:
    return value


def _to_decimal(value: t.Any) -> t.Any:
    return value if value is None else decimal.Decimal(value)


def _to_float(value: t.Any) -> t.Any:
    return value if value is None else float(value)


def _float4(value: t.Any) -> t.Any:
    """A real as psycopg gives it: the double of the digits PostgreSQL prints for it
    (`optimizer.postgres.float_text`), not the double DuckDB widens it to."""
    if value is None or math.isnan(value) or math.isinf(value) or value == 0:
        return value
    return float(shortest_digits(value, 4))


_EXACT = decimal.Context(prec=1000, traps=[decimal.InvalidOperation])


def _scaler(scale: int) -> Convert:
    """A numeric given PostgreSQL's display scale; a value with digits beyond it that are not
    zero is not PostgreSQL's (the local answer is given up)."""
    quantum = decimal.Decimal(1).scaleb(-scale)

    def scaled(value: t.Any) -> t.Any:
        if value is None:
            return None
        exact = decimal.Decimal(value)
        found = exact.quantize(quantum, context=_EXACT)
        if found != exact:
            raise LocalUnfit(f"a value {exact} has more digits than PostgreSQL's scale {scale}")
        return found

    return scaled


def _padder(width: int) -> Convert:
    def pad(value: t.Any) -> t.Any:
        return value if value is None else value.ljust(width)

    return pad


def column_converter(
    oid: int,
    modifier: int,
    duck_type: str,
    width: int | None = None,
    scale: int | None = None,
    zone: dt.tzinfo = dt.UTC,
) -> Convert | None:
    """How a DuckDB value of ``duck_type`` becomes the value psycopg gives for PostgreSQL's
    (``oid``, ``modifier``); None when that cannot be done exactly. ``width``: the n of the
    char(n) values of a char column PostgreSQL types without n, if they have one; ``scale``:
    the display scale of a numeric column's values (None: DuckDB's values have it); for an
    array, ``width`` and ``scale`` are its elements'."""
    element = element_oid(oid)
    if element is not None or duck_type.endswith("]"):  # an array: element by element
        inner = (
            column_converter(element, -1, duck_type[:-2], width, scale, zone)
            if element is not None and duck_type.endswith("[]")
            else None
        )
        if inner is None or inner is _identity:
            return inner
        return _elements(inner)
    base = duck_type.split("(", maxsplit=1)[0].upper().strip('"')
    if base == "NULL":  # DuckDB folded the column to NULL: every value is None
        return _identity
    if oid == OID.interval and base == "VARCHAR":  # an interval with months, printed by DuckDB
        return _interval
    if oid == OID.timestamptz:
        return _in_zone(zone) if base in _SAME[oid] else None
    if oid in _DATETIMES:
        return _in_python_range if base in _SAME[oid] else None
    if oid == OID.numeric:
        if base == "DECIMAL":
            duck_scale = _decimal_scale(duck_type)
            if scale is None:
                # the inference gave this output no scale: DuckDB's is not known to be
                # PostgreSQL's (a numeric the inference typed otherwise)
                return None
            if scale == duck_scale:
                return _identity
            # fewer digits than PostgreSQL's: DuckDB rounded them away
            return _scaler(scale) if duck_scale > scale else None
        if base in _INTEGERS:
            return _to_decimal if not scale else _scaler(scale)
        return None
    if oid in _INTEGER_OIDS:
        return _identity if base in _INTEGERS else None
    if oid == OID.float4:
        if base == "FLOAT":
            return _float4
        return _to_float if base in ("TINYINT", "SMALLINT") else None
    if oid in _FLOAT_OIDS:
        if base in _FLOATS:
            return _identity
        return _to_float if base in _INTEGERS else None
    if oid == OID.bpchar:
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


def _elements(convert: Convert) -> Convert:
    """An array (a list, as psycopg gives it) converted element by element."""
    return lambda value: value if value is None else [convert(v) for v in value]


def converter(
    pg_types: Sequence[tuple[int, int]],
    names: Sequence[str],
    duck_types: Sequence[str],
    outputs: Sequence[Output] | None = None,
    char_widths: Mapping[int, int] | None = None,
    scales: Mapping[int, int] | None = None,
    zone: dt.tzinfo = dt.UTC,
) -> Callable[[list[Row]], list[Row]] | str:
    """The row converter for a result, or why there is none. ``outputs``: how each of
    PostgreSQL's columns is made from DuckDB's (`optimizer.rules.local_statement.Output`);
    ``char_widths``: n for the char columns whose values are all char(n) values (0: the
    statement pads them itself); ``scales``: the display scale of a numeric column's values,
    where every value has the same; ``zone``: the session's time zone, as psycopg gives it."""
    if outputs is None:
        outputs = tuple(range(len(duck_types)))
    if len(pg_types) != len(outputs):
        return f"DuckDB's result has {len(outputs)} columns, PostgreSQL's {len(pg_types)}"
    makers: list[Callable[[Row], t.Any]] = []
    plain = True
    for index, ((oid, modifier), name, output) in enumerate(
        zip(pg_types, names, outputs, strict=True)
    ):
        if isinstance(output, int):
            convert = column_converter(
                oid,
                modifier,
                duck_types[output],
                (char_widths or {}).get(index),
                (scales or {}).get(index),
                zone,
            )
            if convert is None:
                info = psycopg.postgres.types.get(oid)
                return (
                    f"DuckDB computes {name} as {duck_types[output]}, which cannot be "
                    f"made exactly PostgreSQL's {info.name if info else oid}"
                )
            plain = plain and convert is _identity and output == len(makers)
            makers.append(_column(output, convert))
        elif output[0] == "scaled":
            _, value, scale = t.cast(tuple[str, int, int], output)
            if oid != OID.numeric or duck_types[value].split("(")[0].upper() not in _INTEGERS | {
                "DECIMAL"
            }:
                return f"DuckDB computes {name} as {duck_types[value]}, not a numeric"
            plain = False
            makers.append(_scaled_by_row(value, scale))
        else:
            kind, numerator, denominator, top_scale, bottom_scale = t.cast(
                tuple[str, int, int, t.Any, t.Any], output
            )
            made = _division(
                oid,
                kind,
                numerator,
                denominator,
                (duck_types[numerator], duck_types[denominator]),
                (top_scale, bottom_scale),
            )
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


def _scaled_by_row(value: int, scale: int) -> Callable[[Row], t.Any]:
    """A numeric given the display scale DuckDB computed beside it for its row."""
    scalers: dict[int, Convert] = {}

    def make(row: Row) -> t.Any:
        digits = row[scale]
        if row[value] is None or digits is None:
            return None if row[value] is None else _to_decimal(row[value])
        found = scalers.get(digits)
        if found is None:
            found = scalers[digits] = _scaler(int(digits))
        return found(row[value])

    return make


def _operand(duck_type: str, scale: t.Any) -> Callable[[t.Any, Row], t.Any] | None:
    """How a division's operand is read from a row, at PostgreSQL's display scale: the same
    for every row (a number) or DuckDB's column beside it (("column", index))."""
    if isinstance(scale, int):
        found = column_converter(OID.numeric, -1, duck_type, scale=scale)
        if found is None:
            return None
        fixed: Convert = found
        return lambda value, _row: fixed(value)
    base = duck_type.split("(", maxsplit=1)[0].upper()
    if base not in _INTEGERS | {"DECIMAL"}:
        return None
    index = scale[1]
    scalers: dict[int, Convert] = {}

    def read(value: t.Any, row: Row) -> t.Any:
        digits = row[index]
        if value is None or digits is None:
            return value
        found = scalers.get(digits) or scalers.setdefault(digits, _scaler(int(digits)))
        return found(value)

    return read


def _division(
    oid: int,
    kind: str,
    numerator: int,
    denominator: int,
    duck_types: tuple[str, str],
    scales: tuple[t.Any, t.Any] = (0, 0),
) -> Callable[[Row], t.Any] | None:
    """An output the cache divides: numeric division as PostgreSQL's
    (`optimizer.postgres.numeric`), or a floating-point one; None when DuckDB's operands are
    not exact for it. ``scales``: the display scales of PostgreSQL's operands (its quotient's
    scale depends on them)."""
    bases = {d.split("(", maxsplit=1)[0].upper() for d in duck_types}
    if oid == OID.numeric:
        if not bases <= _INTEGERS | {"DECIMAL"}:
            return None
        operands = []
        for duck_type, scale in zip(duck_types, scales, strict=True):
            found = _operand(duck_type, scale)
            if found is None:
                return None
            operands.append(found)
        top_of, bottom_of = operands

        def numeric(row: Row) -> t.Any:
            top, bottom = top_of(row[numerator], row), bottom_of(row[denominator], row)
            if kind == "avg":
                return pg_numeric.average(top, bottom)
            if top is None or bottom is None:
                return None
            if kind != "divide":  # a variance or standard deviation
                return pg_numeric.spread(top, bottom, root=kind.startswith("stddev"))
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
        values = statement.bound({k: v for k, v in named.items() if k in statement.names})
        if statement.zone:
            values[ZONE_PARAMETER] = "UTC"  # the types do not depend on it
        rows = con.execute(f"DESCRIBE {statement.sql}", values).fetchall()
    finally:
        for name in registered:
            con.unregister(name)
    return [str(row[1]) for row in rows]
