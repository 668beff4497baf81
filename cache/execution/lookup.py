"""Point lookups answered from memory (issue 27's hit path): for an all-local statement of the
shape ``SELECT columns FROM view WHERE k1 = $a AND k2 = $b``, the view's rows are kept in a
hash index on ``(k1, k2)``, built by DuckDB's own read of those columns, and a lookup with
parameters of the key columns' own types takes its rows from the index instead of running the
statement (about a microsecond instead of a DuckDB statement's few hundred).

An index is valid while none of the views it read changed (`CacheStore.change_token`, taken
before DuckDB reads, as the result memo's answers): a refresh, a stream batch, an admission or
an eviction makes it stale, and lookups go to DuckDB until it is built again. The guards still
run on every execution; the index only replaces DuckDB's run of the statement they chose.

Only shapes whose answer is exactly the index's rows are indexed: one cached view, no joins,
grouping, ordering, limits or DISTINCT, a select list of its columns as stored (no
expressions: a computed column could fail for rows a lookup never touches), keys compared
with parameters by ``=``, keys of integer or text columns (no value with a time zone among
the columns: a background handle's zone could differ from the session's), and parameters of
exactly those types (anything else, a float for an integer key, is DuckDB's to answer; a NULL
matches no key).
Indexes are built after a shape's `USES_BEFORE_BUILD`-th run, on the statement's thread when
the view is small (`SYNC_ROWS`), else by a background thread, and then not built again sooner
than `REBUILD_SPACING` times its last build's length (a large view the stream changes every
second is not rebuilt every second: DuckDB answers it meanwhile). They are bounded by an
estimate of their memory (the oldest go first).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
import typing as t
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import sqlglot
from sqlglot import exp

from cache.execution.convert import at_edges, infinite_among, infinite_kinds
from cache.store.cache_file import CacheStore

log = logging.getLogger(__name__)

DEFAULT_BYTES = 512 << 20  # per process and cache file
USES_BEFORE_BUILD = 4  # runs of a shape through DuckDB before its index is built
SYNC_ROWS = 50_000  # views up to this size are indexed by the statement that asks
REBUILD_SPACING = 10  # times a build's length, before that shape is built again
_ENTRY_BYTES = 120  # a dict slot, a boxed key and the row's tuple
_VALUE_BYTES = 40  # a boxed value of an integer or a short text

# the DuckDB types of key columns and the one Python type a parameter must have to be looked up
_KEY_TYPES: dict[str, type] = {
    "TINYINT": int,
    "SMALLINT": int,
    "INTEGER": int,
    "BIGINT": int,
    "HUGEINT": int,
    "UTINYINT": int,
    "USMALLINT": int,
    "UINTEGER": int,
    "UBIGINT": int,
    "VARCHAR": str,
}

Row = tuple[t.Any, ...]


@dataclass(frozen=True)
class LookupShape:
    """A statement answered by a lookup: where each key's value is among the statement's
    parameter values (in key order), and the DuckDB statements counting and reading every
    row's keys and output columns."""

    params: tuple[int, ...]
    build_sql: str
    count_sql: str

    def key(self, values: Sequence[t.Any]) -> t.Any:
        """The key these parameter values look up: its one key's value, or the tuple of its
        keys' values (as `LookupIndexes.key_rows` takes it)."""
        params = self.params
        return values[params[0]] if len(params) == 1 else tuple(values[p] for p in params)


def lookup_shape(sql: str, names: Sequence[str]) -> LookupShape | None:
    """The lookup a DuckDB statement is, or None when it is not one (see the module);
    ``names``: its parameters' names, in the order their values are given."""
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return None
    if not isinstance(tree, exp.Select) or not isinstance(tree.args.get("from_"), exp.From):
        return None
    if any(
        tree.args.get(k)
        for k in (
            "with_",
            "joins",
            "group",
            "having",
            "order",
            "limit",
            "offset",
            "distinct",
            "qualify",
            "windows",
            "laterals",
            "kind",
            "hint",
            "exclude",
            "operation_modifiers",
        )
    ):
        return None
    source = tree.args["from_"].this
    if (
        not isinstance(source, exp.Table)
        or source.args.get("joins")
        or not isinstance(source.this, exp.Identifier)
    ):
        return None
    for column in tree.expressions:
        inner = column.this if isinstance(column, exp.Alias) else column
        if not (
            isinstance(inner, exp.Star)
            or (isinstance(inner, exp.Column) and isinstance(inner.this, exp.Identifier | exp.Star))
        ):
            return None
    where = tree.args.get("where")
    if where is None:
        return None
    keys: list[exp.Column] = []
    params: list[int] = []
    for term in where.this.flatten() if isinstance(where.this, exp.And) else [where.this]:
        if not isinstance(term, exp.EQ):
            return None
        left, right = term.this, term.expression
        if isinstance(left, exp.Placeholder):
            left, right = right, left
        if (
            not isinstance(left, exp.Column)
            or not isinstance(right, exp.Placeholder)
            or not isinstance(left.this, exp.Identifier)
            or str(right.this) not in names
        ):
            return None
        keys.append(left)
        params.append(names.index(str(right.this)))
    if len(set(params)) != len(params) or len({k.sql("duckdb") for k in keys}) != len(keys):
        return None
    present = exp.and_(*(exp.Not(this=exp.Is(this=k.copy(), expression=exp.Null())) for k in keys))
    build = tree.copy()
    build.set("expressions", [k.copy() for k in keys] + [c.copy() for c in tree.expressions])
    build.set("where", exp.Where(this=present))
    count = tree.copy()
    count.set("expressions", [exp.Count(this=exp.Star())])
    count.set("where", exp.Where(this=present.copy()))
    return LookupShape(tuple(params), build.sql("duckdb"), count.sql("duckdb"))


class _Index(t.NamedTuple):
    token: tuple[int, ...]
    types: tuple[type, ...]  # each key's Python type
    rows: dict[Hashable, t.Any]  # key (a tuple when there are several) -> row, or list of rows
    size: int


class LookupIndexes:
    """The lookup indexes of one cache file in this process, shared by its engines (see the
    module and `lookups_for`)."""

    def __init__(self, max_bytes: int = DEFAULT_BYTES) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.answered = 0  # lookups answered (a statistic: threads may miss an increment)
        self.built = 0  # indexes built
        self.engines = 0  # the engines using them (`lookups_for`, `release`)
        self._indexes: OrderedDict[LookupShape, _Index] = OrderedDict()
        self._uses: dict[LookupShape, int] = {}
        # not indexed at that token (too big, unsupported types, a failed build)
        self._refused: dict[LookupShape, tuple[int, ...]] = {}
        self._building: set[LookupShape] = set()
        self._not_before: dict[LookupShape, float] = {}  # monotonic time of its next build
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False

    def rows(
        self, shape: LookupShape, token: tuple[int, ...], values: Sequence[t.Any]
    ) -> list[Row] | None:
        """The rows the statement would return for these parameter values, if its index is
        built at ``token`` and the values have the keys' types; else None."""
        return self.key_rows(shape, token, shape.key(values))

    def key_rows(self, shape: LookupShape, token: tuple[int, ...], key: t.Any) -> list[Row] | None:
        """`rows` of the value of the shape's one key, or the tuple of its keys' values."""
        index = self._indexes.get(shape)
        if index is None or index.token != token:
            return None
        if len(index.types) == 1:
            if key is None:
                return []
            if type(key) is not index.types[0]:
                return None
        else:
            if None in key:
                return []
            if any(type(v) is not k for v, k in zip(key, index.types, strict=True)):
                return None
        found = index.rows.get(key)
        self.answered += 1
        if found is None:
            return []
        if type(found) is list:
            return list(found)
        return [found]

    def holds(self, shape: LookupShape, token: tuple[int, ...]) -> bool:
        """Whether the shape's index is built at ``token``."""
        index = self._indexes.get(shape)
        return index is not None and index.token == token

    def ran(
        self,
        shape: LookupShape,
        token: tuple[int, ...],
        duck: duckdb.DuckDBPyConnection,
        values: Sequence[t.Any],
        handle: Callable[[], CacheStore],
    ) -> None:
        """DuckDB ran the shape on ``duck`` with these parameter values: build its index,
        missing or stale, once it has run often enough, here or on a handle of its own
        (``handle()``, closed after)."""
        with self._lock:
            index = self._indexes.get(shape)
            if (
                self._closed
                or shape in self._building
                or self._refused.get(shape) == token
                or (index is not None and index.token == token)
                or time.monotonic() < self._not_before.get(shape, 0.0)
            ):
                return  # (a current index did not take these values' types)
            uses = self._uses[shape] = self._uses.get(shape, 0) + 1
            if uses < USES_BEFORE_BUILD:
                return
            if not all(type(values[p]) in (int, str) for p in shape.params):
                return  # these parameters could not be looked up anyway
            self._uses[shape] = 0
            self._building.add(shape)
        apart = False
        try:
            count = _count(duck, shape)
            if count > SYNC_ROWS:
                with self._lock:
                    if self._pool is None:
                        self._pool = concurrent.futures.ThreadPoolExecutor(
                            1, thread_name_prefix="mtcache-lookup"
                        )
                    self._pool.submit(self._build_apart, shape, token, count, handle())
                apart = True
            else:
                self._build(shape, token, count, duck)
        except Exception:  # the statement was answered: only its index is not made
            log.exception("building a lookup index failed (lookups stay with DuckDB)")
            self._refuse(shape, token)
        finally:
            if not apart:
                with self._lock:
                    self._building.discard(shape)

    def _build_apart(
        self, shape: LookupShape, token: tuple[int, ...], count: int, store: CacheStore
    ) -> None:
        try:
            with contextlib.closing(store):
                self._build(shape, token, count, store.con, apart=True)
        except Exception:
            log.exception("building a lookup index failed (lookups stay with DuckDB)")
            self._refuse(shape, token)
        finally:
            with self._lock:
                self._building.discard(shape)

    def _refuse(self, shape: LookupShape, token: tuple[int, ...]) -> None:
        """Not indexed while its views stay at ``token``."""
        with self._lock:
            self._refused[shape] = token

    def _build(
        self,
        shape: LookupShape,
        token: tuple[int, ...],
        count: int,
        duck: duckdb.DuckDBPyConnection,
        apart: bool = False,
    ) -> None:
        started = time.monotonic()
        relation = duck.sql(shape.build_sql)
        width = len(shape.params)
        kinds = [str(k) for k in relation.types]
        types = tuple(_KEY_TYPES.get(k) for k in kinds[:width])
        size = count * (_ENTRY_BYTES + _VALUE_BYTES * (len(kinds) - width))
        if (
            any(k is None for k in types)
            or any("TIME ZONE" in k for k in kinds)
            or size > self.max_bytes // 2
        ):
            self._refuse(shape, token)
            return
        # DuckDB's own Python values, as its answer to the statement has them
        read = relation.fetchall()
        dated = infinite_kinds(kinds)
        if dated and at_edges(read, dated) and infinite_among(relation.to_arrow_table(), dated):
            self._refuse(shape, token)  # (infinity looks like 0001-01-01: DuckDB answers)
            return
        keys: Sequence[Hashable] = [r[0] for r in read] if width == 1 else [r[:width] for r in read]
        rows = [r[width:] for r in read]
        del read
        index: dict[Hashable, t.Any] = dict(zip(keys, rows, strict=True))
        if len(index) != len(rows):  # a key with several rows: each key's in scan order
            index = {}
            for key, row in zip(keys, rows, strict=True):
                held = index.get(key)
                if held is None:
                    index[key] = row
                elif type(held) is list:
                    held.append(row)
                else:
                    index[key] = [held, row]
        built = _Index(token, t.cast(tuple[type, ...], types), index, size)
        with self._lock:
            if self._closed:
                return
            if apart:  # a large view that keeps changing is not indexed again and again
                self._not_before[shape] = time.monotonic() + REBUILD_SPACING * (
                    time.monotonic() - started
                )
            old = self._indexes.pop(shape, None)
            if old is not None:
                self.used -= old.size
            self._indexes[shape] = built
            self.used += size
            self.built += 1
            while self.used > self.max_bytes and self._indexes:
                _, dropped = self._indexes.popitem(last=False)
                self.used -= dropped.size

    def wait(self) -> None:
        """Until the builds under way have finished (tests and benchmarks)."""
        with self._lock:
            pool = self._pool
        if pool is not None:
            pool.submit(lambda: None).result()

    def summary(self) -> list[dict[str, t.Any]]:
        with self._lock:
            return [{"keys": len(i.rows), "bytes": i.size} for i in self._indexes.values()]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
            self._indexes.clear()
            self.used = 0
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _count(duck: duckdb.DuckDBPyConnection, shape: LookupShape) -> int:
    """The rows an index of the shape would hold."""
    ((count,),) = duck.execute(shape.count_sql).fetchall()
    return int(count)


_INDEXES: dict[Path, LookupIndexes] = {}
_INDEXES_LOCK = threading.Lock()


def lookups_for(cache_file: Path) -> LookupIndexes:
    """The lookup indexes of a cache file in this process, for one more engine (which calls
    `release` when it closes: the last one frees them)."""
    cache_file = cache_file.resolve()
    with _INDEXES_LOCK:
        indexes = _INDEXES.get(cache_file)
        if indexes is None:
            indexes = _INDEXES[cache_file] = LookupIndexes()
        indexes.engines += 1
        return indexes


def release(cache_file: Path) -> None:
    cache_file = cache_file.resolve()
    with _INDEXES_LOCK:
        indexes = _INDEXES.get(cache_file)
        if indexes is None:
            return
        indexes.engines -= 1
        if indexes.engines > 0:
            return
        del _INDEXES[cache_file]
    indexes.close()
