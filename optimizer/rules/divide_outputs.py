"""The cache's own divisions need the backend's result types (a rule of `optimizer.planner`,
before guards are placed): an output column the cache divides (`optimizer.postgres.divisions`)
is done as PostgreSQL's numeric division or as a floating-point one, whichever the backend
describes for it; without that description, or with another type, the statement stays
remote."""

from __future__ import annotations

import dataclasses

from optimizer.plan import Plan, PlanInputs

# PostgreSQL's built-in type OIDs (fixed by its catalog): what a division's result can be
NUMERIC_OID, FLOAT4_OID, FLOAT8_OID = 1700, 700, 701
DIVIDED_TYPES = frozenset({NUMERIC_OID, FLOAT4_OID, FLOAT8_OID})


def divide_outputs(plan: Plan, inputs: PlanInputs) -> Plan:
    analysis = plan.analysis
    if not analysis.divisions or analysis.local_blocker is not None:
        return plan
    types = inputs.result_types
    problem = None
    if types is None:
        problem = "its averages or divisions need the result types only the backend describes"
    elif any(
        index >= len(types) or types[index] not in DIVIDED_TYPES for index in analysis.divisions
    ):
        problem = "it divides values that are neither numeric nor floating point"
    if problem is None:
        return plan
    return dataclasses.replace(plan, analysis=dataclasses.replace(analysis, local_blocker=problem))
