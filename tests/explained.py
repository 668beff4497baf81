"""What EXPLAIN shows is what ran: a check for the differential suites, which run
each query through the cache and compare its answer with PostgreSQL's."""

from __future__ import annotations

import typing as t

import cache


def leaves_of(node: dict[str, t.Any]) -> list[str]:
    """The SQL of every RemoteQuery under a plan node."""
    found = [node["sql"]] if node["op"] == "RemoteQuery" else []
    for child in node.get("children", []):
        found += leaves_of(child)
    return found


def assert_ran_as_explained(cursor: cache.Cursor, explained: cache.Plan) -> str:
    """``cursor`` just ran a query whose EXPLAIN showed ``explained``: the same plan object
    ran, its accesses went where the plan allows, and every SQL text sent is one it shows.
    Returns which part of the plan ran: "remote", "first branches" or "other branches"."""
    plan, executed = cursor.plan, cursor.executed
    assert plan is explained, "the query ran with another plan than EXPLAIN showed"
    assert executed is not None
    document = plan.to_json()
    tree = document["plan"]
    routes = [p["route"] for p in cursor.provenance]
    if executed.backend_sql is not None:  # the whole statement went to PostgreSQL
        assert executed.backend_sql == plan.sql
        assert set(routes) <= {"remote"}
        if tree["op"] == "RemoteQuery":
            assert tree["sql"] == executed.backend_sql
        else:
            assert tree["op"] == "LocalQuery" and "fallback" in tree
        return "remote"
    assert tree["op"] == "LocalQuery", "DuckDB ran a plan EXPLAIN shows as remote"
    shown = leaves_of(tree)
    assert set(executed.leaves) <= set(shown), "a leaf ran that EXPLAIN does not show"
    planned = {a.alias: a for a in plan.accesses}
    views = {}
    for entry, access in zip(cursor.provenance, plan.accesses, strict=True):
        assert entry["table"] == access.table
        if entry["route"] == "local":
            assert entry["view"] in [g.view for g in planned[access.alias].guards]
            views[access.alias] = entry["view"]
        else:
            assert access.leaf.sql in executed.leaves
    accesses = {a["table"]: a for a in document["accesses"]}
    for entry in cursor.provenance:
        if entry["route"] == "local":
            assert accesses[entry["table"]]["route"] == "guarded"
    first = {a.alias: a.guards[0].view for a in plan.guarded_accesses}
    if views == first and len(executed.leaves) == len(plan.accesses) - len(first):
        # every guard passed on its first branch: the statement EXPLAIN shows ran
        assert executed.duckdb_sql == tree["sql"]
        return "first branches"
    return "other branches"
