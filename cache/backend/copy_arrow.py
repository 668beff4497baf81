"""Move rows from PostgreSQL to Arrow: ``COPY (query) TO STDOUT (FORMAT csv)`` parsed by
pyarrow's multithreaded CSV reader with the columns' exact types.

CSV keeps NULL (unquoted empty) apart from the empty string (quoted), and PostgreSQL's text
forms of the cacheable types (control_tables.types) read back exactly; nothing else is NULL
(the strings NA and NULL, and a double's NaN, are values). Dates and times come as numbers
(`control_tables.types.NUMBERED`) and are typed after reading.
"""

from __future__ import annotations

import io
import re
import typing as t

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

_ARROW: dict[str, pa.DataType] = {
    "SMALLINT": pa.int16(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "FLOAT": pa.float32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "VARCHAR": pa.string(),
    "BPCHAR": pa.string(),  # char(n) sent as text (control_tables.types.transfer_type)
    "DATE": pa.date32(),
    "UUID": pa.string(),
    "TIMESTAMP": pa.timestamp("us"),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
    "TIME": pa.time64("us"),
}
# how the numbered types travel (`control_tables.types.NUMBERED`): days or microseconds
_WIRE = {"DATE": pa.int32(), "TIMESTAMP": pa.int64(), "TIMESTAMPTZ": pa.int64(), "TIME": pa.int64()}
_DECIMAL = re.compile(r"DECIMAL\((\d+),(\d+)\)")


def arrow_type(duck_type: str) -> pa.DataType:
    decimal = _DECIMAL.fullmatch(duck_type)
    if decimal:
        return pa.decimal128(int(decimal.group(1)), int(decimal.group(2)))
    return _ARROW[duck_type]


def copy_to_arrow(
    conn: psycopg.Connection,  # type: ignore[type-arg]
    query: str,
    columns: list[tuple[str, str]],
    params: t.Mapping[str, t.Any] | None = None,
) -> pa.Table:
    """Run ``query`` (its columns in the order of ``columns``) and return an Arrow table.
    With ``params`` the query's %(name)s placeholders are bound (and %% is a literal %)."""
    buffer = io.BytesIO()
    statement = f"COPY ({query}) TO STDOUT (FORMAT csv)"
    with conn.cursor().copy(statement, params) as copy:  # type: ignore[arg-type]
        for chunk in copy:
            buffer.write(chunk)
    return read_csv(buffer.getvalue(), columns)


def read_csv(data: bytes | pa.Buffer, columns: list[tuple[str, str]]) -> pa.Table:
    names = [name for name, _ in columns]
    final = {name: arrow_type(duck_type) for name, duck_type in columns}
    if not len(data):
        return pa.table({n: pa.array([], type=t) for n, t in final.items()})
    types = {name: _WIRE.get(duck_type, final[name]) for name, duck_type in columns}
    table = pacsv.read_csv(
        pa.BufferReader(data),
        read_options=pacsv.ReadOptions(column_names=names, block_size=16 << 20),
        # a row of one NULL is an empty line
        parse_options=pacsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(
            column_types=types,
            null_values=[""],  # only the unquoted empty field (pyarrow would take NA, NaN, ...)
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            true_values=["t"],
            false_values=["f"],
        ),
    )
    for index, (name, duck_type) in enumerate(columns):
        if duck_type in _WIRE:
            table = table.set_column(index, name, table.column(name).cast(final[name]))
    return table


def read_texts(texts: pa.Table, columns: list[tuple[str, str]]) -> pa.Table:
    """Columns of PostgreSQL's text values (large strings, null for NULL) in the form a pull
    sends them, typed as `read_csv` types a pull's rows: by Arrow's casts where those read
    PostgreSQL's text forms as the CSV reader does (integers, decimals, text, and the dates
    and times that travel as numbers), else by the CSV reader itself (floats, booleans),
    through CSV written by Arrow's kernels."""
    typed: dict[str, pa.ChunkedArray] = {}
    rest = []
    for name, duck_type in columns:
        values = texts.column(name)
        if duck_type in _CAST_TEXT or _DECIMAL.fullmatch(duck_type):
            typed[name] = values.cast(arrow_type(duck_type))
        elif duck_type in _WIRE:
            typed[name] = values.cast(_WIRE[duck_type]).cast(arrow_type(duck_type))
        else:
            rest.append((name, duck_type))
    if rest:
        read = read_csv(_csv_of(texts, [name for name, _ in rest]), rest)
        typed |= {name: read.column(name) for name, _ in rest}
    return pa.table([typed[name] for name, _ in columns], names=[name for name, _ in columns])


_CAST_TEXT = {"SMALLINT", "INTEGER", "BIGINT", "VARCHAR", "BPCHAR", "UUID"}


def _csv_of(texts: pa.Table, names: list[str]) -> pa.Buffer | bytes:
    """The columns as the CSV `read_csv` reads: NULL unquoted and empty, every other value
    quoted."""
    if not texts.num_rows:
        return b""
    quote, empty = pa.scalar('"', pa.large_string()), pa.scalar("", pa.large_string())
    fields = []
    for name in names:
        escaped = pc.replace_substring(texts.column(name), '"', '""')
        fields.append(
            pc.fill_null(pc.binary_join_element_wise(quote, escaped, quote, empty), empty)
        )
    lines = pc.binary_join_element_wise(
        pc.binary_join_element_wise(*fields, pa.scalar(",", pa.large_string())),
        empty,
        pa.scalar("\n", pa.large_string()),
    )
    text = pa.concat_arrays(lines.chunks) if isinstance(lines, pa.ChunkedArray) else lines
    offsets = np.frombuffer(t.cast(pa.Buffer, text.buffers()[1]), np.int64)
    offsets = offsets[text.offset : text.offset + len(text) + 1]
    return t.cast(pa.Buffer, text.buffers()[2])[int(offsets[0]) : int(offsets[-1])]
