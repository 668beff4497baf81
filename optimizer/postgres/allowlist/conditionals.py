"""Conditional expressions: CASE, coalesce, nullif, greatest and least, typed as PostgreSQL
resolves the common type of their branches."""

from __future__ import annotations

from sqlglot import exp

from optimizer.postgres.allowlist.base import Call, Family, Result
from optimizer.postgres.allowlist.comparisons import _comparable
from optimizer.postgres.types import PgType, combine

FAMILY = Family()
entry = FAMILY.entry


def _case(call: Call) -> Result:
    node = call.node
    values = [i.args["true"] for i in node.args.get("ifs") or []]
    if node.args.get("default") is not None:
        values.insert(0, node.args["default"])  # PostgreSQL resolves the ELSE first
    subject = node.args.get("this")
    for branch in node.args.get("ifs") or []:
        condition = call.of(branch.this)
        if subject is not None:
            if not _comparable(call.of(subject), condition):
                return "it compares CASE's value with another type"
        elif condition.kind not in ("bool", "null"):
            return f"its CASE tests a {condition.kind}"
    return _combined([call.of(v) for v in values])


def _combined(types: list[PgType]) -> Result:
    found = combine(types)
    if found.kind == "unknown":
        return "it mixes values of types the cache cannot resolve as PostgreSQL does"
    return found


entry(
    "CASE",
    exp.Case,
    _case,
    proofs=(
        "CASE WHEN e.i4 > 1 THEN e.n ELSE 0 END",
        "CASE e.c WHEN 'ab' THEN 1 END",
        "CASE WHEN e.b THEN e.c ELSE 'x' END",
        "CASE WHEN e.i4 IS NULL THEN 'none' END",
        "CASE WHEN e.b THEN e.v ELSE e.t END",
        "CASE WHEN e.b THEN e.c ELSE e.v END",
        "CASE WHEN e.b THEN e.v ELSE e.c END",
        "CASE WHEN e.b THEN e.c ELSE e.c1 END",
        "CASE WHEN e.i4 > 0 THEN 1.5 ELSE 2.25 END",
        "(CASE WHEN e.b THEN e.v ELSE e.c END) || '|'",
        "length(CASE WHEN e.b THEN e.t ELSE e.c END)",
        "CASE WHEN e.b THEN e.v ELSE e.c END = 'ab'",
    ),
)


def _coalesce(call: Call) -> Result:
    node = call.node
    return _combined([call.of(node.this), *map(call.of, node.expressions)])


entry(
    "coalesce",
    exp.Coalesce,
    _coalesce,
    proofs=(
        "coalesce(e.i4, 0)",
        "coalesce(e.n, 0)",
        "coalesce(e.c, 'none')",
        "coalesce(e.v, e.t)",
        "coalesce(e.d, DATE '1999-01-01')",
        "coalesce(e.n, e.n4)",
        "coalesce(e.c, e.v)",
        "coalesce(e.v, e.c)",
        "coalesce(e.c, e.t)",
        "coalesce(e.t, e.c1)",
        "coalesce(e.c1, e.c)",
        "SELECT u.x FROM (SELECT coalesce(e.n, 0) AS x FROM edge e UNION ALL "
        "SELECT 0.5 FROM edge e) u",
        "SELECT d.x + 1 FROM (SELECT coalesce(e.n4, e.n) AS x FROM edge e) d",
        "coalesce(e.c, e.v) || '|'",
        "coalesce(e.c, 'x  ') || '|'",
    ),
)


def _nullif(call: Call) -> Result:
    """NULLIF's value is its first argument, promoted to the type it is compared in (an
    integer compared with a numeric is a numeric, of scale 0)."""
    a, b = call.type(), call.type("expression")
    if not _comparable(a, b):
        return f"it compares {a.kind} with {b.kind} in NULLIF"
    common = _combined([a, b])
    if isinstance(common, PgType) and common.kind == "numeric":
        return PgType("numeric", scale=a.as_numeric().scale if a.kind != "null" else None)
    return common if isinstance(common, PgType) and common.kind == "float" else a


entry(
    "nullif",
    exp.Nullif,
    _nullif,
    proofs=(
        "nullif(e.i4, 7)",
        "nullif(e.c, 'ab')",
        "nullif(e.n, 0)",
        "nullif(e.v, '')",
        "nullif(1000, -0.5)",
        "nullif(e.i4, e.n)",
        "nullif(e.n, e.n4)",
        "nullif(e.i4, e.f8)",
    ),
)


def _extreme(call: Call) -> Result:
    node = call.node
    types = [call.of(node.this), *map(call.of, node.expressions)]
    for other in types[1:]:
        if not _comparable(types[0], other):
            return "it compares values of different types in GREATEST/LEAST"
    return _combined(types)


entry(
    "greatest / least",
    (exp.Greatest, exp.Least),
    _extreme,
    proofs=(
        "greatest(e.i4, 0)",
        "least(e.n, 1.5)",
        "greatest(e.v, e.t)",
        "least(e.c, 'b') = 'ab'",
        "least(e.c, e.c)",
        "greatest(e.c, e.v) = 'ab'",
        "least(e.v, e.c)",
        "greatest(e.v, e.c1)",
        "greatest(e.t, e.c)",
        "least(e.d, DATE '1995-01-01')",
        "greatest(e.n, e.i4::numeric)",
        "least(1.5, 2.25)",
        "greatest(e.n, NULL)",
    ),
)
