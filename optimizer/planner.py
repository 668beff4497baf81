"""Planning: a statement's analysis in, one `optimizer.plan.Plan` out, by an ordered tuple of
rules over it (as sqlglot's optimizer composes its rewrites). Pure: everything it needs from
the backend and the cache file (cost estimates, view row counts) is gathered before it, from
what `estimate_requests` asks for of the initial plan, and passed in.

    analysis -> initial plan (every access remote, its leaf made)
             -> divide_outputs (the divisions the cache does as PostgreSQL)
             -> place_guards   (§4.4, §4.5 view matching, Fig 7.2)
             -> estimate_cost  (§4.6: guarded plan vs the whole statement remote)
             -> answer_from_derived (a derived cached view answering the whole statement,
                                when it costs less)
             -> fit_result     (the guarded plan's DuckDB statement, made once; planned
                                again, remote, if DuckDB cannot give PostgreSQL's result)
"""

from __future__ import annotations

import dataclasses
import typing as t

from control_tables.schema import CacheSchema
from optimizer.analysis.analyze import Analysis
from optimizer.analysis.leaves import remote_leaf
from optimizer.derived.answer import answer_from_derived
from optimizer.plan import AccessPlan, ClassPlan, Plan, PlanInputs
from optimizer.rules.divide_outputs import divide_outputs
from optimizer.rules.estimate_cost import EstimateRequests, estimate_cost, requests
from optimizer.rules.local_statement import local_statement
from optimizer.rules.place_guards import place_guards
from sql_ext.catalog import Catalog

Rule = t.Callable[[Plan, PlanInputs], Plan]


def fit_result(plan: Plan, inputs: PlanInputs) -> Plan:
    """A guarded plan gets the DuckDB statement of its first choice, made here once. When
    DuckDB's answer to it could not be PostgreSQL's (``inputs.result_problem`` says why: a
    function DuckDB lacks, a result type it cannot give), the statement is planned again by
    the rules before this one with local execution blocked for that reason: the whole
    statement remote."""
    if not plan.local or plan.derived is not None:  # (a derived view's: fitted when made)
        return plan
    first = local_statement(plan, plan.first_choice())
    problem = inputs.result_problem(plan, first) if inputs.result_problem is not None else None
    if problem is None:
        return dataclasses.replace(plan, first=first)
    unfit = dataclasses.replace(plan.analysis, local_blocker=problem)
    again = initial_plan(unfit, inputs.catalog, plan.with_params)
    for rule in RULES[: RULES.index(fit_result)]:
        again = rule(again, inputs)
    assert not again.local, "a plan blocked from local execution stays remote"
    return again


RULES: tuple[Rule, ...] = (
    divide_outputs,
    place_guards,
    estimate_cost,
    answer_from_derived,
    fit_result,
)


def plan_query(
    analysis: Analysis, inputs: PlanInputs, *, with_params: bool, initial: Plan | None = None
) -> Plan:
    """The plan of a statement shape (``with_params``: executed with parameters), from its
    ``initial`` plan when it was made already (for `estimate_requests`)."""
    plan = (
        initial_plan(analysis, inputs.catalog, with_params)
        if initial is None
        else dataclasses.replace(initial, analysis=analysis)
    )
    for rule in RULES:
        plan = rule(plan, inputs)
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
            plans.append(
                AccessPlan(access, remote_leaf(access, table, analysis.parameter_keys, with_params))
            )
        classes.append(ClassPlan(cls, tuple(plans)))
    return Plan(
        analysis=analysis,
        sql=analysis.query.backend_sql,
        with_params=with_params,
        classes=tuple(classes),
    )
