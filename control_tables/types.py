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


# Dates and times travel as numbers, which keep what text would lose or Arrow would refuse:
# days since 1970-01-01 (a date), microseconds since then (a timestamp, with or without time
# zone) or since midnight (a time); infinity as DuckDB's own sentinels, so that BC dates, dates
# past year 9999, infinity and 24:00:00 arrive as PostgreSQL holds them.
DAYS_INFINITY = 2147483647
MICROS_INFINITY = 9223372036854775807
_EPOCH_MICROS = (
    "CASE WHEN NOT isfinite({c}) THEN (CASE WHEN {c} > 'epoch' THEN {inf} ELSE "
    "-{inf} END) ELSE (extract(epoch FROM {c}) * 1000000)::bigint END"
)
_EPOCH_DAYS = (
    "CASE WHEN {c} = 'infinity' THEN {inf} WHEN {c} = '-infinity' THEN -{inf} "
    "ELSE {c} - DATE '1970-01-01' END"
)
NUMBERED = {
    "DATE": lambda c: _EPOCH_DAYS.format(c=c, inf=DAYS_INFINITY),
    "TIMESTAMP": lambda c: _EPOCH_MICROS.format(c=c, inf=MICROS_INFINITY),
    "TIMESTAMPTZ": lambda c: _EPOCH_MICROS.format(c=c, inf=MICROS_INFINITY),
    "TIME": lambda c: f"(extract(epoch FROM {c}) * 1000000)::bigint",
}


def select_list(columns: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> str:
    """The SELECT list sending each (column, transfer type) in the form the cache reads back
    (`cache.backend.copy_arrow`): char(n) without its padding, dates and times as numbers
    (`NUMBERED`)."""
    parts = []
    for name, duck_type in columns:
        quoted = ident(name)
        if duck_type in NUMBERED:
            parts.append(f"{NUMBERED[duck_type](quoted)} AS {quoted}")
        elif duck_type == BPCHAR:
            parts.append(f"{quoted}::text AS {quoted}")
        else:
            parts.append(quoted)
    return ", ".join(parts)


_STAMP = re.compile(
    r"(\d+)-(\d\d)-(\d\d)(?: (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
    r"(?:([+-])(\d\d)(?::(\d\d)(?::(\d\d))?)?)?( BC)?"
)
_CLOCK = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?")


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 to a date of the proleptic Gregorian calendar, any year (year 0 is
    1 BC), as PostgreSQL counts them (Hinnant's algorithm)."""
    year -= month <= 2
    era = year // 400  # Python's division floors (the C original adjusts for truncation)
    of_era = year - era * 400
    of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    of_era_days = of_era * 365 + of_era // 4 - of_era // 100 + of_year
    return era * 146097 + of_era_days - 719468


def numbered(kind: str, text: str) -> int:
    """The number a date or time of PostgreSQL's text (DateStyle ISO, as a session of the
    replication stream writes it) travels as (`NUMBERED`)."""
    if text in ("infinity", "-infinity"):
        sentinel = DAYS_INFINITY if kind == "DATE" else MICROS_INFINITY
        return sentinel if text == "infinity" else -sentinel
    if kind == "TIME":
        found = _CLOCK.fullmatch(text)
        if found is None:
            raise ValueError(f"not a time: {text!r}")
        hours, minutes, seconds, fraction = found.groups()
        return ((int(hours) * 60 + int(minutes)) * 60 + int(seconds)) * 1_000_000 + _micros(
            fraction
        )
    found = _STAMP.fullmatch(text)
    if found is None:
        raise ValueError(f"not a date or timestamp: {text!r}")
    year, month, day, hour, minute, second, fraction, sign, oh, om, osec, bc = found.groups()
    days = _days_from_civil(1 - int(year) if bc else int(year), int(month), int(day))
    if kind == "DATE":
        return days
    seconds = days * 86400 + int(hour or 0) * 3600 + int(minute or 0) * 60 + int(second or 0)
    if sign is not None:  # a timestamp with time zone: its offset from UTC
        offset = int(oh) * 3600 + int(om or 0) * 60 + int(osec or 0)
        seconds -= offset if sign == "+" else -offset
    return seconds * 1_000_000 + _micros(fraction)


def _micros(fraction: str | None) -> int:
    """The microseconds of a time's fractional digits (up to six)."""
    return int((fraction or "0").ljust(6, "0"))
