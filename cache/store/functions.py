"""Functions of the cache's own that local statements call in DuckDB (`FUNCTIONS`): PostgreSQL's
numeric division, variance, width_bucket (`optimizer.postgres.numeric`), to_char of numbers
(`optimizer.postgres.number_text`), initcap under C (`optimizer.postgres.text_case`) and an
interval times a fraction (`optimizer.postgres.intervals`).

DuckDB keeps a Python function per database, pointing into the connection that registered it:
that connection must outlive every other of the process on the file (a function left behind by
a closed connection crashes the process when called). So each cache file has one connection of
its own for them, opened with the first handle of the process on the file and closed after the
last (`cache.store.cache_file`).
"""

from __future__ import annotations

import typing as t
from pathlib import Path

import duckdb

from optimizer.postgres import intervals, number_text, text_case
from optimizer.postgres import numeric as pg_numeric
from optimizer.postgres.allowlist import (
    INITCAP_C,
    INTERVAL_MULTIPLY,
    NUMERIC_DIVIDE,
    NUMERIC_DIVIDE_SCALE,
    NUMERIC_SPREAD,
    NUMERIC_SPREAD_SCALE,
    NUMERIC_TO_CHAR,
    WIDTH_BUCKET,
)

_TEXT_AND_SCALE = ["VARCHAR", "INTEGER", "VARCHAR", "INTEGER"]
# (name, the Python function, its argument types, its return type)
FUNCTIONS: tuple[tuple[str, t.Callable[..., t.Any], list[str], str], ...] = (
    (NUMERIC_DIVIDE, pg_numeric.divide_texts, _TEXT_AND_SCALE, "VARCHAR"),
    (NUMERIC_DIVIDE_SCALE, pg_numeric.division_text_scale, _TEXT_AND_SCALE, "INTEGER"),
    (
        WIDTH_BUCKET,
        pg_numeric.width_bucket_texts,
        ["VARCHAR", "VARCHAR", "VARCHAR", "INTEGER"],
        "INTEGER",
    ),
    (NUMERIC_SPREAD, pg_numeric.spread_texts, _TEXT_AND_SCALE, "VARCHAR"),
    (NUMERIC_SPREAD_SCALE, pg_numeric.spread_text_scale, _TEXT_AND_SCALE, "INTEGER"),
    (INITCAP_C, text_case.initcap_c, ["VARCHAR"], "VARCHAR"),
    (
        INTERVAL_MULTIPLY,
        intervals.multiply,
        ["INTEGER", "INTEGER", "BIGINT", "DOUBLE"],
        "STRUCT(months INTEGER, days INTEGER, micros BIGINT)",
    ),
    (NUMERIC_TO_CHAR, number_text.to_char_text, ["VARCHAR", "VARCHAR"], "VARCHAR"),
)


def holder(path: Path) -> duckdb.DuckDBPyConnection:
    """A connection to the cache file with the cache's functions registered (the database
    shares them with every other connection of the process)."""
    con = duckdb.connect(str(path))
    register: t.Any = con.create_function  # its stubs list no Python callables of 4 arguments
    for name, function, arguments, returns in FUNCTIONS:
        # (NULLs reach the function: each says what NULL gives; none has side effects)
        register(name, function, arguments, returns, null_handling="special", side_effects=False)
    return con
