"""Reader of the plan and guard-decision fixtures, tests/fixtures/plans/*.toml (as sqlglot's
tests/fixtures/optimizer/*.sql pair an input with its expected output).

A fixture file names a catalog (tests/fixtures/catalogs/<name>.toml) and a cache schema (cache
DDL) shared by its cases. Each ``[[case]]`` gives a statement and the state around it:

    name, sql, params (optional: executed with these parameters)
    schema (optional)       replaces the file's cache schema
    estimates (optional)    {statement = cost, leaves = {alias = [cost, rows]}, views = {view =
                            rows}}: the backend's estimates and the views' sizes; without them
                            the planner has no backend to ask (the guards decide)
    regions                 one region per line, its age before now and its snapshot id:
                              CONTROL (KEY) 30s snapshot 2        a control table's row
                              PARENT.COLUMN (KEY) 30s snapshot 2  a key present in a parent view
                              view VIEW 30s snapshot 2            a view-level region
                            an age "never" is a region never refreshed
    session (optional)      {uncommitted = [tables], written = {table = age}, floor = age,
                            ignore_currency = bool}

and what must come out: ``plan`` (the plan's summary, `plan_summary`), ``decision`` (the
run-time decision, `str(Decision)`), and optionally ``misses``, ``consistency`` (the check each
guarded access's first branch needs, Fig 7.2) and ``explain`` (the EXPLAIN text). They need no
database: catalogs, schemas and region states are values.
"""

from __future__ import annotations

import ast
import datetime as dt
import re
import tomllib
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from control_tables.regions import Key, RegionState, Stamp
from control_tables.schema import CacheSchema
from control_tables.script import apply_script
from optimizer.analysis.analyze import analyze
from optimizer.plan import Estimates, Guard, Plan, PlanInputs
from optimizer.planner import initial_plan, plan_query
from optimizer.rules.estimate_cost import DEFAULT_DELAY
from optimizer.rules.evaluate_guards import Decision, Session, evaluate_guards
from sql_ext import Query, parse, parse_one
from sql_ext.catalog import Catalog, Column, Index, Table, View
from sql_ext.params import ParameterValues

FIXTURES = Path(__file__).parent / "fixtures"
NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)

_REGION = re.compile(
    r"^(?:view (?P<view>\w+)|(?P<owner>\w+)(?:\.(?P<columns>[\w,]+))? \((?P<key>.*)\)) "
    r"(?P<age>never|[\d.]+s)(?: snapshot (?P<snapshot>\d+))?$"
)


@dataclass(frozen=True)
class PlanCase:
    file: str
    name: str
    catalog: Catalog = field(repr=False)
    schema_text: str = field(repr=False)
    spec: dict[str, t.Any] = field(repr=False)

    @property
    def id(self) -> str:
        return f"{self.file}: {self.name}"

    @property
    def params(self) -> t.Any:
        return self.spec.get("params")

    def schema(self) -> CacheSchema:
        statements = parse(self.spec.get("schema", self.schema_text))
        return apply_script(CacheSchema(), statements, self.catalog)[0]

    def plan(self) -> Plan:
        query = parse_one(self.spec["sql"])
        assert isinstance(query, Query)
        analysis = analyze(query, self.catalog, self.spec.get("currency_bound"))
        schema = self.schema()
        with_params = self.params is not None
        estimates = None
        given = self.spec.get("estimates")
        if given is not None:
            draft = initial_plan(analysis, self.catalog, with_params)
            remote = {draft.sql: (float(given["statement"]), 0.0)}
            for alias, (cost, rows) in given.get("leaves", {}).items():
                (access,) = [a for a in draft.accesses if a.alias == alias]
                remote[access.leaf.sql] = (float(cost), float(rows))
            estimates = Estimates(remote, {k: float(v) for k, v in given.get("views", {}).items()})
        # measured refresh delays d per view (the rest: the default)
        delays = tuple(sorted((v, float(d)) for v, d in self.spec.get("delays", {}).items()))
        inputs = PlanInputs(schema, self.catalog, estimates, DEFAULT_DELAY, delays=delays)
        return plan_query(analysis, inputs, with_params=with_params)

    def region_state(self) -> RegionState:
        schema = self.schema()
        controls: dict[str, dict[Key, Stamp]] = {name: {} for name in schema.control_tables}
        views: dict[str, Stamp] = {}
        parents: dict[tuple[str, tuple[str, ...]], dict[Key, Stamp]] = {}
        for line in self.spec.get("regions", "").strip().splitlines():
            match = _REGION.match(line.strip())
            assert match, f"{self.id}: cannot read the region {line!r}"
            age = match["age"]
            refreshed = None if age == "never" else NOW - dt.timedelta(seconds=float(age[:-1]))
            stamp = (refreshed, int(match["snapshot"]) if match["snapshot"] else None)
            if match["view"]:
                views[match["view"]] = stamp
                continue
            key = tuple(ast.literal_eval(f"({match['key']},)"))
            if match["columns"]:
                columns = tuple(match["columns"].split(","))
                parents.setdefault((match["owner"], columns), {})[key] = stamp
            else:
                assert match["owner"] in controls, f"{self.id}: no control table {match['owner']}"
                controls[match["owner"]][key] = stamp
        return RegionState(controls, views, parents)

    def session(self) -> Session:
        given = self.spec.get("session", {})

        def ago(age: str) -> dt.datetime:
            return NOW - dt.timedelta(seconds=float(age.removesuffix("s")))

        return Session(
            timeline_floor=ago(given["floor"]) if "floor" in given else None,
            uncommitted=frozenset(given.get("uncommitted", ())),
            written_at={k: ago(v) for k, v in given.get("written", {}).items()},
            ignore_currency=bool(given.get("ignore_currency", False)),
        )

    def decide(self, plan: Plan, params: t.Any = "the case's") -> Decision:
        """The decision with the case's parameters (or ``params``)."""
        values = ParameterValues(
            plan.analysis.parameter_keys, self.params if params == "the case's" else params
        )
        return evaluate_guards(plan, self.region_state(), values, self.session(), NOW)


def plan_summary(plan: Plan) -> str:
    """``remote: <why>``, or ``local:`` and each access: its guarded branches in order (``a=v``
    for a fully materialized view, ``a=v:presence|v:completeness`` for the key a guard probes)
    or ``leaf`` when it always reads its remote leaf."""
    if not plan.local:
        return f"remote: {plan.reason}"
    guarded = {a.instance.id for a in plan.guarded_accesses}
    parts = [
        f"{a.alias}={'|'.join(_branch(g) for g in a.guards)}"
        if a.instance.id in guarded
        else f"{a.alias}=leaf"
        for a in plan.accesses
    ]
    return "local: " + " ".join(parts)


def _branch(guard: Guard) -> str:
    return guard.view if guard.kind == "full" else f"{guard.view}:{guard.kind}"


def misses_summary(decision: Decision) -> str:
    misses = decision.misses
    text = f"presence {misses.presence}, currency {misses.currency}"
    for kind in ("completeness", "consistency", "timeline"):
        if getattr(misses, kind):
            text += f", {kind} {getattr(misses, kind)}"
    for control, key in misses.admittable:
        text += f", admit {control}{key!r}"
    return text


def consistency_summary(plan: Plan) -> str:
    return "; ".join(f"{a.alias}: {a.guards[0].consistency}" for a in plan.guarded_accesses)


def load_plan_cases() -> list[PlanCase]:
    cases = []
    for path in sorted((FIXTURES / "plans").glob("*.toml")):
        data = tomllib.loads(path.read_text())
        catalog = load_catalog(data["catalog"])
        names = set()
        for spec in data["case"]:
            assert spec["name"] not in names, f"{path.name}: duplicate case {spec['name']!r}"
            names.add(spec["name"])
            cases.append(PlanCase(path.stem, spec["name"], catalog, data.get("schema", ""), spec))
    return cases


def load_catalog(name: str) -> Catalog:
    data = tomllib.loads((FIXTURES / "catalogs" / f"{name}.toml").read_text())
    tables = {}
    for table, spec in data.get("tables", {}).items():
        columns = []
        for text in spec["columns"]:
            column, _, rest = text.partition(" ")
            not_null = rest.endswith(" not null")
            columns.append(
                Column(
                    column,
                    rest.removesuffix(" not null"),
                    nullable=not not_null,
                    n_distinct=spec.get("distinct", {}).get(column),
                )
            )
        tables[table] = Table(
            name=table,
            columns=tuple(columns),
            primary_key=tuple(spec.get("primary_key", ())),
            unique_keys=tuple(tuple(k) for k in spec.get("unique_keys", ())),
            row_count=float(spec.get("rows", 0)),
            indexes=tuple(
                Index(f"{table}_{'_'.join(c)}", tuple(c)) for c in spec.get("indexes", ())
            ),
        )
    views = {name: View(name, spec["definition"]) for name, spec in data.get("views", {}).items()}
    return Catalog(tables=tables, views=views, text_byte_order=data.get("text_byte_order", True))
