"""Analyse a statement once, for every rule after it (STYLE 2): its normalized C&C constraint
(§4.3, §5.1) and its table accesses - for each base-table reference, the columns the query uses
from it, the conjuncts that mention only it (selections that can be pushed to it), and the
constants it is probed with (``col = v``, ``col IN (v, ...)``, parameters included) - plus what
would make DuckDB answer differently from PostgreSQL.

    parse (sql_ext) -> analyse (here) -> plan (optimizer.plan) -> guard
    (optimizer.rules.evaluate_guards) -> execute (cache.execution)
"""

from __future__ import annotations

import functools
import typing as t
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from optimizer.analysis.equivalences import block_classes, joined
from optimizer.analysis.normalize_constraint import (
    ConsistencyClass,
    Constraint,
    Instance,
    QueryResolver,
)
from optimizer.postgres.allowlist import numeric_division, numeric_spread
from optimizer.postgres.divisions import SPREADS, Kind, analyze_divisions
from optimizer.postgres.expression_types import ExpressionTypes
from optimizer.postgres.folds import fold
from optimizer.postgres.numeric_scales import (
    DerivedScales,
    Scale,
    division_operands,
    scale_bound,
)
from optimizer.postgres.semantics import Semantics, pg_semantics
from optimizer.postgres.volatility import repeatable
from sql_ext import Block, Query, Source
from sql_ext.catalog import Catalog
from sql_ext.fds import FD
from sql_ext.nodes import ConstantList
from sql_ext.params import NODE_ID, Key, is_constant, number_nodes, placeholder_keys
from sql_ext.quoting import qualifier

COMPARISONS = (
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.In,
    exp.Between,
    exp.Like,
    exp.ILike,
    exp.NullSafeEQ,
    exp.NullSafeNEQ,
)


@dataclass(frozen=True)
class Access:
    instance: Instance
    source: Source = field(repr=False, compare=False)  # the reference in its block
    block: Block = field(repr=False, compare=False)
    columns: frozenset[str]
    # pushable selections: its own block's conjuncts on it alone, and what the block's
    # equivalence classes imply (optimizer.analysis.equivalences)
    conjuncts: tuple[exp.Expr, ...] = field(compare=False)
    probes: Mapping[str, tuple[exp.Expr, ...]] = field(compare=False)  # column -> constants

    @property
    def table(self) -> str:
        return self.instance.table

    @property
    def node(self) -> exp.Table:
        node = self.source.node
        assert isinstance(node, exp.Table)
        return node

    @property
    def alias(self) -> str:
        """The name the statement reads the table by (its alias, else its name)."""
        return self.node.alias or self.node.name


@dataclass(frozen=True)
class Analysis:
    """What every optimizer rule needs to know about one statement."""

    query: Query
    constraint: Constraint
    fds: tuple[FD, ...]
    accesses: tuple[Access, ...]  # one per direct base-table reference
    # Each placeholder's key (position or name), by node number (sql_ext.params).
    parameter_keys: Mapping[int, Key]
    # Why DuckDB could not answer the statement as PostgreSQL would (None: it can).
    local_blocker: str | None = None
    reads_blank_padded: bool = False  # it reads a char(n) column
    # How the local statement computes what PostgreSQL computes (optimizer.postgres.semantics)
    semantics: Semantics = field(default_factory=Semantics)
    # Output columns the cache divides as PostgreSQL does (optimizer.postgres.divisions):
    # index -> kind
    divisions: Mapping[int, Kind] = field(default_factory=dict)
    # ... and the display scales of each one's numerator and denominator: the same for every
    # value, or the DuckDB expression computing them row by row (optimizer.postgres.numeric_scales)
    division_scales: Mapping[int, tuple[int | exp.Expr, int | exp.Expr]] = field(
        default_factory=dict
    )
    # ... of a variance or standard deviation: the scale its values are read at, the largest
    # any of them may have (its numerator's is twice theirs)
    spread_scales: Mapping[int, int] = field(default_factory=dict)
    # divisions inside the statement, by node number: the DuckDB expression computing each one
    # with PostgreSQL's division (optimizer.postgres.allowlist.numeric_division)
    inner_divisions: Mapping[int, exp.Expr] = field(default_factory=dict)
    # columns the local statement adds to derived tables' bodies: the scale of a column of
    # theirs whose values' scales vary (optimizer.postgres.numeric_scales.DerivedScales)
    derived_scales: Mapping[int, tuple[tuple[str, exp.Expr], ...]] = field(default_factory=dict)
    # ... and to VALUES lists: node number -> (the column's name, each row's scale)
    values_scales: Mapping[int, tuple[tuple[str, tuple[int, ...]], ...]] = field(
        default_factory=dict
    )
    # The answer depends only on the data and parameters (optimizer.postgres.volatility): a local
    # answer may be reused while the views it read are unchanged
    repeatable: bool = False
    # relations it reads that the cache cannot hold (`Catalog.outside`): PostgreSQL answers
    outside: tuple[str, ...] = ()

    @property
    def local_allowed(self) -> bool:
        return self.local_blocker is None

    @functools.cached_property
    def keys(self) -> tuple[Key, ...]:
        """The distinct placeholder keys, in textual order."""
        return tuple(dict.fromkeys(self.parameter_keys.values()))

    def access_of(self, instance: Instance) -> Access:
        return next(a for a in self.accesses if a.instance == instance)

    @functools.cached_property
    def class_accesses(self) -> tuple[tuple[ConsistencyClass, tuple[Access, ...]], ...]:
        """Each consistency class with its accesses in statement order (found once; an input
        read through a backend view has no access of its own)."""
        return tuple(
            (cls, tuple(a for a in self.accesses if a.instance in cls.instances))
            for cls in self.constraint.classes
        )


def statement_types(query: Query, catalog: Catalog) -> ExpressionTypes:
    """The types PostgreSQL gives a statement's expressions, its columns resolved against
    the catalog (what `analyze` types its statements with)."""
    fold(query.tree)
    number_nodes(query.tree)
    return ExpressionTypes(query, catalog, QueryResolver(query, catalog).column_source)


def analyze(query: Query, catalog: Catalog, default_bound: float | None = None) -> Analysis:
    """The analysis of a statement; ``default_bound``: the session's currency bound for its
    blocks without a clause."""
    if not query.is_select:  # a write or a command: nothing to read from the cache
        return Analysis(
            query,
            Constraint((), (), ()),
            (),
            (),
            placeholder_keys(query.tree),
            local_blocker="it is not a query",
        )
    fold(query.tree)  # (forms PostgreSQL answers as others DuckDB has: optimizer.postgres.folds)
    number_nodes(query.tree)
    resolver = QueryResolver(query, catalog)
    constraint = resolver.run(default_bound)
    analysis = query.analysis
    # Which instance each direct table reference is.
    direct: dict[int, tuple[Instance, Source, Block]] = {}
    for block in analysis.blocks:
        for source in block.sources:
            instance = resolver.base_instance(source)
            if instance is not None and isinstance(source.node, exp.Table):
                direct[id(source)] = (instance, source, block)
    columns: dict[Instance, set[str]] = {inst: set() for inst, _, _ in direct.values()}
    for column in query.tree.find_all(exp.Column):
        scope = analysis.enclosing(column)
        if scope is None:
            continue
        attr = resolver.resolve_column(scope, column)
        if attr is not None and attr[0] in columns:
            columns[attr[0]].add(attr[1])
    # SELECT * and t.* need every column (a star inside count(*) needs none, and so does the
    # select list of an EXISTS subquery: only whether it has rows is read).
    for block in analysis.blocks:
        if isinstance(block.select.parent, exp.Exists):
            continue
        for projection in block.select.expressions:
            if isinstance(projection, exp.Star):
                sources = block.sources
            elif isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star):
                named = block.resolve(qualifier(projection))
                sources = [named] if named is not None else []
            else:
                continue
            for source in sources:
                for instance in resolver.source_instances(source):
                    table = catalog.table(instance.table)
                    if instance in columns and table is not None:
                        columns[instance] |= set(table.column_names)
    types = ExpressionTypes(query, catalog, resolver.column_source)
    derived = DerivedScales(query.tree, types.of, lambda c: _column_source(query, resolver, c))
    semantics = pg_semantics(query, types, catalog.text_byte_order, derived.scale)
    divisions, inner, division_blocker = analyze_divisions(query, types)
    division_scales, scale_blocker = _division_scales(query, types, divisions, derived)
    spread_scales = _spread_scales(query, types, divisions, division_scales)
    inner_divisions, inner_blocker = _inner_divisions(
        query, types, inner, derived, semantics.printed_divisions
    )
    scale_blocker = scale_blocker or inner_blocker
    varying = sorted(semantics.varying_scales - set(divisions))
    if varying and semantics.blocker is None:
        scale_blocker = scale_blocker or (
            f"its output column {varying[0] + 1} holds numerics whose display scales vary from "
            "row to row (DuckDB gives one scale to a column)"
        )
    classes = block_classes(query, resolver.resolve_column)
    conjuncts: dict[Instance, list[exp.Expr]] = {inst: [] for inst in columns}
    probes: dict[Instance, dict[str, tuple[exp.Expr, ...]]] = {inst: {} for inst in columns}
    for instance, source, block in direct.values():
        # A block's conjuncts restrict the rows of its own FROM items only (a predicate on an
        # outer table inside NOT EXISTS says nothing about which outer rows reach the result).
        own = conjuncts[instance]
        written = set()
        joined_by = block.join_conditions(source)
        for predicate in block.conjuncts() + joined_by:
            if predicate.find(exp.Select) is not None:
                continue
            attrs = [resolver.resolve_column(block, c) for c in predicate.find_all(exp.Column)]
            if not attrs or None in attrs or {a[0] for a in attrs if a} != {instance}:
                continue
            own.append(predicate)
            probe = _probe(predicate)
            if probe is not None:
                attr = resolver.resolve_column(block, probe[0])
                if attr is not None:
                    written.add(attr[1])
        # What the block's equivalence classes add: columns equal to constants through joins.
        table = catalog.table(instance.table)
        seen = joined(classes[id(block.select)], block, joined_by, resolver.resolve_column)
        for name in table.column_names if table is not None else ():
            values = seen.constants((instance, name))
            if values is None:
                continue
            probes[instance][name] = values
            if name not in written:
                own.append(_restriction(source.name, name, values))
    accesses = tuple(
        Access(
            instance=instance,
            source=source,
            block=block,
            columns=frozenset(columns[instance]),
            conjuncts=tuple(conjuncts[instance]),
            probes=probes[instance],
        )
        for instance, source, block in sorted(direct.values(), key=lambda d: d[0].id)
    )
    return Analysis(
        query=query,
        constraint=constraint,
        fds=constraint.fds,
        accesses=accesses,
        parameter_keys=placeholder_keys(query.tree),
        semantics=semantics,
        divisions=divisions,
        division_scales=division_scales,
        spread_scales=spread_scales,
        inner_divisions=inner_divisions,
        derived_scales={k: tuple(v) for k, v in derived.projections.items()},
        values_scales={k: tuple(v) for k, v in derived.values.items()},
        repeatable=repeatable(query.tree),
        reads_blank_padded=any(
            _is_padded(catalog, (i, c)) for i, used in columns.items() for c in used
        ),
        outside=tuple(dict.fromkeys(resolver.outside)),
        local_blocker=_local_blocker(
            outside=resolver.outside,
            direct={a.instance for a in accesses} == set(constraint.instances),
            division=division_blocker or scale_blocker,
            semantics=semantics.blocker,
        ),
    )


def _local_blocker(
    *, outside: list[str], direct: bool, division: str | None, semantics: str | None
) -> str | None:
    if outside:
        return (
            f"it reads {', '.join(dict.fromkeys(outside))}, which the cache cannot hold (a "
            "system catalog, a temporary table or a table off the search path)"
        )
    if not direct:
        # a local or mixed plan rebinds each table reference; a backend view has none to rebind
        return "it reads a backend view (only base-table references can be rebound locally)"
    return semantics or division


def _column_source(query: Query, resolver: QueryResolver, column: exp.Column) -> t.Any:
    block = query.analysis.enclosing(column)
    return resolver.column_source(block, column) if block is not None else None


def _division_scales(
    query: Query, types: ExpressionTypes, divisions: Mapping[int, str], derived: DerivedScales
) -> tuple[dict[int, tuple[int | exp.Expr, int | exp.Expr]], str | None]:
    """The display scales of the numerator and denominator of each output the cache divides
    (PostgreSQL's quotient's scale depends on them), or why the cache cannot follow them."""
    found: dict[int, tuple[int | exp.Expr, int | exp.Expr]] = {}
    if not divisions or not isinstance(query.tree, exp.Select):
        return found, None
    for index in divisions:
        projection = query.tree.expressions[index]
        node = projection.this if isinstance(projection, exp.Alias) else projection
        operands = division_operands(node, types.of, derived.column)
        scales: list[Scale] = [operands[1], operands[3]] if operands is not None else [None, None]
        if types.of(node.this).kind == "float" or (
            isinstance(node, exp.Div) and types.of(node.expression).kind == "float"
        ):
            scales = [0, 0]  # a division of doubles: no scale
        if any(s is None for s in scales):
            return found, (
                f"its output column {index + 1} divides numerics whose display "
                "scales the cache cannot follow (varying from row to row, or squared beyond "
                "DuckDB's 38 decimal places)"
            )
        found[index] = (t.cast("int | exp.Expr", scales[0]), t.cast("int | exp.Expr", scales[1]))
    return found, None


def _spread_scales(
    query: Query,
    types: ExpressionTypes,
    divisions: Mapping[int, str],
    scales: Mapping[int, tuple[int | exp.Expr, int | exp.Expr]],
) -> dict[int, int]:
    """The scale each variance output's values are read at: theirs where it is one, else the
    largest any of them may have (`optimizer.postgres.numeric_scales.scale_bound`)."""
    found: dict[int, int] = {}
    for index, kind in divisions.items():
        if kind not in SPREADS.values() or index not in scales:
            continue
        numerator_scale = scales[index][0]
        if isinstance(numerator_scale, int):
            found[index] = numerator_scale // 2
            continue
        projection = t.cast(exp.Select, query.tree).expressions[index]
        node = projection.this if isinstance(projection, exp.Alias) else projection
        bound = scale_bound(node.this, types.of)
        if bound is not None:
            found[index] = bound
    return found


def _inner_divisions(
    query: Query,
    types: ExpressionTypes,
    inner: Mapping[int, str],
    derived: DerivedScales,
    printed_divisions: frozenset[int] = frozenset(),
) -> tuple[dict[int, exp.Expr], str | None]:
    """The DuckDB expression of each division inside the statement, or why one cannot be
    (``printed_divisions``: those printed as text, given as the cache's text of the value)."""
    found: dict[int, exp.Expr] = {}
    if not inner:
        return found, None
    for node in query.tree.find_all(exp.Div, exp.Avg, *SPREADS):
        number = node.meta.get(NODE_ID)
        if number not in inner:
            continue
        operands = division_operands(node, types.of, derived.column)
        if isinstance(node, tuple(SPREADS)) and operands is not None:
            numerator, a, denominator, _ = operands
            spread = numeric_spread(
                numerator,
                t.cast("int | exp.Expr", a),
                denominator,
                SPREADS[type(node)].startswith("stddev"),
                False,
            )
            printed = number in printed_divisions
            found[t.cast(int, number)] = spread.this if printed else spread
            continue
        if operands is None or operands[1] is None or operands[3] is None:
            return {}, (
                f"it divides {node.sql(dialect='postgres')[:40]}, numerics whose display "
                "scales the cache cannot follow"
            )
        numerator, a, denominator, b = operands
        target: exp.Expr = (
            node.parent
            if isinstance(node, exp.Avg) and isinstance(node.parent, exp.Window)
            else node
        )
        division = numeric_division(numerator.copy(), _literal(a), denominator.copy(), _literal(b))
        if number in printed_divisions and isinstance(division, exp.Cast):
            division = division.this  # PostgreSQL's text of the quotient, at its display scale
        found[target.meta[NODE_ID]] = division
    return found, None


def _literal(scale: int | exp.Expr | None) -> exp.Expr:
    return exp.Literal.number(scale) if isinstance(scale, int) else t.cast(exp.Expr, scale)


def _column_type(catalog: Catalog, attr: tuple[t.Any, str]) -> str:
    """The PostgreSQL type of a base attribute ("" when unknown)."""
    table = catalog.table(attr[0].table)
    if table is None:
        return ""
    return next((c.type for c in table.columns if c.name == attr[1]), "")


def _is_padded(catalog: Catalog, attr: tuple[t.Any, str]) -> bool:
    return _column_type(catalog, attr).startswith("character(")


def _restriction(alias: str, column: str, values: tuple[exp.Expr, ...]) -> exp.Expr:
    """``alias.column = v`` or ``alias.column IN (v, ...)``: a conjunct the access's
    equivalence classes imply."""
    target = exp.column(column, table=alias, quoted=True)
    if len(values) == 1:
        return exp.EQ(this=target, expression=values[0].copy())
    return exp.In(this=target, expressions=[v.copy() for v in values])


def _probe(predicate: exp.Expr) -> tuple[exp.Column, list[exp.Expr]] | None:
    """``col = constant`` or ``col IN (constants)``: the column and its constants (a long
    list's one `ConstantList`)."""
    if isinstance(predicate, exp.EQ):
        left, right = predicate.this, predicate.expression
        if isinstance(left, exp.Column) and is_constant(right, null=True):
            return left, [right]
        if isinstance(right, exp.Column) and is_constant(left, null=True):
            return right, [left]
    if isinstance(predicate, exp.In) and isinstance(predicate.this, exp.Column):
        values = predicate.expressions
        if (
            values
            and all(is_constant(v, null=True) or isinstance(v, ConstantList) for v in values)
            and not predicate.args.get("query")
        ):
            return predicate.this, list(values)
    return None
