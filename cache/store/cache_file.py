"""The cache file: cached views and control tables in DuckDB, metadata in the schema ``mtcache``.

A cached view or control table ``name`` is the DuckDB table ``main.name``. Internal
state lives in ``mtcache.*``: the shadow catalog of the backend (tables, columns, keys, indexes,
statistics), the cache objects with their DDL text (the cache schema is rebuilt by parsing it),
view-level region state, snapshots and counters. Everything survives restarts.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import typing as t
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
from sqlglot import exp

from cache.private_files import make_private, make_private_dirs
from cache.store import functions
from cache.store.budget import Budget, data_bytes, data_tables, parse_size
from cache.store.served import served_at
from control_tables.schema import CachedView, CacheSchema, ControlTable, view_from_statement
from control_tables.script import apply_script
from control_tables.types import BPCHAR, duckdb_type, transfer_type
from heartbeat.clock import BackendClock
from optimizer.derived.delta import auxiliary_prefix, maintenance
from optimizer.derived.states import layout
from sql_ext import CreateCachedView, CreateControlTable, Statement, parse
from sql_ext.catalog import Catalog, Column, Index, Table, View
from sql_ext.errors import OperationalError, ProgrammingError, first_line, translate
from sql_ext.quoting import ident, idents

T = t.TypeVar("T")


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


def count_in(con: duckdb.DuckDBPyConnection, amounts: t.Mapping[str, int]) -> None:
    """Inside a transaction: add to the counters of `mtcache status`."""
    for name, amount in amounts.items():
        con.execute("UPDATE mtcache.counters SET value = value + ? WHERE name = ?", [amount, name])


# 2: char(n) values are stored without their blank padding (control_tables.types.BPCHAR);
#    the shadow catalog knows each column's own collation
FORMAT_VERSION = "2"

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
    """CREATE TABLE IF NOT EXISTS mtcache.stream_pulls (
        snapshot_id BIGINT, pg_snapshot VARCHAR, until_lsn BIGINT, backend_time TIMESTAMPTZ,
        view VARCHAR, predicate VARCHAR)""",
]

# memo_hits / memo_misses: local answers reused from memory (the result memo or a lookup
# index) / kept in the result memo
# evictions: presence keys the size budget evicted; budget_overruns: stream batches that
# landed over it (nothing left to evict); deferred_admissions: first misses of a key the
# doorkeeper did not admit (`cache.engine.admission`)
COUNTERS = (
    "hits",
    "presence_misses",
    "currency_misses",
    "remote",
    "memo_hits",
    "memo_misses",
    "completeness_misses",
    "consistency_misses",
    "timeline_misses",
    "evictions",
    "budget_overruns",
    "deferred_admissions",
)


@dataclass(frozen=True)
class DdlResult:
    created: list[str]
    dropped: list[str]
    # the fully materialized views it created, filled at once (`Admin.apply_ddl`): each one's
    # report (`cache.maintenance.report.Report`), and those that could not be, with why
    filled: list[t.Any] = field(default_factory=list)
    unfilled: list[tuple[str, str]] = field(default_factory=list)


class StreamHolder(t.Protocol):
    def release(self) -> None: ...


@dataclass
class _Shared:
    """State of one cache file shared by every handle of this process."""

    version: int = 0  # bumped after every committed change of the file
    schema_version: int = 0  # bumped by DDL only
    catalog_version: int = 0  # bumped when the shadow catalog is saved
    lock: threading.RLock = field(default_factory=threading.RLock)
    # held across a write's COMMIT and its version bump, and to read a change token: a reader
    # that saw a commit's rows or stamps never gets a token from before it (a memo entry made
    # from older rows would otherwise pass for current)
    commit_lock: threading.Lock = field(default_factory=threading.Lock)
    # held by the stream consumer while it applies, and by a pull of continuously maintained
    # regions from its snapshot to its commit (the stream must not pass the pull meanwhile)
    stream_lock: threading.RLock = field(default_factory=threading.RLock)
    # held by an admission, refresh or eviction from its closure to its commit: an operation
    # works out what it replaces from the cache as it is, which another one committing
    # meanwhile would make stale (a refresh's older rows over a region admitted since)
    maintenance_lock: threading.RLock = field(default_factory=threading.RLock)
    # the stream consumers of this file in this process (their streaming sessions hold the
    # slot: the cache DDL releases them before it changes or drops it)
    stream_holders: weakref.WeakSet[StreamHolder] = field(default_factory=weakref.WeakSet)
    handles: int = 0  # open handles: with none, another process may change the file
    schema: tuple[int, CacheSchema] | None = None  # parsed at a schema_version
    # what changed which view's rows: a view's count goes up with every committed change of
    # its rows; ``epoch`` with a change of any (DDL, another process's)
    view_versions: dict[str, int] = field(default_factory=dict)
    epoch: int = 0
    # figures read from the file's data, each at the version it was read at (`at_version`)
    figures: dict[str, tuple[t.Any, t.Any]] = field(default_factory=dict)
    # the connection holding the cache's DuckDB functions (`cache.store.functions`): opened
    # with the first handle, closed after the last
    functions: duckdb.DuckDBPyConnection | None = None
    # the size budget of the file's data in this process, and what its regions are worth
    budget: Budget = field(default_factory=Budget)


_SHARED: dict[Path, _Shared] = {}
_SHARED_LOCK = threading.Lock()


def _shared_state(path: Path) -> _Shared:
    key = path.resolve()
    with _SHARED_LOCK:
        return _SHARED.setdefault(key, _Shared())


def damaged(exc: BaseException, path: Path) -> OperationalError | None:
    """The error for a DuckDB error that says the cache file is damaged (else None)."""
    text = first_line(exc)
    if "corrupt" not in text.lower() and "checksum" not in text.lower():
        return None
    return OperationalError(
        f"the cache file {path} is damaged ({text}): move it aside and build the cache again "
        "(mtcache init, ddl, admit); the backend's data is not affected"
    )


class CacheStore:
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
        self._shared = _shared_state(self.path)
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
                        f"(cache.connect(..., server={served.address!r}); the mtcache "
                        "commands do so by themselves)"
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
            for name in COUNTERS:
                self.con.execute(
                    "INSERT INTO mtcache.counters VALUES (?, 0) ON CONFLICT DO NOTHING", [name]
                )
            row = self.con.execute(
                "SELECT value FROM mtcache.meta WHERE key = 'format_version'"
            ).fetchone()
            if row is not None and row[0] == "1":
                self._migrate_from_1()

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
        self.con.execute(
            "UPDATE mtcache.meta SET value = ? WHERE key = 'format_version'", [FORMAT_VERSION]
        )

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

    @property
    def version(self) -> int:
        return self._shared.version

    def committed_version(self) -> int:
        """The version counting every change committed so far: equal at two moments only if
        no change (of rows or regions) committed in between (`transaction` commits and counts
        atomically)."""
        with self._shared.commit_lock:
            return self._shared.version

    def committed_version_at_hand(self) -> int | None:
        """`committed_version`, or None while a change is being committed."""
        lock = self._shared.commit_lock
        if not lock.acquire(False):
            return None
        try:
            return self._shared.version
        finally:
            lock.release()

    def unchanged_since(self, version: int) -> bool:
        """Whether no change committed since the file was at ``version``, and none is being
        committed (`committed_version` without waiting, in one step)."""
        lock = self._shared.commit_lock
        if not lock.acquire(False):
            return False
        try:
            return self._shared.version == version
        finally:
            lock.release()

    def at_version(self, name: str, read: Callable[[], T]) -> T:
        """``read()``, or what it gave at the file's present version (no change committed
        since, and the file and its WAL on disk as they were: a checkpoint changes where
        the data lies without a change of version): a figure of the file's data too costly
        to read again each time it is asked (the stored bytes that the status, and so each
        scrape of the server's metrics, gives). The caller does not change what it gets."""
        shared = self._shared
        version = (self.committed_version(), self._on_disk())
        with shared.lock:
            kept = shared.figures.get(name)
        if kept is not None and kept[0] == version:
            return t.cast(T, kept[1])
        value = read()
        # (read while a change committed or a checkpoint moved the data: not kept)
        if self.unchanged_since(version[0]) and self._on_disk() == version[1]:
            with shared.lock:
                shared.figures[name] = (version, value)
        return value

    def _on_disk(self) -> tuple[tuple[int, int] | None, ...]:
        """The size and modification time of the file and of its WAL (None: not there)."""
        found: list[tuple[int, int] | None] = []
        for path in (self.path, self.path.with_name(self.path.name + ".wal")):
            try:
                stat = path.stat()
            except FileNotFoundError:
                found.append(None)
            else:
                found.append((stat.st_size, stat.st_mtime_ns))
        return tuple(found)

    def bump(self, views: Iterable[str] | None = None) -> None:
        """After a change committed outside `transaction` (DDL, once its schema version is
        counted): of the rows of ``views`` (None: of any view)."""
        with self._shared.commit_lock:
            self._bump(views)

    def _bump(self, views: Iterable[str] | None) -> None:
        with self._shared.lock:
            shared = self._shared
            shared.version += 1
            if views is None:
                shared.epoch += 1
            else:
                for view in views:
                    shared.view_versions[view] = shared.view_versions.get(view, 0) + 1

    def change_token(self, views: Iterable[str]) -> tuple[int, ...]:
        """Equal at two moments only if no row of ``views`` changed in between."""
        with self._shared.commit_lock:
            return self._token(views)

    def change_token_at_hand(self, views: Iterable[str]) -> tuple[int, ...] | None:
        """`change_token`, or None while a change is being committed."""
        lock = self._shared.commit_lock
        if not lock.acquire(False):
            return None
        try:
            return self._token(views)
        finally:
            lock.release()

    def _token(self, views: Iterable[str]) -> tuple[int, ...]:
        shared = self._shared
        versions = shared.view_versions
        return (shared.epoch, *(versions.get(v, 0) for v in views))

    def save_clock(self, clock: BackendClock) -> None:
        """The last backend-clock measurement, for tools without a backend connection."""
        with self.transaction() as con:
            con.execute(
                "INSERT OR REPLACE INTO mtcache.meta VALUES ('backend_clock', ?)",
                [json.dumps(clock.to_json())],
            )

    def add_counters(self, amounts: dict[str, int]) -> None:
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

    @property
    def catalog_version(self) -> int:
        """Bumped whenever the shadow catalog is saved (reflect, DDL)."""
        return self._shared.catalog_version

    @property
    def schema_version(self) -> int:
        """Bumped by DDL only: plans depend on the schema, not on region contents."""
        return self._shared.schema_version

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

    @property
    def budget(self) -> Budget:
        """The file's size budget in this process (`cache.store.budget`)."""
        return self._shared.budget

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

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """One DuckDB transaction: everything inside commits together or not at all; the
        changes named by `changed` inside it are counted at the commit, atomically with it."""
        with self._shared.lock:
            self.con.execute("BEGIN TRANSACTION")
            try:
                yield self.con
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
            else:
                with self._shared.commit_lock:
                    self.con.execute("COMMIT")
                    if self._change is not None:
                        self._bump(self._change[0])
            finally:
                self._change = None

    def changed(self, views: Iterable[str] | None = None) -> None:
        """Inside `transaction`: the rows of ``views`` (None: of any view) change with it
        (called again, the views add up)."""
        if views is None or (self._change is not None and self._change[0] is None):
            self._change = (None,)
        else:
            before = self._change[0] if self._change is not None else []
            assert before is not None
            self._change = ([*before, *views],)

    @property
    def stream_lock(self) -> threading.RLock:
        return self._shared.stream_lock

    @property
    def maintenance_lock(self) -> threading.RLock:
        return self._shared.maintenance_lock

    def hold_stream(self, holder: StreamHolder) -> None:
        """``holder`` streams this file's slot (`release_streams` ends its session)."""
        self._shared.stream_holders.add(holder)

    def release_streams(self) -> None:
        with self.stream_lock:
            for holder in list(self._shared.stream_holders):
                holder.release()

    # -- the shadow catalog --------------------------------------------------------------------

    def save_catalog(self, catalog: Catalog) -> None:
        now = dt.datetime.now(dt.UTC)
        with self.transaction() as con:
            for internal in (
                "backend_tables",
                "backend_columns",
                "backend_unique_keys",
                "backend_indexes",
                "backend_views",
            ):
                con.execute(f"DELETE FROM mtcache.{internal}")
            for table in catalog.tables.values():
                con.execute(
                    "INSERT INTO mtcache.backend_tables (name, schema, row_count, pages, "
                    "primary_key, reflected_at, oid) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        table.name,
                        table.schema,
                        table.row_count,
                        table.pages,
                        list(table.primary_key),
                        now,
                        table.oid,
                    ],
                )
                con.executemany(
                    "INSERT INTO mtcache.backend_columns (table_name, position, name, type, "
                    "nullable, n_distinct, byte_order, deterministic, type_oid, type_modifier, "
                    "number) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        [
                            table.name,
                            i,
                            c.name,
                            c.type,
                            c.nullable,
                            c.n_distinct,
                            c.byte_order,
                            c.deterministic,
                            c.type_oid,
                            c.type_modifier,
                            c.number,
                        ]
                        for i, c in enumerate(table.columns)
                    ],
                )
                for key in table.unique_keys:
                    con.execute(
                        "INSERT INTO mtcache.backend_unique_keys VALUES (?, ?)",
                        [table.name, list(key)],
                    )
                for index in table.indexes:
                    con.execute(
                        "INSERT INTO mtcache.backend_indexes VALUES (?, ?, ?, ?)",
                        [table.name, index.name, list(index.columns), index.unique],
                    )
            for view in catalog.views.values():
                con.execute(
                    "INSERT INTO mtcache.backend_views VALUES (?, ?, ?)",
                    [view.name, view.schema, view.definition],
                )
            for setting, on in (
                ("text_byte_order", catalog.text_byte_order),
                ("ascii_case", catalog.ascii_case),
                ("utf8", catalog.utf8),
            ):
                con.execute(
                    "INSERT OR REPLACE INTO mtcache.meta VALUES (?, ?)", [setting, str(on).lower()]
                )
        with self._shared.lock:
            self._shared.catalog_version += 1

    def has_catalog(self) -> bool:
        row = self.con.execute("SELECT count(*) FROM mtcache.backend_tables").fetchone()
        return bool(row and row[0])

    def catalog_is_current(self) -> bool:
        """Whether the shadow catalog holds all it keeps now (one saved by an older version
        lacks the columns' type OIDs and numbers)."""
        row = self.con.execute(
            "SELECT count(*) FROM mtcache.backend_columns WHERE type_oid IS NULL"
        ).fetchone()
        return not (row and row[0])

    def load_catalog(self) -> Catalog:
        columns: dict[str, list[Column]] = {}
        for (
            table,
            name,
            type_,
            nullable,
            distinct,
            byte_order,
            deterministic,
            type_oid,
            modifier,
            number,
        ) in self.con.execute(
            "SELECT table_name, name, type, nullable, n_distinct, byte_order, deterministic, "
            "type_oid, type_modifier, number FROM mtcache.backend_columns "
            "ORDER BY table_name, position"
        ).fetchall():
            columns.setdefault(table, []).append(
                Column(
                    name,
                    type_,
                    nullable,
                    distinct,
                    byte_order,
                    deterministic is not False,
                    type_oid or 0,
                    -1 if modifier is None else modifier,
                    number or 0,
                )
            )
        unique: dict[str, list[tuple[str, ...]]] = {}
        for table, cols in self.con.execute(
            "SELECT table_name, columns FROM mtcache.backend_unique_keys"
        ).fetchall():
            unique.setdefault(table, []).append(tuple(cols))
        indexes: dict[str, list[Index]] = {}
        for table, name, cols, is_unique in self.con.execute(
            "SELECT table_name, name, columns, is_unique FROM mtcache.backend_indexes ORDER BY 1, 2"
        ).fetchall():
            indexes.setdefault(table, []).append(Index(name, tuple(cols), is_unique))
        tables = {
            name: Table(
                name=name,
                columns=tuple(columns.get(name, [])),
                primary_key=tuple(pk or ()),
                unique_keys=tuple(unique.get(name, [])),
                schema=schema,
                row_count=row_count or 0.0,
                pages=int(pages or 0),
                indexes=tuple(indexes.get(name, [])),
                oid=oid or 0,
            )
            for name, schema, row_count, pages, pk, oid in self.con.execute(
                "SELECT name, schema, row_count, pages, primary_key, oid "
                "FROM mtcache.backend_tables"
            ).fetchall()
        }
        views = {
            name: View(name, definition, schema)
            for name, schema, definition in self.con.execute(
                "SELECT name, schema, definition FROM mtcache.backend_views"
            ).fetchall()
        }
        meta = dict(
            self.con.execute(
                "SELECT key, value FROM mtcache.meta "
                "WHERE key IN ('text_byte_order', 'ascii_case', 'utf8')"
            ).fetchall()
        )
        # a catalog saved before the ctype was read: case mapping stays at the backend
        return Catalog(
            tables=tables,
            views=views,
            text_byte_order=meta.get("text_byte_order", "true") == "true",
            ascii_case=meta.get("ascii_case") == "true",
            utf8=meta.get("utf8") == "true",
        )

    # -- the cache schema ----------------------------------------------------------------------

    def load_schema(self) -> CacheSchema:
        """The cache schema, parsed from the DDL texts once per schema version."""
        shared = self._shared
        with shared.lock:
            version = shared.schema_version
            if shared.schema is not None and shared.schema[0] == version:
                return shared.schema[1]
        schema = self._parse_schema()
        with shared.lock:
            if shared.schema_version == version:
                shared.schema = (version, schema)
        return schema

    def control_table_names(self) -> t.AbstractSet[str]:
        return self.load_schema().control_tables.keys()

    def _parse_schema(self) -> CacheSchema:
        schema = CacheSchema()
        for kind, text, columns, key in self.con.execute(
            "SELECT kind, statement, columns, key FROM mtcache.objects ORDER BY seq"
        ).fetchall():
            statement = parse(text)[0]
            if kind == "control table":
                assert isinstance(statement, CreateControlTable)
                schema = schema.with_control_table(statement)
            else:
                assert isinstance(statement, CreateCachedView)
                view = view_from_statement(statement, tuple(columns), tuple(key))
                schema = schema.with_view(view)
        return schema

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
        schema, actions = apply_script(self.load_schema(), statements, catalog)
        self._execute_actions(actions, schema, catalog, then)
        self.save_catalog(catalog)
        with self._shared.lock:
            self._shared.schema_version += 1
        self.bump()  # after the schema version: region state is re-read with the new schema
        return DdlResult(
            created=[n for a, n in actions if a == "create"],
            dropped=[n for a, n in actions if a == "drop"],
        )

    def _execute_actions(
        self,
        actions: list[tuple[str, str]],
        schema: CacheSchema,
        catalog: Catalog,
        then: t.Callable[[duckdb.DuckDBPyConnection], None] | None,
    ) -> None:
        try:
            with self.transaction() as con:
                row = con.execute("SELECT coalesce(max(seq), 0) FROM mtcache.objects").fetchone()
                seq = int(row[0]) if row else 0
                for action, name in actions:
                    if action == "drop":
                        con.execute(f"DROP TABLE IF EXISTS {ident(name)}")
                        for (copy,) in con.execute(  # a derived view's copies of its tables
                            "SELECT table_name FROM duckdb_tables() WHERE schema_name = "
                            "'main' AND starts_with(table_name, ?)",
                            [auxiliary_prefix(name)],
                        ).fetchall():
                            con.execute(f"DROP TABLE {ident(copy)}")
                        con.execute("DELETE FROM mtcache.objects WHERE name = ?", [name])
                        con.execute("DELETE FROM mtcache.view_state WHERE view = ?", [name])
                        continue
                    seq += 1
                    if name in schema.control_tables:
                        self._create_control_table(schema.control_tables[name], seq)
                    else:
                        self._create_view(schema, schema.views[name], catalog, seq)
                if then is not None:
                    then(con)
        except duckdb.Error as exc:
            raise translate(exc, "applying the cache schema (nothing was changed)") from exc

    def _create_control_table(self, control: ControlTable, seq: int) -> None:
        columns = [
            f"{ident(name)} {exp.DataType.build(type_, dialect='postgres').sql(dialect='duckdb')}"
            for name, type_ in control.columns
        ]
        self.con.execute(
            f"CREATE TABLE {ident(control.name)} ({', '.join(columns)}, "
            f"refreshed_at TIMESTAMPTZ, snapshot_id BIGINT, "
            f"PRIMARY KEY ({idents(control.column_names)}))"
        )
        self.con.execute(
            "INSERT INTO mtcache.objects VALUES (?, ?, 'control table', ?, ?, NULL, NULL, NULL, "
            "NULL, now())",
            [seq, control.name, control.statement, list(control.column_names)],
        )

    def _create_view(
        self, schema: CacheSchema, view: CachedView, catalog: Catalog, seq: int
    ) -> None:
        if view.is_derived:  # (its stored columns, and no primary key: a group may be NULL)
            stored = layout(view, catalog).columns
            columns = [f"{ident(c.name)} {c.duckdb_type}" for c in stored]
            self.con.execute(f"CREATE TABLE {ident(view.name)} ({', '.join(columns)})")
            if view.continuous:  # its copies of the tables it reads (`optimizer.derived.delta`)
                for aux in maintenance(view, catalog).auxiliaries:
                    table = catalog.table(aux.table)
                    assert table is not None
                    types = {c.name: c.type for c in table.columns}
                    copy = aux.copy
                    columns = [f"{ident(c)} {duckdb_type(types[c])}" for c in copy.columns]
                    self.con.execute(
                        f"CREATE TABLE {ident(copy.name)} ({', '.join(columns)}, "
                        f"PRIMARY KEY ({idents(copy.key)}))"
                    )
        else:
            table = catalog.table(view.table)
            assert table is not None
            types = {c.name: c.type for c in table.columns}
            columns = [f"{ident(c)} {duckdb_type(types[c])}" for c in view.columns]
            self.con.execute(
                f"CREATE TABLE {ident(view.name)} ({', '.join(columns)}, "
                f"PRIMARY KEY ({idents(view.key)}))"
            )
        self.con.execute(
            "INSERT INTO mtcache.objects VALUES (?, ?, 'cached view', ?, ?, ?, ?, ?, ?, now())",
            [
                seq,
                view.name,
                view.statement,
                list(view.columns),
                list(view.key),
                view.color,
                "view" if view.view_level else "group",
                [p.control for p in view.presence],
            ],
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

    def counters(self) -> dict[str, int]:
        return {
            name: int(value)
            for name, value in self.con.execute(
                "SELECT name, value FROM mtcache.counters"
            ).fetchall()
        }
