"""Planning: a statement's analysis in, one `optimizer.plan.Plan` out, by an ordered tuple of
rules over it (as sqlglot's optimizer composes its rewrites). Pure: everything it needs from
the backend and the cache file (cost estimates, view row counts) is gathered before it, from
what `estimate_requests` asks for of the initial plan, and passed in.

    analysis -> initial plan (every access remote, its leaf made)
             -> divide_outputs (the divisions the cache does as PostgreSQL, SPEC §5.11)
             -> place_guards   (§4.4, §4.5 view matching, Fig 7.2)
             -> estimate_cost  (§4.6: guarded plan vs the whole statement remote)
"""

from __future__ import annotations

import dataclasses
import typing as t

from control_tables.schema import CacheSchema
from optimizer.analyze import Analysis
from optimizer.divide_outputs import divide_outputs
from optimizer.estimate_cost import EstimateRequests, estimate_cost, requests
from optimizer.leaves import remote_leaf
from optimizer.local_statement import local_statement
from optimizer.place_guards import place_guards
from optimizer.plan import AccessPlan, ClassPlan, Plan, PlanInputs
from sql_ext.catalog import Catalog

Rule = t.Callable[[Plan, PlanInputs], Plan]

RULES: tuple[Rule, ...] = (divide_outputs, place_guards, estimate_cost)


def plan_query(
    analysis: Analysis, inputs: PlanInputs, *, with_params: bool, initial: Plan | None = None
) -> Plan:
    """The plan of a statement shape (``with_params``: executed with parameters), from its
    ``initial`` plan when it was made already (for `estimate_requests`)."""
    plan = initial_plan(analysis, inputs.catalog, with_params) if initial is None \
        else dataclasses.replace(initial, analysis=analysis)  # fmt: skip
    for rule in RULES:
        plan = rule(plan, inputs)
    if plan.local:
        plan = dataclasses.replace(plan, first=local_statement(plan, plan.first_choice()))
    return plan


def estimate_requests(initial: Plan, schema: CacheSchema) -> EstimateRequests:
    """What to gather for `plan_query`'s `Estimates` (the I/O before planning)."""
    return requests(initial, schema)


def initial_plan(analysis: Analysis, catalog: Catalog, with_params: bool) -> Plan:
    """Every access remote: the whole statement and each access's leaf."""
    classes = []
    for cls, accesses in analysis.class_accesses:
        plans = []
        for access in accesses:
            table = catalog.table(access.table)
            assert table is not None  # an access is a reference to a catalog table
            plans.append(AccessPlan(access, remote_leaf(access, table, analysis.parameter_keys,
                                                        with_params)))  # fmt: skip
        classes.append(ClassPlan(cls, tuple(plans)))
    return Plan(
        analysis=analysis,
        sql=analysis.query.backend_sql,
        with_params=with_params,
        classes=tuple(classes),
    )
