"""The planning rule that answers a whole statement from a derived cached view
(`optimizer.match_derived`) when the view answers it and that costs less than the plan chosen
so far.

The plan it makes has one consistency class over every input (the view's one region is one
snapshot, which satisfies every class of the statement's constraint) with the tightest bound
of them, and each access guarded by the view's view-level region, as a fully materialized
view's access is (currency, timeline, the session's own writes and positions: §4.4's
SwitchUnion, `optimizer.evaluate_guards`): the guards hold together or fail together, and
when they fail the statement goes to PostgreSQL whole. Its local statement is the match's.
"""

from __future__ import annotations

import dataclasses

from optimizer.estimate_cost import (
    GUARD_COST,
    LOCAL_ROW_COST,
    below_delay,
    guarded_cost,
    local_probability,
)
from optimizer.match_derived import match_derived
from optimizer.normalize_constraint import ConsistencyClass
from optimizer.plan import ClassPlan, Guard, LocalStatement, Plan, PlanInputs
from sql_ext.params import duckdb_name


def answer_from_derived(plan: Plan, inputs: PlanInputs) -> Plan:
    """The plan answering from a derived view, if one answers the statement and costs less
    (``plan_choice`` "remote" keeps the remote plan; "guarded" takes the view's)."""
    analysis = plan.analysis
    if inputs.choice == "remote" or not analysis.local_allowed or analysis.outside \
            or not plan.accesses or not analysis.query.is_select:  # fmt: skip
        return plan
    for view in sorted(inputs.schema.views.values(), key=lambda v: v.name):
        if view.derivation is None:
            continue
        match = match_derived(analysis.query, view, inputs.catalog, analysis.parameter_keys)
        if match is None:
            continue
        bound = min(c.bound_seconds for c in analysis.constraint.classes)
        delay = inputs.delay_of(view.name)
        if below_delay(bound, delay):
            continue
        p = local_probability(bound, delay, view.refresh_seconds or 0.0)
        estimates = inputs.estimates
        cost = 0.0
        if estimates is not None:
            whole = estimates.cost(plan.sql)[0]
            rows = estimates.view_rows.get(view.name, 0.0)
            cost = guarded_cost(p, rows * LOCAL_ROW_COST, whole, GUARD_COST)
            chosen = plan.estimated_cost
            if inputs.choice != "guarded" and cost >= chosen:
                continue
        guard = Guard(view.name, "full", bound)
        instances = frozenset(i for c in analysis.constraint.classes for i in c.instances)
        accesses = tuple(dataclasses.replace(a, guards=(guard,), probability_local=p,
                                             refresh_delay=delay)
                         for a in plan.accesses)  # fmt: skip
        # (its parameters are the query's, compared with the same columns' values: what
        # PostgreSQL reads them as is checked per execution, as for any local statement)
        typed = tuple(sorted({(analysis.parameter_keys[n], kind) for n, kind
                              in analysis.semantics.parameters.items()}, key=str))  # fmt: skip
        statement = LocalStatement(match.sql, analysis.keys,
                                   tuple(map(duckdb_name, analysis.keys)), (), match.outputs,
                                   typed)  # fmt: skip
        semantics = dataclasses.replace(
            analysis.semantics,
            output_scales={**analysis.semantics.output_scales, **match.scales})  # fmt: skip
        derived = dataclasses.replace(
            plan, analysis=dataclasses.replace(analysis, semantics=semantics),
            classes=(ClassPlan(ConsistencyClass(bound, instances, frozenset()), accesses),),
            local=True, estimated_cost=cost, reason=None, first=statement,
            derived=view.name, candidates=(*plan.candidates, ("derived", cost)))  # fmt: skip
        problem = inputs.result_problem(derived, statement) \
            if inputs.result_problem is not None else None  # fmt: skip
        if problem is None:
            return derived
    return plan


__all__ = ["answer_from_derived"]
