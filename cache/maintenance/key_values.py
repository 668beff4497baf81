"""Control-key values typed exactly as their control table's columns (admission and eviction
take them from applications and from the command line, where they are text).

A value is read as PostgreSQL reads a literal of the column's declared type, except that
nothing is ever rounded: '6.5' or 6.5 for an integer key is an error (PostgreSQL's
``'6.5'::integer`` is one too, but DuckDB's cast would give 7), as is 2.345 for a numeric(10,2)
key (PostgreSQL would round it). Whitespace around a number and a leading sign are accepted,
as PostgreSQL accepts them. Other types are cast by DuckDB, whose casts of text to dates,
times, booleans and uuids reject what they cannot read.
"""

from __future__ import annotations

import contextlib
import decimal
import re
import typing as t
from collections.abc import Iterator

import duckdb
import pyarrow as pa
from sqlglot import exp

from control_tables.regions import FAST_LIST, in_list
from control_tables.schema import ControlTable
from sql_ext.errors import DataError, first_line
from sql_ext.quoting import keys_in

Key = tuple[t.Any, ...]

_INTEGER_NAMES = {
    exp.DataType.Type.SMALLINT: "smallint",
    exp.DataType.Type.INT: "integer",
    exp.DataType.Type.BIGINT: "bigint",
}
_INTEGER_TEXT = re.compile(r"\s*[+-]?\d+\s*")
_DUCKDB_DECIMAL = (18, 3)  # what DuckDB makes of a numeric declared without precision
_WIDE = decimal.Context(prec=1000)


_RANGES = {
    exp.DataType.Type.SMALLINT: 2**15,
    exp.DataType.Type.INT: 2**31,
    exp.DataType.Type.BIGINT: 2**63,
}


def exact_keys(
    con: duckdb.DuckDBPyConnection, control: ControlTable, values: list[Key]
) -> list[Key]:
    """Each value (one item per key column) typed as the control table's key columns, or a
    `DataError` naming the column, its type and what was given. Integer and text keys are
    checked here, each column's reader made once (an admission of 150,000 keys cast each in
    DuckDB for minutes; asking sqlglot a key's type for each value took 12 s for 100,000);
    other types are cast by DuckDB."""
    types = [exp.DataType.build(kind, dialect="postgres") for _, kind in control.columns]
    readers = [
        _reader(kind, f"{control.name}.{name}")
        for (name, _), kind in zip(control.columns, types, strict=True)
    ]
    if all(kind.this in _RANGES or kind.is_type(*exp.DataType.TEXT_TYPES) for kind in types):
        limits = [
            (_RANGES.get(kind.this), name, kind)
            for (name, _), kind in zip(control.columns, types, strict=True)
        ]
        checked = []
        for value in values:
            typed = tuple(read(v) for read, v in zip(readers, value, strict=True))
            for item, (limit, name, kind) in zip(typed, limits, strict=True):
                if limit is not None and not -limit <= item < limit:
                    raise DataError(
                        f"{control.name}: cannot read {value!r} as its control "
                        f"key: {item} is out of range for {name} "
                        f"{_name(kind)}"
                    )
            checked.append(typed)
        return checked
    return [_cast(con, control, types, readers, value) for value in values]


def _cast(
    con: duckdb.DuckDBPyConnection,
    control: ControlTable,
    types: list[exp.DataType],
    readers: list[t.Callable[[t.Any], t.Any]],
    value: Key,
) -> Key:
    typed = [read(v) for read, v in zip(readers, value, strict=True)]
    casts = ", ".join(f"CAST(? AS {kind.sql('duckdb')})" for kind in types)
    try:
        row = con.execute(f"SELECT {casts}", typed).fetchone()
    except duckdb.Error as exc:
        declared = ", ".join(
            f"{name} {_name(kind)}" for (name, _), kind in zip(control.columns, types, strict=True)
        )
        raise DataError(
            f"{control.name}: cannot read {value!r} as its control key ({declared}): "
            f"{first_line(exc)}"
        ) from None
    assert row is not None
    return tuple(row)


def _reader(kind: exp.DataType, where: str) -> t.Callable[[t.Any], t.Any]:
    """What a value of a column of this type is read as before it is cast: for integers and
    decimals the exact number (checked here), for text a str PostgreSQL can hold, else the
    value itself; NULL never."""

    def present(value: t.Any) -> t.Any:
        if value is None:
            raise DataError(f"{where}: a control key cannot be NULL (no row's key equals NULL)")
        return value

    if kind.is_type(*exp.DataType.TEXT_TYPES, exp.DataType.Type.BPCHAR):

        def text(value: t.Any) -> t.Any:
            if not isinstance(value, str):
                present(value)
                raise DataError(
                    f"{where} is {_name(kind)}: {value!r} is a {type(value).__name__}, not "
                    "text (pass the key as a str)"
                )
            if "\0" in value:
                raise DataError(f"{where} is {_name(kind)}: PostgreSQL text cannot hold NUL (\\0)")
            return value

        return text
    if kind.is_type(*exp.DataType.INTEGER_TYPES):

        def integer(value: t.Any) -> t.Any:
            number = _integer(present(value))
            if number is None:
                raise DataError(
                    f"{where} is {_name(kind)}: {value!r} is not an integer (control keys are "
                    "read exactly, never rounded)"
                )
            return number

        return integer
    if kind.is_type(exp.DataType.Type.DECIMAL):
        scale = _scale(kind)
        step = decimal.Decimal(1).scaleb(-scale)

        def number(value: t.Any) -> t.Any:
            exact = _decimal(present(value))
            if exact is None or not exact.is_finite():
                raise DataError(f"{where} is {_name(kind)}: {value!r} is not a number")
            if exact != exact.quantize(step, context=_WIDE):
                raise DataError(
                    f"{where} is {_name(kind)}: {value!r} has more than {scale} decimal "
                    "place(s) (control keys are read exactly, never rounded)"
                )
            return exact

        return number
    return present


def _integer(value: t.Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, decimal.Decimal) and value.is_finite():
        return int(value) if value == value.to_integral_value() else None
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


def _scale(kind: exp.DataType) -> int:
    params = [int(p.name) for p in kind.expressions]
    return params[1] if len(params) > 1 else 0 if params else _DUCKDB_DECIMAL[1]


def _name(kind: exp.DataType) -> str:
    """The type as PostgreSQL names it in messages."""
    return _INTEGER_NAMES.get(kind.this) or kind.sql("postgres").lower()


@contextlib.contextmanager
def keys_listed(
    con: duckdb.DuckDBPyConnection, alias: str, columns: tuple[str, ...], values: list[Key]
) -> Iterator[str]:
    """SQL: the row ``alias`` has one of the key values. Many keys are an Arrow table joined
    while inside (a literal list of 100,000 keys took DuckDB a second to parse); few, or
    ones Arrow cannot type exactly, a literal list."""
    keys = None
    if len(values) >= FAST_LIST:
        try:
            keys = pa.table({f"k{i}": [v[i] for v in values] for i in range(len(columns))})
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            keys = None
    if keys is None:
        yield in_list(columns, values).sql("duckdb")  # (its columns unqualified)
        return
    con.register("mtcache_listed_keys", keys)
    try:
        yield keys_in(columns, alias, "mtcache_listed_keys", keys.column_names)
    finally:
        con.unregister("mtcache_listed_keys")
