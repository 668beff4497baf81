"""The typed cache DDL statements (§3): `CreateControlTable`, `CreateCachedView` (with its
`Presence`, `Consistency`, `Completeness` and a derived view's `Derivation`) and
`DropCacheObject`, and where in its script a DDL statement's offset stands."""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field

from sqlglot import exp

from sql_ext.aggregates import AGGREGATES, AggregateName


@dataclass(frozen=True)
class ControlColumn:
    name: str
    type: str  # PostgreSQL type as written, normalized by sqlglot


@dataclass(frozen=True)
class CreateControlTable:
    text: str
    name: str
    columns: tuple[ControlColumn, ...]
    # (line, column) of the first character of ``text`` in its script (1-based)
    position: tuple[int, int] = field(default=(1, 1), compare=False)

    kind: t.ClassVar[str] = "ddl"

    def to_sql(self, dialect: str = "postgres") -> str:
        cols = ", ".join(f"{c.name} {c.type}" for c in self.columns)
        return f"CREATE TABLE {self.name} ({cols})"

    def to_json(self) -> dict[str, t.Any]:
        return {
            "kind": self.kind,
            "sql": self.to_sql(),
            "clauses": [],
            "ddl": {
                "statement": "create control table",
                "name": self.name,
                "columns": [{"name": c.name, "type": c.type} for c in self.columns],
            },
        }


@dataclass(frozen=True)
class Presence:
    columns: tuple[str, ...]  # the view's presence-controlled key K'
    control: str  # control table or cached view
    control_columns: tuple[str, ...]  # its control key K (defaults to the same names)


@dataclass(frozen=True)
class Consistency:
    kind: t.Literal["all", "on", "root"]
    columns: tuple[str, ...] = ()
    control: str | None = None  # None with kind "on" = full guarantee for every value


@dataclass(frozen=True)
class Completeness:
    columns: tuple[str, ...]
    control: str | None  # None = full completeness for every value


@dataclass(frozen=True)
class DerivedSource:
    """A table a derived cached view reads (`Derivation`)."""

    table: str
    schema: str | None
    alias: str  # as written, else the table's name: what the view's columns are qualified by


@dataclass(frozen=True)
class DerivedOutput:
    """A column of a derived cached view: a column of its rows, or an aggregate of them."""

    name: str
    expression: exp.Expr | None = field(compare=False)  # the column, the aggregate's argument
    aggregate: AggregateName | None = None  # None: a column (`sql_ext.aggregates`)

    @property
    def count_star(self) -> bool:
        """count(*): the group's rows counted (an aggregate that takes * and has no argument)."""
        return (
            self.aggregate is not None
            and AGGREGATES[self.aggregate].star
            and self.expression is None
        )


@dataclass(frozen=True)
class Derivation:
    """What a derived cached view's SELECT says (`sql_ext.grammar.cache_ddl.is_derived`): tables
    joined by column equalities, grouped by columns, its columns and aggregates; names are
    resolved against the catalog with the schema (`control_tables.derived`)."""

    sources: tuple[DerivedSource, ...]
    joins: tuple[tuple[exp.Column, exp.Column], ...] = field(compare=False)
    group: tuple[exp.Column, ...] = field(compare=False)
    outputs: tuple[DerivedOutput, ...]

    @property
    def aggregates(self) -> bool:
        """One row per group (GROUP BY, or aggregates over all rows: one group)."""
        return bool(self.group) or any(o.aggregate for o in self.outputs)


@dataclass(frozen=True)
class CreateCachedView:
    text: str
    name: str
    table: str  # the backend table (a derived view's: the first it reads)
    schema: str | None
    columns: tuple[str, ...] | None  # None = every column (SELECT *)
    select: exp.Select = field(repr=False, compare=False)
    presence: tuple[Presence, ...]
    consistency: Consistency | None
    completeness: Completeness | None
    refresh_seconds: float | None
    position: tuple[int, int] = field(default=(1, 1), compare=False)
    continuous: bool = False  # REFRESH CONTINUOUSLY: kept current from the backend's WAL
    # REFRESH AUTO: refreshed at the interval the bounds its queries ask pay for; WITHIN: the
    # age its data must never pass (seconds)
    auto: bool = False
    within_seconds: float | None = None
    derivation: Derivation | None = None  # a derived view's joins, groups and aggregates
    # WITH DATA (the default, as PostgreSQL's CREATE MATERIALIZED VIEW): a fully materialized
    # view is filled by the statement that creates it; WITH NO DATA: by its first refresh
    with_data: bool = True

    kind: t.ClassVar[str] = "ddl"

    @property
    def where(self) -> exp.Expr | None:
        where = self.select.args.get("where")
        return where.this if where is not None else None

    def to_sql(self, dialect: str = "postgres") -> str:
        """The view's defining query."""
        return self.select.sql(dialect=dialect)

    def to_json(self) -> dict[str, t.Any]:
        consistency = None
        if self.consistency is not None:
            consistency = {
                "kind": self.consistency.kind,
                "columns": list(self.consistency.columns),
                "control": self.consistency.control,
            }
        completeness = None
        if self.completeness is not None:
            completeness = {
                "columns": list(self.completeness.columns),
                "control": self.completeness.control,
            }
        return {
            "kind": self.kind,
            "sql": self.to_sql(),
            "clauses": [],
            "ddl": {
                "statement": "create cached view",
                "name": self.name,
                "table": self.table,
                "columns": list(self.columns) if self.columns is not None else None,
                "presence": [
                    {
                        "columns": list(p.columns),
                        "control": p.control,
                        "control_columns": list(p.control_columns),
                    }
                    for p in self.presence
                ],
                "consistency": consistency,
                "completeness": completeness,
                "refresh_seconds": self.refresh_seconds,
                "continuous": self.continuous,
                "auto": self.auto,
                "within_seconds": self.within_seconds,
            },
        }


@dataclass(frozen=True)
class DropCacheObject:
    text: str
    object_kind: t.Literal["cached view", "control table"]
    name: str
    if_exists: bool
    position: tuple[int, int] = field(default=(1, 1), compare=False)

    kind: t.ClassVar[str] = "ddl"

    def to_sql(self, dialect: str = "postgres") -> str:
        return f"DROP TABLE {'IF EXISTS ' if self.if_exists else ''}{self.name}"

    def to_json(self) -> dict[str, t.Any]:
        return {
            "kind": self.kind,
            "sql": self.to_sql(),
            "clauses": [],
            "ddl": {"statement": f"drop {self.object_kind}", "name": self.name},
        }


def position_in_script(
    statement: CreateControlTable | CreateCachedView | DropCacheObject, offset: int
) -> tuple[int, int]:
    """(line, column) in the script of an offset into the statement's own text."""
    line, col = statement.position
    before = statement.text[:offset]
    if "\n" not in before:
        return line, col + offset
    return line + before.count("\n"), offset - before.rfind("\n")
