"""Pull maintenance (§3.4.1): admission, eviction and refresh of cache regions.

One operation = one backend snapshot and one DuckDB transaction:

1. open a REPEATABLE READ, READ ONLY transaction on the backend and export its snapshot
   (`engines.Coordinator`); ``refreshed_at`` is that statement's start time, never later than
   the snapshot (so currency errs towards older);
2. compute AC(U) on the cache instance (one pass: the schema is safe) and retrieve MaxAC(U);
3. Maintenance Algorithm: while the pulled rows fall into regions outside the closure (a row
   moved to another city), widen the closure and pull again, inside the same snapshot;
4. top-down, pull the gray children controlled by the pulled rows, and re-pull view-level
   children whose parents changed (no child row outlives its parent region) - steps 2-4 are
   `pull.Pull`, run by an `engines.Engine`;
5. apply the Maintenance Rule in one DuckDB transaction (`apply.apply_pull`): delete the rows
   of AC(U) and rows whose keys reappear, insert the pulled rows, stamp control rows with
   refreshed_at and snapshot_id.

Any failure before the DuckDB commit leaves the cache file exactly as it was.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
import typing as t
from collections.abc import Collection, Iterable, Iterator

import duckdb
import psycopg
import pyarrow as pa

from cache.defaults import ENGINES
from cache.maintenance import faults
from cache.maintenance.apply import apply_pull, apply_rows, begin_apply, end_apply
from cache.maintenance.engines import Coordinator, Engine, InlineEngine, PullQuery
from cache.maintenance.evict import evict
from cache.maintenance.key_values import exact_keys
from cache.maintenance.lineup import record_pull
from cache.maintenance.pull import Pull, distinct_rows
from cache.maintenance.report import NAMED_KEYS, Report
from cache.store.cache_file import CacheStore
from control_tables.closure import affected_closure_safe, control_values
from control_tables.kinds import RegionKind, Role
from control_tables.regions import Region, guarantees, key_text
from control_tables.schema import CachedView, CacheSchema, control_role, controlled_columns
from optimizer.derived.delta import copy_table
from sql_ext.catalog import Catalog
from sql_ext.errors import (
    Error,
    OperationalError,
    ProgrammingError,
    connection_lost,
    first_line,
    interrupted,
    translate,
)
from sql_ext.nodes import plural


def make_engine(name: str, master: str | None = None) -> Engine:
    """A refresh engine by name (`ENGINES`): ``auto`` chooses by each operation's size
    (`SizedEngine`); Spark (and its JVM) is loaded only when it pulls. A master URL mtcache
    cannot pull on is refused here, whichever engine pulls."""
    if master is not None:
        from cache.maintenance.spark import check_master_url

        check_master_url(master)
    if name == "auto":
        return SizedEngine(master)
    if name == "inline":
        return InlineEngine()
    if name == "spark":
        if not spark_installed():
            raise ProgrammingError(SPARK_MISSING)
        from cache.maintenance.spark import DEFAULT_MASTER, SparkEngine

        return SparkEngine(master or DEFAULT_MASTER)
    raise ProgrammingError(f"unknown refresh engine {name!r}: use {', '.join(ENGINES)}")


SPARK_MISSING = "Spark is not installed: pip install 'mtcache[spark]'"


def spark_installed() -> bool:
    """Whether pyspark can be imported (the ``spark`` extra), without importing it."""
    return importlib.util.find_spec("pyspark") is not None


# An admission of more keys than this goes in pieces of this many (`_admit_in_pieces`)
ADMIT_PIECE = 50_000

# Pulls reading tables of at least this many backend heap pages (8 KiB each: 128 MiB) go to
# Spark when an engine is chosen by size; smaller ones are pulled inline (no JVM to start).
SPARK_MIN_PAGES = 16384


class SizedEngine:
    """Inline or Spark by the size of what an operation pulls: the refresh scheduler's engine
    (Spark for the pipeline's large pulls, inline for small ones). ``name`` is the
    engine the last pull used (what a refresh's report and provenance record)."""

    def __init__(self, spark_master: str | None = None, spark_pages: int = SPARK_MIN_PAGES) -> None:
        self.spark_master = spark_master
        self.spark_pages = spark_pages
        self.name = "inline"
        self.reason = "nothing pulled yet"
        self._spark: Engine | None = None

    def pull(self, coordinator: Coordinator, queries: list[PullQuery]) -> list[pa.Table]:
        largest = max((q.pages for q in queries), default=0)
        pages = f"its largest pull reads {plural(largest, 'page')} of the backend"
        if largest < self.spark_pages:
            self.name = "inline"
            self.reason = f"{pages}; Spark pays from {self.spark_pages:,}"
            return InlineEngine().pull(coordinator, queries)
        if not spark_installed():
            self.name = "inline"
            self.reason = f"{pages}, but {SPARK_MISSING}"
            return InlineEngine().pull(coordinator, queries)
        if self._spark is None:
            self._spark = make_engine("spark", self.spark_master)
        self.name = "spark"
        self.reason = f"{pages}; Spark pays from {self.spark_pages:,}"
        return self._spark.pull(coordinator, queries)


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
        self.engine: Engine = engine or InlineEngine("admissions and the stream's pulls run inline")
        self.faults = faults.active(faults_enabled)

    def admit(
        self, control: str, values: list[tuple[t.Any, ...]], *, allow_empty: bool = False
    ) -> Report:
        """Add control-key values and pull the regions they define (and their closure). A
        presence key the backend has no rows for is an error unless ``allow_empty`` (then it
        is admitted as an empty region: the cache answers for it that there are none)."""
        schema = self.store.load_schema()
        view, role, _ = control_role(schema, control)
        values = _coerce_keys(self.store, schema, control, values)
        columns = controlled_columns(view, role, control)
        if len(values) > ADMIT_PIECE and not schema.continuous(view.name):
            return self._admit_in_pieces(schema, control, view, role, columns, values, allow_empty)
        seeds = {Region(view.name, role, columns, v, control) for v in values}
        must_hold = seeds if role == RegionKind.PRESENCE and not allow_empty else set()
        return self._run(
            f"admit {control}", schema, seeds, admitted={control: values}, must_hold=must_hold
        )

    def _admit_in_pieces(
        self,
        schema: CacheSchema,
        control: str,
        view: CachedView,
        role: Role,
        columns: tuple[str, ...],
        values: list[tuple[t.Any, ...]],
        allow_empty: bool,
    ) -> Report:
        """Many keys, ``ADMIT_PIECE`` at a time (the regions of one piece in memory, not of
        all): every piece pulled in the one backend snapshot and applied in the one DuckDB
        transaction, so the admission lands whole or not at all, as one of few keys does.
        A piece's closure sees the pieces applied before it (inside the transaction): a
        region two pieces reach is pulled twice from the same snapshot, the same rows."""
        label = f"admit {control}"
        started = time.monotonic()
        catalog = self.store.load_catalog()
        report = Report(operation=label, engine=self.engine.name)
        regions = 0
        with (
            self._operation(label) as coordinator,
            self.store.maintenance_lock,
            self.store.transaction() as con,
        ):
            snapshot_id = None
            changed: list[str] = []
            for at in range(0, len(values), ADMIT_PIECE):
                piece = values[at : at + ADMIT_PIECE]
                seeds = {Region(view.name, role, columns, v, control) for v in piece}
                pull = self._pull(
                    schema,
                    catalog,
                    coordinator,
                    seeds,
                    seeds if role == RegionKind.PRESENCE and not allow_empty else (),
                )
                if snapshot_id is None:
                    snapshot_id = begin_apply(con, coordinator.snapshot, self.engine.name)
                stamp = [coordinator.snapshot.backend_time, snapshot_id]
                changed += apply_rows(
                    con,
                    schema,
                    pull.omega,
                    pull.staged,
                    {control: piece},
                    stamp,
                    report,
                    pull.copies,
                )
                regions += len(pull.omega)
                report.rounds = max(report.rounds, pull.rounds)
            assert snapshot_id is not None
            report.engine, report.engine_reason = self.engine.name, self.engine.reason
            end_apply(
                self.store,
                schema,
                snapshot_id,
                changed,
                self.faults,
                report,
                {control: values},
                coordinator.snapshot_age(),
            )
        report.snapshot_id = snapshot_id
        report.backend_time = coordinator.snapshot.backend_time
        report.name_regions([f"{control}{v}" for v in values[:NAMED_KEYS]], regions)
        report.seconds = time.monotonic() - started
        return report

    @contextlib.contextmanager
    def _operation(self, label: str) -> Iterator[Coordinator]:
        """One operation's backend snapshot (`Coordinator`), its failures in the PEP 249 tree
        saying the cache is unchanged, the backend session closed at the end."""
        coordinator = Coordinator(self.dsn, self.faults)
        try:
            if "after_snapshot:disconnect" in self.faults:
                coordinator.terminate_session()
            faults.hit("after_snapshot", self.faults)
            yield coordinator
        except faults.InjectedFault:
            raise
        except Exception as exc:
            raise _failed(exc, label) from exc
        finally:
            # A lost connection is gone already; nothing was written through it.
            with contextlib.suppress(psycopg.Error):
                coordinator.close()

    def _pull(
        self,
        schema: CacheSchema,
        catalog: Catalog,
        coordinator: Coordinator,
        seeds: set[Region],
        must_hold: Collection[Region],
    ) -> Pull:
        """Steps 2-4 of the module's: the closure of ``seeds``, pulled with the children.
        Admitted rows exist for the closure computation only inside the apply transaction;
        until then new control rows are seeds on their own."""
        con = self.store.con
        pull = Pull(con, self.engine, schema, catalog, coordinator)
        pull.converge(affected_closure_safe(con, schema, seeds), seeds)
        pull.children()
        _refuse_empty(pull, must_hold)
        faults.hit("after_pull", self.faults)
        return pull

    def evict(self, control: str, values: list[tuple[t.Any, ...]]) -> Report:
        """Remove control-key values; for presence, their rows and, transitively, the rows of
        the children they control. Needs no backend."""
        schema = self.store.load_schema()
        view, role, columns = control_role(schema, control)
        values = _coerce_keys(self.store, schema, control, values)
        listed = set(control_values(self.store.con, control, columns))
        absent = [v for v in dict.fromkeys(values) if v not in listed]
        if absent:
            raise ProgrammingError(
                f"{control} has no key {', '.join(map(repr, absent))}: nothing was evicted "
                f"(it lists {len(listed)} key(s); `mtcache status` shows them)"
            )
        try:
            with self.store.maintenance_lock:
                return evict(self.store, schema, view, role, control, columns, values, self.faults)
        except faults.InjectedFault:
            raise
        except Exception as exc:
            raise _failed(exc, "evicting") from exc

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
            seeds |= view_regions(self.store, schema.views[name], keys if view_name else None)
        label = f"refresh {view_name or 'all'}"
        if keys:  # (as the control table types them: the command line gives text)
            found = sorted({r.values for r in seeds if r.kind == RegionKind.PRESENCE}, key=repr)
            label += " keys " + ", ".join(key_text(key) for key in found)
        return self._run(label, schema, seeds, admitted={})

    def refresh_regions(self, view_name: str, regions: Collection[Region]) -> Report:
        """Refresh some regions of one white view (a REFRESH AUTO view's: those read since
        their last refresh) and what their closure requires, in one snapshot."""
        schema = self.store.load_schema()
        label = f"refresh {view_name} ({plural(len(regions), 'region')} read since refreshed)"
        return self._run(label, schema, set(regions), admitted={})

    def _run(
        self,
        label: str,
        schema: CacheSchema,
        seeds: set[Region],
        admitted: dict[str, list[tuple[t.Any, ...]]],
        must_hold: Collection[Region] = (),
        then: t.Callable[[duckdb.DuckDBPyConnection, int], None] | None = None,
    ) -> Report:
        """``then(con, snapshot_id)``: more work inside the apply transaction (the stream
        consumer applies the transaction that needed this pull: it must land, over the size
        budget if it must, as the stream's batches do)."""
        # one operation at a time (`_Shared.maintenance_lock`); the stream must not pass the
        # snapshot of a pull of continuously maintained views before the pull is applied
        continuous = any(schema.continuous(r.view) for r in seeds)
        with (
            self.store.stream_lock if continuous else contextlib.nullcontext(),
            self.store.maintenance_lock,
        ):
            return self._pull_and_apply(label, schema, seeds, admitted, must_hold, then)

    def _pull_and_apply(
        self,
        label: str,
        schema: CacheSchema,
        seeds: set[Region],
        admitted: dict[str, list[tuple[t.Any, ...]]],
        must_hold: Collection[Region],
        then: t.Callable[[duckdb.DuckDBPyConnection, int], None] | None,
    ) -> Report:
        started = time.monotonic()
        catalog = self.store.load_catalog()
        report = Report(operation=label, engine=self.engine.name)
        with self._operation(label) as coordinator:
            pull = self._pull(schema, catalog, coordinator, seeds, must_hold)
            # (an engine chosen by size names its choice now)
            report.engine, report.engine_reason = self.engine.name, self.engine.reason

            def finish(con: duckdb.DuckDBPyConnection, snapshot_id: int) -> None:
                record_pull(
                    con,
                    schema,
                    pull.omega,
                    snapshot_id,
                    coordinator.snapshot,
                    [n for n in pull.staged if copy_table(n)],
                )
                if then is not None:
                    then(con, snapshot_id)

            apply_pull(
                self.store,
                schema,
                pull.omega,
                pull.staged,
                admitted,
                coordinator.snapshot,
                self.engine.name,
                self.faults,
                report,
                coordinator.snapshot_age(),
                finish,
                then is None,
                pull.copies,
            )
        report.rounds = pull.rounds
        report.regions = sorted(str(r) for r in pull.omega)
        report.seconds = time.monotonic() - started
        return report


def _refuse_empty(pull: Pull, must_hold: Collection[Region]) -> None:
    """Admitted presence keys the backend has no rows for (checked in the pull's snapshot)."""
    pulled = {(r.view, r.columns) for r in must_hold}
    held = {at: set(distinct_rows(pull.staged.get(at[0]), at[1])) for at in pulled}
    empty = sorted((r for r in must_hold if r.values not in held[r.view, r.columns]), key=str)
    if empty:
        control = empty[0].control
        keys = ", ".join(repr(r.values) for r in empty[:NAMED_KEYS])
        if len(empty) > NAMED_KEYS:
            keys += f" and {len(empty) - NAMED_KEYS} more ({len(empty)} keys)"
        which = "key" if len(empty) == 1 else "keys"
        raise ProgrammingError(
            f"{control}: the backend has no rows for {which} {keys} ({empty[0].view} would "
            f"hold no rows for it); nothing was admitted. Admit it as an empty region with "
            "allow_empty=True (CLI: --allow-empty)"
        )


def _coerce_keys(
    store: CacheStore, schema: CacheSchema, control: str, values: list[tuple[t.Any, ...]]
) -> list[tuple[t.Any, ...]]:
    """Values typed as the control table's columns, exactly (the CLI passes text)."""
    columns = schema.control_tables[control].column_names
    for value in values:
        if len(value) != len(columns):
            raise ProgrammingError(
                f"{control} has {len(columns)} control-key column(s) ({', '.join(columns)}); "
                f"got {len(value)} value(s)"
            )
    return exact_keys(store.con, schema.control_tables[control], values)


def view_regions(
    store: CacheStore, view: CachedView, keys: list[tuple[t.Any, ...]] | None = None
) -> set[Region]:
    """The view's regions: all of them, or those of the given presence keys."""
    if view.view_level:
        return {Region(view.name, RegionKind.VIEW)}
    regions: set[Region] = set()
    for edge in view.presence:
        listed = control_values(store.con, edge.control, edge.control_columns)
        if keys is not None:
            wanted = {tuple(str(v) for v in k) for k in keys}
            listed = [v for v in listed if tuple(str(x) for x in v) in wanted]
        regions |= {
            Region(view.name, RegionKind.PRESENCE, edge.columns, v, edge.control) for v in listed
        }
    if keys is None:
        for kind, columns, control in guarantees(view):
            if control is not None and kind != RegionKind.VIEW:
                regions |= {
                    Region(view.name, kind, columns, v, control)
                    for v in control_values(store.con, control, columns)
                }
    return regions


def _failed(exc: BaseException, what: str) -> Error:
    """An operation's failure in the PEP 249 tree, saying the cache is unchanged."""
    if isinstance(exc, Error):
        return exc
    if interrupted(exc):  # (a cancel or a timeout: the statement's, not the cache's)
        return translate(exc)
    if connection_lost(exc):
        return translate(
            exc,
            what,
            unreachable="lost the backend during the pull; the cache "
            "is unchanged, try again when the backend is back",
        )
    if isinstance(exc, psycopg.Error):
        return translate(exc, f"{what}: the backend refused a pull (the cache is unchanged)")
    return OperationalError(f"{what} failed, the cache is unchanged: {first_line(exc)}")
