"""Cost of a guarded access (§4.6): a SwitchUnion runs its local branch with probability p.

Refresh is periodic with interval f and delay d, and queries arrive uniformly over a cycle.
Right after a refresh the local data is d old; it ages to d + f before the next one. A query
with bound B finds it fresh enough during B - d of every f seconds:

    p = 0            if B - d <= 0
    p = (B - d) / f  if 0 < B - d <= f
    p = 1            if B - d > f

f = 0 models continuous propagation: p = 1 when B > d, else 0.

The rule `estimate_cost` (of `optimizer.planner`) costs the guarded plan against the whole
statement remote and keeps the cheaper. Costs are in PostgreSQL's units: remote costs are the
backend's own estimates (``EXPLAIN (FORMAT JSON)``, gathered before planning, so backend
indexes count, as in §4.7.3's Q6), local costs the rows DuckDB scans.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from control_tables.schema import CachedView, CacheSchema
from optimizer.analysis.analyze import Access
from optimizer.plan import AccessPlan, Plan, PlanInputs
from optimizer.postgres.expression_types import column_type

DEFAULT_DELAY = 1.0  # seconds a refresh takes to land (d of §4.6), until measured

# Calibrated on this project's reference machine (docs/decisions/the-cost-model.md,
# `python -m experiments.calibrate_costs`): over the TPC-H queries a cached row the local
# statement scans is worth a median 0.0013 of PostgreSQL's cost units (its own time per unit
# measured on the same query); Arrow moves a backend row into DuckDB in about 1 us (~0.25 units
# at the ~4 us per unit of PostgreSQL's scans). Results reach the application either way, so
# neither side is charged for delivering them; costs count work, so a point lookup through a
# cached key stays local although both engines answer it in a fraction of a ms.
LOCAL_ROW_COST = 0.0013  # DuckDB, per row of a cached view scanned
# DuckDB decompresses a string column of mostly distinct values (FSST) a vector of 2048 rows
# at a time, for every vector holding a row its filter keeps: 25-41 ns a value for TPC-H's
# c_name, 0.006-0.012 units. A selective scan that projects such text pays for the vectors its
# matches fall in, which with scattered matches is nearly all of them (§4.7.3's Q6: 4 of its
# 5 ms). A column of few distinct values stays a dictionary: ~1 ns a value, not counted.
LOCAL_TEXT_COST = 0.006
DUCKDB_VECTOR = 2048
DISTINCT_TEXT = 0.5  # distinct values per row from which a text column is decoded value by value
TRANSFER_ROW_COST = 0.25  # per row a remote leaf moves from the backend into DuckDB
GUARD_COST = 0.01  # dictionary lookups


def below_delay(bound: float, delay: float = DEFAULT_DELAY) -> bool:
    """§4.4's compile-time rule: a bound no larger than the refresh delay can never be met by
    a cached copy, so plans (and the executor following them) do not try."""
    return bound <= delay


def local_probability(bound: float, delay: float, interval: float | None) -> float:
    """p for bound B, refresh delay d and refresh interval f (None: never refreshed on a
    schedule, so only data refreshed on demand can serve, which a cost model cannot count on:
    p = 0 unless the bound is unlimited)."""
    if bound < 0 or delay < 0:
        raise ValueError("bounds and delays are durations: 0 or more")
    slack = bound - delay
    if slack <= 0:
        return 0.0
    if interval is None:
        return 1.0 if bound == float("inf") else 0.0
    if interval <= 0:
        return 1.0
    return min(1.0, slack / interval)


def guarded_cost(p: float, local: float, remote: float, guard: float) -> float:
    """Expected cost of a SwitchUnion: p*c_local + (1 - p)*c_remote + c_guard."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p is a probability, got {p}")
    return p * local + (1.0 - p) * remote + guard


def estimate_cost(plan: Plan, inputs: PlanInputs) -> Plan:
    """Cost the guarded plan (each access on its SwitchUnion, or its remote leaf) against the
    whole statement remote; keep the cheaper. Without estimates (no backend to ask) a plan
    with guards is kept: they decide at run time."""
    schema, estimates = inputs.schema, inputs.estimates
    guarded = {a.instance.id for a in plan.guarded_accesses}
    whole = estimates.cost(plan.sql)[0] if estimates is not None else 0.0
    reasons = [
        f"({', '.join(c.cls.tables)}): {c.remote_reason}" for c in plan.classes if c.remote_reason
    ]
    if not plan.analysis.local_allowed or not plan.accesses:
        return _remote(plan, whole, reasons)
    accesses = {}
    for access in plan.accesses:
        if access.instance.id in guarded:
            first = access.guards[0]
            # no REFRESH EVERY: p as for f = 0; such a view is refreshed on demand (admission
            # pulls its regions) and its guard catches a region that has grown too old
            interval = schema.views[first.view].refresh_seconds or 0.0
            delay = inputs.delay_of(first.view)
            p = local_probability(first.bound_seconds, delay, interval)
            accesses[access.instance.id] = dataclasses.replace(
                access, probability_local=p, refresh_delay=delay
            )
    classes = tuple(
        dataclasses.replace(c, accesses=tuple(accesses.get(a.instance.id, a) for a in c.accesses))
        for c in plan.classes
    )
    plan = dataclasses.replace(plan, classes=classes)
    if estimates is None:
        if not guarded:
            return _remote(plan, whole, reasons)
        return dataclasses.replace(plan, local=True, estimated_cost=0.0, reason=None)
    mixed = _guarded_plan_cost(plan, whole, inputs)
    plan = dataclasses.replace(plan, candidates=(("remote", whole), ("guarded", mixed)))
    if inputs.choice == "remote":
        return _remote(plan, whole, ["the remote plan was asked for (plan_choice)"])
    if inputs.choice != "guarded" and whole <= mixed:
        what = "guarded" if guarded else "with every access a remote leaf"
        reasons.append(f"cheaper remote: estimated cost {whole:.4g} against {mixed:.4g} {what}")
        return _remote(plan, whole, reasons if not guarded else reasons[-1:])
    return dataclasses.replace(plan, local=True, estimated_cost=mixed, reason=None)


def _guarded_plan_cost(plan: Plan, whole: float, inputs: PlanInputs) -> float:
    """Expected cost of the guarded plan as it runs (`optimizer.rules.evaluate_guards`): a class
    whose guards hold (probability p, the least of its accesses': they decide together) reads
    its views, one whose guards fail fetches its accesses as remote leaves, which a class
    without guards always does. When every guarded class fails, the statement goes to
    PostgreSQL whole: that outcome costs ``whole``, not the leaves. Classes fail together,
    not independently: a query arrives at one moment of cycles that run on shared intervals,
    so the chance that every class fails is that of the likeliest-local class failing."""
    estimates = inputs.estimates
    assert estimates is not None
    expected = fetched = 0.0
    likeliest = 0.0  # the largest p of a guarded class
    for cls in plan.classes:
        fetch = local = 0.0
        for access in cls.accesses:
            leaf_cost, leaf_rows = estimates.cost(access.leaf.sql)
            # the remote leaves are read in one backend snapshot, so a class of
            # several accesses may be read as leaves and joined locally (§4.7.3, Table 4.3's
            # plan 2)
            fetch += leaf_cost + leaf_rows * TRANSFER_ROW_COST
            if cls.guarded:
                local += local_cost(access, leaf_rows, inputs)
        fetched += fetch
        if not cls.guarded:
            expected += fetch
            continue
        p = min(a.probability_local for a in cls.accesses)
        expected += guarded_cost(p, local, fetch, GUARD_COST * len(cls.accesses))
        likeliest = max(likeliest, p)
    if any(c.guarded for c in plan.classes):
        expected += (1.0 - likeliest) * (whole - fetched)
    return expected


def _remote(plan: Plan, cost: float, reasons: list[str]) -> Plan:
    return dataclasses.replace(
        plan, local=False, estimated_cost=cost, reason="; ".join(dict.fromkeys(reasons)) or None
    )


def local_cost(access: AccessPlan, matched: float, inputs: PlanInputs) -> float:
    """DuckDB's cost of reading the access from its first candidate view: the rows it scans,
    and the values of mostly distinct text columns it decompresses (``matched``: the rows the
    backend estimates the access keeps; their vectors are decoded whole). A column whose
    distinct count the backend has not estimated is not counted."""
    assert inputs.estimates is not None
    view = inputs.schema.views[access.guards[0].view]
    rows = scanned_rows(access.access, view, inputs.estimates.view_rows)
    table = inputs.catalog.table(access.access.table)
    texts = (
        0
        if table is None
        else sum(
            1
            for c in table.columns
            if c.name in access.access.columns
            and column_type(c, True).is_string
            and (c.n_distinct or 0.0) >= DISTINCT_TEXT * table.row_count > 0
        )
    )
    decoded = min(rows, max(matched, 1.0) * DUCKDB_VECTOR)
    return rows * LOCAL_ROW_COST + decoded * texts * LOCAL_TEXT_COST


def scanned_rows(access: Access, view: CachedView, view_rows: Mapping[str, float]) -> float:
    """Rows DuckDB reads for the access: the probed keys when the access names the view's key
    with constants (its primary-key index finds them), else the whole view."""
    if view.key and all(c in access.probes for c in view.key):
        return float(math.prod(len(access.probes[c]) for c in view.key))
    return view_rows.get(view.name, 0.0)


@dataclass(frozen=True)
class EstimateRequests:
    """What `Estimates` must hold for a plan: the backend's estimates of the whole statement
    (written with the application's placeholders) and of the leaf queries (named
    placeholders), and the rows of the views."""

    statement: str
    leaves: tuple[str, ...]
    views: tuple[str, ...]


def requests(plan: Plan, schema: CacheSchema) -> EstimateRequests:
    """The requests of a plan before costing: every leaf is asked for when some accessed table
    has a cached view (none otherwise: the statement can only go remote)."""
    tables = {a.table for a in plan.accesses}
    views = tuple(
        sorted(v.name for v in schema.views.values() if v.table in tables and not v.is_derived)
    )
    # (a derived view reading only these tables may answer the whole statement: its rows)
    derived = tuple(
        sorted(
            v.name
            for v in schema.views.values()
            if v.derivation is not None and {s.table for s in v.derivation.sources} <= tables
        )
    )
    leaves = tuple(dict.fromkeys(a.leaf.sql for a in plan.accesses)) if views else ()
    views += derived
    return EstimateRequests(plan.sql, leaves, views)
