"""Normalize a query's currency clauses into one C&C constraint (§4.3, §5.1).

The result is a set of disjoint consistency classes over base-table instances. Steps:

1. every input a spec names expands to the base-table instances beneath it (derived tables,
   CTEs and backend views expand recursively: "T is computed from B and R");
2. defaults, always the strictest: a query with no clause is one class with bound 0; an input of
   a clause-bearing block named in none of its specs, and a base table no spec reaches, is a
   class of its own with bound 0 - unless the session set a currency bound d: then every
   SELECT block without a clause reads as if it ended with ``CURRENCY BOUND d``;
3. classes sharing an instance merge (Normalization Rule): bound = min, inputs = union,
   grouping G = ∩ Gi+ under the FDs of backend keys and the query's equality predicates,
   restricted to the class's attributes and reduced to a minimal generating set.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from sql_ext.blocks import Block, BlockAnalysis, Source, analyze
from sql_ext.catalog import Catalog
from sql_ext.errors import CatalogError, SqlSyntaxError
from sql_ext.fds import FD, Attr, closure, minimize
from sql_ext.quoting import folded, output_name, qualifier
from sql_ext.statements import Query, position_of


@dataclass(frozen=True, eq=False)
class Instance:
    """One occurrence of a base table in the expanded query."""

    id: int
    table: str
    label: str  # the name it is visible by where it occurs (alias or table name)

    def __str__(self) -> str:
        return f"{self.table}#{self.id:04d}"


@dataclass(frozen=True)
class ConsistencyClass:
    """One normalized tuple <bound, inputs, grouping>: the inputs must come from one snapshot
    per group of ``grouping`` values (all of them together when grouping is empty), no older
    than ``bound_seconds``."""

    bound_seconds: float
    instances: frozenset[Instance]
    grouping: frozenset[Attr]

    @property
    def tables(self) -> list[str]:
        return sorted({i.table for i in self.instances})

    @property
    def by(self) -> list[str]:
        return sorted(f"{t.cast(Instance, inst).table}.{col}" for inst, col in self.grouping)

    def to_json(self) -> dict[str, t.Any]:
        return {"bound_seconds": self.bound_seconds, "tables": self.tables, "by": self.by}


@dataclass(frozen=True)
class Constraint:
    """The normalized constraint of a statement: disjoint classes over all its instances."""

    classes: tuple[ConsistencyClass, ...]
    instances: tuple[Instance, ...] = field(repr=False)
    fds: tuple[FD, ...] = field(repr=False)

    def to_json(self) -> list[dict[str, t.Any]]:
        return [c.to_json() for c in self.classes]

    def class_of(self, instance: Instance) -> ConsistencyClass:
        return next(c for c in self.classes if instance in c.instances)


@dataclass
class _Draft:
    bound: float
    instances: set[Instance]
    grouping: frozenset[Attr]  # generator set; its closure is what the class requires
    preferred: set[Attr]  # grouping columns the query wrote


def normalize_constraint(
    query: Query, catalog: Catalog, default_bound: float | None = None
) -> Constraint:
    """The normalized C&C constraint of a parsed statement (empty for non-SELECT statements);
    ``default_bound``: the session's currency bound for blocks without a clause."""
    if not query.is_select:
        return Constraint(classes=(), instances=(), fds=())
    return QueryResolver(query, catalog).run(default_bound)


class QueryResolver:
    """Resolves a query's inputs to base-table instances and its columns to their attributes;
    `run` normalizes the constraint. Shared by every optimizer rule that needs names resolved."""

    def __init__(self, query: Query, catalog: Catalog) -> None:
        self.query = query
        self.catalog = catalog
        self._instances: dict[int, list[Instance]] = {}  # id(Source) -> its instances
        self._base: dict[int, Instance] = {}  # id(Source) -> the instance of a table source
        self._views: dict[int, BlockAnalysis] = {}  # id(Source) -> analysis of its view body
        self._fd_blocks: list[Block] = []
        self._next_id = 0
        self.outside: list[str] = []  # relations read from the backend as they are (`Catalog`)

    # -- 1. instances ------------------------------------------------------------------------

    def source_instances(self, source: Source) -> list[Instance]:
        key = id(source)
        if key in self._instances:
            return self._instances[key]
        self._instances[key] = []  # guards against recursive CTEs
        result: list[Instance] = []
        if source.body:
            for block in source.body:
                result += self.block_instances(block)
        elif source.is_table:
            assert source.table is not None
            outside = source.written in self.catalog.outside  # before the tables it shadows
            table = None if outside else self.catalog.table(source.table, source.schema)
            view = None if outside else self.catalog.view(source.table, source.schema)
            if table is not None:
                instance = Instance(self._next_id, table.name, source.name)
                self._next_id += 1
                self._base[key] = instance
                result = [instance]
            elif view is not None:
                try:
                    body = analyze(sqlglot.parse_one(view.definition, read="postgres"))
                except (ParseError, TokenError):
                    # A definition sqlglot cannot read: the view stays one opaque input (read
                    # from the backend as it is; no columns or keys known).
                    instance = Instance(self._next_id, view.name, source.name)
                    self._next_id += 1
                    self._base[key] = instance
                    self._instances[key] = [instance]
                    return [instance]
                self._views[key] = body
                for block in body.blocks:
                    self._fd_blocks.append(block)
                    for inner in block.sources:
                        result += self.source_instances(inner)
            elif outside:
                # read from the backend as it is (no columns or keys known), as PostgreSQL does
                instance = Instance(self._next_id, source.written, source.name)
                self._next_id += 1
                self._base[key] = instance
                self.outside.append(source.written)
                result = [instance]
            else:
                known = ", ".join(sorted([*self.catalog.tables, *self.catalog.views])[:12])
                error = CatalogError(
                    f"unknown table or view {source.written!r}: the backend has no such "
                    f"relation on its search path (known: {known or 'none'})",
                    *position_of(source.node),
                )
                error.relation = (source.written, source.sql_name)
                raise error
        self._instances[key] = result
        return result

    def base_instance(self, source: Source) -> Instance | None:
        """The instance of a direct reference to a catalog table (None for views, CTEs,
        derived tables and table functions)."""
        self.source_instances(source)
        instance = self._base.get(id(source))
        if instance is None or self.catalog.table(instance.table) is None:
            return None
        return instance

    def block_instances(self, block: Block) -> list[Instance]:
        """Every instance a block reads: its sources and its nested subqueries."""
        result: list[Instance] = []
        for source in block.sources:
            result += self.source_instances(source)
        for child in self.query.analysis.blocks:
            if child.parent is block:  # subqueries; derived/CTE bodies again, deduplicated
                result += self.block_instances(child)
        return list(dict.fromkeys(result))

    # -- 2. columns and dependencies -----------------------------------------------------------

    def attr_of(self, source: Source, column: str) -> Attr | None:
        """The base attribute a column of a source stands for, or None (computed, unknown)."""
        self.source_instances(source)
        if id(source) in self._base:
            instance = self._base[id(source)]
            table = self.catalog.table(instance.table)
            return (instance, column) if table is not None and table.has_column(column) else None
        bodies: list[Block] = (
            self._views[id(source)].blocks[:1] if id(source) in self._views else source.body
        )
        if len(bodies) != 1:
            return None  # a UNION's column has no single base attribute
        body = bodies[0]
        aliases = source.column_aliases
        for position, projection in enumerate(body.select.expressions):
            name = aliases[position] if position < len(aliases) else output_name(projection)
            if isinstance(projection, exp.Star):
                for inner in body.sources:
                    attr = self.attr_of(inner, column)
                    if attr is not None:
                        return attr
                continue
            if name == column:
                target = projection.this if isinstance(projection, exp.Alias) else projection
                if isinstance(target, exp.Column):
                    return self.resolve_column(body, target)
                return None
        return None

    def resolve_column(self, block: Block, column: exp.Column) -> Attr | None:
        found = self.column_source(block, column)
        return self.attr_of(*found) if found is not None else None

    def column_source(self, block: Block, column: exp.Column) -> tuple[Source, str] | None:
        """The FROM item a column reference reads (innermost scope first, as PostgreSQL binds
        names) and the column's name in it; None when unknown or ambiguous."""
        name = folded(column)
        if column.table:
            source = block.resolve(qualifier(column))
            return (source, name) if source is not None else None
        scope: Block | None = block
        while scope is not None:
            hits = [s for s in scope.sources if self._has_column(s, name)]
            if len(hits) == 1:
                return hits[0], name
            if hits:
                return None  # ambiguous: PostgreSQL will say so
            scope = scope.parent
        return None

    def _has_column(self, source: Source, name: str) -> bool:
        self.source_instances(source)
        if id(source) in self._base:
            table = self.catalog.table(self._base[id(source)].table)
            return table is not None and table.has_column(name)
        if source.series is not None:
            return name in source.function_columns
        bodies = (
            self._views[id(source)].blocks[:1] if id(source) in self._views else source.body[:1]
        )
        if not bodies:
            return False
        aliases = source.column_aliases
        for position, projection in enumerate(bodies[0].select.expressions):
            if isinstance(projection, exp.Star):
                if any(self._has_column(inner, name) for inner in bodies[0].sources):
                    return True
                continue
            label = aliases[position] if position < len(aliases) else output_name(projection)
            if label == name:
                return True
        return False

    def dependencies(self, instances: list[Instance]) -> list[FD]:
        fds: list[FD] = []
        for instance in instances:
            table = self.catalog.table(instance.table)
            if table is None:
                continue  # an opaque view: nothing known about it
            every = frozenset((instance, c) for c in table.column_names)
            for key in table.candidate_keys():
                fds.append(FD(frozenset((instance, c) for c in key), every))
        blocks = [b for b in self.query.analysis.blocks if _positive_path(b)] + self._fd_blocks
        for block in blocks:
            for predicate in block.conjuncts():
                fds += self._equality(block, predicate)
        return fds

    def _equality(self, block: Block, predicate: exp.Expr) -> list[FD]:
        if not isinstance(predicate, exp.EQ):
            return []
        left, right = predicate.this, predicate.expression
        sides: list[Attr | str | None] = []
        for side in (left, right):
            if isinstance(side, exp.Column):
                sides.append(self.resolve_column(block, side))
            elif isinstance(side, exp.Literal | exp.Placeholder | exp.Parameter):
                sides.append("constant")
            else:
                sides.append(None)
        a, b = sides
        if isinstance(a, tuple) and isinstance(b, tuple):
            return [FD(frozenset([a]), frozenset([b])), FD(frozenset([b]), frozenset([a]))]
        if isinstance(a, tuple) and b == "constant":
            return [FD(frozenset(), frozenset([a]))]
        if isinstance(b, tuple) and a == "constant":
            return [FD(frozenset(), frozenset([b]))]
        return []

    # -- 3. classes ----------------------------------------------------------------------------

    def run(self, default_bound: float | None = None) -> Constraint:
        analysis = self.query.analysis
        everything: list[Instance] = []
        for block in analysis.blocks:
            everything += self.block_instances(block)
        everything = list(dict.fromkeys(everything))

        drafts: list[_Draft] = []
        if not self.query.has_currency_clause and default_bound is None:
            # Traditional semantics: latest snapshot, all inputs together.
            drafts.append(_Draft(0.0, set(everything), frozenset(), set()))
        for block in analysis.blocks:
            if block.clause is not None:
                drafts += self._block_drafts(block)
            elif default_bound is not None:
                # the session's bound, as if the block ended with CURRENCY BOUND d
                instances: set[Instance] = set()
                for source in block.sources:
                    instances |= set(self.source_instances(source))
                drafts.append(_Draft(default_bound, instances, frozenset(), set()))
        covered = {i for d in drafts for i in d.instances}
        for instance in everything:
            if instance not in covered:
                drafts.append(_Draft(0.0, {instance}, frozenset(), set()))

        fds = self.dependencies(everything)
        classes = [self._merge(group, fds) for group in _components(drafts)]
        classes.sort(key=lambda c: (c.tables, c.bound_seconds, c.by))
        return Constraint(classes=tuple(classes), instances=tuple(everything), fds=tuple(fds))

    def _block_drafts(self, block: Block) -> list[_Draft]:
        clause = block.clause
        assert clause is not None
        drafts: list[_Draft] = []
        named: set[int] = set()
        for spec in clause.expressions:
            on = spec.args.get("on")
            if on is None:
                members = list(block.sources)
            else:
                members = [t.cast(Source, block.resolve(folded(i))) for i in on]
            named |= {id(m) for m in members}
            instances: set[Instance] = set()
            for member in members:
                instances |= set(self.source_instances(member))
            grouping = frozenset(
                self._by_attr(block, members, c) for c in spec.args.get("by") or []
            )
            drafts.append(_Draft(spec.this.seconds, instances, grouping, set(grouping)))
        # §2: an input of this block that no spec names is a class of its own, bound 0.
        for source in block.sources:
            if id(source) not in named:
                instances = set(self.source_instances(source))
                if instances:
                    drafts.append(_Draft(0.0, instances, frozenset(), set()))
        return drafts

    def _by_attr(self, block: Block, members: list[Source], column: exp.Column) -> Attr:
        written = column.sql(dialect="postgres").lower()
        if column.table:
            source = next((m for m in members if m.name == qualifier(column)), None)
            candidates = [source] if source is not None else []
        else:
            candidates = members
        hits = [(m, a) for m in candidates if (a := self.attr_of(m, folded(column))) is not None]
        if len(hits) == 1:
            return hits[0][1]
        names = ", ".join(m.name for m in members)
        if len(hits) > 1:
            raise SqlSyntaxError(
                f"BY column {written} is ambiguous: {', '.join(m.name for m, _ in hits)} all "
                f"have it; qualify it (e.g. {hits[0][0].name}.{column.name.lower()})",
                *position_of(column),
            )
        computed = [m for m in candidates if not m.is_table and _projects(m, column.name)]
        if computed:
            raise SqlSyntaxError(
                f"BY column {written} is computed inside {computed[0].name}: group by a column "
                "that comes straight from a base table",
                *position_of(column),
            )
        raise SqlSyntaxError(
            f"BY column {written} is not a column of the class's inputs ({names})",
            *position_of(column),
        )

    def _merge(self, group: list[_Draft], fds: list[FD]) -> ConsistencyClass:
        instances: set[Instance] = set()
        for draft in group:
            instances |= draft.instances
        attrs = frozenset(
            (i, c)
            for i in instances
            if (table := self.catalog.table(i.table)) is not None
            for c in table.column_names
        )
        required = attrs
        for draft in group:
            required &= closure(draft.grouping, fds)
        preferred = set().union(*(d.preferred for d in group))
        grouping = minimize(required, fds, keep_last=preferred)
        return ConsistencyClass(
            bound_seconds=min(d.bound for d in group),
            instances=frozenset(instances),
            grouping=grouping,
        )


def _components(drafts: list[_Draft]) -> list[list[_Draft]]:
    """Groups of drafts connected by shared instances (merge until disjoint)."""
    parent = list(range(len(drafts)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[Instance, int] = {}
    for index, draft in enumerate(drafts):
        for instance in draft.instances:
            if instance in owner:
                parent[find(index)] = find(owner[instance])
            else:
                owner[instance] = index
    groups: dict[int, list[_Draft]] = {}
    for index, draft in enumerate(drafts):
        groups.setdefault(find(index), []).append(draft)
    return [g for g in groups.values() if any(d.instances for d in g)]


def _positive_path(block: Block) -> bool:
    current: Block | None = block
    while current is not None:
        if not current.positive:
            return False
        current = current.parent
    return True


def _projects(source: Source, column: str) -> bool:
    for body in source.body:
        for projection in body.select.expressions:
            if output_name(projection) == column:
                return True
    return False
