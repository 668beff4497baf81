"""A random query's parts kept apart (`Select`, `Compound`), so that a failing query can be made
smaller (`smaller`) while it still fails."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field

from experiments.differential.vocabulary import Column


@dataclass(frozen=True)
class Source:
    """A table (or derived table) in scope: its alias, its columns, whether an outer join may
    give it NULL rows."""

    alias: str
    columns: tuple[Column, ...]
    table: str | None = None  # None: a derived table
    nullable: bool = False


@dataclass
class Select:
    items: list[str]
    from_: str
    where: list[str] = field(default_factory=list)
    group: list[str] = field(default_factory=list)
    having: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    limit: int | None = None
    offset: int | None = None
    distinct: bool = False
    with_: str | None = None
    kind: str = "select"  # what shape it was made as (reports count by it)

    def sql(self) -> str:
        parts = []
        if self.with_:
            parts.append(f"WITH {self.with_}")
        parts.append("SELECT " + ("DISTINCT " if self.distinct else "") + ", ".join(self.items))
        parts.append(f"FROM {self.from_}")
        if self.where:
            parts.append("WHERE " + " AND ".join(self.where))
        if self.group:
            parts.append("GROUP BY " + ", ".join(self.group))
        if self.having:
            parts.append("HAVING " + " AND ".join(self.having))
        if self.order:
            parts.append("ORDER BY " + ", ".join(self.order))
        if self.limit is not None:
            parts.append(f"LIMIT {self.limit}")
        if self.offset is not None:
            parts.append(f"OFFSET {self.offset}")
        return " ".join(parts)

    @property
    def ordered(self) -> bool:
        return bool(self.order)

    def smaller(self) -> Iterator[Select]:
        """Variants one step smaller (for minimal reproductions); some may be invalid SQL."""
        if self.with_ is not None and self.with_ not in self.from_:
            yield dataclasses.replace(self, with_=None)
        if self.limit is not None or self.offset is not None or self.order:
            yield dataclasses.replace(self, order=[], limit=None, offset=None)
        if len(self.items) > 1:
            for index in range(len(self.items)):
                kept = [self.items[index]]
                order = [f"{i}" for i in range(1, 2)] if self.order else []
                yield dataclasses.replace(self, items=kept, order=order)
        for index in range(len(self.where)):
            yield dataclasses.replace(self, where=self.where[:index] + self.where[index + 1 :])
        for index in range(len(self.having)):
            yield dataclasses.replace(self, having=self.having[:index] + self.having[index + 1 :])
        if self.distinct:
            yield dataclasses.replace(self, distinct=False)


@dataclass
class Compound:
    left: Select
    op: str
    right: Select
    order: list[str] = field(default_factory=list)
    limit: int | None = None
    kind: str = "set operation"

    def sql(self) -> str:
        text = f"{self.left.sql()} {self.op} {self.right.sql()}"
        if self.order:
            text += " ORDER BY " + ", ".join(self.order)
        if self.limit is not None:
            text += f" LIMIT {self.limit}"
        return text

    @property
    def ordered(self) -> bool:
        return bool(self.order)

    def smaller(self) -> Iterator[Select | Compound]:
        yield self.left
        yield self.right
        if self.order or self.limit is not None:
            yield dataclasses.replace(self, order=[], limit=None)


Query = Select | Compound
