"""Set-returning functions in FROM: ``generate_series`` over integers.

PostgreSQL's ``generate_series(start, stop [, step])`` over int4 (and smaller) arguments
returns int4, over an int8 one int8: the values from start to stop by step (1 without one),
none when the range is empty or an argument is NULL, an error (22023) for a step of zero. Its
arguments may read the FROM items before it (PostgreSQL joins it to them as a LATERAL item,
and so does DuckDB). DuckDB's own series are always BIGINT: an int4 series is read through a
subquery casting its values to INTEGER (streamed, as PostgreSQL's), so arithmetic on them
overflows where PostgreSQL's does. The
column is named as PostgreSQL names it (`optimizer.postgres.folds.name_series_columns`).
"""

from __future__ import annotations

import typing as t

from sqlglot import exp

from optimizer.postgres.allowlist.base import (
    NOT_MINE,
    Call,
    Family,
    Result,
    _error_if,
    _func,
    _integers,
)
from optimizer.postgres.types import PgType

FAMILY = Family()
entry = FAMILY.entry

_ARGUMENTS = ("start", "end", "step")


def _series(width: int) -> t.Callable[[Call], Result]:
    """The signature of the series of integers of ``width`` bytes (int4 unless an argument is
    an int8, as PostgreSQL picks)."""

    def signature(call: Call) -> Result:
        table = call.node.parent
        if not isinstance(table, exp.Table) or table.this is not call.node:
            return "it calls generate_series outside FROM (a set-returning select list)"
        if table.args.get("ordinality"):
            return "it calls generate_series WITH ORDINALITY"
        types = [call.type(k) for k in _ARGUMENTS if call.arg(k) is not None]
        if not _integers(*types):
            kinds = ", ".join(found.kind for found in types)
            return f"it calls generate_series over {kinds} (integer series only)"
        wide = 8 if any(found.width == 8 for found in types) else 4
        return PgType("integer", width) if wide == width else NOT_MINE

    return signature


def _arguments(node: exp.Expr) -> list[exp.Expr]:
    """The arguments, a step of zero raising as in PostgreSQL (DuckDB's list of a step read
    from a row would be empty)."""
    found = [node.args[k] for k in _ARGUMENTS if node.args.get(k) is not None]
    if len(found) == 3:
        step = found[2]
        found[2] = _error_if(
            exp.EQ(this=step.copy(), expression=exp.Literal.number(0)),
            "step size cannot equal zero",
            step,
        )
    return found


def _series_of(name: str) -> t.Callable[[exp.Expr], exp.Expr]:
    """DuckDB's series (BIGINT values) read through a subquery casting them to ``name``:
    streamed, as PostgreSQL's (a list of them would be built whole first)."""

    def rewrite(node: exp.Expr) -> exp.Expr:
        values = exp.Cast(this=exp.column("generate_series"), to=exp.DataType.build(name))
        source = exp.Table(this=_func("generate_series", *_arguments(node)))
        return exp.Subquery(this=exp.select(values).from_(source))

    return rewrite


entry(
    "generate_series(integer, integer, integer)",
    (exp.ExplodingGenerateSeries,),
    _series(4),
    rewrite=_series_of("INTEGER"),
    proofs=(
        "SELECT e.id, g.y FROM edge e, generate_series(1, 3) AS g(y)",
        "SELECT e.id, g.y FROM edge e, generate_series(e.i2, 3) AS g(y)",
        "SELECT e.id, g FROM edge e, generate_series(e.i2, e.i4 % 10, -2) AS g",
        "SELECT e.id, count(g.y), sum(g.y) FROM edge e LEFT JOIN generate_series(e.i2, 2) "
        "AS g(y) ON g.y <> 0 GROUP BY e.id",
        "SELECT e.id, generate_series FROM edge e, generate_series(3, NULL)",
        "SELECT g.y, count(e.id) FROM generate_series(-2, 8, 3) AS g(y) "
        "LEFT JOIN edge e ON e.i4 = g.y GROUP BY g.y",
        "SELECT e.id, g.y FROM edge e, generate_series(2147483645, 2147483647) AS g(y)",
    ),
    raises=(
        "(SELECT max(g.y + 1) FROM generate_series(2147483646, 2147483647) AS g(y))",
        "(SELECT count(*) FROM generate_series(1, 3, 0 * e.i4) AS g)",
        "(SELECT count(*) FROM edge x, generate_series(1, 3, x.i2) AS g WHERE x.i2 = 0)",
    ),
)
entry(
    "generate_series(bigint, bigint, bigint)",
    (exp.ExplodingGenerateSeries,),
    _series(8),
    rewrite=_series_of("BIGINT"),
    proofs=(
        "SELECT e.id, g.y FROM edge e, generate_series(e.i8, e.i8 + 2) AS g(y)",
        "SELECT e.id, g.y FROM edge e, generate_series(1, 10, e.i8) AS g(y) WHERE e.i8 <> 0",
        "SELECT e.id, g.y FROM edge e, generate_series(9223372036854775805, "
        "9223372036854775807) AS g(y)",
    ),
    raises=(
        "(SELECT max(g.y * 2) FROM generate_series(1, 9223372036854775807, "
        "4611686018427387904) AS g(y))",
    ),
)
