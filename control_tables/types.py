"""PostgreSQL column types and the DuckDB types the cache stores them as.

Rows travel as CSV from `COPY ... TO STDOUT` through Arrow; a type is cacheable when PostgreSQL's
text form reads back exactly in DuckDB. Anything else is refused at DDL time with a clear error.
"""

from __future__ import annotations

import re

from sql_ext.quoting import ident

_EXACT = {
    "smallint": "SMALLINT",
    "integer": "INTEGER",
    "bigint": "BIGINT",
    "real": "FLOAT",
    "double precision": "DOUBLE",
    "boolean": "BOOLEAN",
    "text": "VARCHAR",
    "date": "DATE",
    "uuid": "UUID",
    "timestamp without time zone": "TIMESTAMP",
    "timestamp with time zone": "TIMESTAMPTZ",
    "time without time zone": "TIME",
    "name": "VARCHAR",
}

_PATTERNS = [
    (re.compile(r"^(character varying|character|varchar|char|bpchar)(\(\d+\))?$"), "VARCHAR"),
    (re.compile(r"^timestamp\(\d\) without time zone$"), "TIMESTAMP"),
    (re.compile(r"^timestamp\(\d\) with time zone$"), "TIMESTAMPTZ"),
    (re.compile(r"^time\(\d\) without time zone$"), "TIME"),
]

_NUMERIC = re.compile(r"^numeric\((\d+),(\d+)\)$")


def duckdb_type(pg_type: str) -> str | None:
    """The DuckDB type for a PostgreSQL ``format_type`` string, or None when not cacheable."""
    text = pg_type.strip().lower()
    if text in _EXACT:
        return _EXACT[text]
    for pattern, target in _PATTERNS:
        if pattern.match(text):
            return target
    numeric = _NUMERIC.match(text.replace(" ", ""))
    if numeric:
        precision, scale = int(numeric.group(1)), int(numeric.group(2))
        # DuckDB decimals stop at 38 digits; wider ones would lose digits silently.
        return f"DECIMAL({precision},{scale})" if precision <= 38 else None
    if text == "numeric":
        # Unconstrained numeric has no fixed scale: DOUBLE would round, so it is refused.
        return None
    return None


_BLANK_PADDED = re.compile(r"^(character|char|bpchar)(\(\d+\))?$")

# How a blank-padded char(n) value travels and is stored: without its padding. PostgreSQL
# ignores trailing blanks of char(n) in comparisons, LIKE, functions and concatenation (all of
# them see the value cast to text), so the cache keeps that text form, and a result column of
# type char(n) is padded again when it reaches the application (cache.execution.convert).
BPCHAR = "BPCHAR"


def transfer_type(pg_type: str) -> str | None:
    """The type a column travels as from the backend: `duckdb_type`, except ``BPCHAR`` for
    char(n), which is sent as text (its padding removed) and stored as VARCHAR."""
    if _BLANK_PADDED.match(pg_type.strip().lower()):
        return BPCHAR
    return duckdb_type(pg_type)


def select_list(columns: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> str:
    """The SELECT list sending each (column, transfer type) in the text form the cache reads
    back (`cache.backend.copy_arrow`): timestamps with time zone as UTC wall time, char(n)
    without its padding."""
    parts = []
    for name, duck_type in columns:
        quoted = ident(name)
        if duck_type == "TIMESTAMPTZ":
            parts.append(f"({quoted} AT TIME ZONE 'UTC') AS {quoted}")
        elif duck_type == BPCHAR:
            parts.append(f"{quoted}::text AS {quoted}")
        else:
            parts.append(quoted)
    return ", ".join(parts)
