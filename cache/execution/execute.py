"""Run a query with currency clauses through the cache (SPEC §5.4).

When the plan opens, each consistency class decides once, all its accesses together (its
SwitchUnion): local if every access has a matching view whose guard passes - presence (probed
keys present), completeness (probed values complete), currency (every region used at most the
bound old), one snapshot for the class, the session timeline and its own writes - else remote.
If some class is local, the statement runs in DuckDB with each table reference bound to its
cached view or to a remote leaf (the rows ``SELECT cols FROM t WHERE pushed conjuncts`` fetched
from PostgreSQL through Arrow); a remote class then has a single access, so no two remote leaves
need to agree on a snapshot. Otherwise the statement goes to PostgreSQL whole.
"""

from __future__ import annotations

import datetime as dt
import functools
import typing as t
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import psycopg
import pyarrow as pa
from sqlglot import exp

from cache.backend.copy_arrow import select_list
from cache.store.region_index import Key, RegionIndex, Stamp
from control_tables.types import duckdb_type
from optimizer.accesses import Access, QueryModel
from optimizer.estimate_cost import below_delay
from optimizer.match_views import Match
from optimizer.normalize_constraint import ConsistencyClass
from sql_ext.catalog import Catalog
from sql_ext.fds import closure
from sql_ext.nodes import strip_extensions
from sql_ext.params import Params, placeholders, values_for

# DuckDB result types and the PostgreSQL type codes a DB-API description reports for them.
_PG_NAMES = {
    "BOOLEAN": "bool", "SMALLINT": "int2", "INTEGER": "int4", "BIGINT": "int8",
    "HUGEINT": "numeric", "FLOAT": "float4", "DOUBLE": "float8", "DECIMAL": "numeric",
    "VARCHAR": "text", "DATE": "date", "TIME": "time", "TIMESTAMP": "timestamp",
    "TIMESTAMP WITH TIME ZONE": "timestamptz", "UUID": "uuid", "BLOB": "bytea",
    "INTERVAL": "interval",
}  # fmt: skip


@dataclass
class Session:
    """What the guards need to know about the session."""

    now: dt.datetime
    ignore_currency: bool = False  # stale_ok with the backend down: any present data will do
    timeline_floor: dt.datetime | None = None
    dirty_tables: set[str] = field(default_factory=set)  # written in the open transaction
    last_write: dict[str, dt.datetime] = field(default_factory=dict)  # committed writes


class Parameters:
    """Values of the statement's constants for one execution: literals as written, placeholders
    from the parameters (by position or name) - no tree copies on the hot path."""

    def __init__(
        self, model: QueryModel, params: Params, known: dict[int, int | str] | None = None
    ) -> None:
        self.params = params
        self.slots = known if known is not None else slots(model)

    def value(self, constant: exp.Expr) -> t.Any:
        if isinstance(constant, exp.Placeholder):
            slot = self.slots.get(id(constant))
            params = self.params
            try:
                if isinstance(slot, int) and isinstance(params, Sequence):
                    return params[slot]
                if isinstance(slot, str) and isinstance(params, Mapping):
                    return params[slot]
            except (IndexError, KeyError):
                return _UNKNOWN
            return _UNKNOWN
        return _value(constant)


def slots(model: QueryModel) -> dict[int, int | str]:
    """Each placeholder node's parameter: its position (%s) or its name (%(name)s)."""
    found: dict[int, int | str] = {}
    for position, mark in enumerate(placeholders(model.query.tree)):
        found[id(mark)] = mark.name if mark.this is not None else position
    return found


@dataclass
class DecisionTemplate:
    """A decision's DuckDB statement, made once per decision signature (which access reads
    which view, which are remote leaves): tables bound to their views or to the leaves' names,
    parameters as named DuckDB parameters (``names``: one per placeholder key)."""

    sql: str
    keys: tuple[int | str, ...]  # each placeholder's position (%s) or name (%(name)s)
    names: tuple[str, ...]  # the DuckDB parameter of each
    # per remote leaf (in access order): its registered name and its query for the backend,
    # with the statement's parameters as psycopg named placeholders
    leaves: tuple[tuple[str, LeafQuery], ...] = ()
    statement: t.Any = None  # DuckDB's parse of sql, kept: executions skip the parser
    # result description per parameter-type signature (the statement's types are fixed by it)
    descriptions: dict[tuple[type, ...], list[tuple[t.Any, ...]]] = field(default_factory=dict)


def decision_template(
    model: QueryModel, bindings: dict[int, Binding], catalog: Catalog, with_params: bool
) -> DecisionTemplate:
    """The DuckDB statement of a local or mixed decision (see DecisionTemplate). With parameters
    (``with_params``: any, even none in a list) a ``%%`` in the text means ``%``, as psycopg
    reads it; the string literals get that meaning here."""
    original = model.query.tree
    for number, node in enumerate(original.walk()):
        node.meta.setdefault("mt_id", number)
    marks = slots(model)
    names = {node.meta["mt_id"]: key for node in placeholders(original)
             if (key := marks.get(id(node))) is not None}  # fmt: skip
    copy = strip_extensions(original)
    if with_params:
        for literal in copy.find_all(exp.Literal):
            if literal.is_string and "%%" in literal.this:
                literal.set("this", literal.this.replace("%%", "%"))
    by_id = {n.meta["mt_id"]: n for n in copy.walk() if "mt_id" in n.meta}
    leaves = []
    ordered = sorted(bindings.values(), key=lambda b: b.access.instance.id)
    for number, binding in enumerate(ordered):
        node = t.cast(exp.Table, by_id[binding.access.node.meta["mt_id"]])
        alias = node.alias or node.name
        if binding.match is not None:
            target = binding.match.view.name
        else:
            target = f"mtcache_leaf_{number}"
            # the leaf's conjuncts from the copy: literals as this execution style reads them
            conjuncts = [by_id[c.meta["mt_id"]] for c in binding.access.conjuncts]
            leaves.append((target, leaf_query(binding.access, conjuncts, names, catalog)))
        node.replace(exp.Table(this=exp.to_identifier(target),
                               alias=exp.TableAlias(this=exp.to_identifier(alias))))  # fmt: skip
    for mark in list(copy.find_all(exp.Placeholder)):
        key = names.get(mark.meta.get("mt_id", -1))
        mark.replace(exp.Placeholder(this=exp.to_identifier(_duck_name(t.cast(t.Any, key)))))
    keys = tuple(dict.fromkeys(marks.values()))
    return DecisionTemplate(
        copy.sql(dialect="duckdb"), keys, tuple(map(_duck_name, keys)), tuple(leaves)
    )


def _duck_name(key: int | str) -> str:
    return f"p{key}" if isinstance(key, int) else key


def run_template(
    template: DecisionTemplate, parameters: Parameters, bindings: dict[int, Binding], duck: t.Any,
    now: dt.datetime, fetch: Fetch | None = None,
) -> Result:  # fmt: skip
    """Run a decision's statement: no trees, no SQL generation. An all-local one is the hit
    path (one DuckDB statement); a mixed one first fetches its remote leaves through ``fetch``
    (all at once, so they may come in parallel) and registers them by name."""
    values = values_for(template.keys, parameters.params) if template.keys else []
    named = dict(zip(template.names, values, strict=True))
    statement = template.statement
    if statement is None:
        (statement,) = duck.extract_statements(template.sql)
        template.statement = statement
    registered: list[str] = []
    tables: list[pa.Table] = []
    if template.leaves:
        assert fetch is not None
        leaf_params = named or None  # a statement without placeholders: its leaves have none
        tables = fetch([(sql, columns, leaf_params) for _, (sql, columns) in template.leaves])
        duck.complete()  # a result some fetchone() left open would block register() (DuckDB 2)
    try:
        for (name, _), table in zip(template.leaves, tables, strict=True):
            duck.register(name, table)
            registered.append(name)
        cursor = duck.execute(statement, named) if named else duck.execute(statement)
        rows = cursor.fetchall()
        types = tuple(map(type, values))
        description = template.descriptions.get(types)
        if description is None:
            description = template.descriptions[types] = _description(
                tuple((d[0], str(d[1])) for d in cursor.description or [])
            )
    finally:
        for name in registered:
            duck.unregister(name)
    return Result(description, rows, bindings, now)


def remote_provenance(table: str) -> dict[str, t.Any]:
    """A table access answered by the backend: current data (SPEC §9)."""
    return {
        "table": table,
        "route": "remote",
        "view": None,
        "regions": [],
        "currency_seconds": 0.0,
        "snapshot_ids": [],
        "stale": False,
    }


def _local_provenance(binding: Binding, now: dt.datetime) -> dict[str, t.Any]:
    assert binding.match is not None
    stamps = [s for _, s in binding.regions]
    return {
        "table": binding.access.table,
        "route": "local",
        "view": binding.match.view.name,
        "regions": [list(k) for k, _ in binding.regions],
        "currency_seconds": max(
            ((now - s[0]).total_seconds() for s in stamps if s[0]), default=0.0
        ),
        "snapshot_ids": sorted({s[1] for s in stamps if s[1] is not None}),
        "stale": False,
    }


@dataclass
class Misses:
    """Why guards failed during one decision (for the status counters)."""

    presence: int = 0
    currency: int = 0
    # (control table, key) of presence misses a background admission can fill
    admittable: list[tuple[str, Key]] = field(default_factory=list)


@dataclass(frozen=True)
class Binding:
    access: Access
    match: Match | None  # None: a remote leaf
    regions: tuple[tuple[Key, Stamp], ...] = ()


@dataclass
class Result:
    description: list[tuple[t.Any, ...]]
    rows: list[tuple[t.Any, ...]]
    bindings: dict[int, Binding]
    now: dt.datetime  # the moment the guards judged currency at

    @functools.cached_property
    def provenance(self) -> list[dict[str, t.Any]]:
        """Per table access, in statement order: where its rows came from (SPEC §9)."""
        return [
            _local_provenance(b, self.now) if b.match is not None
            else remote_provenance(b.access.table)
            for b in sorted(self.bindings.values(), key=lambda b: b.access.instance.id)
        ]  # fmt: skip

    @property
    def local_count(self) -> int:
        return sum(1 for b in self.bindings.values() if b.match is not None)

    @property
    def newest_local(self) -> dt.datetime | None:
        """The newest refresh time among the local regions read (for the session timeline)."""
        times = [s[0] for b in self.bindings.values() for _, s in b.regions if s[0] is not None]
        return max(times) if times else None


def decide(
    model: QueryModel,
    index: RegionIndex,
    bound: Parameters,
    session: Session,
    misses: Misses,
    catalog: Catalog,
) -> dict[int, Binding] | None:
    """The SwitchUnion decisions: a binding per access (by instance id), or None for the
    whole statement remote. With ``session.ignore_currency`` (the backend is down and the
    application accepts stale data) every class that can be answered locally is."""
    if not model.local_allowed(catalog):
        return None
    bindings: dict[int, Binding] = {}
    any_local = False
    for cls, accesses in model.class_accesses:
        chosen = _class_local(cls, accesses, index, bound, session, model, misses)
        if chosen is None:
            if session.ignore_currency:
                return None  # the backend is needed and down
            if len(accesses) > 1:
                return None  # two remote leaves would need one snapshot: one statement instead
            bindings[accesses[0].instance.id] = Binding(accesses[0], None)
        else:
            any_local = True
            bindings.update({b.access.instance.id: b for b in chosen})
    return bindings if any_local else None


def _class_local(
    cls: ConsistencyClass,
    accesses: t.Sequence[Access],
    index: RegionIndex,
    bound: Parameters,
    session: Session,
    model: QueryModel,
    misses: Misses,
) -> list[Binding] | None:
    if below_delay(cls.bound_seconds) and not session.ignore_currency:
        return None  # as planned: no copy can ever be this fresh
    chosen: list[Binding] = []
    bound_seconds = float("inf") if session.ignore_currency else cls.bound_seconds
    for access in accesses:
        binding = None
        for match in index.matches(access):
            regions = _guard(access, match, index, bound, session, bound_seconds, misses)
            if regions is not None:
                binding = Binding(access, match, tuple(regions))
                break
        if binding is None:
            return None
        chosen.append(binding)
    snapshots = {stamp[1] for b in chosen for _, stamp in b.regions}
    if len(snapshots) > 1 and not _groups_inside_regions(cls, chosen, model):
        return None  # the class needs one snapshot and the regions used have several
    return chosen


def _groups_inside_regions(cls: ConsistencyClass, chosen: list[Binding], model: QueryModel) -> bool:
    """One access whose regions are its presence regions, and the required grouping determines
    the presence key: every required group lies inside one region (Presence Assumption)."""
    if len(chosen) != 1 or chosen[0].match is None or chosen[0].match.kind != "presence":
        return False
    instance = chosen[0].access.instance
    wanted = closure(cls.grouping, model.fds)
    return {(instance, c) for c in chosen[0].match.columns} <= wanted


def _guard(
    access: Access,
    match: Match,
    index: RegionIndex,
    statement: Parameters,
    session: Session,
    bound: float,
    misses: Misses,
) -> list[tuple[Key, Stamp]] | None:
    """The regions the access would read, if every check passes; else None."""
    if access.table in session.dirty_tables:
        return None  # the session's uncommitted writes are only on the backend
    regions: list[tuple[Key, Stamp]] = []
    if match.kind == "full":
        stamp = index.views.get(match.view.name)
        if stamp is None:
            return None
        regions.append(((), stamp))
    else:
        keys = _probed_keys(access, match.columns, statement)
        if keys is None:
            return None
        if match.control in index.schema.control_tables:
            listed = index.controls.get(t.cast(str, match.control), {})
        else:
            listed = index.parents.get((t.cast(str, match.control), match.control_columns), {})
        for key in keys:
            if key not in listed:
                misses.presence += 1
                if match.kind == "presence":
                    target = _admission_target(index, t.cast(str, match.control),
                                               match.control_columns, key)  # fmt: skip
                    if target is not None:
                        misses.admittable.append(target)
                return None  # a presence (or completeness) miss
            regions.append((key, listed[key]))
    floor = session.timeline_floor
    written = session.last_write.get(access.table)
    for _, (refreshed_at, _snapshot) in regions:
        if refreshed_at is None:
            return None
        if (session.now - refreshed_at).total_seconds() > bound and not session.ignore_currency:
            misses.currency += 1
            return None  # a currency miss
        if floor is not None and refreshed_at < floor:
            return None  # time must not move backwards inside TIMEORDERED
        if written is not None and refreshed_at < written:
            return None  # read your own writes
    return regions


def _admission_target(
    index: RegionIndex, control: str, control_columns: tuple[str, ...], key: Key
) -> tuple[str, Key] | None:
    """Where admitting ``key`` would make it present: the control table itself, or - for a
    view controlled by a parent view on the parent's own presence key - the parent's."""
    schema = index.schema
    if control in schema.control_tables:
        return control, key
    parent = schema.views.get(control)
    if parent is None or len(parent.presence) != 1:
        return None
    edge = parent.presence[0]
    if edge.columns != control_columns:
        return None
    return _admission_target(index, edge.control, edge.control_columns, key)


def _probed_keys(
    access: Access, columns: tuple[str, ...], statement: Parameters
) -> list[Key] | None:
    values: list[list[t.Any]] = []
    for column in columns:
        constants = access.probes.get(column)
        if not constants:
            return None
        evaluated = []
        for constant in constants:
            value = statement.value(constant)
            if value is _UNKNOWN:
                return None
            evaluated.append(value)
        values.append(evaluated)
    if len(columns) == 1:
        return [(v,) for v in dict.fromkeys(values[0])]
    if all(len(v) == 1 for v in values):
        return [tuple(v[0] for v in values)]
    return None  # several values for a composite key: which combinations? not guessed


_UNKNOWN = object()


def _value(constant: exp.Expr) -> t.Any:
    """A bound constant's Python value (parameters are literals by now)."""
    if isinstance(constant, exp.Literal | exp.Boolean):
        return constant.to_py()
    return _UNKNOWN  # NULL matches no key; casts and expressions are not guessed


LeafQuery = tuple[str, list[tuple[str, str]]]  # SQL for the backend, its (column, DuckDB type)s
# the leaves to fetch, each with the parameters its placeholders name -> their Arrow tables
Fetch = t.Callable[
    [list[tuple[str, list[tuple[str, str]], dict[str, t.Any] | None]]], list[pa.Table]
]


def leaf_query(
    access: Access, conjuncts: list[exp.Expr], names: dict[int, int | str], catalog: Catalog
) -> LeafQuery:
    """The remote leaf of an access: its columns under its pushed-down ``conjuncts``, with the
    statement's placeholders as psycopg named parameters (%(p0)s, %(name)s)."""
    table = catalog.table(access.table)
    assert table is not None
    types = {c.name: c.type for c in table.columns}
    wanted = sorted(access.columns) or [table.column_names[0]]
    columns = [(c, t.cast(str, duckdb_type(types[c]) or "VARCHAR")) for c in wanted]
    alias = access.node.alias or access.node.name
    rendered = []
    for conjunct in conjuncts:
        copy = conjunct.copy()
        for mark in list(copy.find_all(exp.Placeholder)):
            key = names[mark.meta["mt_id"]]
            mark.replace(exp.Placeholder(this=exp.to_identifier(f"mtcache_param_{key}")))
        rendered.append(copy.sql(dialect="postgres"))
    where = " AND ".join(f"({c})" for c in rendered) or "TRUE"
    sql = (
        f'SELECT {select_list(columns)} FROM "{table.schema}".'
        f'"{table.name}" AS "{alias}" WHERE {where}'
    )
    if names:
        # psycopg reads % as the start of a placeholder once parameters are passed: double
        # the literal ones, then restore the parameters' own
        sql = sql.replace("%", "%%")
        for key in set(names.values()):
            sql = sql.replace(f"%%(mtcache_param_{key})s", f"%({_duck_name(key)})s")
    return sql, columns


@functools.lru_cache(maxsize=1024)
def _description(columns: tuple[tuple[str, str], ...]) -> list[tuple[t.Any, ...]]:
    return [(name, _type_code(kind), None, None, None, None, None) for name, kind in columns]


def _type_code(duck_type: str) -> int | None:
    name = _PG_NAMES.get(duck_type.split("(", maxsplit=1)[0].upper())
    info = psycopg.postgres.types.get(name) if name else None
    return info.oid if info is not None else None
