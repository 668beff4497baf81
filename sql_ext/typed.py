"""The typed statement of a parsed tree (`typed_statement`): the cache's own statements, the
cache DDL (a derived view's `Derivation` read from its SELECT), and a query with its currency
clauses, checked against the scoping rules of §2 (ON names inputs visible from the block; BY
columns lie inside their class)."""

from __future__ import annotations

import typing as t

from sqlglot import exp

from sql_ext.aggregates import aggregate_of
from sql_ext.blocks import Block, analyze
from sql_ext.ddl import (
    Completeness,
    Consistency,
    ControlColumn,
    CreateCachedView,
    CreateControlTable,
    Derivation,
    DerivedOutput,
    DerivedSource,
    DropCacheObject,
    Presence,
)
from sql_ext.errors import SqlSyntaxError
from sql_ext.grammar.base import BODY_START, SPAN
from sql_ext.grammar.cache_ddl import is_derived
from sql_ext.nodes import (
    CachedViewDef,
    ConsistencyClause,
    ControlTableDef,
    CurrencyClause,
    Duration,
    ExplainStatement,
)
from sql_ext.nodes import CacheSetting as CacheSettingNode
from sql_ext.nodes import DropCacheObject as DropNode
from sql_ext.nodes import Inspect as InspectNode
from sql_ext.nodes import RefreshCached as RefreshNode
from sql_ext.nodes import SessionBound as SessionBoundNode
from sql_ext.nodes import Timeline as TimelineNode
from sql_ext.quoting import folded
from sql_ext.quoting import qualifier as column_qualifier
from sql_ext.statements import (
    BlockClause,
    CacheSetting,
    Inspect,
    Query,
    RefreshCachedView,
    SessionBound,
    Spec,
    Statement,
    Timeline,
    position_of,
)


def typed_statement(tree: exp.Expr, text: str, offset: int = 0) -> Statement:
    """The typed statement of a tree; ``text``: its own text, which begins at ``offset`` of
    the parsed script (the tree's positions are the script's)."""
    if isinstance(tree, TimelineNode):
        return Timeline(text=text, begin=tree.name == "BEGIN")
    if isinstance(tree, SessionBoundNode):
        duration = tree.args.get("expression")
        action = t.cast(t.Literal["set", "reset", "show"], tree.name.lower())
        return SessionBound(text, action, duration.seconds if duration is not None else None)
    if isinstance(tree, InspectNode):
        return Inspect(text, t.cast(t.Any, tree.name), tuple(tree.args.get("views") or ()))
    if isinstance(tree, CacheSettingNode):
        action = t.cast(t.Literal["set", "reset", "show"], tree.name.lower())
        return CacheSetting(text, action, tree.text("name"), tree.args.get("value"))
    if isinstance(tree, RefreshNode):
        keys = tree.args.get("keys")
        view = tree.args.get("this")
        return RefreshCachedView(text, view, tuple(keys) if keys is not None else None)
    if isinstance(tree, ControlTableDef):
        for column in tree.expressions:
            kind = column.args["kind"]
            if kind.this == exp.DataType.Type.USERDEFINED:
                raise SqlSyntaxError(
                    f"unknown type {kind.sql(dialect='postgres')!r} for control column "
                    f"{column.name}: use a built-in type such as INTEGER, BIGINT, TEXT, "
                    "NUMERIC(p, s) or DATE (user-defined types cannot be cached)",
                    *position_of(column),
                )
        return CreateControlTable(
            text=text,
            name=folded(tree.this),
            columns=tuple(
                ControlColumn(name=folded(c.this), type=c.args["kind"].sql(dialect="postgres"))
                for c in tree.expressions
            ),
        )
    if isinstance(tree, CachedViewDef):
        return _typed_cached_view(tree, text)
    if isinstance(tree, DropNode):
        return DropCacheObject(
            text=text,
            object_kind="cached view" if tree.text("kind") == "CACHED VIEW" else "control table",
            name=folded(tree.this),
            if_exists=bool(tree.args.get("exists")),
        )
    explain, body_start = None, 0
    if isinstance(tree, ExplainStatement):
        explain = tree.text("options")
        body_start = tree.meta[BODY_START] - offset
        tree = tree.this
    analysis = analyze(tree)
    clauses = tuple(_check_clause(block, text) for block in analysis.blocks if block.clause)
    cuts = tuple(
        (b - offset, e - offset)
        for b, e in (node.meta[SPAN] for node in tree.find_all(CurrencyClause))
    )
    return Query(
        text=text,
        tree=tree,
        clauses=clauses,
        analysis=analysis,
        explain=explain,
        cuts=cuts,
        body_start=body_start,
    )


def _names(nodes: list[exp.Expr] | None) -> tuple[str, ...]:
    return tuple(folded(n) for n in nodes or [])


def _typed_cached_view(tree: CachedViewDef, text: str) -> CreateCachedView:
    select: exp.Select = tree.expression
    table: exp.Table = select.args["from_"].this
    columns: tuple[str, ...] | None = None
    if not any(isinstance(p, exp.Star) for p in select.expressions):
        columns = tuple(
            folded(p.args["alias"]) if isinstance(p, exp.Alias) else folded(p)
            for p in select.expressions
        )
    presence = tuple(
        Presence(
            columns=_names(p.expressions),
            control=folded(p.this),
            control_columns=_names(p.args.get("control_columns") or p.expressions),
        )
        for p in tree.args.get("presence") or []
    )
    consistency = None
    node: ConsistencyClause | None = tree.args.get("consistency")
    if node is not None:
        kind = t.cast(t.Literal["all", "on", "root"], node.text("kind").lower())
        control = node.args.get("this")
        consistency = Consistency(
            kind=kind,
            columns=_names(node.expressions),
            control=folded(control) if control is not None else None,
        )
    completeness = None
    if tree.args.get("completeness") is not None:
        cnode = tree.args["completeness"]
        control = cnode.args.get("this")
        completeness = Completeness(
            columns=_names(cnode.expressions),
            control=folded(control) if control is not None else None,
        )
    refresh: Duration | exp.Var | None = tree.args.get("refresh")
    mode = refresh.name if isinstance(refresh, exp.Var) else None
    within: Duration | None = tree.args.get("within")
    derivation = _derivation(select) if is_derived(select) else None
    if derivation is not None:
        columns = tuple(o.name for o in derivation.outputs)
    return CreateCachedView(
        text=text,
        name=folded(tree.this),
        table=folded(table),
        schema=folded(table.args["db"]) if table.args.get("db") else None,
        columns=columns,
        select=select,
        presence=presence,
        consistency=consistency,
        completeness=completeness,
        refresh_seconds=refresh.seconds if isinstance(refresh, Duration) else None,
        continuous=mode == "CONTINUOUSLY",
        auto=mode == "AUTO",
        within_seconds=within.seconds if within is not None else None,
        derivation=derivation,
        with_data=tree.args.get("data") is None or tree.args["data"].this is True,
    )


def _derivation(select: exp.Select) -> Derivation:
    """A derived view's SELECT as the dialect checked it
    (`CacheDDLParser._check_derived_select`)."""
    tables = [select.args["from_"].this, *(j.this for j in select.args.get("joins") or [])]
    sources = tuple(
        DerivedSource(
            folded(table),
            folded(table.args["db"]) if table.args.get("db") else None,
            folded(table.args["alias"].this) if table.args.get("alias") else folded(table),
        )
        for table in tables
    )
    joins: list[tuple[exp.Column, exp.Column]] = []
    for join in select.args.get("joins") or []:
        on = join.args["on"]
        for pair in on.flatten() if isinstance(on, exp.And) else [on]:
            joins.append((pair.this, pair.expression))
    group = select.args.get("group")
    outputs = []
    for projection in select.expressions:
        target = projection.this if isinstance(projection, exp.Alias) else projection
        name = (
            folded(projection.args["alias"])
            if isinstance(projection, exp.Alias)
            else folded(target)
        )
        if isinstance(target, exp.Column):
            outputs.append(DerivedOutput(name, target))
            continue
        value = target.this
        aggregate = aggregate_of(target)
        assert aggregate is not None  # (the dialect took no other)
        outputs.append(
            DerivedOutput(name, None if isinstance(value, exp.Star) else value, aggregate.name)
        )
    return Derivation(
        sources, tuple(joins), tuple(group.expressions) if group is not None else (), tuple(outputs)
    )


def _column_name(column: exp.Column) -> str:
    """``table.column`` as PostgreSQL reads it (unquoted names folded), without quotes."""
    name = folded(column)
    return f"{column_qualifier(column)}.{name}" if column.table else name


def _check_clause(block: Block, text: str) -> BlockClause:
    """§2 scoping: ON names inputs visible from the block; BY columns lie inside the class."""
    clause = block.clause
    assert clause is not None
    specs = []
    own = {s.name for s in block.sources if s.name}
    for node in clause.expressions:
        on = node.args.get("on")
        if on is not None:
            for ident in on:
                if block.resolve(folded(ident)) is None:
                    visible = sorted({s.name for s in block.visible() if s.name})
                    raise SqlSyntaxError(
                        f"input {folded(ident)!r} is not visible from this block: name a "
                        f"table or alias of this block or an outer one ({', '.join(visible)})",
                        *position_of(ident),
                    )
        members = {folded(i) for i in on} if on is not None else own
        for column in node.args.get("by") or []:
            qualifier = column_qualifier(column)
            if qualifier and qualifier not in members:
                raise SqlSyntaxError(
                    f"BY column {_column_name(column)} is outside its consistency class: "
                    f"{qualifier!r} is not among the class's inputs ({', '.join(sorted(members))})",
                    *position_of(column),
                )
        duration: Duration = node.this
        specs.append(
            Spec(
                bound_seconds=duration.seconds,
                on=tuple(folded(i) for i in on) if on is not None else None,
                by=tuple(_column_name(c) for c in node.args.get("by") or []),
                node=node,
            )
        )
    return BlockClause(block=block.index, specs=tuple(specs))
