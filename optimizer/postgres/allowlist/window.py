"""Window functions: row_number, rank, dense_rank, lag / lead and first_value / last_value."""

from __future__ import annotations

from sqlglot import exp

from optimizer.postgres.allowlist.base import Call, Family, Result, _literal_int
from optimizer.postgres.allowlist.conditionals import _combined
from optimizer.postgres.types import INT8

FAMILY = Family()
entry = FAMILY.entry


entry(
    "row_number / rank / dense_rank",
    (exp.RowNumber, exp.Rank, exp.DenseRank),
    lambda call: INT8,
    proofs=(
        "row_number() OVER (ORDER BY e.id)",
        "rank() OVER (ORDER BY e.c)",
        "dense_rank() OVER (PARTITION BY e.b ORDER BY e.i4)",
    ),
)


def _offset_value(call: Call) -> Result:
    value = call.type()
    default = call.arg("default")
    if default is not None:
        return _combined([value, call.of(default)])
    offset = call.arg("offset")
    if offset is not None and _literal_int(offset) is None:
        return "it takes lag/lead with an offset that is not a literal"
    return value


entry(
    "lag / lead",
    (exp.Lag, exp.Lead),
    _offset_value,
    proofs=(
        "lag(e.i4) OVER (ORDER BY e.id)",
        "lead(e.c, 2) OVER (ORDER BY e.id)",
        "lead(e.t, 1, 'none') OVER (ORDER BY e.id)",
    ),
)
entry(
    "first_value / last_value",
    (exp.FirstValue, exp.LastValue),
    lambda call: call.type(),
    proofs=(
        "first_value(e.n) OVER (ORDER BY e.id)",
        "last_value(e.c) OVER (ORDER BY e.id "
        "ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)",
    ),
)
