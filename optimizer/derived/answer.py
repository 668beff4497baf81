"""The planning rule that answers a whole statement from a derived cached view
(`optimizer.derived.match`) when the view answers it and that costs less than the plan chosen
so far.

The plan it makes has one consistency class over every input with the tightest bound of
them, and each access guarded alike (currency, timeline, the session's own writes and
positions: §4.4's SwitchUnion, `optimizer.rules.evaluate_guards`): by the view's view-level region,
as a fully materialized view's access is; with PRESENCE, by the regions of the keys the query
compares the presence columns with (every one present, one snapshot among them, a miss
admitted). The guards hold together or fail together, and when they fail the statement goes
to PostgreSQL whole. Its local statement is the match's.
"""

from __future__ import annotations

import dataclasses

from sqlglot import exp

from control_tables.derived import plain_output
from control_tables.kinds import GuardKind
from control_tables.schema import CachedView
from optimizer.analysis.normalize_constraint import ConsistencyClass
from optimizer.derived.match import match_derived
from optimizer.plan import ClassPlan, Guard, LocalStatement, Plan, PlanInputs
from optimizer.rules.estimate_cost import (
    GUARD_COST,
    LOCAL_ROW_COST,
    below_delay,
    guarded_cost,
    local_probability,
)
from sql_ext.params import duckdb_name
from sql_ext.quoting import folded
from sql_ext.quoting import qualifier as column_qualifier


def answer_from_derived(plan: Plan, inputs: PlanInputs) -> Plan:
    """The plan answering from a derived view, if one answers the statement and costs less
    (``plan_choice`` "remote" keeps the remote plan; "guarded" takes the view's)."""
    analysis = plan.analysis
    if (
        inputs.choice == "remote"
        or not analysis.local_allowed
        or analysis.outside
        or not plan.accesses
        or not analysis.query.is_select
    ):
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
        guard = Guard(view.name, GuardKind.FULL, bound)
        probes: dict[str, tuple[exp.Expr, ...]] | None = None
        if view.presence:
            probes = _presence_probes(plan, view)
            if probes is None:
                continue  # (the regions the query reads are not known: it is not matched)
            edge = view.presence[0]
            guard = Guard(
                view.name,
                GuardKind.PRESENCE,
                bound,
                probe=edge.columns,
                control=edge.control,
                control_columns=edge.control_columns,
                admit_into=edge.control,
            )
        instances = frozenset(i for c in analysis.constraint.classes for i in c.instances)
        accesses = tuple(
            dataclasses.replace(
                a,
                guards=(guard,),
                probability_local=p,
                refresh_delay=delay,
                access=a.access if probes is None else dataclasses.replace(a.access, probes=probes),
            )
            for a in plan.accesses
        )
        # (its parameters are the query's, compared with the same columns' values: what
        # PostgreSQL reads them as is checked per execution, as for any local statement)
        typed = tuple(
            sorted(
                {
                    (analysis.parameter_keys[n], kind)
                    for n, kind in analysis.semantics.parameters.items()
                },
                key=str,
            )
        )
        statement = LocalStatement(
            match.sql,
            analysis.keys,
            tuple(map(duckdb_name, analysis.keys)),
            (),
            match.outputs,
            typed,
        )
        semantics = dataclasses.replace(
            analysis.semantics, output_scales={**analysis.semantics.output_scales, **match.scales}
        )
        derived = dataclasses.replace(
            plan,
            analysis=dataclasses.replace(analysis, semantics=semantics),
            classes=(ClassPlan(ConsistencyClass(bound, instances, frozenset()), accesses),),
            local=True,
            estimated_cost=cost,
            reason=None,
            first=statement,
            derived=view.name,
            candidates=(*plan.candidates, ("derived", cost)),
        )
        problem = (
            inputs.result_problem(derived, statement) if inputs.result_problem is not None else None
        )
        if problem is None:
            return derived
    return plan


def _presence_probes(plan: Plan, view: CachedView) -> dict[str, tuple[exp.Expr, ...]] | None:
    """The constants the query compares the view's presence columns with (each a column of
    one of its tables, found in that table's access), by the view's column names: what its
    presence guard looks up, for every access of the plan (None: a column not compared)."""
    derivation = view.derivation
    assert derivation is not None
    tables = {s.alias: s.table for s in derivation.sources}
    found: dict[str, tuple[exp.Expr, ...]] = {}
    for column in view.presence[0].columns:
        source = plain_output(derivation, column)
        if source is None:
            return None
        table = tables.get(column_qualifier(source)) if source.table else None
        owners = [
            a
            for a in plan.accesses
            if (table is None or a.table == table) and folded(source) in a.access.probes
        ]
        if len(owners) != 1:
            return None
        found[column] = owners[0].access.probes[folded(source)]
    return found


__all__ = ["answer_from_derived"]
