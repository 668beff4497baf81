"""Pull maintenance (§3.4.1, SPEC §7): admission, eviction and refresh of cache regions.

One operation = one backend snapshot and one DuckDB transaction:

1. open a REPEATABLE READ, READ ONLY transaction on the backend and export its snapshot;
   ``refreshed_at`` is that statement's start time, never later than the snapshot (so currency
   errs towards older);
2. compute AC(U) on the cache instance (one pass: the schema is safe) and retrieve MaxAC(U);
3. Maintenance Algorithm: while the pulled rows fall into regions outside the closure (a row
   moved to another city), widen the closure and pull again, inside the same snapshot;
4. top-down, pull the gray children controlled by the pulled rows, and re-pull view-level
   children whose parents changed (no child row outlives its parent region);
5. apply the Maintenance Rule in one DuckDB transaction: delete the rows of AC(U) and rows whose
   keys reappear, insert the pulled rows, stamp control rows with refreshed_at and snapshot_id.

Any failure before the DuckDB commit leaves the cache file exactly as it was.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
import typing as t
from collections.abc import Iterable
from dataclasses import dataclass, field

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from cache import faults
from cache.backend_catalog import connect_backend
from cache.copy_arrow import copy_to_arrow, select_list
from cache.errors import (
    BackendUnavailableError,
    OperationalError,
    ProgrammingError,
    first_line,
    translate,
)
from cache.store import CacheStore
from control_tables.closure import (
    affected_closure_safe,
    control_values,
    max_affected_closure_safe,
)
from control_tables.regions import Region, guarantees, in_list, region_predicate
from control_tables.schema import CachedView, CacheSchema
from control_tables.types import duckdb_type
from optimizer.catalog import Catalog


@dataclass(frozen=True)
class Snapshot:
    backend_time: dt.datetime
    exported: str  # pg_export_snapshot(): other sessions join it with SET TRANSACTION SNAPSHOT
    pg_snapshot: str  # pg_current_snapshot() as text, kept for the record


@dataclass(frozen=True)
class PullQuery:
    view: str
    table: str  # backend table (schema-qualified)
    columns: tuple[tuple[str, str], ...]  # (column, DuckDB type) in view order
    where: str  # PostgreSQL predicate: the view's WHERE and the regions'
    pages: int = 0  # backend heap pages: lets an engine split a large pull by block range

    def sql(self, extra: str | None = None) -> str:
        where = self.where if extra is None else f"({self.where}) AND ({extra})"
        return f"SELECT {select_list(list(self.columns))} FROM {self.table} WHERE {where}"


class Engine(t.Protocol):
    """Runs pulls inside the coordinator's snapshot and returns one Arrow table per query."""

    name: str

    def pull(self, coordinator: Coordinator, queries: list[PullQuery]) -> list[pa.Table]: ...


class Coordinator:
    """The backend side of one operation: a REPEATABLE READ transaction whose snapshot every
    pull of the operation reads, exported for engines that pull from other sessions."""

    def __init__(self, dsn: str, enabled_faults: frozenset[str]) -> None:
        self.dsn = dsn
        self.faults = enabled_faults
        self.conn = connect_backend(dsn, autocommit=False)
        try:
            self.conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            row = self.conn.execute(
                "SELECT statement_timestamp(), pg_export_snapshot(), pg_current_snapshot()::text"
            ).fetchone()
        except psycopg.Error as exc:
            self.conn.close()
            raise translate(exc, "opening the refresh snapshot on the backend") from exc
        assert row is not None
        self.snapshot = Snapshot(row[0], row[1], row[2])

    def terminate_session(self) -> None:
        """Have the backend end this session (fault injection: a real disconnect)."""
        pid = self.conn.info.backend_pid
        with psycopg.connect(self.dsn, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))

    def close(self) -> None:
        try:
            self.conn.rollback()
        finally:
            self.conn.close()


class InlineEngine:
    """Pulls in this process over the coordinator's own connection (psycopg COPY into Arrow):
    for small on-demand pulls such as a presence miss's admission."""

    name = "inline"

    def pull(self, coordinator: Coordinator, queries: list[PullQuery]) -> list[pa.Table]:
        return [
            copy_to_arrow(coordinator.conn, query.sql(), list(query.columns)) for query in queries
        ]


def make_engine(name: str, master: str | None = None) -> Engine:
    if name == "inline":
        return InlineEngine()
    if name == "spark":
        from cache.spark_engine import DEFAULT_MASTER, SparkEngine

        return SparkEngine(master or DEFAULT_MASTER)
    raise ProgrammingError(f"unknown refresh engine {name!r}: use spark or inline")


@dataclass
class Report:
    """What one operation did."""

    operation: str
    engine: str
    snapshot_id: int | None = None
    backend_time: dt.datetime | None = None
    regions: list[str] = field(default_factory=list)
    rows_deleted: dict[str, int] = field(default_factory=dict)
    rows_inserted: dict[str, int] = field(default_factory=dict)
    rounds: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, t.Any]:
        return {
            "operation": self.operation,
            "engine": self.engine,
            "snapshot_id": self.snapshot_id,
            "backend_time": self.backend_time.isoformat() if self.backend_time else None,
            "regions": self.regions,
            "rows_deleted": self.rows_deleted,
            "rows_inserted": self.rows_inserted,
            "rounds": self.rounds,
            "seconds": round(self.seconds, 3),
        }


class Maintainer:
    """Admission, eviction and refresh over one cache file and its backend."""

    def __init__(
        self,
        store: CacheStore,
        dsn: str,
        engine: Engine | None = None,
        faults_enabled: Iterable[str] = (),
    ) -> None:
        self.store = store
        self.dsn = dsn
        self.engine: Engine = engine or InlineEngine()
        self.faults = faults.active(faults_enabled)

    # -- the three operations -----------------------------------------------------------------

    def admit(self, control: str, values: list[tuple[t.Any, ...]]) -> Report:
        """Add control-key values and pull the regions they define (and their closure)."""
        schema = self.store.load_schema()
        view, role, columns = control_role(schema, control)
        values = [_coerce_key(self.store, control, columns, v) for v in values]
        seeds = {Region(view.name, role, _view_columns(view, role, control), v, control)
                 for v in values}  # fmt: skip
        return self._run(f"admit {control}", schema, seeds, admitted={control: values})

    def evict(self, control: str, values: list[tuple[t.Any, ...]]) -> Report:
        """Remove control-key values; for presence, their rows and, transitively, the rows of
        the children they control. Needs no backend."""
        started = time.monotonic()
        schema = self.store.load_schema()
        view, role, columns = control_role(schema, control)
        values = [_coerce_key(self.store, control, columns, v) for v in values]
        report = Report(operation=f"evict {control}", engine="none")
        if role == "presence":
            _refuse_breaking_completeness(self.store, view, control, columns, values)
        try:
            with self.store.transaction() as con:
                con.execute(
                    f'DELETE FROM "{control}" WHERE {in_list(columns, values).sql("duckdb")}'
                )
                if role == "presence":
                    _evict_presence(con, schema, view, report)
                faults.hit("before_commit", self.faults)
        except faults.InjectedFault:
            raise
        except Exception as exc:
            raise _as_error(exc, "evicting") from exc
        self.store.bump()
        report.regions = [f"{control}{v}" for v in values]
        report.seconds = time.monotonic() - started
        return report

    def refresh(
        self, view_name: str | None = None, keys: list[tuple[t.Any, ...]] | None = None
    ) -> Report:
        """Refresh one view's regions (all, or those of the given presence keys), or every
        white view when no view is named."""
        schema = self.store.load_schema()
        if view_name is None:
            names = [v for v in schema.topological_order() if not schema.views[v].is_gray]
        else:
            if view_name not in schema.views:
                known = ", ".join(sorted(schema.views)) or "none"
                raise ProgrammingError(f"no cached view {view_name!r} (cached views: {known})")
            view = schema.views[view_name]
            if view.is_gray:
                root = schema.consistency_root(view_name)
                raise ProgrammingError(
                    f"{view_name} is gray: its regions are consistent with {root}'s and are "
                    f"refreshed with them; refresh {root} instead (§3.4.1: only white views "
                    "are refreshed directly)"
                )
            names = [view_name]
        seeds: set[Region] = set()
        for name in names:
            seeds |= _all_regions(self.store, schema.views[name], keys if view_name else None)
        label = f"refresh {view_name or 'all'}" + (f" keys {keys}" if keys else "")
        return self._run(label, schema, seeds, admitted={})

    # -- the pipeline -------------------------------------------------------------------------

    def _run(
        self,
        label: str,
        schema: CacheSchema,
        seeds: set[Region],
        admitted: dict[str, list[tuple[t.Any, ...]]],
    ) -> Report:
        started = time.monotonic()
        catalog = self.store.load_catalog()
        report = Report(operation=label, engine=self.engine.name)
        coordinator = Coordinator(self.dsn, self.faults)
        try:
            if "after_snapshot:disconnect" in self.faults:
                coordinator.terminate_session()
            faults.hit("after_snapshot", self.faults)
            pull = _Pull(self, schema, catalog, coordinator)
            # Admitted rows exist for the closure computation only inside the apply
            # transaction; until then new control rows are seeds on their own.
            omega = affected_closure_safe(self.store.con, schema, seeds)
            pull.converge(omega, seeds)
            pull.children()
            faults.hit("after_pull", self.faults)
            self._apply(schema, pull, admitted, coordinator.snapshot, report)
        except faults.InjectedFault:
            raise
        except psycopg.OperationalError as exc:
            raise BackendUnavailableError(
                f"{label}: lost the backend during the pull ({first_line(exc)}); the cache "
                "is unchanged, try again when the backend is back"
            ) from exc
        except Exception as exc:
            raise _as_error(exc, label) from exc
        finally:
            # A lost connection is gone already; nothing was written through it.
            with contextlib.suppress(psycopg.Error):
                coordinator.close()
        report.rounds = pull.rounds
        report.regions = sorted(str(r) for r in pull.omega)
        report.seconds = time.monotonic() - started
        return report

    def _apply(
        self,
        schema: CacheSchema,
        pull: _Pull,
        admitted: dict[str, list[tuple[t.Any, ...]]],
        snapshot: Snapshot,
        report: Report,
    ) -> None:
        """The Maintenance Rule's step 2, in one DuckDB transaction."""
        con = self.store.con
        with self.store.transaction():
            row = con.execute(
                "SELECT coalesce(max(snapshot_id), 0) + 1 FROM mtcache.snapshots"
            ).fetchone()
            assert row is not None
            snapshot_id = int(row[0])
            con.execute(
                "INSERT INTO mtcache.snapshots VALUES (?, ?, ?, ?, now())",
                [snapshot_id, snapshot.backend_time, snapshot.pg_snapshot, self.engine.name],
            )
            stamp = [snapshot.backend_time, snapshot_id]
            for control, values in admitted.items():
                columns = schema.control_tables[control].column_names
                cols = ", ".join(f'"{c}"' for c in columns)
                for value in values:
                    con.execute(
                        f'INSERT INTO "{control}" ({cols}, refreshed_at, snapshot_id) '
                        f"VALUES ({', '.join('?' for _ in columns)}, ?, ?) ON CONFLICT DO NOTHING",
                        [*value, *stamp],
                    )
            for name in schema.topological_order():
                view = schema.views[name]
                regions = {r for r in pull.omega if r.view == name}
                staged = pull.staged.get(name)
                if not regions and staged is None:
                    continue
                deleted = _delete_rows(con, view, regions, staged)
                inserted = 0
                if staged is not None and staged.num_rows:
                    con.register("mtcache_staged", staged)
                    cols = ", ".join(f'"{c}"' for c in view.columns)
                    con.execute(f'INSERT INTO "{name}" ({cols}) SELECT {cols} FROM mtcache_staged')
                    con.unregister("mtcache_staged")
                    inserted = staged.num_rows
                report.rows_deleted[name] = deleted
                report.rows_inserted[name] = inserted
                _stamp_regions(con, schema, view, regions, staged, stamp)
                if view.view_level and (Region(name, "view") in regions):
                    con.execute(
                        "INSERT OR REPLACE INTO mtcache.view_state VALUES (?, ?, ?)",
                        [name, *stamp],
                    )
            faults.hit("before_commit", self.faults)
        self.store.bump()
        report.snapshot_id = snapshot_id
        report.backend_time = snapshot.backend_time


class _Pull:
    """Retrieval state of one operation: the closure Ω and the rows staged per view."""

    def __init__(
        self, owner: Maintainer, schema: CacheSchema, catalog: Catalog, coordinator: Coordinator
    ) -> None:
        self.owner = owner
        self.schema = schema
        self.catalog = catalog
        self.coordinator = coordinator
        self.con = owner.store.con
        self.omega: set[Region] = set()
        self.fetched: set[Region] = set()  # pulled already in this snapshot: not again
        self.staged: dict[str, pa.Table] = {}
        self.rounds = 0

    def query(self, view: CachedView, predicate: str) -> PullQuery:
        table = self.catalog.table(view.table)
        assert table is not None
        types = {c.name: c.type for c in table.columns}
        where = predicate
        if view.where is not None:
            where = f"({view.where_sql('postgres')}) AND ({predicate})"
        return PullQuery(
            view=view.name,
            table=f'"{table.schema}"."{table.name}"',
            columns=tuple((c, t.cast(str, duckdb_type(types[c]))) for c in view.columns),
            where=where,
            pages=table.pages,
        )

    def fetch(self, queries: list[PullQuery]) -> None:
        if not queries:
            return
        for query, rows in zip(queries, self.owner.engine.pull(self.coordinator, queries),
                               strict=True):  # fmt: skip
            previous = self.staged.get(query.view)
            self.staged[query.view] = (
                rows
                if previous is None
                else _union_by_key(previous, rows, self.schema.views[query.view].key)
            )

    def converge(self, omega: set[Region], seeds: set[Region]) -> None:
        """Steps 2-3: pull MaxAC(Ω) until the pulled rows add no region (all in one snapshot)."""
        self.omega = set(omega)
        while True:
            self.rounds += 1
            wanted = max_affected_closure_safe(self.con, self.schema, self.omega) | seeds
            self.fetch(self._retrieval(wanted - self.fetched))
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
                keys = set(_distinct_rows(self.staged.get(edge.control), edge.control_columns))
                keys |= {r.values for r in self.omega if r.view == name}
                self.omega |= {
                    Region(name, "presence", edge.columns, k, edge.control) for k in keys
                }
                predicate = in_list(edge.columns, sorted(keys, key=repr)).sql("postgres")
                self.fetch([self.query(view, predicate)])
            else:
                self.omega.add(Region(name, "view"))
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
        row = self.con.execute(f'SELECT count(*) FROM "{view}" WHERE {predicate}').fetchone()
        return bool(row and row[0])

    def _retrieval(self, wanted: set[Region]) -> list[PullQuery]:
        """Queries for the wanted regions of white views, one per view (§3.4.1: presence,
        consistency and completeness queries, OR-ed)."""
        by_view: dict[str, list[str]] = {}
        for region in sorted(wanted):
            view = self.schema.views[region.view]
            if view.is_gray:
                continue  # pulled top-down from its parent's rows
            by_view.setdefault(region.view, []).append(self._region_query(view, region))
        return [
            self.query(self.schema.views[name], " OR ".join(f"({p})" for p in preds))
            for name, preds in by_view.items()
        ]

    def _region_query(self, view: CachedView, region: Region) -> str:
        if region.kind == "presence":
            return in_list(region.columns, [region.values]).sql("postgres")
        if region.kind == "view":
            return self._view_level_predicate(view)
        # Consistency queries: the presence keys the cache holds inside the region.
        inside = region_predicate([region]).sql("duckdb")
        parts = []
        for edge in view.presence:
            keys = self._distinct_cached(view.name, edge.columns, inside)
            parts.append(in_list(edge.columns, keys).sql("postgres"))
        if region.kind == "completeness" and self._holds_rows(view, region):
            # §3.4.1: the completeness query runs only for a non-empty region: an entry in the
            # CpCT does not imply presence ("all rows or none"; none needs no pull).
            parts.append(in_list(region.columns, [region.values]).sql("postgres"))
        return " OR ".join(f"({p})" for p in parts) if parts else "FALSE"

    def _holds_rows(self, view: CachedView, region: Region) -> bool:
        if region.values in _distinct_rows(self.staged.get(view.name), region.columns):
            return True
        inside = region_predicate([region]).sql("duckdb")
        row = self.con.execute(f'SELECT count(*) FROM "{view.name}" WHERE {inside}').fetchone()
        return bool(row and row[0])

    def _view_level_predicate(self, view: CachedView) -> str:
        if view.is_fully_materialized:
            return "TRUE"
        parts = []
        for edge in view.presence:
            if edge.control in self.schema.control_tables:
                keys = [tuple(r) for r in self.con.execute(
                    f'SELECT {", ".join(chr(34) + c + chr(34) for c in edge.control_columns)} '
                    f'FROM "{edge.control}"'
                ).fetchall()]  # fmt: skip
            else:
                keys = self._parent_keys_after(edge.control, edge.control_columns)
            parts.append(in_list(edge.columns, keys).sql("postgres"))
        return " OR ".join(f"({p})" for p in parts) if parts else "FALSE"

    def _parent_keys_after(self, parent: str, columns: tuple[str, ...]) -> list[tuple[t.Any, ...]]:
        """The parent's control-column values once this operation is applied."""
        regions = {r for r in self.omega if r.view == parent}
        kept = region_predicate(regions).sql("duckdb")
        select = ", ".join(f'"{c}"' for c in columns)
        keys = {tuple(r) for r in self.con.execute(
            f'SELECT DISTINCT {select} FROM "{parent}" WHERE NOT ({kept})'
        ).fetchall()}  # fmt: skip
        keys |= set(_distinct_rows(self.staged.get(parent), columns))
        return sorted(keys, key=repr)

    def _distinct_cached(
        self, view: str, columns: tuple[str, ...], predicate: str
    ) -> list[tuple[t.Any, ...]]:
        select = ", ".join(f'"{c}"' for c in columns)
        return [tuple(r) for r in self.con.execute(
            f'SELECT DISTINCT {select} FROM "{view}" WHERE {predicate} ORDER BY ALL'
        ).fetchall()]  # fmt: skip

    def _regions_of_staged(self) -> set[Region]:
        """Regions (listed in control tables, or full guarantees) holding a pulled row."""
        found: set[Region] = set()
        for name, rows in self.staged.items():
            view = self.schema.views[name]
            if view.is_gray or rows.num_rows == 0:
                continue
            for kind, columns, control in guarantees(view):
                if kind == "view":
                    found.add(Region(name, "view"))
                    continue
                values = set(_distinct_rows(rows, columns))
                if control is not None:
                    values &= set(control_values(self.con, control, columns))
                found |= {Region(name, kind, columns, v, control) for v in values}
            for edge in view.presence:
                if edge.control in self.schema.control_tables:
                    listed = set(control_values(self.con, edge.control, edge.control_columns))
                    values = set(_distinct_rows(rows, edge.columns)) & listed
                    found |= {
                        Region(name, "presence", edge.columns, v, edge.control) for v in values
                    }
        return found


# -- helpers -------------------------------------------------------------------------------------


def control_role(schema: CacheSchema, control: str) -> tuple[CachedView, t.Any, tuple[str, ...]]:
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


def _view_columns(view: CachedView, role: str, control: str) -> tuple[str, ...]:
    """The view columns a control table's key maps to (presence: K', else the same names)."""
    if role == "presence":
        edge = next(p for p in view.presence if p.control == control)
        return edge.columns
    spec = view.consistency if role == "consistency" else view.completeness
    assert spec is not None
    return spec.columns


def _coerce_key(
    store: CacheStore, control: str, columns: tuple[str, ...], value: tuple[t.Any, ...]
) -> tuple[t.Any, ...]:
    """Values typed as the control table's columns (the CLI passes text)."""
    if len(value) != len(columns):
        raise ProgrammingError(
            f"{control} has {len(columns)} control-key column(s) ({', '.join(columns)}); "
            f"got {len(value)} value(s)"
        )
    types = dict(store.con.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'main' AND table_name = ?",
        [control],
    ).fetchall())  # fmt: skip
    casts = ", ".join(f"CAST(? AS {types[c]})" for c in columns)
    try:
        row = store.con.execute(f"SELECT {casts}", list(value)).fetchone()
    except Exception as exc:
        raise ProgrammingError(
            f"{control}: cannot read {value!r} as its control key ({', '.join(columns)}): "
            f"{first_line(exc)}"
        ) from exc
    assert row is not None
    return tuple(row)


def _all_regions(
    store: CacheStore, view: CachedView, keys: list[tuple[t.Any, ...]] | None
) -> set[Region]:
    if view.view_level:
        return {Region(view.name, "view")}
    regions: set[Region] = set()
    for edge in view.presence:
        listed = control_values(store.con, edge.control, edge.control_columns)
        if keys is not None:
            wanted = {tuple(str(v) for v in k) for k in keys}
            listed = [v for v in listed if tuple(str(x) for x in v) in wanted]
        regions |= {Region(view.name, "presence", edge.columns, v, edge.control) for v in listed}
    if keys is None:
        for kind, columns, control in guarantees(view):
            if control is not None and kind != "view":
                regions |= {
                    Region(view.name, kind, columns, v, control)
                    for v in control_values(store.con, control, columns)
                }
    return regions


def _distinct_rows(rows: pa.Table | None, columns: tuple[str, ...]) -> list[tuple[t.Any, ...]]:
    if rows is None or rows.num_rows == 0:
        return []
    distinct = rows.select(list(columns)).group_by(list(columns)).aggregate([])
    return list(zip(*(distinct.column(c).to_pylist() for c in columns), strict=True))


def _union_by_key(old: pa.Table, new: pa.Table, key: tuple[str, ...]) -> pa.Table:
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


def _delete_rows(
    con: t.Any, view: CachedView, regions: set[Region], staged: pa.Table | None
) -> int:
    """Delete the rows of the regions and the rows whose keys the pull brings again."""
    deleted = 0
    if regions:
        predicate = region_predicate(regions).sql("duckdb")
        row = con.execute(f'DELETE FROM "{view.name}" WHERE {predicate}').fetchone()
        deleted += int(row[0]) if row else 0
    if staged is not None and staged.num_rows:
        con.register("mtcache_keys", staged.select(list(view.key)))
        match = " AND ".join(f'v."{k}" = s."{k}"' for k in view.key)
        row = con.execute(
            f'DELETE FROM "{view.name}" v WHERE EXISTS (SELECT 1 FROM mtcache_keys s WHERE {match})'
        ).fetchone()
        con.unregister("mtcache_keys")
        deleted += int(row[0]) if row else 0
    return deleted


def _stamp_regions(
    con: t.Any,
    schema: CacheSchema,
    view: CachedView,
    regions: set[Region],
    staged: pa.Table | None,
    stamp: list[t.Any],
) -> None:
    """Set refreshed_at and snapshot_id on the control rows of refreshed regions, and admit the
    presence keys that arrived with a completeness pull."""
    for region in regions:
        if region.control not in schema.control_tables:
            continue
        columns = _control_columns(view, region)
        con.execute(
            f'UPDATE "{region.control}" SET refreshed_at = ?, snapshot_id = ? WHERE '
            f"{in_list(columns, [region.values]).sql('duckdb')}",
            stamp,
        )
    if staged is None or staged.num_rows == 0:
        return
    for edge in view.presence:
        if edge.control not in schema.control_tables:
            continue
        keys = _distinct_rows(staged, edge.columns)
        cols = ", ".join(f'"{c}"' for c in edge.control_columns)
        for key in keys:
            con.execute(
                f'INSERT INTO "{edge.control}" ({cols}, refreshed_at, snapshot_id) VALUES '
                f"({', '.join('?' for _ in key)}, ?, ?) ON CONFLICT DO NOTHING",
                [*key, *stamp],
            )


def _control_columns(view: CachedView, region: Region) -> tuple[str, ...]:
    if region.kind == "presence":
        edge = next(
            p for p in view.presence if p.control == region.control and p.columns == region.columns
        )
        return edge.control_columns
    return region.columns


def _refuse_breaking_completeness(
    store: CacheStore,
    view: CachedView,
    control: str,
    columns: tuple[str, ...],
    values: list[tuple[t.Any, ...]],
) -> None:
    """A complete region holds all of its rows or none (§3.2.3): evicting one presence key
    inside it would leave it incomplete."""
    spec = view.completeness
    if spec is None:
        return
    edge = next(p for p in view.presence if p.control == control)
    rows = in_list(edge.columns, values).sql("duckdb")
    cols = ", ".join(f'v."{c}"' for c in spec.columns)
    sql = f'SELECT DISTINCT {cols} FROM "{view.name}" v WHERE ({rows})'
    if spec.control is not None:
        match = " AND ".join(f'c."{c}" = v."{c}"' for c in spec.columns)
        sql += f' AND EXISTS (SELECT 1 FROM "{spec.control}" c WHERE {match})'
    inside = store.con.execute(sql).fetchall()
    if inside:
        where = ", ".join(str(tuple(r)) for r in inside)
        fix = (
            f"evict {where} from {spec.control} first"
            if spec.control is not None
            else f"the view is complete on ({', '.join(spec.columns)}) for every value"
        )
        raise ProgrammingError(
            f"cannot evict {values} from {control}: the rows lie in complete region(s) "
            f"{where} of {view.name}, which must hold all of their rows or none; {fix}"
        )


def _evict_presence(con: t.Any, schema: CacheSchema, view: CachedView, report: Report) -> None:
    """Delete rows no presence region holds any more, then cascade to the children."""
    pending = [view.name]
    while pending:
        name = pending.pop(0)
        current = schema.views[name]
        held = []
        for edge in current.presence:
            cols = ", ".join(f'"{c}"' for c in edge.columns)
            ccols = ", ".join(f'"{c}"' for c in edge.control_columns)
            held.append(f'({cols}) IN (SELECT {ccols} FROM "{edge.control}")')
        predicate = " OR ".join(held) if held else "TRUE"
        row = con.execute(f'DELETE FROM "{name}" WHERE NOT ({predicate})').fetchone()
        removed = int(row[0]) if row else 0
        report.rows_deleted[name] = report.rows_deleted.get(name, 0) + removed
        if removed:
            pending += [c for c in schema.children(name) if c not in pending]


def _as_error(exc: BaseException, what: str) -> Exception:
    from cache.errors import Error

    if isinstance(exc, Error):
        return exc
    if isinstance(exc, psycopg.Error):
        return translate(exc, f"{what}: the backend refused a pull (the cache is unchanged)")
    return OperationalError(f"{what} failed, the cache is unchanged: {first_line(exc)}")
