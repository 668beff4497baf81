"""Place a SwitchUnion with its guard over every access that a cached view may answer (§4.4,
§5.3); a rule of `optimizer.planner`.

A class may run locally only as a whole (§4.4.3: its accesses decide together), so a class gets
guards only when every access has a matching view (`match_views`), DuckDB can answer the
statement as PostgreSQL would, and its bound exceeds the refresh delay (§4.4's compile-time
rule: a bound no larger than the delay can never be met by a copy). Each matching view becomes
one guarded branch, in the order matching found them.

Which consistency check a branch needs follows Fig 7.2, decided here once:
  A. every required group lies inside one presence region (the required grouping determines
     the presence key): the Presence Assumption holds it, no check;
  B/C. every required group lies inside one consistency region: none for a full guarantee,
     else probe the consistency control table with the probed values (Fig 7.3 A12);
  D. otherwise the regions read must all come from one snapshot (ad-hoc checking, S11).
The run-time guard (`optimizer.rules.evaluate_guards`) evaluates exactly these through the §5.2
satisfaction rule (`derive_consistency`); the text here is what EXPLAIN shows of it.
"""

from __future__ import annotations

import dataclasses

from control_tables.kinds import GuardKind
from control_tables.schema import CacheSchema
from optimizer.analysis.analyze import Access, Analysis
from optimizer.analysis.normalize_constraint import ConsistencyClass
from optimizer.plan import ClassPlan, ConsistencyProbe, Guard, Plan, PlanInputs
from optimizer.rules.derive_consistency import group_leaf, satisfies
from optimizer.rules.estimate_cost import below_delay
from optimizer.rules.match_views import Match, match_access


def place_guards(plan: Plan, inputs: PlanInputs) -> Plan:
    analysis, schema = plan.analysis, inputs.schema
    classes = []
    for cls_plan in plan.classes:
        cls = cls_plan.cls
        if analysis.local_blocker is not None:
            blocked = f"DuckDB cannot answer it as PostgreSQL: {analysis.local_blocker}"
            classes.append(dataclasses.replace(cls_plan, remote_reason=blocked))
            continue
        accesses = []
        missing: list[str] = []
        for access_plan in cls_plan.accesses:
            guards = tuple(
                _guard(match, access_plan.access, cls, analysis, schema)
                for match in match_access(access_plan.access, schema)
                if match.kind != GuardKind.COMPLETENESS or match.control is not None
            )
            if not guards:
                missing.append(f"{access_plan.table} ({access_plan.alias})")
            accesses.append(dataclasses.replace(access_plan, guards=guards))
        reason: str | None = None
        if missing:
            reason = f"no cached view answers {', '.join(missing)}"
            accesses = [dataclasses.replace(a, guards=()) for a in accesses]
        elif below_delay(
            cls.bound_seconds,
            delay := min(
                (inputs.delay_of(g.view) for a in accesses for g in a.guards), default=inputs.delay
            ),
        ):
            # the guards stay, for answering from stale data when the backend is down
            reason = (
                f"bound {cls.bound_seconds:g}s is at or below the refresh delay "
                f"{delay:g}s (§4.4): no copy can be that fresh"
            )
        classes.append(ClassPlan(cls, tuple(accesses), reason))
    return dataclasses.replace(plan, classes=tuple(classes))


def _guard(
    match: Match, access: Access, cls: ConsistencyClass, analysis: Analysis, schema: CacheSchema
) -> Guard:
    view = match.view
    groups: list[tuple[str, ...]] = []
    if match.kind == GuardKind.PRESENCE:
        groups.append(match.columns)  # Presence Assumption
    probe = None
    spec = view.consistency
    if spec is not None and spec.kind == "on":
        if spec.control is None:
            groups.append(spec.columns)  # a full consistency guarantee
        elif all(c in access.probes for c in spec.columns):
            probe = ConsistencyProbe(spec.columns, spec.control)
    return Guard(
        view=view.name,
        kind=match.kind,
        bound_seconds=cls.bound_seconds,
        probe=match.columns,
        control=match.control,
        control_columns=match.control_columns,
        groups=tuple(groups),
        consistency_probe=probe,
        consistency=_consistency(cls, access, groups, probe, analysis),
        admit_into=_admission_target(schema, match) if match.kind == GuardKind.PRESENCE else None,
    )


def _consistency(
    cls: ConsistencyClass,
    access: Access,
    groups: list[tuple[str, ...]],
    probe: ConsistencyProbe | None,
    analysis: Analysis,
) -> str:
    """Fig 7.2's outcome for this branch, by the same rule the run-time guard applies."""
    instance = access.instance
    if len(cls.instances) == 1:
        for columns in groups:
            if satisfies(
                group_leaf(instance, [{(instance, c) for c in columns}]), [cls], analysis.fds
            ):
                return f"groups inside regions of ({', '.join(columns)}): no check (Fig 7.2 A/C)"
        if probe is not None and satisfies(
            group_leaf(instance, [{(instance, c) for c in probe.columns}]), [cls], analysis.fds
        ):
            return (
                f"probed ({', '.join(probe.columns)}) listed in {probe.control}, else "
                "one snapshot (Fig 7.3 A12)"
            )
    return "one snapshot per consistency class"


def _admission_target(schema: CacheSchema, match: Match) -> str | None:
    """Where admitting the probed key makes it present: the control table itself, or - for a
    view controlled by a parent view on the parent's own presence key - the parent's."""
    control, columns = match.control, match.control_columns
    while control is not None and control not in schema.control_tables:
        parent = schema.views.get(control)
        if parent is None or len(parent.presence) != 1:
            return None
        edge = parent.presence[0]
        if edge.columns != columns:
            return None
        control, columns = edge.control, edge.control_columns
    return control
