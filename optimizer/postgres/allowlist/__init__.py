"""What DuckDB may compute for a local answer: every function, operator, cast and
literal form that may run in DuckDB is listed here, with the argument types it is listed for,
the type PostgreSQL gives its result, and the rewrite DuckDB needs to compute exactly what
PostgreSQL computes (or none). Anything not listed keeps the statement at the backend, and
EXPLAIN's ``reason`` names it.

Each entry carries its proofs: expressions over the edge-value table of
tests/optimizer/test_allowlist.py (NULLs, empty strings, trailing blanks in char(n), negative
and zero scales, extremes, out-of-range arguments) whose answers the test compares with
PostgreSQL's, values and types, and expressions PostgreSQL raises an error for, which the
cache must raise with the same SQLSTATE. An entry without a proof fails that test.

Entries speak in `optimizer.postgres.types` types; the type inference
(`optimizer.postgres.expression_types`) asks `resolve` for the type of every node that computes
a value.

The entries come by family, a module each, joined in this order into one list
(`table.ENTRIES`): `literals`, `casts`, `arithmetic` (operators, and the cache's numeric
division), `comparisons` (comparison operators and predicates), `patterns` (LIKE, SIMILAR TO,
regular expressions), `conditionals`, `strings`, `math_functions`, `date_time`, `aggregates`,
`window`. Where two entries take the same form, the first whose signature takes the arguments
resolves the node. `base` holds what the families share. This package's names are what the
rest of the optimizer and the cache use.
"""

from optimizer.postgres.allowlist.arithmetic import (
    DIVISION_SCALE,
    INTERVAL_MULTIPLY,
    NUMERIC_DIVIDE,
    NUMERIC_DIVIDE_SCALE,
    NUMERIC_SPREAD,
    NUMERIC_SPREAD_SCALE,
    numeric_division,
    numeric_spread,
)
from optimizer.postgres.allowlist.base import Call, Entry, Result, Settings
from optimizer.postgres.allowlist.casts import reads_alike
from optimizer.postgres.allowlist.date_time import ZONE_PARAMETER
from optimizer.postgres.allowlist.math_functions import NUMERIC_TO_CHAR, WIDTH_BUCKET
from optimizer.postgres.allowlist.strings import INITCAP_C
from optimizer.postgres.allowlist.table import (
    BY_NAME,
    ENTRIES,
    QUERY_PARTS,
    WHY_NOT_LISTED,
    computes,
    entries_for,
    name_of,
    resolve,
)

__all__ = [
    "BY_NAME",
    "DIVISION_SCALE",
    "ENTRIES",
    "INITCAP_C",
    "INTERVAL_MULTIPLY",
    "NUMERIC_DIVIDE",
    "NUMERIC_DIVIDE_SCALE",
    "NUMERIC_SPREAD",
    "NUMERIC_SPREAD_SCALE",
    "NUMERIC_TO_CHAR",
    "QUERY_PARTS",
    "WHY_NOT_LISTED",
    "WIDTH_BUCKET",
    "ZONE_PARAMETER",
    "Call",
    "Entry",
    "Result",
    "Settings",
    "computes",
    "entries_for",
    "name_of",
    "numeric_division",
    "numeric_spread",
    "reads_alike",
    "resolve",
]
