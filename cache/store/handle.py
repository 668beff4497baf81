"""What every handle on one cache file in this process shares (`shared_state`: versions,
locks, the parsed schema, the size budget), and the handle's part that reads and moves it
(`FileHandle`): the versions and change tokens that tell what committed since, transactions that
count their changes at the commit, and the stream and maintenance locks. `CacheStore`
(`cache.store.cache_file`) opens the file and is such a handle."""

from __future__ import annotations

import threading
import typing as t
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from cache.store.bound_asks import BoundAsks
from cache.store.budget import Budget
from cache.store.region_reads import RegionReads
from cache.store.remote_reads import RemoteReads
from control_tables.schema import CacheSchema

T = t.TypeVar("T")


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
    # the bounds queries asked of its views in this process (`cache.store.bound_asks`)
    asks: BoundAsks = field(default_factory=BoundAsks)
    # the cached reads the backend answered in this process (`cache.store.remote_reads`)
    remote_reads: RemoteReads = field(default_factory=RemoteReads)
    # the presence regions read since their last refresh (`cache.store.region_reads`)
    region_reads: RegionReads = field(default_factory=RegionReads)


_SHARED: dict[Path, _Shared] = {}
_SHARED_LOCK = threading.Lock()


def shared_state(path: Path) -> _Shared:
    key = path.resolve()
    with _SHARED_LOCK:
        return _SHARED.setdefault(key, _Shared())


class FileHandle:
    """A handle's view of its file's shared state (`CacheStore` opens it)."""

    path: Path
    con: duckdb.DuckDBPyConnection
    _shared: _Shared
    _change: tuple[list[str] | None] | None  # (views,) once `changed`

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
        counted): of the rows of ``views`` (None: of any view). The file's write lock first,
        then the commit lock, as `transaction` takes them (the other order deadlocks against
        a write committing meanwhile)."""
        with self._shared.lock, self._shared.commit_lock:
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

    @property
    def catalog_version(self) -> int:
        """Bumped whenever the shadow catalog is saved (reflect, DDL)."""
        return self._shared.catalog_version

    @property
    def schema_version(self) -> int:
        """Bumped by DDL only: plans depend on the schema, not on region contents."""
        return self._shared.schema_version

    @property
    def budget(self) -> Budget:
        """The file's size budget in this process (`cache.store.budget`)."""
        return self._shared.budget

    @property
    def asks(self) -> BoundAsks:
        """The bounds asked of the file's views in this process (`cache.store.bound_asks`)."""
        return self._shared.asks

    @property
    def remote_reads(self) -> RemoteReads:
        """The cached reads the backend answered in this process (`cache.store.remote_reads`)."""
        return self._shared.remote_reads

    @property
    def region_reads(self) -> RegionReads:
        """The presence regions read since their last refresh, in this process
        (`cache.store.region_reads`)."""
        return self._shared.region_reads

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
