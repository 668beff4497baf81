"""The plan of a query: one frozen value, made once per statement shape by
`optimizer.planner.plan_query`, printed by EXPLAIN and run by the executor - never derived twice.

A plan is either the whole statement sent to PostgreSQL (``local`` False) or a guarded plan:
the statement run by DuckDB with each table access bound, when the plan opens, to a cached view
or to a remote leaf. Accesses come grouped by consistency class (§4.3); a class decides all its
accesses together. Each access of a class that may run locally sits under a chain of
SwitchUnions (§4.4): one per candidate view, tried in order, each with the `Guard` that must hold
for its local branch; the last branch is the access's `RemoteLeaf`. The remote leaves of an
execution are read in one backend snapshot. If every guard fails, the statement goes to
PostgreSQL whole instead.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import typing as t
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from control_tables.kinds import GuardKind
from control_tables.schema import CacheSchema
from optimizer.analysis.analyze import Access, Analysis
from optimizer.analysis.leaves import RemoteLeaf
from optimizer.analysis.normalize_constraint import ConsistencyClass, Instance
from sql_ext.catalog import Catalog
from sql_ext.params import Key

# A numeric's display scale as the converter finds it: the same for every value (a number), or
# DuckDB's result column computing it row by row (("column", its index)).
ScaleOf = int | tuple[str, int]
# How an output column of the statement is made from DuckDB's result columns: the column
# itself (its index); ("scaled", value index, scale index) for a numeric whose values' display
# scales vary (optimizer.postgres.numeric_scales); ("avg" | "divide", numerator index,
# denominator index, numerator scale, denominator scale) for an average or division the cache
# does as PostgreSQL (optimizer.postgres.divisions).
Output = int | tuple[str, int, int] | tuple[str, int, int, ScaleOf, ScaleOf]


@dataclass(frozen=True)
class LocalStatement:
    sql: str  # DuckDB
    keys: tuple[Key, ...]  # each placeholder key, in textual order ...
    names: tuple[str, ...]  # ... and its DuckDB parameter name
    leaves: tuple[tuple[str, RemoteLeaf], ...]  # (registered name, leaf), statement order
    outputs: tuple[Output, ...] | None = None  # None: DuckDB's columns as they are
    # parameters PostgreSQL reads as another type than text: (key, kind), checked per
    # execution (a string must read alike in both engines:
    # `optimizer.postgres.allowlist.reads_alike`)
    typed_parameters: tuple[tuple[Key, str], ...] = ()
    # it reads the session's time zone (`optimizer.postgres.allowlist.ZONE_PARAMETER`)
    zone: bool = False
    # each long constant list's values, bound to the DuckDB parameter of that name (DuckDB
    # reads a list of 100,000 keys as one value, not as 1 MB of SQL text)
    lists: tuple[tuple[str, list[int] | list[str]], ...] = ()

    def bound(self, named: Mapping[str, t.Any]) -> dict[str, t.Any]:
        """The statement's DuckDB parameters: ``named`` (its placeholders) and its lists."""
        return {**named, **dict(self.lists)} if self.lists else dict(named)


@dataclass(frozen=True)
class Estimates:
    """What planning needs from outside, gathered before it: the backend's estimate (total
    cost, rows) per SQL text, and the rows each cached view holds."""

    remote: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    view_rows: Mapping[str, float] = field(default_factory=dict)

    def cost(self, sql: str) -> tuple[float, float]:
        # a statement the backend would not plan is never chosen
        return self.remote.get(sql, (math.inf, 0.0))


PLAN_CHOICES = ("cost", "remote", "guarded")  # `PlanInputs.choice`


@dataclass(frozen=True)
class PlanInputs:
    """Everything planning reads besides the statement's analysis."""

    schema: CacheSchema
    catalog: Catalog
    estimates: Estimates | None  # None: no backend to ask; the guards decide
    delay: float  # the refresh delay d of §4.6 of a view without a measured one
    # the type OIDs of the statement's result columns, as the backend describes them
    result_types: tuple[int, ...] | None = None
    delays: tuple[tuple[str, float], ...] = ()  # (view, its measured d)
    # which candidate to keep: the cheaper ("cost"), or one forced ("remote": the whole
    # statement at the backend; "guarded": the plan with SwitchUnions, its guards deciding
    # at run time) - the experiments time each candidate (experiments/runs/plan_choices.py)
    choice: str = "cost"  # one of PLAN_CHOICES
    # why DuckDB's answer to a guarded plan's statement could not be PostgreSQL's (its result
    # types, found by DuckDB without running it), or None; None: not asked (`fit_result`)
    result_problem: t.Callable[[Plan, LocalStatement], str | None] | None = None

    def delay_of(self, view: str) -> float:
        """The view's refresh delay d: measured, else the default."""
        return dict(self.delays).get(view, self.delay)


@dataclass(frozen=True)
class ConsistencyProbe:
    """Fig 7.3 A12: the rows read are consistent per value of ``columns`` if every value the
    access probes them with is listed in the consistency control table ``control``."""

    columns: tuple[str, ...]
    control: str


@dataclass(frozen=True)
class Guard:
    """What a SwitchUnion checks, once when the plan opens, before its local branch may run:
    presence (the probed key values are present), completeness (the probed values are complete),
    currency (every region read is at most ``bound_seconds`` old on the backend clock), the
    session's timeline and its own writes, and the class's consistency (§5.2, Fig 7.2)."""

    view: str
    kind: GuardKind  # full: a fully materialized view; else the key the access probes
    bound_seconds: float
    probe: tuple[str, ...] = ()  # the probed key columns of the view (presence/completeness)
    control: str | None = None  # where the probed values are looked up: control table/parent
    control_columns: tuple[str, ...] = ()
    # Keys under which the rows read are mutually consistent whatever their snapshots: the
    # presence key (Presence Assumption), a full consistency key (§5.2.1 Ω).
    groups: tuple[tuple[str, ...], ...] = ()
    consistency_probe: ConsistencyProbe | None = None  # a partial consistency key (A12)
    consistency: str = "one snapshot"  # the class's consistency check on this branch (Fig 7.2)
    admit_into: str | None = None  # a presence miss is admitted into this control table

    def to_json(self) -> dict[str, t.Any]:
        found: dict[str, t.Any] = {"currency_bound_seconds": self.bound_seconds, "view": self.view}
        if self.kind.probes:  # (the document holds plain text: EXPLAIN prints it as a dict)
            found[self.kind.value] = {"columns": list(self.probe), "in": self.control}
        found["consistency"] = self.consistency
        return found


@dataclass(frozen=True)
class AccessPlan:
    """One table access: its remote leaf and the guarded local branches it may take."""

    access: Access = field(repr=False, compare=False)
    leaf: RemoteLeaf
    guards: tuple[Guard, ...] = ()  # SwitchUnion branches in order; () = always remote
    probability_local: float = 0.0  # §4.6 p of the first branch
    refresh_delay: float | None = None  # the d that p was reckoned with (its view's)

    @property
    def instance(self) -> Instance:
        return self.access.instance

    @property
    def table(self) -> str:
        return self.access.table

    @property
    def alias(self) -> str:
        return self.access.alias

    @property
    def filter(self) -> str | None:
        """The conjuncts pushed down to the access (PostgreSQL), as a LocalScan applies them."""
        parts = [c.sql(dialect="postgres") for c in self.access.conjuncts]
        return " AND ".join(parts) or None


@dataclass(frozen=True)
class ClassPlan:
    """A consistency class of the normalized constraint and its accesses (statement order)."""

    cls: ConsistencyClass
    accesses: tuple[AccessPlan, ...]
    remote_reason: str | None = None  # why the class always runs remote (None: guarded)
    # the run-time guards' memo of §5.2 verdicts per region pattern
    # (optimizer.rules.evaluate_guards)
    verdicts: dict[t.Any, bool] = field(default_factory=dict, compare=False, repr=False)

    @functools.cached_property
    def bound_delta(self) -> dt.timedelta | None:
        """The bound as a duration (None: beyond any date, every region is fresh enough)."""
        try:
            return dt.timedelta(seconds=self.cls.bound_seconds)
        except OverflowError:
            return None

    @functools.cached_property
    def has_guards(self) -> bool:
        return all(a.guards for a in self.accesses)

    @functools.cached_property
    def guarded(self) -> bool:
        return self.remote_reason is None and self.has_guards

    @property
    def bound_seconds(self) -> float:
        return self.cls.bound_seconds


@dataclass(frozen=True)
class Plan:
    analysis: Analysis = field(repr=False, compare=False)
    sql: str  # the whole statement for PostgreSQL (its remote plan)
    with_params: bool  # made for executions with parameters (psycopg's reading of %%)
    classes: tuple[ClassPlan, ...]
    local: bool = False  # the guarded plan was chosen over the whole statement remote
    estimated_cost: float = 0.0
    reason: str | None = None  # why the whole statement goes remote (when not local)
    # the estimated cost of each candidate costed: ("remote", c), ("guarded", c)
    candidates: tuple[tuple[str, float], ...] = ()
    # the DuckDB statement of the first branches (every guard passes), for a local plan
    first: LocalStatement | None = field(default=None, repr=False, compare=False)
    # the derived cached view answering the whole statement (`optimizer.derived.answer`):
    # every access is guarded by its one region, and ``first`` reads it
    derived: str | None = None

    @property
    def local_sql(self) -> str | None:
        return self.first.sql if self.first is not None else None

    def first_choice(self) -> dict[int, str | None]:
        """The choice of the first branches: each guarded access reads its first view."""
        return {a.instance.id: a.guards[0].view for a in self.guarded_accesses}

    @property
    def accesses(self) -> tuple[AccessPlan, ...]:
        """Every access in statement order."""
        found = [a for c in self.classes for a in c.accesses]
        return tuple(sorted(found, key=lambda a: a.instance.id))

    @property
    def guarded_accesses(self) -> tuple[AccessPlan, ...]:
        return tuple(a for c in self.classes if c.guarded for a in c.accesses)

    @functools.cached_property
    def saved_per_hit(self) -> float:
        """The backend cost an answer on the guarded plan avoids, as the cost model estimated
        the two candidates (0 when it costed only one): what the size budget's eviction policy
        counts a hit as worth (`optimizer.rules.eviction_policy`)."""
        costs = dict(self.candidates)
        remote, guarded = costs.get("remote"), costs.get("guarded")
        return max(remote - guarded, 0.0) if remote is not None and guarded is not None else 0.0

    @functools.cached_property
    def asks(self) -> tuple[tuple[str, float, float], ...]:
        """What each run of the plan asks of the views it guards, whether the plan is chosen
        or not: (view, the bound its class asks, the backend cost a local answer saves, an
        equal share of `saved_per_hit` per view), each view once (its tightest bound). What
        `REFRESH AUTO` chooses intervals from (`cache.store.bound_asks`)."""
        bounds: dict[str, float] = {}
        for cls in self.classes:
            for access in cls.accesses:
                if access.guards:
                    view, bound = access.guards[0].view, access.guards[0].bound_seconds
                    bounds[view] = min(bound, bounds.get(view, bound))
        if not bounds:
            return ()
        share = self.saved_per_hit / len(bounds)
        return tuple((view, bound, share) for view, bound in bounds.items())

    @functools.cached_property
    def guards_read_parameters(self) -> bool:
        """Whether its guards read parameter values (the keys a presence or completeness
        guard, or a consistency probe, looks up): if not, every execution's values get the
        same decision."""
        return any(
            guard.kind.probes or guard.consistency_probe is not None
            for access in self.accesses
            for guard in access.guards
        )

    # -- EXPLAIN ---------------------------------------------------------------------------------

    def to_json(self) -> dict[str, t.Any]:
        """The document of `mtcache explain --json` and EXPLAIN (docs/json-outputs.md)."""
        guarded = {a.instance.id: a for a in self.guarded_accesses} if self.local else {}
        accesses = [
            {
                "table": a.table,
                "route": "guarded" if a.instance.id in guarded else "remote",
                "view": a.guards[0].view if a.instance.id in guarded else None,
            }
            for a in self.accesses
        ] or [
            {"table": i.table, "route": "remote", "view": None}
            for i in self.analysis.constraint.instances
        ]
        return {
            "constraint": self.analysis.constraint.to_json(),
            "plan": self._tree(),
            "accesses": accesses,
            "estimated_cost": round(self.estimated_cost, 4),
        }

    def _tree(self) -> dict[str, t.Any]:
        if not self.local:
            node: dict[str, t.Any] = {"op": "RemoteQuery", "sql": self.sql}
            if self.reason:
                node["reason"] = self.reason
            return node
        if self.derived is not None:  # (its guard: of the one region every access reads)
            first = self.accesses[0]
            union = {
                "op": "SwitchUnion",
                "guard": first.guards[0].to_json(),
                "probability_local": round(first.probability_local, 4),
                "children": [
                    {"op": "DerivedScan", "view": self.derived},
                    {"op": "RemoteQuery", "sql": self.sql},
                ],
            }
            return {
                "op": "LocalQuery",
                "engine": "duckdb",
                "sql": self.local_sql,
                "fallback": "RemoteQuery of the whole statement",
                "children": [union],
            }
        guarded = {a.instance.id for a in self.guarded_accesses}
        leaves = [_access_tree(a) if a.instance.id in guarded else _leaf(a) for a in self.accesses]
        tree = leaves[0]
        for leaf in leaves[1:]:
            tree = {"op": "Join", "children": [tree, leaf]}
        if _aggregates(self.analysis.query.tree):
            tree = {"op": "Aggregate", "children": [tree]}
        return {
            "op": "LocalQuery",
            "engine": "duckdb",
            "sql": self.local_sql,
            # when every guard fails
            "fallback": "RemoteQuery of the whole statement",
            "children": [tree],
        }

    def render(self) -> list[str]:
        """The plan as indented text lines (EXPLAIN through a cursor returns these as rows)."""
        document = self.to_json()
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


def _leaf(access: AccessPlan) -> dict[str, t.Any]:
    return {"op": "RemoteQuery", "sql": access.leaf.sql}


def _access_tree(access: AccessPlan) -> dict[str, t.Any]:
    """The SwitchUnion chain of an access: each guard's local branch, then the remote leaf."""
    node = _leaf(access)
    for position, guard in reversed(list(enumerate(access.guards))):
        union: dict[str, t.Any] = {"op": "SwitchUnion", "guard": guard.to_json()}
        if position == 0:
            union["probability_local"] = round(access.probability_local, 4)
            if access.refresh_delay is not None:
                union["refresh_delay_seconds"] = round(access.refresh_delay, 3)
        union["children"] = [
            {"op": "LocalScan", "view": guard.view, "filter": access.filter},
            node,
        ]
        node = union
    return node


def _aggregates(top: exp.Expr) -> bool:
    if not isinstance(top, exp.Select):
        return False
    return bool(top.args.get("group")) or any(
        isinstance(node, exp.AggFunc) for node in top.expressions for node in node.walk()
    )
