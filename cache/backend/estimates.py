"""The backend's own cost estimates for planning (§4.6): ``EXPLAIN (FORMAT JSON)`` of
each SQL text a plan may send, so backend indexes count. A shape is costed with the values of
its first execution, bound client-side (psycopg's mogrify)."""

from __future__ import annotations

import math
import typing as t
from collections.abc import Iterable

import psycopg

from cache.backend.pool import pooled
from sql_ext.params import Params


def backend_estimates(
    dsn: str, statements: Iterable[tuple[str, Params]]
) -> dict[str, tuple[float, float]]:
    """(total cost, rows) per SQL text, each with the parameters its placeholders take. One
    the backend will not plan costs infinity: never chosen."""
    found: dict[str, tuple[float, float]] = {}
    with pooled(dsn) as conn:
        cursor = psycopg.ClientCursor(conn)
        for sql, params in statements:
            try:
                bound = cursor.mogrify(sql, params)  # type: ignore[arg-type]
                row = conn.execute(f"EXPLAIN (FORMAT JSON) {bound}").fetchone()  # type: ignore[arg-type]
            except psycopg.Error:
                found[sql] = (math.inf, 0.0)
                continue
            plan: dict[str, t.Any] = row[0][0]["Plan"] if row else {}
            found[sql] = (float(plan.get("Total Cost", 0.0)), float(plan.get("Plan Rows", 0.0)))
    return found
