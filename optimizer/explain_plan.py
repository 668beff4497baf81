"""The plan of a query as EXPLAIN shows it (SPEC §5.7, §9): SwitchUnions with their guards over
a LocalScan and a RemoteQuery per cached access, remote leaves, joins and aggregation on top,
and the estimated cost of §4.6.

Pure: the caller supplies the backend's cost estimate for a SQL text (from PostgreSQL's
``EXPLAIN (FORMAT JSON)``) and the local row counts.
"""

from __future__ import annotations

import math
import typing as t
from collections.abc import Callable

from sqlglot import exp

from control_tables.schema import CachedView, CacheSchema
from optimizer.accesses import Access, QueryModel
from optimizer.estimate_cost import DEFAULT_DELAY, below_delay, guarded_cost, local_probability
from optimizer.match_views import Match, match_access
from sql_ext.catalog import Catalog

# Costs are in PostgreSQL's units (its EXPLAIN estimates the remote side). Calibrated on this
# project's reference machine (docs/decisions.md, "Cost constants"): a warm PostgreSQL spends
# about 4 us per unit on scans; DuckDB scans a cached view at 7-36 ns per row; Arrow moves a
# backend row into DuckDB in about 1 us. Results reach the application either way, so neither
# side is charged for delivering them; costs count work, so a point lookup through a cached
# key stays local although both engines answer it in a fraction of a millisecond.
LOCAL_ROW_COST = 0.005  # DuckDB, per row of a cached view scanned
TRANSFER_ROW_COST = 0.25  # per row a remote leaf moves from the backend into DuckDB
GUARD_COST = 0.01  # dictionary lookups


def explain(
    model: QueryModel,
    schema: CacheSchema,
    remote_cost: Callable[[str], tuple[float, float]],  # sql -> (total cost, rows)
    local_rows: Callable[[str], float],  # view -> rows it holds
    catalog: Catalog | None = None,
) -> dict[str, t.Any]:
    """The EXPLAIN document: constraint, plan tree, accesses and estimated cost."""
    whole_sql = model.query.to_sql("postgres")
    whole_cost, whole_rows = remote_cost(whole_sql)
    remote_plan: dict[str, t.Any] = {"op": "RemoteQuery", "sql": whole_sql}
    guarded: dict[int, Match] = {}
    if model.local_allowed(catalog or Catalog()):
        for cls in model.constraint.classes:
            if below_delay(cls.bound_seconds):
                continue  # §4.4: below the refresh delay no region can ever be fresh enough
            matches = {i.id: match_access(model.access_of(i), schema) for i in cls.instances}
            if all(matches.values()):
                guarded.update({i: m[0] for i, m in matches.items()})
    bounds = {i.id: c.bound_seconds for c in model.constraint.classes for i in c.instances}
    leaves: list[dict[str, t.Any]] = []
    mixed_cost = 0.0
    for access in model.accesses if guarded else []:
        leaf_sql = leaf_query(access)
        leaf_cost, leaf_rows = remote_cost(leaf_sql)
        remote_leaf = {"op": "RemoteQuery", "sql": leaf_sql}
        fetch = leaf_cost + leaf_rows * TRANSFER_ROW_COST
        match = guarded.get(access.instance.id)
        if match is None:
            leaves.append(remote_leaf)
            mixed_cost += fetch
            continue
        view = match.view
        p = local_probability(
            bounds[access.instance.id], DEFAULT_DELAY, view.refresh_seconds or 0.0
        )
        local = scanned_rows(access, view, local_rows) * LOCAL_ROW_COST
        mixed_cost += guarded_cost(p, local, fetch, GUARD_COST)
        leaves.append({
            "op": "SwitchUnion",
            "guard": _guard(match, bounds[access.instance.id]),
            "probability_local": round(p, 4),
            "children": [
                {"op": "LocalScan", "view": view.name, "filter": _filter(access)},
                remote_leaf,
            ],
        })  # fmt: skip
    accesses = [
        {
            "table": a.table,
            "route": "guarded" if a.instance.id in guarded else "remote",
            "view": guarded[a.instance.id].view.name if a.instance.id in guarded else None,
        }
        for a in model.accesses
    ] or [{"table": i.table, "route": "remote", "view": None} for i in model.constraint.instances]
    del whole_rows  # the result reaches the application from either side
    if not guarded or whole_cost <= mixed_cost:
        plan, cost = remote_plan, whole_cost
        if guarded:
            accesses = [{**a, "route": "remote", "view": None} for a in accesses]
    else:
        tree: dict[str, t.Any] = leaves[0]
        for leaf in leaves[1:]:
            tree = {"op": "Join", "children": [tree, leaf]}
        if _aggregates(model):
            tree = {"op": "Aggregate", "children": [tree]}
        plan = {"op": "LocalQuery", "engine": "duckdb", "children": [tree]}
        cost = mixed_cost
    return {
        "constraint": model.constraint.to_json(),
        "plan": plan,
        "accesses": accesses,
        "estimated_cost": round(cost, 4),
    }


def scanned_rows(access: Access, view: CachedView, local_rows: Callable[[str], float]) -> float:
    """Rows DuckDB reads for the access: the probed keys when the access names the view's key
    with constants (its primary-key index finds them), else the whole view."""
    if view.key and all(c in access.probes for c in view.key):
        return float(math.prod(len(access.probes[c]) for c in view.key))
    return local_rows(view.name)


def leaf_query(access: Access) -> str:
    """The remote leaf of an access: its columns under its pushed conjuncts (PostgreSQL)."""
    columns = ", ".join(f'"{c}"' for c in sorted(access.columns)) or "1"
    alias = access.node.alias or access.node.name
    sql = f'SELECT {columns} FROM {access.table} AS "{alias}"'
    if access.conjuncts:
        sql += " WHERE " + " AND ".join(c.sql(dialect="postgres") for c in access.conjuncts)
    return sql


def _filter(access: Access) -> str | None:
    if not access.conjuncts:
        return None
    return " AND ".join(c.sql(dialect="postgres") for c in access.conjuncts)


def _guard(match: Match, bound: float) -> dict[str, t.Any]:
    guard: dict[str, t.Any] = {"currency_bound_seconds": bound, "view": match.view.name}
    if match.kind == "presence":
        guard["presence"] = {"columns": list(match.columns), "in": match.control}
    elif match.kind == "completeness":
        guard["completeness"] = {"columns": list(match.columns), "in": match.control}
    guard["consistency"] = "one snapshot per consistency class"
    return guard


def _aggregates(model: QueryModel) -> bool:
    top = model.query.tree
    if not isinstance(top, exp.Select):
        return False
    return bool(top.args.get("group")) or any(
        isinstance(node, exp.AggFunc) for node in top.expressions for node in node.walk()
    )


def render(document: dict[str, t.Any]) -> list[str]:
    """The plan as indented text lines (EXPLAIN through a cursor returns these as rows)."""
    lines = [f"estimated cost {document['estimated_cost']}"]

    def walk(node: dict[str, t.Any], depth: int) -> None:
        details = {k: v for k, v in node.items() if k not in ("op", "children")}
        text = ", ".join(f"{k}={v}" for k, v in details.items())
        lines.append(f"{'  ' * depth}{node['op']}" + (f" ({text})" if text else ""))
        for child in node.get("children", []):
            walk(child, depth + 1)

    walk(document["plan"], 0)
    for cls in document["constraint"]:
        lines.append(
            f"constraint: {', '.join(cls['tables'])} within {cls['bound_seconds']:g}s"
            + (f" by {', '.join(cls['by'])}" if cls["by"] else "")
        )
    return lines
