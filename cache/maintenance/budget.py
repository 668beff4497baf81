"""Keeping the cache's data within its size budget (``cache_size_limit``).

Inside the transaction of an admission, a refresh or a stream batch, after its rows are in:
if the data's bytes (`cache.store.budget.data_bytes`) pass the limit, whole presence regions
are evicted, with their cascade (`evict.remove_keys`), in the order of
`optimizer.rules.eviction_policy`, until the data is back under the limit with some room
(``ROOM``: one eviction makes space for many admissions, not for one). The transaction commits
both or neither, so no committed state of the file is over the budget, and the guards see an
eviction with the commit that made it (the file's version moves: a statement that decided
before it decides again, `cache.engine.session`).

Never evicted: the regions the operation itself admits, a fully materialized view (it has no
regions to leave), a presence key inside a complete region (the region would lose part of
its rows, §3.2.3). If what is left still passes the limit, an admission or a refresh fails
(`BudgetExceeded`) and the cache is as it was; a stream batch, which must land, lands over
the budget and is counted (``budget_overruns``): the next operation that can evicts.
"""

from __future__ import annotations

import typing as t
from collections.abc import Collection, Iterable, Mapping

import duckdb

from cache.maintenance.evict import remove_keys
from cache.maintenance.report import Report
from cache.store.budget import data_bytes, data_tables
from cache.store.cache_file import CacheStore, count_in
from cache.store.counters import Counter
from control_tables.schema import CachedView, CacheSchema, control_role
from optimizer.rules.eviction_policy import Held, refreshes_per_window, victims
from sql_ext.errors import OperationalError
from sql_ext.quoting import equal_columns, ident, idents, keys_in

Key = tuple[t.Any, ...]

ROOM = 0.05  # an eviction brings the data down to this fraction under the limit


class BudgetExceeded(OperationalError):
    """An admission or refresh would leave the cache's data above its budget, and nothing it
    may evict makes room: nothing was changed."""


def within_budget(
    store: CacheStore,
    schema: CacheSchema,
    report: Report,
    protected: Mapping[str, Collection[Key]] = {},
    strict: bool = True,
) -> None:
    """Inside the operation's transaction (``store.con``'s): evict until the data is within
    the budget (see the module). ``protected``: control table -> keys not to evict."""
    budget = store.budget
    limit = budget.limit
    if limit is None:
        return
    con = store.con
    tables = data_tables(con, schema)
    sizes = data_bytes(con, tables, budget.widths)
    total = sum(sizes.values())
    if total <= limit:
        return
    target = int(limit * (1 - ROOM))
    evicted: dict[str, list[Key]] = {}
    touched: set[str] = set()
    protected_keys = {(c, k) for c, keys in protected.items() for k in keys}
    excluded = set(protected_keys)
    while total > limit:
        held = [
            h
            for h in _held(con, schema, budget.widths, budget.hits.worths, budget.hits.half_life)
            if (h.control, h.key) not in excluded
        ]
        chosen = victims(held, total - target)
        if not chosen:
            break
        for control, keys in _by_control(chosen).items():
            view, role, columns = control_role(schema, control)
            touched.update(remove_keys(con, schema, view, role, control, columns, keys, report))
            evicted.setdefault(control, []).extend(keys)
            excluded |= {(control, k) for k in keys}
        sizes = data_bytes(con, tables, budget.widths)
        total = sum(sizes.values())
    count = sum(len(keys) for keys in evicted.values())
    amounts = {Counter.EVICTIONS: count}
    if total > limit:
        if strict:
            left = _held(con, schema, budget.widths, _nothing, 1.0)
            admitted = sum(h.bytes for h in left if (h.control, h.key) in protected_keys)
            fixed = total - sum(h.bytes for h in left)
            raise BudgetExceeded(
                f"{report.operation}: the cache's data would take {total:,} bytes, above its "
                f"cache_size_limit of {limit:,}, with every region it may evict gone "
                f"({admitted:,} bytes are the regions being admitted, {fixed:,} fully "
                "materialized views and copies); nothing was changed. Raise "
                "cache_size_limit, or admit fewer keys"
            )
        amounts[Counter.BUDGET_OVERRUNS] = 1
    count_in(con, amounts)
    if touched:
        store.changed(sorted(touched))
    for control, keys in evicted.items():  # (their reads are kept: `RegionHits`)
        report.evicted[control] = report.evicted.get(control, 0) + len(keys)
    report.data_bytes = total


def _nothing(control: str, keys: list[Key]) -> list[tuple[float, float]]:
    return [(0.0, 0.0)] * len(keys)


# (control, keys) -> (reads, saved per hit) of each
Worth = t.Callable[[str, list[Key]], list[tuple[float, float]]]


def _held(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    widths: Mapping[str, tuple[int, float]],
    worth: Worth,
    window: float,
) -> list[Held]:
    """Every presence region the budget may evict, with its rows, bytes (``widths``: each
    view's bytes per row, `data_bytes`') and worth."""
    found: list[Held] = []
    for view in schema.views.values():
        if view.is_fully_materialized:
            continue
        width = widths.get(view.name, (0, 0.0))[1]
        refreshes = refreshes_per_window(view.refresh_seconds, window, schema.continuous(view.name))
        kept = _inside_complete_regions(con, view)
        for edge in view.presence:
            if edge.control not in schema.control_tables:
                continue  # (a parent view's rows control it: they leave with their region)
            keys = idents(edge.control_columns, "c")
            match = equal_columns(edge.columns, "v", "c", edge.control_columns)
            counted = [
                (tuple(key), int(rows))
                for *key, rows in con.execute(
                    f"SELECT {keys}, count(v.{ident(edge.columns[0])}) FROM "
                    f"{ident(edge.control)} c LEFT JOIN {ident(view.name)} v ON {match} "
                    "GROUP BY ALL"
                ).fetchall()
            ]
            if kept is not None:
                counted = [(k, r) for k, r in counted if (edge.control, k) not in kept]
            worths = worth(edge.control, [k for k, _ in counted])
            found += [
                Held(edge.control, key, rows, int(rows * width), hits, saved, refreshes)
                for (key, rows), (hits, saved) in zip(counted, worths, strict=True)
            ]
    return found


def _inside_complete_regions(
    con: duckdb.DuckDBPyConnection, view: CachedView
) -> set[tuple[str, Key]] | None:
    """The presence keys whose rows lie in a complete region of the view (evicting one
    would leave that region incomplete), None when the view has no completeness."""
    spec = view.completeness
    if spec is None:
        return None
    found: set[tuple[str, Key]] = set()
    for edge in view.presence:
        sql = f"SELECT DISTINCT {idents(edge.columns, 'v')} FROM {ident(view.name)} v"
        if spec.control is not None:
            sql += f" WHERE {keys_in(spec.columns, 'v', ident(spec.control))}"
        found |= {(edge.control, tuple(r)) for r in con.execute(sql).fetchall()}
    return found


def _by_control(chosen: Iterable[Held]) -> dict[str, list[Key]]:
    found: dict[str, list[Key]] = {}
    for region in chosen:
        found.setdefault(region.control, []).append(region.key)
    return found
