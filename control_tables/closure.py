"""Affected closure AC(U) and maximal affected closure MaxAC(U) (§3.4.1, Theorem 4.2).

Two algorithms over the same cache instance (the DuckDB file):

* `affected_closure` / `max_affected_closure` work for any schema: they enumerate every region
  of every view with its row set, close over overlap and consistency-wise correlation, and pick
  maxima by row-set containment, as the definitions say. Cost grows with the cache.
* `affected_closure_safe` / `max_affected_closure_safe` use what Rules 1-5 guarantee (regions of
  a view nest; a gray view's presence regions partition it): one top-down pass of small SQL
  queries touching only the rows involved. The refresh pipeline uses these.

Tests check that both give the same answer on safe schemas.
"""

from __future__ import annotations

import typing as t
from collections.abc import Iterable

import duckdb

from control_tables.kinds import RegionKind
from control_tables.regions import Region, guarantees, order_key, region_predicate
from control_tables.schema import CachedView, CacheSchema
from sql_ext.quoting import ident, idents

RowId = tuple[str, tuple[t.Any, ...]]  # (view, key values)


# -- the general algorithm ---------------------------------------------------------------------


def enumerate_regions(
    con: duckdb.DuckDBPyConnection, schema: CacheSchema
) -> dict[Region, frozenset[RowId]]:
    """Every region of every view, with the rows (by key) it holds now."""
    found: dict[Region, frozenset[RowId]] = {}
    for name in schema.topological_order():
        view = schema.views[name]
        rows = _rows(con, view)
        for edge in view.presence:
            for values in control_values(con, edge.control, edge.control_columns):
                region = Region(name, RegionKind.PRESENCE, edge.columns, values, edge.control)
                found[region] = _matching(name, rows, view, edge.columns, values)
        for kind, columns, control in guarantees(view):
            if kind == RegionKind.VIEW:
                found[Region(name, RegionKind.VIEW)] = frozenset((name, key) for key, _ in rows)
                continue
            listed = (
                control_values(con, control, columns)
                if control is not None
                else sorted({tuple(r[c] for c in columns) for _, r in rows}, key=repr)
            )
            for values in listed:
                region = Region(name, kind, columns, values, control)
                found[region] = _matching(name, rows, view, columns, values)
    return found


def correlated(
    con: duckdb.DuckDBPyConnection, schema: CacheSchema, regions: dict[Region, frozenset[RowId]]
) -> dict[Region, set[Region]]:
    """Consistency-wise correlation: a gray view's presence region for parent key p and every
    region of the parent holding the parent row(s) with key p (both directions)."""
    links: dict[Region, set[Region]] = {r: set() for r in regions}
    for child in schema.views.values():
        if not child.is_gray:
            continue
        edge = child.presence[0]
        parent = schema.views[edge.control]
        by_value: dict[tuple[t.Any, ...], set[RowId]] = {}
        for key, row in _rows(con, parent, extra=edge.control_columns):
            value = tuple(row[c] for c in edge.control_columns)
            by_value.setdefault(value, set()).add((parent.name, key))
        for region, _ in regions.items():
            if region.view != child.name or region.kind != RegionKind.PRESENCE:
                continue
            parent_rows = by_value.get(region.values, set())
            for other, rows in regions.items():
                if other.view == parent.name and rows & parent_rows:
                    links[region].add(other)
                    links[other].add(region)
    return links


def affected_closure(
    con: duckdb.DuckDBPyConnection, schema: CacheSchema, seeds: Iterable[Region]
) -> tuple[set[Region], dict[Region, frozenset[RowId]]]:
    """AC(U): U, every region overlapping a member, every region correlated with a member,
    transitively. Returns the closure and the region row sets it was computed on."""
    regions = enumerate_regions(con, schema)
    links = correlated(con, schema, regions)
    result = set(seeds)
    frontier = list(result)
    while frontier:
        current = frontier.pop()
        rows = regions.get(current, frozenset())
        candidates = set(links.get(current, ()))
        if rows:
            candidates |= {r for r, rs in regions.items() if r.view == current.view and rs & rows}
        for region in candidates - result:
            result.add(region)
            frontier.append(region)
    return result, regions


def max_affected_closure(
    omega: set[Region], regions: dict[Region, frozenset[RowId]]
) -> set[Region]:
    """MaxAC (§3.4.1): the regions whose remote queries refresh all of Ω.

    Strongest first, a region is kept unless its rows lie inside a kept region of its view. A
    region inside another is retrieved by that region's queries (Lemma 4.1), so the
    constructing step's presence regions under a consistency region and the cleaning step's
    consistency regions under a completeness region both drop out. Two exceptions: a
    completeness region is only ever covered by another completeness region (its query fetches
    rows the cache does not hold yet), and an empty region (just admitted) is always kept.
    """

    def rows(region: Region) -> frozenset[RowId]:
        return regions.get(region, frozenset())

    kept: list[Region] = []
    for region in sorted(omega, key=lambda r: (-r.kind.strength, -len(rows(r)), order_key(r))):
        containers = [
            k
            for k in kept
            if k.view == region.view
            and (region.kind != RegionKind.COMPLETENESS or k.kind == RegionKind.COMPLETENESS)
        ]
        if rows(region) and any(rows(region) <= rows(k) for k in containers):
            continue
        kept.append(region)
    return set(kept)


def _rows(
    con: duckdb.DuckDBPyConnection, view: CachedView, extra: tuple[str, ...] = ()
) -> list[tuple[tuple[t.Any, ...], dict[str, t.Any]]]:
    columns = list(dict.fromkeys([*view.key, *view.columns, *extra]))
    result = []
    for record in con.execute(f"SELECT {idents(columns)} FROM {ident(view.name)}").fetchall():
        row = dict(zip(columns, record, strict=True))
        result.append((tuple(row[k] for k in view.key), row))
    return result


def _matching(
    name: str,
    rows: list[tuple[tuple[t.Any, ...], dict[str, t.Any]]],
    view: CachedView,
    columns: tuple[str, ...],
    values: tuple[t.Any, ...],
) -> frozenset[RowId]:
    return frozenset((name, key) for key, row in rows if tuple(row[c] for c in columns) == values)


def control_values(
    con: duckdb.DuckDBPyConnection, control: str, columns: tuple[str, ...]
) -> list[tuple[t.Any, ...]]:
    """The distinct values of columns of a control table (or a parent view), in order."""
    sql = f"SELECT DISTINCT {idents(columns)} FROM {ident(control)} ORDER BY ALL"
    return [tuple(r) for r in con.execute(sql).fetchall()]


# -- the one-pass algorithm for safe schemas -----------------------------------------------------


def affected_closure_safe(
    con: duckdb.DuckDBPyConnection, schema: CacheSchema, seeds: Iterable[Region]
) -> set[Region]:
    """AC(U) top-down in one pass (Theorem 4.2): per white view, the regions enclosing the
    seeds' rows and every region inside those; then the gray descendants' regions controlled
    by the rows of the closure, level by level."""
    result = set(seeds)
    for name in schema.topological_order():
        view = schema.views[name]
        mine = {r for r in result if r.view == name}
        if not mine:
            continue
        if not view.is_gray:
            result |= _enclosing_and_contained(con, schema, view, mine)
            mine = {r for r in result if r.view == name}
        for child, edge in schema.edges_from(name):
            if not child.is_gray:
                continue  # white children are not correlated (the pipeline cascades to them)
            predicate = region_predicate(mine).sql(dialect="duckdb")
            keys = _distinct(con, name, edge.control_columns, predicate)
            result |= {Region(child.name, RegionKind.PRESENCE, edge.columns, k, name) for k in keys}
    return result


def _enclosing_and_contained(
    con: duckdb.DuckDBPyConnection, schema: CacheSchema, view: CachedView, seeds: set[Region]
) -> set[Region]:
    found = set(seeds)
    touched = region_predicate(seeds).sql(dialect="duckdb")
    for kind, columns, control in guarantees(view):
        if kind == RegionKind.VIEW:
            if con.execute(
                f"SELECT 1 FROM {ident(view.name)} v WHERE ({touched}) LIMIT 1"
            ).fetchone():
                found.add(Region(view.name, RegionKind.VIEW))
            continue
        for values in _distinct(con, view.name, columns, touched, control):
            found.add(Region(view.name, kind, columns, values, control))
    # Everything inside the enclosing regions is affected too: it overlaps them.
    enclosing = region_predicate(found).sql(dialect="duckdb")
    for edge in view.presence:
        for values in _distinct(
            con, view.name, edge.columns, enclosing, edge.control, edge.control_columns
        ):
            found.add(Region(view.name, RegionKind.PRESENCE, edge.columns, values, edge.control))
    for kind, columns, control in guarantees(view):
        if kind != RegionKind.VIEW:
            for values in _distinct(con, view.name, columns, enclosing, control):
                found.add(Region(view.name, kind, columns, values, control))
    return found


def _distinct(
    con: duckdb.DuckDBPyConnection,
    view: str,
    columns: tuple[str, ...],
    predicate: str,
    control: str | None = None,
    control_columns: tuple[str, ...] | None = None,
) -> list[tuple[t.Any, ...]]:
    """Distinct values of columns among the view's rows matching predicate; with a control,
    only values listed there."""
    sql = f"SELECT DISTINCT {idents(columns, 'v')} FROM {ident(view)} v WHERE ({predicate})"
    if control is not None:  # (IN, not a correlated EXISTS: DuckDB hashes the one)
        sql += (
            f" AND ({idents(columns, 'v')}) IN (SELECT {idents(control_columns or columns)} "
            f"FROM {ident(control)})"
        )
    return [tuple(r) for r in con.execute(sql + " ORDER BY ALL").fetchall()]


def max_affected_closure_safe(
    con: duckdb.DuckDBPyConnection, schema: CacheSchema, omega: set[Region]
) -> set[Region]:
    """MaxAC with the same rule as `max_affected_closure`, kind by kind: in a safe view the
    regions of one kind are disjoint and those of different kinds nest, so one containment
    query per region against the stronger kinds decides. A gray view's presence regions
    partition it (Rule 4): all are kept."""
    result: set[Region] = set()
    for name in schema.topological_order():
        mine = {r for r in omega if r.view == name}
        if schema.views[name].is_gray:
            result |= mine
            continue
        strongest, *weaker = RegionKind.strongest_first()  # completeness, then the rest
        kept = {r for r in mine if r.kind == strongest}
        for kind in weaker:
            candidates = {r for r in mine if r.kind == kind}
            kept |= candidates - _inside(con, name, candidates, kept)
        result |= kept
    return result


def _inside(
    con: duckdb.DuckDBPyConnection, view: str, mine: set[Region], others: set[Region]
) -> set[Region]:
    """The regions of ``mine`` whose (non-empty) rows all lie inside the union of others: one
    query per set of region columns (an admission of 150,000 keys made one per region)."""
    if not others or not mine:
        return set()
    theirs = region_predicate(others).sql(dialect="duckdb")
    found: set[Region] = set()
    by_columns: dict[tuple[str, ...], list[Region]] = {}
    for region in mine:
        by_columns.setdefault(region.columns, []).append(region)
    for columns, group in by_columns.items():
        if not columns:  # view-level: one region, all rows
            row = con.execute(
                f"SELECT count(*), count(*) FILTER (WHERE NOT ({theirs})) FROM {ident(view)}"
            ).fetchone()
            if row is not None and row[0] and not row[1]:
                found.update(group)
            continue
        inside = {
            tuple(r[:-1])
            for r in con.execute(
                f"SELECT {idents(columns)}, count(*) FILTER (WHERE NOT ({theirs})) "
                f"FROM {ident(view)} WHERE {region_predicate(group).sql(dialect='duckdb')} "
                "GROUP BY ALL"
            ).fetchall()
            if not r[-1]
        }
        found.update(r for r in group if r.values in inside)
    return found
