"""The cache file: cached views and control tables in DuckDB, metadata in the schema ``mtcache``.

A cached view or control table ``name`` is the DuckDB table ``main.name``. Internal
state lives in ``mtcache.*``: the shadow catalog of the backend (tables, columns, keys, indexes,
statistics), the cache objects with their DDL text (the cache schema is rebuilt by parsing it),
view-level region state, snapshots and counters. Everything survives restarts.

`CacheStore` is one open file: it opens (and migrates) it, and is a `FileHandle`
(`cache.store.handle`: versions, transactions, locks) with the shadow catalog
(`cache.store.shadow_catalog`) and the cache schema (`cache.store.schema_store`); here too are
the file's format, its counters (`cache.store.counters`), DuckDB's resources and a DDL
script applied whole.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import typing as t
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
from sqlglot import exp

from cache.private_files import make_private, make_private_dirs
from cache.store import functions
from cache.store.bound_asks import BoundAsks
from cache.store.budget import data_bytes, data_tables, parse_size
from cache.store.counters import Counter, Counts, named
from cache.store.gathered import Gathered
from cache.store.handle import shared_state
from cache.store.remote_reads import RemoteReads
from cache.store.schema_store import SchemaStore
from cache.store.served import served_at
from cache.store.shadow_catalog import CatalogStore
from control_tables.script import apply_script
from control_tables.types import BPCHAR, transfer_type
from heartbeat.clock import BackendClock
from sql_ext import Statement
from sql_ext.catalog import Catalog
from sql_ext.errors import OperationalError, ProgrammingError, first_line, translate
from sql_ext.quoting import ident, idents


def limit_resources(
    con: duckdb.DuckDBPyConnection, memory_limit: str | None = None, threads: int | None = None
) -> None:
    """Set DuckDB's memory limit and threads on ``con``'s database, or say what is wrong with
    them (`check_resources` tries them on a DuckDB of its own first)."""
    for name, value in (("memory_limit", memory_limit), ("threads", threads)):
        if value is None:
            continue
        try:
            con.execute(f"SET {name} = ?", [value])
        except duckdb.Error as exc:
            what = (
                "a size with its unit, as '2GB' or '512MiB'"
                if name == "memory_limit"
                else "a number of threads"
            )
            raise ProgrammingError(
                f"{name}: DuckDB cannot take {value!r} ({first_line(exc)}); give {what}"
            ) from None


def check_resources(
    memory_limit: str | None = None,
    threads: int | None = None,
    cache_size_limit: int | str | None = None,
) -> None:
    """The options' error, if any, before a cache file is opened (or made): their types,
    then `limit_resources`' on a DuckDB of its own; ``cache_size_limit`` is `parse_size`'s."""
    if cache_size_limit is not None:
        parse_size(cache_size_limit)
    if memory_limit is not None and (not isinstance(memory_limit, str) or not memory_limit):
        raise ProgrammingError(
            f"memory_limit must be a size with its unit, as '2GB', not {memory_limit!r}"
        )
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0
    ):
        raise ProgrammingError(f"threads must be a positive number, not {threads!r}")
    with duckdb.connect() as trial:
        limit_resources(trial, memory_limit, threads)


def count_in(con: duckdb.DuckDBPyConnection, amounts: t.Mapping[Counter, int]) -> None:
    """Inside a transaction: add to the counters of `mtcache status` (`cache.store.counters`)."""
    for counter, amount in amounts.items():
        con.execute(
            "UPDATE mtcache.counters SET value = value + ? WHERE name = ?", [amount, counter.value]
        )


G = t.TypeVar("G", bound=Gathered)

log = logging.getLogger("mtcache.store")

# 2: char(n) values are stored without their blank padding (control_tables.types.BPCHAR);
#    the shadow catalog knows each column's own collation
# 3: a base view kept continuously that holds all of a table is the derived views' copy of it
FORMAT_VERSION = "3"

_METADATA = [
    "CREATE SCHEMA IF NOT EXISTS mtcache",
    "CREATE TABLE IF NOT EXISTS mtcache.meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
    """CREATE TABLE IF NOT EXISTS mtcache.backend_tables (
        name VARCHAR PRIMARY KEY, schema VARCHAR, row_count DOUBLE, pages BIGINT,
        primary_key VARCHAR[], reflected_at TIMESTAMPTZ)""",
    """CREATE TABLE IF NOT EXISTS mtcache.backend_columns (
        table_name VARCHAR, position INTEGER, name VARCHAR, type VARCHAR, nullable BOOLEAN,
        n_distinct DOUBLE, byte_order BOOLEAN, deterministic BOOLEAN DEFAULT true,
        PRIMARY KEY (table_name, name))""",
    """CREATE TABLE IF NOT EXISTS mtcache.backend_unique_keys (
        table_name VARCHAR, columns VARCHAR[])""",
    """CREATE TABLE IF NOT EXISTS mtcache.backend_indexes (
        table_name VARCHAR, name VARCHAR, columns VARCHAR[], is_unique BOOLEAN)""",
    """CREATE TABLE IF NOT EXISTS mtcache.backend_views (
        name VARCHAR PRIMARY KEY, schema VARCHAR, definition VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS mtcache.objects (
        seq INTEGER, name VARCHAR PRIMARY KEY, kind VARCHAR, statement VARCHAR,
        columns VARCHAR[], key VARCHAR[], color VARCHAR, consistency VARCHAR,
        parents VARCHAR[], created_at TIMESTAMPTZ)""",
    """CREATE TABLE IF NOT EXISTS mtcache.view_state (
        view VARCHAR PRIMARY KEY, refreshed_at TIMESTAMPTZ, snapshot_id BIGINT)""",
    """CREATE TABLE IF NOT EXISTS mtcache.snapshots (
        snapshot_id BIGINT PRIMARY KEY, backend_time TIMESTAMPTZ, pg_snapshot VARCHAR,
        engine VARCHAR, applied_at TIMESTAMPTZ)""",
    # the views an operation stamped, and its delay d (§4.6): how old its snapshot was when
    # its rows became visible (files made before these were kept have them NULL)
    "ALTER TABLE mtcache.snapshots ADD COLUMN IF NOT EXISTS views VARCHAR[]",
    "ALTER TABLE mtcache.snapshots ADD COLUMN IF NOT EXISTS delay_seconds DOUBLE",
    # why a refresh ran on its engine (`auto` chooses by size; files made before: NULL)
    "ALTER TABLE mtcache.snapshots ADD COLUMN IF NOT EXISTS engine_reason VARCHAR",
    # what a RowDescription gives a column read as it is (files made before: reflected again)
    "ALTER TABLE mtcache.backend_tables ADD COLUMN IF NOT EXISTS oid BIGINT",
    "ALTER TABLE mtcache.backend_columns ADD COLUMN IF NOT EXISTS type_oid BIGINT",
    "ALTER TABLE mtcache.backend_columns ADD COLUMN IF NOT EXISTS type_modifier INTEGER",
    "ALTER TABLE mtcache.backend_columns ADD COLUMN IF NOT EXISTS number INTEGER",
    "CREATE TABLE IF NOT EXISTS mtcache.counters (name VARCHAR PRIMARY KEY, value BIGINT)",
    # continuous maintenance (cache.maintenance.stream): the slot and how far it is applied
    # (an LSN and the backend time every change before which is applied), and the pulls whose
    # snapshot the stream has not passed yet (the stream skips what they already hold)
    """CREATE TABLE IF NOT EXISTS mtcache.stream (
        slot VARCHAR PRIMARY KEY, publication VARCHAR, applied_lsn BIGINT,
        stream_time TIMESTAMPTZ, applied_at TIMESTAMPTZ, relations VARCHAR, problem VARCHAR)""",
    # the bounds queries asked of each view, decayed sums (`cache.store.bound_asks`), and the
    # interval the scheduler chose for each REFRESH AUTO view from them, with why
    """CREATE TABLE IF NOT EXISTS mtcache.bound_asks (
        view VARCHAR, bound DOUBLE, queries DOUBLE, saved DOUBLE, since TIMESTAMPTZ,
        as_of TIMESTAMPTZ, PRIMARY KEY (view, bound))""",
    # the cached reads the backend answered, per statement shape (`cache.store.remote_reads`)
    """CREATE TABLE IF NOT EXISTS mtcache.remote_reads (
        statement VARCHAR PRIMARY KEY, calls BIGINT, backend_ms DOUBLE, kind VARCHAR,
        reason VARCHAR, first_seen TIMESTAMPTZ, last_seen TIMESTAMPTZ)""",
    """CREATE TABLE IF NOT EXISTS mtcache.auto_refresh (
        view VARCHAR PRIMARY KEY, interval_seconds DOUBLE, served DOUBLE[], reason VARCHAR,
        saves DOUBLE, chosen_at TIMESTAMPTZ)""",
    """CREATE TABLE IF NOT EXISTS mtcache.stream_pulls (
        snapshot_id BIGINT, pg_snapshot VARCHAR, until_lsn BIGINT, backend_time TIMESTAMPTZ,
        view VARCHAR, predicate VARCHAR)""",
]


@dataclass(frozen=True)
class DdlResult:
    created: list[str]
    dropped: list[str]
    # the fully materialized views it created, filled at once (`Admin.apply_ddl`): each one's
    # report (`cache.maintenance.report.Report`), and those that could not be, with why
    filled: list[t.Any] = field(default_factory=list)
    unfilled: list[tuple[str, str]] = field(default_factory=list)


def damaged(exc: BaseException, path: Path) -> OperationalError | None:
    """The error for a DuckDB error that says the cache file is damaged (else None)."""
    text = first_line(exc)
    if "corrupt" not in text.lower() and "checksum" not in text.lower():
        return None
    return OperationalError(
        f"the cache file {path} is damaged ({text}): move it aside and build the cache again "
        "(mtcache init, ddl, admit); the backend's data is not affected"
    )


class CacheStore(SchemaStore, CatalogStore):
    """One open cache file. Not shared across processes (DuckDB's rule: one writer process)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            make_private_dirs(self.path.parent)
        except OSError as exc:
            raise OperationalError(
                f"cannot create the cache file {self.path}: {exc.strerror or exc} (pass --cache "
                "or cache_path= with a directory you can write to)"
            ) from None
        # Shared by every handle on this file in the process (other connections, other
        # threads): the change counters, so each region index notices every commit, and the
        # lock that lets one write transaction at a time in (DuckDB would abort the second
        # writer of a row with a conflict).
        self._shared = shared_state(self.path)
        self._change: tuple[list[str] | None] | None = None  # (views,) once `changed`
        created = not self.path.exists()
        try:
            self.con = duckdb.connect(str(self.path))
            if created:
                make_private(self.path)
        except duckdb.Error as exc:
            damage = damaged(exc, self.path)
            if damage is not None:
                raise damage from exc
            if "conflicting lock" in str(exc).lower() or "could not set lock" in str(exc).lower():
                served = served_at(self.path)
                if served is not None:
                    raise OperationalError(
                        f"the cache file {self.path} is served by `mtcache serve` (pid "
                        f"{served.pid}) at {served.address}: connect through it "
                        f"(cache.connect(server={served.url!r}), or psql {served.url}; "
                        "the mtcache commands do so by themselves)"
                    ) from exc
                raise OperationalError(
                    f"the cache file {self.path} is in use by another process (DuckDB allows "
                    f"one): stop that process or use another --cache file ({first_line(exc)})"
                ) from exc
            raise translate(exc, f"opening the cache file {self.path}") from exc
        with self._shared.lock:
            if self._shared.handles == 0:
                # another process may have changed the file while this one had it closed
                self._shared.version += 1
                self._shared.schema_version += 1
                self._shared.epoch += 1
                self._shared.schema = None
            if self._shared.functions is None:
                try:
                    self._shared.functions = functions.holder(self.path)
                except BaseException:
                    self.con.close()
                    raise
            self._shared.handles += 1
        self._configure()
        with self.transaction():
            for statement in _METADATA:
                self.con.execute(statement)
            self.con.execute(
                "INSERT INTO mtcache.meta VALUES ('format_version', ?) ON CONFLICT DO NOTHING",
                [FORMAT_VERSION],
            )
            for counter in Counter:
                self.con.execute(
                    "INSERT INTO mtcache.counters VALUES (?, 0) ON CONFLICT DO NOTHING",
                    [counter.value],
                )
            row = self.con.execute(
                "SELECT value FROM mtcache.meta WHERE key = 'format_version'"
            ).fetchone()
            version = row[0] if row is not None else FORMAT_VERSION
            if version == "1":
                self._migrate_from_1()
                version = "2"
            if version == "2":
                self._copies_held_by_base_views(self.load_catalog())
                self.con.execute(
                    "UPDATE mtcache.meta SET value = ? WHERE key = 'format_version'",
                    [FORMAT_VERSION],
                )

    def _migrate_from_1(self) -> None:
        """Format 1 kept char(n) values padded: strip the padding (see transfer_type). Its
        shadow catalog had no collations: it is dropped, and the next connection reflects the
        backend's again."""
        for column in ("byte_order BOOLEAN", "deterministic BOOLEAN DEFAULT true"):
            self.con.execute(
                f"ALTER TABLE mtcache.backend_columns ADD COLUMN IF NOT EXISTS {column}"
            )
        catalog = self.load_catalog()
        for view in self._parse_schema().views.values():
            table = catalog.table(view.table)
            if table is None:
                continue
            types = {c.name: c.type for c in table.columns}
            for column in view.columns:
                if transfer_type(types.get(column, "")) == BPCHAR:
                    name = ident(column)
                    self.con.execute(f"UPDATE {ident(view.name)} SET {name} = rtrim({name}, ' ')")
        self.con.execute("DELETE FROM mtcache.backend_tables")

    def _configure(self) -> None:
        # Local answers follow PostgreSQL: integer / integer truncates.
        self.con.execute("SET integer_division = true")
        # a library prints nothing: DuckDB would draw a progress bar on the application's
        # stdout for a statement that runs a few seconds
        self.con.execute("SET enable_progress_bar = false")

    @classmethod
    def _sharing(cls, parent: CacheStore) -> CacheStore:
        twin = cls.__new__(cls)
        twin.path = parent.path
        twin.con = parent.con.cursor()  # a connection of its own to the same database
        twin._configure()  # (its settings are its own: a cursor starts with DuckDB's)
        twin._shared = parent._shared
        twin._change = None
        with twin._shared.lock:
            twin._shared.handles += 1
        return twin

    def load_asks(self) -> BoundAsks:
        """The bounds asked of the file's views, with the sums the file kept when this
        process first asks."""
        return self._gathered(self.asks)

    def load_remote_reads(self) -> RemoteReads:
        """The cached reads the backend answered, with those the file kept when this process
        first asks."""
        return self._gathered(self.remote_reads)

    def _gathered(self, found: G) -> G:
        """``found``, with the rows the file keeps of it read in when this process first
        asks."""
        if not found.loaded:
            found.load(
                self.con.execute(f"SELECT {found.COLUMNS} FROM mtcache.{found.TABLE}").fetchall()
            )
        return found

    def _keep_gathered(self) -> None:
        try:
            self.asks.fold(time.time())
            self.save_gathered(time.time(), force=True)
        except Exception as exc:  # (a file that cannot take them: the process's are lost; the
            # file closes all the same)
            log.warning(
                "keeping the bounds asked and the reads the backend answered in %s failed: %s",
                self.path,
                first_line(exc),
            )

    def save_gathered(self, now: float, force: bool = False) -> None:
        """Keep what the reads taught in the file: the bounds they asked, and the reads the
        backend answered (each at most every minute unless ``force``; no cached data changes,
        so no reader is told of it)."""
        gathered: tuple[Gathered, ...] = (self.load_asks(), self.load_remote_reads())
        saved = [(found.TABLE, found.to_save(now, force)) for found in gathered]
        if all(rows is None for _, rows in saved):
            return
        try:
            with self.transaction() as con:
                for table, rows in saved:
                    if rows is None:
                        continue
                    con.execute(f"DELETE FROM mtcache.{table}")
                    if rows:
                        marks = ", ".join("?" * len(rows[0]))
                        con.executemany(f"INSERT INTO mtcache.{table} VALUES ({marks})", rows)
        except BaseException:
            for found in gathered:
                found.unsaved()  # (written at the next chance)
            raise

    def save_clock(self, clock: BackendClock) -> None:
        """The last backend-clock measurement, for tools without a backend connection."""
        with self.transaction() as con:
            con.execute(
                "INSERT OR REPLACE INTO mtcache.meta VALUES ('backend_clock', ?)",
                [json.dumps(clock.to_json())],
            )

    def save_reported(self, reported: t.Mapping[str, str]) -> None:
        """What the backend reports to a new session (ParameterStatus), for a server that
        starts while the backend is down."""
        with self.transaction() as con:
            con.execute(
                "INSERT OR REPLACE INTO mtcache.meta VALUES ('backend_reported', ?)",
                [json.dumps(dict(reported))],
            )

    def load_reported(self) -> dict[str, str] | None:
        rows = self.con.execute(
            "SELECT value FROM mtcache.meta WHERE key = 'backend_reported'"
        ).fetchall()
        return {str(k): str(v) for k, v in json.loads(rows[0][0]).items()} if rows else None

    def add_counters(self, amounts: t.Mapping[Counter, int]) -> None:
        """Add to the counters of `mtcache status` (hits, misses, remote executions)."""
        with self.transaction() as con:
            count_in(con, amounts)

    def load_clock(self) -> BackendClock | None:
        rows = self.con.execute(
            "SELECT value FROM mtcache.meta WHERE key = 'backend_clock'"
        ).fetchall()
        if not rows:
            return None
        data = json.loads(rows[0][0])
        return BackendClock(
            float(data["offset_seconds"]),
            float(data["uncertainty_seconds"]),
            dt.datetime.fromisoformat(data["measured_at"]),
        )

    def for_thread(self) -> CacheStore:
        """A handle for another thread of this process (DuckDB connections are per thread)."""
        return CacheStore._sharing(self)

    def limit_resources(
        self,
        memory_limit: str | None = None,
        threads: int | None = None,
        cache_size_limit: int | str | None = None,
    ) -> None:
        """DuckDB's memory limit (``"2GB"``) and threads for this file in this process (every
        handle on it shares them); None leaves DuckDB's default (80% of the memory, every
        core). ``cache_size_limit``: the budget of the cached data's bytes (`budget`; None
        leaves it as it is, none at first)."""
        limit_resources(self.con, memory_limit, threads)
        if cache_size_limit is not None:
            self._shared.budget.limit = parse_size(cache_size_limit)

    def resources(self) -> dict[str, t.Any]:
        """What the file's DuckDB may use and uses now (status: use against the limits)."""
        row = self.con.execute(
            "SELECT current_setting('memory_limit'), current_setting('threads'), "
            "(SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()), "
            "total_blocks * block_size, wal_size FROM pragma_database_size() "
            "WHERE database_name = current_database()"
        ).fetchall()
        [(limit, threads, used, size, wal)] = row
        budget = self._shared.budget
        data = data_bytes(self.con, data_tables(self.con, self.load_schema()), budget.widths)
        return {
            "memory_limit": limit,
            "threads": int(threads),
            "memory_in_use_bytes": int(used),
            "file_bytes": int(size),
            "wal": wal,
            "cache_size_limit": budget.limit,
            "data_bytes": sum(data.values()),
        }

    def close(self) -> None:
        if self.con is None:
            return
        with self._shared.lock:
            if self._shared.handles == 1:  # the last one: the bounds asked stay in the file
                self._keep_gathered()
            self._shared.handles -= 1
            self.con.close()
            self.con = None  # type: ignore[assignment]
            if self._shared.handles == 0 and self._shared.functions is not None:
                self._shared.functions.close()  # the last connection: its functions go
                self._shared.functions = None

    def __enter__(self) -> CacheStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def apply_ddl(
        self,
        statements: Sequence[Statement],
        catalog: Catalog,
        then: t.Callable[[duckdb.DuckDBPyConnection], None] | None = None,
    ) -> DdlResult:
        """Apply a DDL script all or nothing: check the schema it leads to (validity and
        Rules 1-5) against ``catalog``, the backend's just now; then keep that catalog and
        create and drop the DuckDB tables in one transaction. A script refused leaves the
        file as it was, its catalog included. ``then(con)`` runs last inside the transaction."""
        before = self.load_schema()
        schema, actions = apply_script(before, statements, catalog)
        actions = self.recreated_readers(before, schema, catalog, actions)
        self._execute_actions(actions, schema, catalog, then)
        self.save_catalog(catalog)
        with self._shared.lock:
            self._shared.schema_version += 1
        self.bump()  # after the schema version: region state is re-read with the new schema
        return DdlResult(
            created=[n for a, n in actions if a == "create"],
            dropped=[n for a, n in actions if a == "drop"],
        )

    def matching_keys(
        self, control: str, columns: Sequence[str], where: exp.Expr | None
    ) -> list[tuple[t.Any, ...]]:
        """The control-key values of a control table's rows a WHERE clause selects."""
        sql = f"SELECT {idents(columns)} FROM {ident(control)}"
        if where is not None:
            sql += f" WHERE {where.this.sql(dialect='duckdb')}"
        return [tuple(r) for r in self.con.execute(sql).fetchall()]

    def row_counts(self, views: Iterable[str]) -> dict[str, float]:
        """The rows each cached view holds (cost inputs of planning)."""
        found = {}
        for view in views:
            row = self.con.execute(f"SELECT count(*) FROM {ident(view)}").fetchone()
            found[view] = float(row[0]) if row else 0.0
        return found

    # -- counters ------------------------------------------------------------------------------

    def counters(self) -> Counts:
        """The counters saved in the file, in its order (a name this version does not know,
        a newer one's, is left out)."""
        found: Counts = {}
        for name, value in self.con.execute("SELECT name, value FROM mtcache.counters").fetchall():
            counter = named(name)
            if counter is not None:
                found[counter] = int(value)
        return found
