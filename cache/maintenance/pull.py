"""Retrieval of one maintenance operation (§3.4.1, steps 2-4 of the pipeline): the affected
closure Ω and the rows pulled for it, per view, all inside the coordinator's backend snapshot.

`Pull.converge` pulls MaxAC(Ω) until the pulled rows add no region (the Maintenance Algorithm);
`Pull.children` then pulls, parents first, the gray children of the pulled rows and the
view-level children of changed parents. Nothing is written here: `cache.maintenance.apply`
applies the staged rows.
"""

from __future__ import annotations

import typing as t

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from cache.maintenance.engines import Coordinator, Engine, PullQuery
from cache.store.budget import pulled_copies
from control_tables.closure import (
    affected_closure_safe,
    control_values,
    max_affected_closure_safe,
)
from control_tables.kinds import RegionKind
from control_tables.regions import Region, guarantees, in_list, order_key, region_predicate
from control_tables.schema import CachedView, CacheSchema
from control_tables.types import transfer_type
from optimizer.derived.delta import copies, copy_name, tables_read
from optimizer.derived.states import layout, pull_select
from sql_ext.catalog import Catalog
from sql_ext.quoting import ident, idents, qualified


class Pull:
    """Retrieval state of one operation: the closure Ω and the rows staged per view."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        engine: Engine,
        schema: CacheSchema,
        catalog: Catalog,
        coordinator: Coordinator,
    ) -> None:
        self.con = con
        self.engine = engine
        self.schema = schema
        self.catalog = catalog
        self.coordinator = coordinator
        self.omega: set[Region] = set()
        self.fetched: set[Region] = set()  # pulled already in this snapshot: not again
        self.staged: dict[str, pa.Table] = {}
        # the copies of tables pulled (their view states' names), each with the DuckDB table
        # holding it (its own, or the base view that is the copy, `optimizer.derived.delta`)
        self.copies: dict[str, str] = {}
        self.rounds = 0

    def query(self, view: CachedView, predicate: str) -> PullQuery:
        return pull_query(view, predicate, self.catalog)

    def fetch(self, queries: list[PullQuery]) -> None:
        if not queries:
            return
        for query, rows in zip(queries, self.engine.pull(self.coordinator, queries), strict=True):
            previous = self.staged.get(query.view)
            self.staged[query.view] = (
                rows
                if previous is None or query.view not in self.schema.views  # (a copy: whole)
                else union_by_key(previous, rows, self.schema.views[query.view].key)
            )

    def converge(self, omega: set[Region], seeds: set[Region]) -> None:
        """Steps 2-3: pull MaxAC(Ω) until the pulled rows add no region (all in one snapshot)."""
        self.omega = set(omega)
        while True:
            self.rounds += 1
            wanted = max_affected_closure_safe(self.con, self.schema, self.omega) | seeds
            self.fetch(self.retrieval(wanted - self.fetched))
            self.fetched |= wanted
            delta = self._regions_of_staged() - self.omega
            if not delta:
                return
            self.omega |= affected_closure_safe(self.con, self.schema, delta)

    def children(self) -> None:
        """Step 4, parents first: gray children follow the pulled parent rows; a view-level
        child of a changed parent is pulled whole with the parent keys it will have."""
        for name in self.schema.topological_order():
            view = self.schema.views[name]
            parents = self.schema.parents(name)
            if not parents:
                continue
            if not any(self._changes(p) for p in parents):
                continue
            if view.is_gray:
                edge = view.presence[0]
                keys = set(distinct_rows(self.staged.get(edge.control), edge.control_columns))
                keys |= {r.values for r in self.omega if r.view == name}
                self.omega |= {
                    Region(name, RegionKind.PRESENCE, edge.columns, k, edge.control) for k in keys
                }
                predicate = in_list(edge.columns, sorted(keys, key=repr)).sql("postgres")
                self.fetch([self.query(view, predicate)])
            else:
                self.omega.add(Region(name, RegionKind.VIEW))
                self.fetch([self.query(view, self._view_level_predicate(view))])

    def _changes(self, view: str) -> bool:
        """Does this operation replace any row of the view (pulled rows, or cached rows of
        regions it refreshes)?"""
        staged = self.staged.get(view)
        if staged is not None and staged.num_rows:
            return True
        regions = {r for r in self.omega if r.view == view}
        if not regions:
            return False
        predicate = region_predicate(regions).sql("duckdb")
        row = self.con.execute(f"SELECT count(*) FROM {ident(view)} WHERE {predicate}").fetchone()
        return bool(row and row[0])

    def retrieval(self, wanted: set[Region]) -> list[PullQuery]:
        """Queries for the wanted regions of white views, one per view (§3.4.1: presence,
        consistency and completeness queries, OR-ed). The presence regions of a view are one
        IN list per control key (PostgreSQL hashes a long list; an OR of one comparison per
        key is evaluated term by term for every row: 150,000 admitted keys never finished)."""
        by_view: dict[str, list[str]] = {}
        present: dict[tuple[str, tuple[str, ...]], list[tuple[t.Any, ...]]] = {}
        brought, copied = self._copied(wanted)
        for name in copied:  # (a copy comes with every key its readers hold, in one snapshot)
            view = self.schema.views[name]
            if view.view_level:
                self.omega.add(Region(name, RegionKind.VIEW))
                wanted = wanted | {Region(name, RegionKind.VIEW)}
            for edge in view.presence:
                listed = {
                    Region(name, RegionKind.PRESENCE, edge.columns, k, edge.control)
                    for k in control_values(self.con, edge.control, edge.control_columns)
                }
                self.omega |= listed
                wanted = wanted | listed
        for region in sorted(wanted, key=order_key):
            view = self.schema.views[region.view]
            if view.is_gray:
                continue  # pulled top-down from its parent's rows
            predicates = by_view.setdefault(region.view, [])
            if region.kind == RegionKind.PRESENCE:
                present.setdefault((region.view, region.columns), []).append(region.values)
            else:
                predicates.append(self._region_query(view, region))
        for (name, columns), values in present.items():
            by_view[name].insert(0, in_list(columns, values).sql("postgres"))
        queries = [
            self.query(self.schema.views[name], " OR ".join(f"({p})" for p in preds))
            for name, preds in by_view.items()
        ]
        self.copies |= {copy_name(copy.table): copy.name for copy in brought}
        return queries + [
            self._copy_query(copy) for copy in brought if copy.name not in self.schema.views
        ]

    def _copied(self, wanted: set[Region]) -> tuple[list[CachedView], list[str]]:
        """The copies of tables this pull brings (`optimizer.derived.delta.copies`), and the
        continuously maintained derived views that read them, which come whole with them
        (whatever one snapshot pulls of a copy, every view kept from it must be of that
        snapshot too; a view pulled alone is kept from copies the stream keeps, lined up
        with it). A copy comes when a view the pull brings reads it and it was never pulled
        (new, or made again), or when every view reading it comes whole anyway."""
        readers = [v for v in self.schema.views.values() if v.is_derived and v.continuous]
        names = {r.view for r in wanted}
        whole = {r.view for r in wanted if r.kind == RegionKind.VIEW}
        filled = pulled_copies(self.con)
        brought: list[CachedView] = []
        copied: set[str] = set()
        shared = copies(self.schema.views.values(), self.catalog)
        while True:  # (a view a copy brings whole may read another copy never pulled)
            more = False
            for table, copy in shared.items():
                if copy_name(table) in self.copies or copy in brought:
                    continue
                reading = [v for v in readers if table in tables_read(v)]
                # (a base view that is the copy: its pull is the copy's, and brings them)
                held = [copy] if copy.name in self.schema.views else []
                if not names & {v.name for v in [*reading, *held]}:
                    continue
                if (
                    copy_name(table) not in filled
                    or copy.name in names
                    or all(v.view_level and v.name in whole for v in reading)
                ):
                    brought.append(copy)
                    copied |= {v.name for v in [*reading, *held]}
                    names |= {v.name for v in [*reading, *held]}
                    whole |= {v.name for v in [*reading, *held] if v.view_level}
                    more = True
            if not more:
                break
        return brought, sorted(copied)

    def _copy_query(self, copy: CachedView) -> PullQuery:
        """All rows of the copy of a table (`optimizer.derived.delta`)."""
        table = self.catalog.table(copy.table)
        assert table is not None
        types = {c.name: c.type for c in table.columns}
        return PullQuery(
            view=copy.name,
            table=qualified(table.schema, table.name),
            columns=tuple((c, t.cast(str, transfer_type(types[c]))) for c in copy.columns),
            where="TRUE",
            pages=table.pages,
        )

    def _region_query(self, view: CachedView, region: Region) -> str:
        if region.kind == RegionKind.PRESENCE:
            return in_list(region.columns, [region.values]).sql("postgres")
        if region.kind == RegionKind.VIEW:
            return self._view_level_predicate(view)
        # Consistency queries: the presence keys the cache holds inside the region.
        inside = region_predicate([region]).sql("duckdb")
        parts = []
        for edge in view.presence:
            keys = self._distinct_cached(view.name, edge.columns, inside)
            parts.append(in_list(edge.columns, keys).sql("postgres"))
        if region.kind == RegionKind.COMPLETENESS:
            # A listed completeness region holds all of its rows, always: the guard answers a
            # read of its key from it (an empty region would answer "none" for a group the
            # backend has rows in), and the stream adds the rows that join it.
            parts.append(in_list(region.columns, [region.values]).sql("postgres"))
        return " OR ".join(f"({p})" for p in parts) if parts else "FALSE"

    def _view_level_predicate(self, view: CachedView) -> str:
        if view.is_fully_materialized:
            return "TRUE"
        parts = []
        for edge in view.presence:
            if edge.control in self.schema.control_tables:
                keys = control_values(self.con, edge.control, edge.control_columns)
            else:
                keys = self._parent_keys_after(edge.control, edge.control_columns)
            parts.append(in_list(edge.columns, keys).sql("postgres"))
        return " OR ".join(f"({p})" for p in parts) if parts else "FALSE"

    def _parent_keys_after(self, parent: str, columns: tuple[str, ...]) -> list[tuple[t.Any, ...]]:
        """The parent's control-column values once this operation is applied."""
        regions = {r for r in self.omega if r.view == parent}
        kept = region_predicate(regions).sql("duckdb")
        keys = {
            tuple(r)
            for r in self.con.execute(
                f"SELECT DISTINCT {idents(columns)} FROM {ident(parent)} WHERE NOT ({kept})"
            ).fetchall()
        }
        keys |= set(distinct_rows(self.staged.get(parent), columns))
        return sorted(keys, key=repr)

    def _distinct_cached(
        self, view: str, columns: tuple[str, ...], predicate: str
    ) -> list[tuple[t.Any, ...]]:
        return [
            tuple(r)
            for r in self.con.execute(
                f"SELECT DISTINCT {idents(columns)} FROM {ident(view)} "
                f"WHERE {predicate} ORDER BY ALL"
            ).fetchall()
        ]

    def _regions_of_staged(self) -> set[Region]:
        """Regions (listed in control tables, or full guarantees) holding a pulled row."""
        found: set[Region] = set()
        for name, rows in self.staged.items():
            view = self.schema.views.get(name)
            if view is None or view.is_gray or rows.num_rows == 0:  # (None: a derived's copy)
                continue
            for kind, columns, control in guarantees(view):
                if kind == RegionKind.VIEW:
                    found.add(Region(name, RegionKind.VIEW))
                    continue
                values = set(distinct_rows(rows, columns))
                if control is not None:
                    values &= set(control_values(self.con, control, columns))
                found |= {Region(name, kind, columns, v, control) for v in values}
            for edge in view.presence:
                if edge.control in self.schema.control_tables:
                    listed = set(control_values(self.con, edge.control, edge.control_columns))
                    values = set(distinct_rows(rows, edge.columns)) & listed
                    found |= {
                        Region(name, RegionKind.PRESENCE, edge.columns, v, edge.control)
                        for v in values
                    }
        return found


# -- helpers -------------------------------------------------------------------------------------


def pull_query(view: CachedView, predicate: str, catalog: Catalog) -> PullQuery:
    """The backend query of the view's rows that ``predicate`` (PostgreSQL) selects."""
    if view.is_derived:  # (fully materialized: its one region's predicate is TRUE)
        stored = layout(view, catalog)
        return PullQuery(
            view=view.name,
            table=f"({pull_select(view, stored)}) AS mtcache_derived",
            columns=tuple((c.name, t.cast(str, transfer_type(c.pg_type))) for c in stored.columns),
            where=predicate,
        )
    table = catalog.table(view.table)
    assert table is not None
    types = {c.name: c.type for c in table.columns}
    where = predicate
    if view.where is not None:
        where = f"({view.where_sql('postgres')}) AND ({predicate})"
    return PullQuery(
        view=view.name,
        table=qualified(table.schema, table.name),
        columns=tuple((c, t.cast(str, transfer_type(types[c]))) for c in view.columns),
        where=where,
        pages=table.pages,
    )


def distinct_rows(rows: pa.Table | None, columns: tuple[str, ...]) -> list[tuple[t.Any, ...]]:
    if rows is None or rows.num_rows == 0:
        return []
    distinct = rows.select(list(columns)).group_by(list(columns)).aggregate([])
    return list(zip(*(distinct.column(c).to_pylist() for c in columns), strict=True))


def union_by_key(old: pa.Table, new: pa.Table, key: tuple[str, ...]) -> pa.Table:
    """Rows of both, the newer winning per key (pulls of one snapshot agree anyway)."""
    if old.num_rows == 0:
        return new
    if len(key) == 1:
        keep = pc.invert(pc.is_in(old.column(key[0]), value_set=new.column(key[0])))
    else:
        new_keys = set(zip(*(new.column(k).to_pylist() for k in key), strict=True))
        keep = pa.array(
            [k not in new_keys for k in zip(*(old.column(c).to_pylist() for c in key), strict=True)]
        )
    return pa.concat_tables([old.filter(keep), new])
