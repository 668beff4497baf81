"""Cache regions (§3.3.1) and the SQL that selects their rows.

A region is a group of rows of one view that a guarantee holds for: a presence region per
presence control-key value, a consistency or completeness region per control-key value (listed
in a control table, or every value for a full guarantee), and the view-level region of a fully
materialized or CONSISTENCY ON ALL view.
"""

from __future__ import annotations

import datetime as dt
import typing as t
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sqlglot import exp

from control_tables.kinds import RegionKind
from control_tables.schema import CachedView

Key = tuple[t.Any, ...]  # a control-key value
Stamp = tuple[dt.datetime | None, int | None]  # a region's (refreshed_at, snapshot_id)


@dataclass(frozen=True, order=True)
class Region:
    view: str
    kind: RegionKind
    columns: tuple[str, ...] = ()  # view columns the region is defined on; () = view-level
    values: tuple[t.Any, ...] = ()
    control: str | None = None  # the control table (or parent view) listing it; None = full

    def __str__(self) -> str:
        if self.kind == RegionKind.VIEW:
            return f"{self.view}(all rows)"
        pairs = ", ".join(f"{c}={v!r}" for c, v in zip(self.columns, self.values, strict=True))
        return f"{self.view} {self.kind}({pairs})"


def order_key(region: Region) -> tuple[t.Any, ...]:
    """The regions' order as a plain tuple, compared in C (a dataclass's comparison, in
    Python, took seconds to sort 100,000 regions)."""
    return (region.view, region.kind, region.columns, region.values, region.control or "")


def column(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def literal(value: t.Any) -> exp.Expr:
    return exp.convert(value)


def key_text(values: Sequence[t.Any]) -> str:
    """A region's key as messages write it, as SQL would: ``(4)``, ``(1, 'x')``."""
    return "(" + ", ".join(literal(v).sql("postgres") for v in values) + ")"


def in_list(columns: Sequence[str], values: Iterable[tuple[t.Any, ...]]) -> exp.Expr:
    """``(cols) IN ((v1), (v2), ...)``; FALSE for an empty list. A long list of integers and
    strings is written as text at once, not built as a tree of literals (100,000 keys took
    11 s to build and print): the same text in PostgreSQL and DuckDB; a list of composite
    keys as a VALUES list."""
    rows = list(dict.fromkeys(values))
    if not rows:
        return exp.false()
    if len(rows) >= FAST_LIST and all(_plain(v) for r in rows for v in r):
        names = ", ".join(column(c).sql() for c in columns)
        if len(columns) == 1:
            items = ", ".join(_text(r[0]) for r in rows)
            return exp.Var(this=f"{names} IN ({items})")
        # (a VALUES list, which PostgreSQL joins: a list of row literals it expands into an
        # OR of row comparisons, over its stack's depth at 20,000 keys)
        items = ", ".join("(" + ", ".join(_text(v) for v in r) + ")" for r in rows)
        return exp.Var(this=f"({names}) IN (VALUES {items})")
    if len(columns) == 1:
        return exp.In(this=column(columns[0]), expressions=[literal(r[0]) for r in rows])
    return exp.In(
        this=exp.Tuple(expressions=[column(c) for c in columns]),
        expressions=[exp.Tuple(expressions=[literal(v) for v in r]) for r in rows],
    )


FAST_LIST = 64  # a list this long of integers and strings is written as text at once


def _plain(value: t.Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)


def _text(value: t.Any) -> str:
    """An integer's or a string's SQL literal, as `literal` prints it."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def any_of(predicates: Iterable[exp.Expr]) -> exp.Expr:
    parts = [p for p in predicates if not (isinstance(p, exp.Boolean) and not p.this)]
    if not parts:
        return exp.false()
    if any(isinstance(p, exp.Boolean) and p.this for p in parts):
        return exp.true()
    return exp.or_(*parts) if len(parts) > 1 else parts[0]


def region_predicate(regions: Iterable[Region]) -> exp.Expr:
    """A predicate on a view's columns selecting the rows of the given regions (one view)."""
    by_columns: dict[tuple[str, ...], list[tuple[t.Any, ...]]] = {}
    whole = False
    for region in regions:
        if region.kind == RegionKind.VIEW:
            whole = True
        else:
            by_columns.setdefault(region.columns, []).append(region.values)
    if whole:
        return exp.true()
    return any_of(in_list(cols, values) for cols, values in sorted(by_columns.items()))


def guarantees(view: CachedView) -> list[tuple[RegionKind, tuple[str, ...], str | None]]:
    """(kind, columns, control) of the consistency and completeness guarantees of a view
    beyond its presence regions (VIEW for a view-level one)."""
    found: list[tuple[RegionKind, tuple[str, ...], str | None]] = []
    if view.view_level:
        found.append((RegionKind.VIEW, (), None))
    if view.consistency is not None and view.consistency.kind == "on":
        found.append((RegionKind.CONSISTENCY, view.consistency.columns, view.consistency.control))
    if view.completeness is not None:
        found.append(
            (RegionKind.COMPLETENESS, view.completeness.columns, view.completeness.control)
        )
    return found


@dataclass(frozen=True)
class RegionState:
    """Which regions the cache holds at one moment, with their stamps: what run-time guards
    read (a value; `cache.store.region_state` reads it from the cache file).

    ``controls``: every control table's rows (control-key value -> stamp); ``views``: the
    view-level regions; ``parents``: for each (parent view, control columns) that
    presence-controls a child, the control-key values present in the parent's rows, with the
    stamp of the parent region holding them.
    """

    controls: Mapping[str, Mapping[Key, Stamp]] = field(default_factory=dict)
    views: Mapping[str, Stamp] = field(default_factory=dict)
    parents: Mapping[tuple[str, tuple[str, ...]], Mapping[Key, Stamp]] = field(default_factory=dict)
    version: int = 0  # the cache file's change counter it was read at

    def listed(self, control: str, columns: tuple[str, ...]) -> Mapping[Key, Stamp]:
        """The values listed by a control: a control table, or a parent view's rows."""
        found = self.controls.get(control)
        if found is not None:
            return found
        return self.parents.get((control, columns), {})
