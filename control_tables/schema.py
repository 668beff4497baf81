"""The cache schema (§3.3, §3.6): control tables, cached views and the cache DAG.

Pure values built from parsed DDL (`sql_ext`) and the backend catalog. The DuckDB file keeps the
DDL text; the schema is rebuilt from it on load, so there is one source of truth.
"""

from __future__ import annotations

import typing as t
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from control_tables.kinds import RegionKind, Role
from sql_ext import (
    Completeness,
    Consistency,
    CreateCachedView,
    CreateControlTable,
    Derivation,
    Presence,
)
from sql_ext.errors import ProgrammingError


@dataclass(frozen=True)
class ControlTable:
    name: str
    columns: tuple[tuple[str, str], ...]  # (name, PostgreSQL type)
    statement: str  # the DDL as written

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.columns)


@dataclass(frozen=True)
class CachedView:
    """A selection and projection of one backend table, with its cache constraints; or a
    derived view (``derivation``: joins, groups and aggregates, fully materialized)."""

    name: str
    table: str
    columns: tuple[str, ...]  # resolved: SELECT * expands to the backend table's columns
    key: tuple[str, ...]  # the backend key the view is identified by (its DuckDB primary key)
    where: exp.Expr | None = field(compare=False)
    presence: tuple[Presence, ...]
    consistency: Consistency | None
    completeness: Completeness | None
    refresh_seconds: float | None
    statement: str  # the DDL as written
    continuous: bool = False  # REFRESH CONTINUOUSLY (a gray view follows its root: `continuous`)
    auto: bool = False  # REFRESH AUTO: the scheduler chooses f (`optimizer.rules.refresh_interval`)
    within_seconds: float | None = None  # REFRESH AUTO WITHIN: the age it must never pass
    # a derived view's joins, groups and aggregates (`control_tables.derived`): then ``table``
    # is the first table it reads, and only what handles derivations reads it
    derivation: Derivation | None = field(default=None, compare=False)

    @property
    def is_derived(self) -> bool:
        return self.derivation is not None

    @property
    def is_fully_materialized(self) -> bool:
        """No PRESENCE clause: one view-level region holding every row."""
        return not self.presence

    @property
    def is_gray(self) -> bool:
        return self.consistency is not None and self.consistency.kind == "root"

    @property
    def color(self) -> t.Literal["white", "gray"]:
        return "gray" if self.is_gray else "white"

    @property
    def view_level(self) -> bool:
        """All rows mutually consistent: a circle in the cache DAG (§3.3.4)."""
        return self.is_fully_materialized or (
            self.consistency is not None and self.consistency.kind == "all"
        )

    def where_sql(self, dialect: str = "postgres") -> str | None:
        return self.where.sql(dialect=dialect) if self.where is not None else None


@dataclass(frozen=True)
class CacheSchema:
    control_tables: Mapping[str, ControlTable] = field(default_factory=dict)
    views: Mapping[str, CachedView] = field(default_factory=dict)

    # -- lookup ------------------------------------------------------------------------------

    def kind_of(self, name: str) -> t.Literal["control table", "cached view"] | None:
        if name in self.control_tables:
            return "control table"
        if name in self.views:
            return "cached view"
        return None

    def parents(self, view: str) -> list[str]:
        """Cached views that presence-control ``view`` (edges of the cache DAG)."""
        return [p.control for p in self.views[view].presence if p.control in self.views]

    def children(self, view: str) -> list[str]:
        return [
            name for name, v in self.views.items() if any(p.control == view for p in v.presence)
        ]

    def edges_from(self, view: str) -> Iterator[tuple[CachedView, Presence]]:
        """(child, presence edge) for every child presence-controlled by ``view``."""
        for child in self.views.values():
            for edge in child.presence:
                if edge.control == view:
                    yield child, edge

    def users_of(self, control: str) -> list[tuple[str, Role]]:
        """(view, role) pairs that use a control table or view as a control: role is
        presence, consistency or completeness."""
        found: list[tuple[str, Role]] = []
        for view in self.views.values():
            found += [
                (view.name, RegionKind.PRESENCE) for p in view.presence if p.control == control
            ]
            if view.consistency is not None and view.consistency.control == control:
                found.append((view.name, RegionKind.CONSISTENCY))
            if view.completeness is not None and view.completeness.control == control:
                found.append((view.name, RegionKind.COMPLETENESS))
        return found

    def consistency_root(self, view: str) -> str:
        """The closest white ancestor (itself when white): its regions decide the view's."""
        current = self.views[view]
        while current.is_gray:
            current = self.views[current.presence[0].control]
        return current.name

    def continuous(self, view: str) -> bool:
        """Kept current from the backend's WAL: REFRESH CONTINUOUSLY on the view or, for a
        gray view, on its consistency root."""
        return self.views[self.consistency_root(view)].continuous

    def continuous_views(self) -> list[str]:
        return [v for v in self.topological_order() if self.continuous(v)]

    def topological_order(self) -> list[str]:
        """Views parents first (the DAG is acyclic once Rule 1 has been checked)."""
        order: list[str] = []
        seen: set[str] = set()

        def visit(name: str) -> None:
            if name in seen:
                return
            seen.add(name)
            for parent in self.parents(name):
                visit(parent)
            order.append(name)

        for name in sorted(self.views):
            visit(name)
        return order

    # -- building ----------------------------------------------------------------------------

    def with_control_table(self, statement: CreateControlTable) -> CacheSchema:
        table = ControlTable(
            name=statement.name,
            columns=tuple((c.name, c.type) for c in statement.columns),
            statement=statement.text.strip(),
        )
        return CacheSchema({**self.control_tables, table.name: table}, dict(self.views))

    def with_view(self, view: CachedView) -> CacheSchema:
        return CacheSchema(dict(self.control_tables), {**self.views, view.name: view})

    def without(self, name: str) -> CacheSchema:
        return CacheSchema(
            {k: v for k, v in self.control_tables.items() if k != name},
            {k: v for k, v in self.views.items() if k != name},
        )


def view_from_statement(
    statement: CreateCachedView, table_columns: tuple[str, ...], key: tuple[str, ...]
) -> CachedView:
    return CachedView(
        name=statement.name,
        table=statement.table,
        columns=statement.columns if statement.columns is not None else table_columns,
        key=key,
        where=statement.where,
        presence=statement.presence,
        consistency=statement.consistency,
        completeness=statement.completeness,
        refresh_seconds=statement.refresh_seconds,
        statement=statement.text.strip(),
        continuous=statement.continuous,
        auto=statement.auto,
        within_seconds=statement.within_seconds,
        derivation=statement.derivation,
    )


def control_role(schema: CacheSchema, control: str) -> tuple[CachedView, Role, tuple[str, ...]]:
    """The view a control table controls, in which role, and the control table's key."""
    if control in schema.views:
        raise ProgrammingError(
            f"{control} is a cached view; admit or evict through the control table that "
            "controls it, or through its parent view's control table"
        )
    if control not in schema.control_tables:
        known = ", ".join(sorted(schema.control_tables)) or "none"
        raise ProgrammingError(f"no control table {control!r} (control tables: {known})")
    users = schema.users_of(control)
    if not users:
        raise ProgrammingError(
            f"control table {control} controls no cached view yet; create a view that uses it"
        )
    view_name, role = users[0]
    return schema.views[view_name], role, schema.control_tables[control].column_names


def controlled_columns(view: CachedView, role: Role, control: str) -> tuple[str, ...]:
    """The view columns a control table's key maps to (presence: K', else the same names)."""
    if role == RegionKind.PRESENCE:
        edge = next(p for p in view.presence if p.control == control)
        return edge.columns
    spec = view.consistency if role == RegionKind.CONSISTENCY else view.completeness
    assert spec is not None
    return spec.columns
