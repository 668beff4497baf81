"""Continuous maintenance from the WAL (issue 11; the design in docs/decisions.md,
"Continuous maintenance from the WAL"): views declared ``REFRESH CONTINUOUSLY`` are kept
current from PostgreSQL's logical replication stream.

`apply_ddl` (the cache DDL) keeps one publication and one slot per cache file over the
continuously maintained views' tables and the heartbeat table. `Consumer` streams the slot
(`cache.backend.replication.SlotStream`), and `apply_transactions` applies whole backend
transactions, in commit order, to the views in one DuckDB transaction with the stream
position: a crash anywhere streams again from the position the file stores (nothing lost,
nothing applied twice).

Applying is set-based (one batch of transactions = a few statements per view): per table, the
last change of each key wins; the keys touched are deleted from the view and the final rows
inserted where they belong to a present region (Noria's partial state: changes to keys the
cache does not hold are dropped; a row moving into a present region arrives whole, one moving
out leaves). Views go parents first, so a child row belongs where its parent row now is; a
parent key that disappears takes its children's rows with it. What the stream cannot carry -
the children of a parent row that newly appears, the rest of a presence region a completeness
region admits - is pulled (an upquery: `Maintainer` in the backend's current snapshot, lined
up with the stream by `cache.maintenance.lineup`).

The heartbeat's row travels in the same stream: applying heartbeat time T means every change
committed before T is applied, so the continuously maintained regions are stamped T, all
with the one snapshot id of the batch, which names the stream position (``lsn X/Y``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import logging
import operator
import secrets
import select
import time
import typing as t
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import duckdb
import psycopg
import pyarrow as pa

from cache.backend.copy_arrow import read_csv
from cache.backend.pgoutput import (
    UNCHANGED,
    Relation,
    Transaction,
    Transactions,
    lsn_text,
)
from cache.backend.reflect import connect_backend
from cache.backend.replication import (
    SlotStream,
    create_publication,
    create_slot,
    drop_publication,
    drop_slot,
    slot_state,
    wal_mark,
)
from cache.maintenance import faults
from cache.maintenance.lineup import Pending, pending_pulls
from cache.maintenance.pipeline import Maintainer
from cache.store.cache_file import CacheStore, DdlResult
from control_tables.regions import Region, in_list
from control_tables.schema import CachedView, CacheSchema
from control_tables.script import apply_script
from control_tables.types import BPCHAR, NUMBERED, numbered, transfer_type
from heartbeat.beat import TABLE as HEARTBEAT_TABLE
from heartbeat.beat import ensure_table
from heartbeat.loop import Loop
from sql_ext import CreateCachedView, Presence, Statement
from sql_ext.catalog import Catalog
from sql_ext.errors import NotSupportedError, OperationalError, first_line
from sql_ext.quoting import equal_columns, ident, idents

log = logging.getLogger("mtcache.stream")

SLOT_PREFIX = "mtcache_"
KEEP_SNAPSHOTS = 200  # stream snapshot rows kept (status and the measured delay read the last)
IDLE_SECONDS = 1.0  # how often a consumer without a stream looks for one
CONFIRM_SECONDS = 1.0  # the slot is confirmed at most this often while batches come
CHECK_SECONDS = 1.0  # the slot's lag is looked at this often
IN_USE_SECONDS = 10.0  # a slot still streamed by a session that is ending (a killed owner's)
DEFAULT_LAG_LIMIT = 1 << 30  # bytes of WAL the slot may hold back before status warns


class StreamProblem(Exception):
    """The stream cannot be applied as it is (a cached table changed at the backend)."""


@dataclass(frozen=True)
class StreamRow:
    slot: str
    publication: str
    applied_lsn: int
    stream_time: dt.datetime | None
    applied_at: dt.datetime | None
    relations: dict[str, list[list[t.Any]]]  # table -> [[column, type oid], ...] at DDL time
    problem: str | None


def load_stream(con: duckdb.DuckDBPyConnection) -> StreamRow | None:
    row = con.execute(
        "SELECT slot, publication, applied_lsn, stream_time, applied_at, relations, problem "
        "FROM mtcache.stream"
    ).fetchone()
    if row is None:
        return None
    return StreamRow(row[0], row[1], int(row[2]), row[3], row[4], json.loads(row[5] or "{}"),
                     row[6])  # fmt: skip


# -- the cache DDL's side: publication and slot ---------------------------------------------------


def apply_ddl(
    store: CacheStore, dsn: str, statements: Sequence[Statement], catalog: Catalog
) -> DdlResult:
    """Apply cache DDL, keeping the publication and the slot in step with the continuously
    maintained views: made (the slot with the first such view) before the DuckDB commit and
    dropped again if it fails; dropped after the commit that removes the last such view. The
    file's stream consumers wait meanwhile, their sessions ended (they start again from the
    file's position, with the relations as they are now)."""
    with store.stream_lock:
        if load_stream(store.con) is not None:
            store.release_streams()
        return _apply_ddl(store, dsn, statements, catalog)


def _apply_ddl(
    store: CacheStore, dsn: str, statements: Sequence[Statement], catalog: Catalog
) -> DdlResult:
    before = store.load_schema()
    after, _ = apply_script(before, statements, catalog)
    tables = _stream_tables(after, catalog)
    current = load_stream(store.con)
    if not tables:
        result = store.apply_ddl(statements, catalog, then=_forget_stream)
        if current is not None:
            with contextlib.suppress(psycopg.Error, OperationalError):
                drop_slot(dsn, current.slot)
                drop_publication(dsn, current.publication)
        return result
    created = [st.name for st in statements
               if isinstance(st, CreateCachedView) and after.continuous(st.name)]  # fmt: skip
    if current is not None and tables == _stream_tables(before, catalog) and not (
        current.problem and created
    ):  # fmt: skip
        return store.apply_ddl(statements, catalog)
    # (a stopped stream resumes once continuous views are created again: they are checked
    # against the backend's catalog of now, whose columns the stream is signed with anew)
    _check_replica_identity(after, catalog)
    with connect_backend(dsn, autocommit=True) as conn:
        ensure_table(conn)  # in the backend's default schema, wherever that is
        row = conn.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = to_regclass(%s)", (HEARTBEAT_TABLE,)
        ).fetchone()  # fmt: skip
        assert row is not None
        heartbeat = (row[0], HEARTBEAT_TABLE)
        relations = _relation_signatures(conn, tables)
    name = current.slot if current is not None else SLOT_PREFIX + secrets.token_hex(8)
    create_publication(dsn, name, [*tables, heartbeat])
    if current is not None:
        # the new tables' changes come from now on; the new views are empty until pulled
        return store.apply_ddl(statements, catalog,
                               then=lambda con: _set_relations(con, relations))  # fmt: skip
    try:
        with create_slot(dsn, name) as start:

            def keep(con: duckdb.DuckDBPyConnection) -> None:
                con.execute("DELETE FROM mtcache.stream_pulls")
                con.execute(
                    "INSERT INTO mtcache.stream VALUES (?, ?, ?, NULL, now(), ?, NULL)",
                    [name, name, start.consistent_lsn, json.dumps(relations)],
                )

            return store.apply_ddl(statements, catalog, then=keep)
    except BaseException:
        with contextlib.suppress(psycopg.Error, OperationalError):
            drop_slot(dsn, name)
            drop_publication(dsn, name)
        raise


def _forget_stream(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("DELETE FROM mtcache.stream")
    con.execute("DELETE FROM mtcache.stream_pulls")


def _set_relations(con: duckdb.DuckDBPyConnection, relations: dict[str, t.Any]) -> None:
    con.execute("UPDATE mtcache.stream SET relations = ?, problem = NULL",
                [json.dumps(relations)])  # fmt: skip


def _stream_tables(schema: CacheSchema, catalog: Catalog) -> list[tuple[str, str]]:
    found = set()
    for name in schema.continuous_views():
        table = catalog.table(schema.views[name].table)
        assert table is not None
        found.add((table.schema, table.name))
    return sorted(found)


def _check_replica_identity(schema: CacheSchema, catalog: Catalog) -> None:
    """The stream identifies a row by its table's primary key (PostgreSQL's default replica
    identity); a table without one cannot even be updated once it is published."""
    for name in schema.continuous_views():
        view = schema.views[name]
        table = catalog.table(view.table)
        assert table is not None
        if not table.primary_key:
            raise NotSupportedError(
                f"cached view {name}: REFRESH CONTINUOUSLY needs a primary key on {view.table} "
                "(the replication stream identifies rows by it); add one, or use REFRESH EVERY"
            )
        if tuple(view.key) != tuple(table.primary_key):
            raise NotSupportedError(
                f"cached view {name}: REFRESH CONTINUOUSLY needs {view.table}'s primary key "
                f"({', '.join(table.primary_key)}) among the view's columns"
            )


def _relation_signatures(
    conn: psycopg.Connection[t.Any], tables: Iterable[tuple[str, str]]
) -> dict[str, list[list[t.Any]]]:
    """Each table's columns and type ids as the stream will describe them."""
    found = {}
    for schema, name in tables:
        rows = conn.execute(
            "SELECT attname, atttypid::int FROM pg_attribute WHERE attrelid = "
            "(quote_ident(%s) || '.' || quote_ident(%s))::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum", (schema, name)
        ).fetchall()  # fmt: skip
        found[f"{schema}.{name}"] = [list(r) for r in rows]
    return found


# -- applying transactions --------------------------------------------------------------------


@dataclass
class NeedsPull(Exception):
    """The stream cannot carry what a transaction brings into the cache: pull these."""

    seeds: set[Region]
    admitted: dict[str, list[tuple[t.Any, ...]]] = field(default_factory=dict)


@dataclass
class Applied:
    views: set[str] = field(default_factory=set)  # whose rows the batch changed


def apply_transactions(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    catalog: Catalog,
    stream: StreamRow,
    txns: Sequence[Transaction],
    pendings: list[Pending],
    enabled_faults: frozenset[str] = frozenset(),
) -> Applied:
    """Apply whole transactions inside the caller's DuckDB transaction, then stamp the
    regions and record the stream position. ``pendings`` (pulls the stream has not passed)
    is updated: a pull the first of ``txns`` passes is resolved (the caller applies a batch
    of more than one transaction only when there is none)."""
    stream_time = stream.stream_time
    skip: dict[str, list[str]] = {}
    for pending in list(pendings):
        if pending.passed_by(txns[0].xid, txns[0].commit_lsn):
            con.execute("DELETE FROM mtcache.stream_pulls WHERE snapshot_id = ?",
                        [pending.snapshot_id])  # fmt: skip
            stream_time = _later(stream_time, pending.backend_time)
            pendings.remove(pending)
        else:
            for view, predicate in pending.predicates.items():
                skip.setdefault(view, []).append(predicate)
    assert all(not p.passed_by(x.xid, x.commit_lsn) for p in pendings for x in txns[1:]), \
        "a run of transactions that leaves the pending pulls as they are (`_run_of`)"  # fmt: skip
    applied = Applied()
    by_table: dict[str, list[tuple[Relation, t.Any]]] = {}
    truncated: set[str] = set()
    checked: set[int] = set()  # relations (as described in this batch) checked
    for txn in txns:
        cuts = list(txn.truncated)
        for index, (relation, change) in enumerate(txn.changes):
            _truncate_until(index, cuts, stream, truncated, by_table)
            if relation.name == HEARTBEAT_TABLE:
                if change.new is not None:
                    beat = _heartbeat_time(relation, change.new)
                    stream_time = _later(stream_time, beat)
                continue
            if id(relation) not in checked:
                _check_relation(stream, relation)
                checked.add(id(relation))
            by_table.setdefault(relation.name, []).append((relation, change))
        _truncate_until(len(txn.changes), cuts, stream, truncated, by_table)
    views = schema.continuous_views()
    staged: dict[str, _Staged] = {}
    for name in views:
        table = schema.views[name].table
        if table not in staged:
            staged[table] = _stage(schema, catalog, table, by_table.get(table, []))
    for name in views:
        cached = schema.views[name]
        if cached.table in truncated:
            # TRUNCATE: the rows leave (their regions stay present, empty)
            _delete_where(con, schema, cached, _keep(skip.get(name, [])), applied)
        if staged[cached.table].count:
            _apply_view(con, schema, cached, staged[cached.table], skip.get(name, []), applied)
    for stage in staged.values():
        stage.close(con)
    faults.hit("stream_apply", enabled_faults)  # the changes made, the position not yet
    last = txns[-1]
    _stamp(con, schema, stream, last.end_lsn, stream_time, [p.snapshot_id for p in pendings],
           applied)  # fmt: skip
    return applied


def _truncate_until(
    index: int,
    cuts: list[tuple[int, Relation]],
    stream: StreamRow,
    truncated: set[str],
    by_table: dict[str, list[tuple[Relation, t.Any]]],
) -> None:
    """The TRUNCATEs of a transaction that came before its change ``index``: the table's
    changes so far no longer matter (its views empty out), the ones after start afresh."""
    while cuts and cuts[0][0] <= index:
        _, cut = cuts.pop(0)
        if cut.name != HEARTBEAT_TABLE:
            _check_relation(stream, cut)
            truncated.add(cut.name)
            by_table.pop(cut.name, None)


def _run_of(txns: list[Transaction], pendings: list[Pending]) -> list[Transaction]:
    """The leading transactions that one `apply_transactions` call may take: the first may
    pass pending pulls, the others none of those left."""
    left = [p for p in pendings if not p.passed_by(txns[0].xid, txns[0].commit_lsn)]
    for index, txn in enumerate(txns[1:], start=1):
        if any(p.passed_by(txn.xid, txn.commit_lsn) for p in left):
            return txns[:index]
    return txns


def _later(a: dt.datetime | None, b: dt.datetime | None) -> dt.datetime | None:
    if a is None or b is None:
        return a or b
    return max(a, b)


def _heartbeat_time(relation: Relation, row: tuple[t.Any, ...]) -> dt.datetime | None:
    names = [c.name for c in relation.columns]
    value = row[names.index("beat_at")] if "beat_at" in names else None
    if not isinstance(value, str):
        return None
    return dt.datetime.fromisoformat(value).astimezone(dt.UTC)


def _check_relation(stream: StreamRow, relation: Relation) -> None:
    expected = stream.relations.get(f"{relation.schema}.{relation.name}")
    got = [[c.name, c.type_oid] for c in relation.columns]
    if expected is not None and expected != got:
        raise StreamProblem(
            f"table {relation.schema}.{relation.name} changed at the backend (its columns are "
            f"now {', '.join(c.name for c in relation.columns)}): continuous maintenance "
            "stopped, its views age and queries go to the backend; recreate the cached views "
            "of that table (DROP CACHED VIEW, CREATE CACHED VIEW) to resume"
        )


class _Staged:
    """One table's batch: the keys touched and the final rows, typed as the cache stores
    them, registered in DuckDB as ``mtcache_del_<table>`` and ``mtcache_put_<table>``."""

    def __init__(self, con_name: str):
        self.name = con_name
        self.count = 0
        self.dels: pa.Table | None = None
        self.puts: pa.Table | None = None

    @property
    def del_name(self) -> str:
        return f"mtcache_del_{self.name}"

    @property
    def put_name(self) -> str:
        return f"mtcache_put_{self.name}"

    def register(self, con: duckdb.DuckDBPyConnection) -> None:
        assert self.dels is not None and self.puts is not None
        con.register(self.del_name, self.dels)
        con.register(self.put_name, self.puts)

    def close(self, con: duckdb.DuckDBPyConnection) -> None:
        if self.dels is not None:
            with contextlib.suppress(duckdb.Error):
                con.unregister(self.del_name)
                con.unregister(self.put_name)


def _stage(
    schema: CacheSchema, catalog: Catalog, table_name: str, changes: list[tuple[Relation, t.Any]]
) -> _Staged:
    table = catalog.table(table_name)
    assert table is not None
    wanted: list[str] = []
    for name in schema.continuous_views():
        view = schema.views[name]
        if view.table == table_name:
            wanted += [c for c in view.columns if c not in wanted]
    types = {c.name: c.type for c in table.columns}
    columns = [(c, t.cast(str, transfer_type(types[c]))) for c in wanted]
    stage = _Staged(str(len(table_name)) + "_" + "".join(ch for ch in table_name if ch.isalnum()))
    if not changes:
        return stage
    final: dict[tuple[t.Any, ...], tuple[t.Any, ...] | None] = {}
    touched: dict[tuple[t.Any, ...], None] = {}  # keys in the stream's text form
    transfer = dict(columns)
    key_columns = [(k, transfer.get(k) or t.cast(str, transfer_type(types[k])))
                   for k in table.primary_key]  # fmt: skip
    getters: dict[int, tuple[Callable[[t.Any], tuple[t.Any, ...]], ...]] = {}
    for relation, change in changes:
        got = getters.get(id(relation))
        if got is None:
            names = [c.name for c in relation.columns]
            missing = [c for c in [*table.primary_key, *(c for c, _ in columns)]
                       if c not in names]  # fmt: skip
            if missing:
                raise StreamProblem(
                    f"table {relation.schema}.{relation.name} has no column "
                    f"{', '.join(missing)} any more: continuous maintenance stopped; recreate "
                    "the cached views of that table (DROP CACHED VIEW, CREATE CACHED VIEW)"
                )
            got = getters[id(relation)] = (
                _picker([names.index(k) for k in table.primary_key]),
                _picker([names.index(c) for c, _ in columns]),
            )
        key_of, row_of = got
        if change.old is not None:
            old_key = key_of(change.old)
            touched[old_key] = None
            final[old_key] = None
        new = change.new
        if new is not None:
            key, row = key_of(new), row_of(new)
            previous = final.get(key)
            if previous is not None and UNCHANGED in row:
                row = tuple(p if v is UNCHANGED else v for v, p in zip(row, previous, strict=True))
            touched[key] = None
            final[key] = row
    stage.count = len(changes)
    stage.dels = read_csv(_csv(touched, key_columns), key_columns)
    rows = [r for r in final.values() if r is not None]
    if any(UNCHANGED in r for r in rows):
        # a TOASTed value the update did not send: the row's cached copy has it, else a pull
        flags = [[v is UNCHANGED for v in r] for r in rows]
        rows = [tuple(None if v is UNCHANGED else v for v in r) for r in rows]
        puts = read_csv(_csv(rows, columns), columns)
        for index, (name, _) in enumerate(columns):
            puts = puts.append_column(f"mtcache_unchanged_{name}",
                                      pa.array([f[index] for f in flags]))  # fmt: skip
        stage.puts = puts
    else:
        stage.puts = read_csv(_csv(rows, columns), columns)
    return stage


def _picker(indexes: list[int]) -> Callable[[t.Any], tuple[t.Any, ...]]:
    if len(indexes) == 1:
        (only,) = indexes
        return lambda row: (row[only],)
    return operator.itemgetter(*indexes)


def _text_form(column: str, kind: str) -> Callable[[t.Any], t.Any]:
    """A value of the stream in the form a pull sends (control_tables.types.select_list):
    char(n) without its padding, dates and times as numbers (`control_tables.types.NUMBERED`),
    read from the text PostgreSQL wrote."""
    if kind == BPCHAR:
        return lambda v: v.rstrip(" ") if isinstance(v, str) else v
    if kind in NUMBERED:

        def number(value: t.Any) -> t.Any:
            if not isinstance(value, str):
                return value
            try:
                return str(numbered(kind, value))
            except ValueError as exc:
                raise StreamProblem(f"column {column}: {exc}") from None

        return number
    return lambda v: v


def _csv(rows: Iterable[tuple[t.Any, ...]], columns: list[tuple[str, str]]) -> bytes:
    """PostgreSQL text values as the CSV `read_csv` reads a pull's rows from (NULL unquoted
    and empty, every other value quoted), in the text form a pull sends (`_text_form`)."""
    forms = [(i, _text_form(c, kind)) for i, (c, kind) in enumerate(columns)
             if kind == BPCHAR or kind in NUMBERED]  # fmt: skip
    out = io.StringIO()
    write = out.write
    for row in rows:
        values = list(row) if forms else row
        for index, form in forms:
            values[index] = form(values[index])  # type: ignore[index]
        write(",".join("" if v is None else '"' + v.replace('"', '""') + '"' for v in values))
        write("\n")
    return out.getvalue().encode()


def _apply_view(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    view: CachedView,
    stage: _Staged,
    skip: list[str],
    applied: Applied,
) -> None:
    """One view's part of a batch: the touched keys leave, the final rows that belong to a
    present region arrive (``skip``: predicates of regions a pending pull holds)."""
    assert stage.puts is not None
    stage.register(con)
    name = ident(view.name)
    keep = _keep(skip)
    touched = f"EXISTS (SELECT 1 FROM {stage.del_name} d WHERE {equal_columns(view.key, 'v', 'd')})"
    children = list(schema.edges_from(view.name))
    leaving: dict[tuple[str, ...], set[tuple[t.Any, ...]]] = {}
    before: dict[tuple[str, ...], set[tuple[t.Any, ...]]] = {}
    for _, edge in children:
        cols = idents(edge.control_columns)
        leaving[edge.control_columns] = _distinct(
            con, f"SELECT DISTINCT {cols} FROM {name} v WHERE ({keep}) AND {touched}"
        )
        before[edge.control_columns] = _distinct(
            con, f"SELECT DISTINCT {cols} FROM {name} WHERE ({cols}) IN "
                 f"(SELECT {cols} FROM {stage.put_name})")  # fmt: skip
    unchanged = [c for c in view.columns if f"mtcache_unchanged_{c}" in stage.puts.column_names]
    source = stage.put_name
    if unchanged:
        # the cached copy of a row whose TOASTed value the update did not send supplies it
        merged = ", ".join(
            f"CASE WHEN p.{ident('mtcache_unchanged_' + c)} THEN k.{ident(c)} "
            f"ELSE p.{ident(c)} END AS {ident(c)}" if c in unchanged else f"p.{ident(c)}"
            for c in view.columns)  # fmt: skip
        lacking = " OR ".join(f"(p.{ident('mtcache_unchanged_' + c)} AND k.{ident(view.key[0])} "
                              "IS NULL)" for c in unchanged)  # fmt: skip
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE mtcache_merged AS SELECT {merged}, ({lacking}) AS "
            f"mtcache_lacking FROM {stage.put_name} p LEFT JOIN (SELECT * FROM {name} v WHERE "
            f"{touched}) k ON {equal_columns(view.key, 'k', 'p')}"
        )
        source = "mtcache_merged"
        qualifies = _qualifies(schema, view, "p")
        lacking_rows = "(SELECT * FROM mtcache_merged WHERE mtcache_lacking) p"
        if con.execute(f"SELECT count(*) FROM {lacking_rows} WHERE ({qualifies}) "
                       f"AND ({keep})").fetchone() != (0,):  # fmt: skip
            raise NeedsPull(_regions_of(con, view, lacking_rows))
    row = con.execute(f"DELETE FROM {name} v WHERE ({keep}) AND {touched}").fetchone()
    deleted = int(row[0]) if row else 0
    arriving = (
        f"SELECT {idents(view.columns)} FROM {source} p WHERE ({_qualifies(schema, view, 'p')}) "
        f"AND ({keep})"
    )
    if skip:  # a row a pending pull holds was kept above: it stays as pulled
        arriving += f" AND NOT EXISTS (SELECT 1 FROM {name} v WHERE " \
                    f"{equal_columns(view.key, 'v', 'p')})"  # fmt: skip
    if not children and view.completeness is None:  # nothing looks at the rows that arrived
        row = con.execute(f"INSERT INTO {name} ({idents(view.columns)}) {arriving}").fetchone()
        if unchanged:
            con.execute("DROP TABLE mtcache_merged")
        _changed(applied, view, row, deleted)
        return
    con.execute(f"CREATE OR REPLACE TEMP TABLE mtcache_arrived AS {arriving}")
    if unchanged:
        con.execute("DROP TABLE mtcache_merged")
    row = con.execute(
        f"INSERT INTO {name} ({idents(view.columns)}) SELECT * FROM mtcache_arrived"
    ).fetchone()
    try:
        _admit_completeness_keys(con, schema, view)
        for child, edge in children:
            cols = idents(edge.control_columns)
            new = _distinct(con, f"SELECT DISTINCT {cols} FROM mtcache_arrived")
            new -= before[edge.control_columns]
            if new:
                # the children of a row new to the cache are not in the stream: pull them
                where = in_list(edge.control_columns, new).sql("duckdb")
                raise NeedsPull(
                    _regions_of(con, view, f"(SELECT * FROM mtcache_arrived WHERE {where}) p")
                )
            gone = leaving[edge.control_columns] - _distinct(
                con, f"SELECT DISTINCT {cols} FROM {name}"
            )
            if gone:
                _delete_under(con, schema, child, edge, gone, applied)
    finally:
        con.execute("DROP TABLE mtcache_arrived")
    _changed(applied, view, row, deleted)


def _keep(skip: list[str]) -> str:
    """SQL: the row is in no region a pending pull holds (``skip``: their predicates)."""
    return " AND ".join(f"NOT ({p})" for p in skip) or "true"


def _changed(applied: Applied, view: CachedView, inserted: tuple[t.Any, ...] | None,
             deleted: int) -> None:  # fmt: skip
    if deleted or (inserted and inserted[0]):
        applied.views.add(view.name)


def _distinct(con: duckdb.DuckDBPyConnection, query: str) -> set[tuple[t.Any, ...]]:
    return {tuple(r) for r in con.execute(query).fetchall()}


def _edge_match(edge: Presence, alias: str) -> str:
    """SQL: the control row ``c`` lists the row ``alias`` by the presence edge."""
    pairs = zip(edge.columns, edge.control_columns, strict=True)
    return " AND ".join(f"c.{ident(cc)} = {alias}.{ident(vc)}" for vc, cc in pairs)


def _qualifies(schema: CacheSchema, view: CachedView, alias: str) -> str:
    """SQL: the row ``alias`` belongs to a present region of ``view``."""
    if view.is_fully_materialized:
        return "true"
    parts = []
    for edge in view.presence:
        match = _edge_match(edge, alias)
        parts.append(f"EXISTS (SELECT 1 FROM {ident(edge.control)} c WHERE {match})")
    if view.completeness is not None:
        if view.completeness.control is None:
            return "true"
        match = " AND ".join(f"c.{ident(c)} = {alias}.{ident(c)}"
                             for c in view.completeness.columns)  # fmt: skip
        parts.append(f"EXISTS (SELECT 1 FROM {ident(view.completeness.control)} c WHERE {match})")
    return " OR ".join(parts) or "false"


def _admit_completeness_keys(
    con: duckdb.DuckDBPyConnection, schema: CacheSchema, view: CachedView
) -> None:
    """Rows a completeness region brought in: their presence keys become listed (the region
    is then the row itself when the key identifies rows, else it is pulled)."""
    if view.completeness is None:
        return
    for edge in view.presence:
        if edge.control not in schema.control_tables:
            continue
        match = _edge_match(edge, "a")
        keys = con.execute(
            f"SELECT DISTINCT {', '.join('a.' + ident(c) for c in edge.columns)} "
            f"FROM mtcache_arrived a WHERE NOT EXISTS "
            f"(SELECT 1 FROM {ident(edge.control)} c WHERE {match})"
        ).fetchall()
        if not keys:
            continue
        if not set(view.key) <= set(edge.columns):
            values = [tuple(k) for k in keys]
            raise NeedsPull(
                {Region(view.name, "presence", edge.columns, v, edge.control) for v in values},
                {edge.control: values},
            )
        marks = ", ".join("?" for _ in edge.control_columns)
        con.executemany(
            f"INSERT INTO {ident(edge.control)} ({idents(edge.control_columns)}) "
            f"VALUES ({marks}) ON CONFLICT DO NOTHING", [list(k) for k in keys]
        )  # fmt: skip


def _regions_of(con: duckdb.DuckDBPyConnection, view: CachedView, rows: str) -> set[Region]:
    """The regions of ``view`` holding ``rows`` (SQL for a relation aliased p): pulling them
    brings the rows' children along (`Pull.children`), in one snapshot with them."""
    if view.view_level:
        return {Region(view.name, "view")}
    found: set[Region] = set()
    for edge in view.presence:
        match = _edge_match(edge, "p")
        found |= {Region(view.name, "presence", edge.columns, values, edge.control)
                  for values in _distinct(
                      con, f"SELECT DISTINCT {', '.join('p.' + ident(c) for c in edge.columns)} "
                           f"FROM {rows} WHERE EXISTS (SELECT 1 FROM {ident(edge.control)} c "
                           f"WHERE {match})")}  # fmt: skip
    spec = view.completeness
    if spec is not None and spec.control is not None:
        match = " AND ".join(f"c.{ident(c)} = p.{ident(c)}" for c in spec.columns)
        found |= {Region(view.name, "completeness", spec.columns, values, spec.control)
                  for values in _distinct(
                      con, f"SELECT DISTINCT {', '.join('p.' + ident(c) for c in spec.columns)} "
                           f"FROM {rows} WHERE EXISTS (SELECT 1 FROM {ident(spec.control)} c "
                           f"WHERE {match})")}  # fmt: skip
    return found


def _delete_where(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    view: CachedView,
    where: str,
    applied: Applied,
) -> None:
    """Delete the rows of ``view`` that ``where`` selects (SQL on the alias v); a parent key
    no longer in the view takes the child rows under it along, and so on down."""
    name = ident(view.name)
    children = list(schema.edges_from(view.name))
    leaving = {edge.control_columns: _distinct(
        con, f"SELECT DISTINCT {idents(edge.control_columns)} FROM {name} v WHERE {where}")
        for _, edge in children}  # fmt: skip
    row = con.execute(f"DELETE FROM {name} v WHERE {where}").fetchone()
    if row and row[0]:
        applied.views.add(view.name)
    for child, edge in children:
        gone = leaving[edge.control_columns] - _distinct(
            con, f"SELECT DISTINCT {idents(edge.control_columns)} FROM {name}")  # fmt: skip
        if gone:
            _delete_under(con, schema, child, edge, gone, applied)


def _delete_under(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    child: CachedView,
    edge: Presence,
    gone: set[tuple[t.Any, ...]],
    applied: Applied,
) -> None:
    """Parent keys no longer in the parent: the child rows under them leave, unless another
    parent still lists them."""
    where = in_list(edge.columns, gone).sql("duckdb")
    _delete_where(con, schema, child, f"{where} AND NOT ({_qualifies(schema, child, 'v')})",
                  applied)  # fmt: skip


def _stamp(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    stream: StreamRow,
    end_lsn: int,
    stream_time: dt.datetime | None,
    pending_ids: list[int],
    applied: Applied,
) -> None:
    """The batch's snapshot (naming the stream position) on every continuously maintained
    region the stream has reached (a pull's regions keep theirs until the stream passes it),
    with ``refreshed_at`` the stream time; the position with it."""
    row = con.execute("SELECT coalesce(max(snapshot_id), 0) + 1 FROM mtcache.snapshots").fetchone()
    assert row is not None
    snapshot_id = int(row[0])
    views = schema.continuous_views()
    age = None  # d (§4.6): how old the stream time is as it lands; batches that do not
    if stream_time is not None and stream_time != stream.stream_time:  # move it measure none
        age = max(0.0, (dt.datetime.now(dt.UTC) - stream_time).total_seconds())
    con.execute(
        "INSERT INTO mtcache.snapshots (snapshot_id, backend_time, pg_snapshot, engine, "
        "applied_at, views, delay_seconds) VALUES (?, ?, ?, 'stream', now(), ?, ?)",
        [snapshot_id, stream_time, f"lsn {lsn_text(end_lsn)}", views, age],
    )
    if snapshot_id % 20 == 0:  # now and then: a statement costs as much as the batch's rows
        con.execute("DELETE FROM mtcache.snapshots WHERE engine = 'stream' AND snapshot_id < ?",
                    [snapshot_id - KEEP_SNAPSHOTS])  # fmt: skip
    reached = (f"(snapshot_id IS NULL OR snapshot_id NOT IN ({', '.join(map(str, pending_ids))}))"
               if pending_ids else "true")  # fmt: skip
    controls: set[str] = set()
    for name in views:
        view = schema.views[name]
        controls |= {p.control for p in view.presence if p.control in schema.control_tables}
        for spec in (view.consistency, view.completeness):
            if spec is not None and spec.control is not None:
                controls.add(spec.control)
    for control in sorted(controls):
        con.execute(
            f"UPDATE {ident(control)} SET refreshed_at = coalesce(?, refreshed_at), "
            f"snapshot_id = ? WHERE {reached}",
            [stream_time, snapshot_id],
        )
    level = [n for n in views if schema.views[n].view_level]
    if level:
        con.execute(
            "UPDATE mtcache.view_state SET refreshed_at = coalesce(?, refreshed_at), "
            f"snapshot_id = ? WHERE view IN ({', '.join('?' for _ in level)}) "
            f"AND {reached}",
            [stream_time, snapshot_id, *level],
        )
    con.execute(
        "UPDATE mtcache.stream SET applied_lsn = ?, stream_time = ?, applied_at = now()",
        [end_lsn, stream_time],
    )
    applied.views |= set(views)


# -- the consumer --------------------------------------------------------------------------------


class Consumer:
    """Streams the file's slot and applies it: `step` once (a batch), `catch_up` until the
    stream has passed the backend's position of now, `start`/`stop` as a thread of the owning
    process. The streaming session stays open between steps (`release` ends it: the cache
    DDL does, before it changes the slot)."""

    def __init__(
        self,
        store: CacheStore,
        dsn: str,
        *,
        batch: int = 20_000,
        poll: float = 0.05,
        lag_limit: int = DEFAULT_LAG_LIMIT,
    ) -> None:
        self.store = store
        self.dsn = dsn
        self.batch = batch
        self.poll = poll
        self.lag_limit = lag_limit
        self._conn: psycopg.Connection[t.Any] | None = None
        self._source: SlotStream | None = None
        self._decoder = Transactions()
        self._loop = Loop("mtcache-stream")
        self._warned: str | None = None
        self.upqueries = 0
        self.faults = faults.active()
        self._catalog_at: tuple[int, Catalog] | None = None
        self._confirmed_at = 0.0  # monotonic time the slot was last confirmed
        self._checked_at = 0.0  # monotonic time the slot's lag was last looked at
        # the position the file held after the last step (None: no stream, or stopped)
        self.position: int | None = None
        store.hold_stream(self)

    # -- one batch ---------------------------------------------------------------------------

    def step(self, confirm: bool = True, wait: float = 0.0) -> int:
        """Apply the complete transactions the stream has brought (up to about ``batch``
        messages; with none there yet, waiting up to ``wait`` seconds for some); the number
        applied. ``confirm``: also confirm the slot to the backend when due (at most once a
        second while batches come, and when the stream goes idle)."""
        with self.store.stream_lock:
            stream = load_stream(self.store.con)
            self.position = None
            if stream is None or stream.problem is not None:
                self.release()
                return 0
            try:
                source = self._open(stream)
                if source is None:
                    return 0
                txns = [x for x in self._decoder.read(source.messages(self.batch, wait))
                        if x.end_lsn > stream.applied_lsn]  # fmt: skip
                if not txns:
                    self.position = stream.applied_lsn
                    self._pass_idle(stream, source.reached)
                    if confirm and source.confirmed < stream.applied_lsn:
                        self._confirm(source, stream.applied_lsn, wait=1.0)
                    return 0
                try:
                    self._apply(stream, txns)
                except StreamProblem as exc:
                    self._report(str(exc))
                    self.release()
                    return 0
                self.position = txns[-1].end_lsn  # now in the file
                if confirm and time.monotonic() - self._confirmed_at >= CONFIRM_SECONDS:
                    self._confirm(source, self.position)
                return len(txns)
            except BaseException:
                # what was read goes with the session: the next starts from the file's position
                self.release()
                raise

    def _open(self, stream: StreamRow) -> SlotStream | None:
        """The streaming session, started from the file's position if there is none (None:
        the slot was gone; it is made again and the views pulled anew)."""
        source = self._source
        if source is not None and source.slot == stream.slot:
            if time.monotonic() - self._checked_at >= CHECK_SECONDS:
                self._check_lag(slot_state(self.connection(), stream.slot).lag_bytes)
                self._checked_at = time.monotonic()
            return source
        self.store.release_streams()  # this one's, and another consumer's of this process
        state = slot_state(self.connection(), stream.slot)
        if not state.exists:
            self._recover(stream)
            return None
        self._check_lag(state.lag_bytes)
        self._checked_at = time.monotonic()
        deadline = time.monotonic() + IN_USE_SECONDS
        while True:
            try:
                source = SlotStream(self.dsn, stream.slot, stream.publication,
                                    stream.applied_lsn, state.confirmed_lsn or 0)  # fmt: skip
                break
            except psycopg.errors.ObjectInUse as exc:  # a session that is ending holds it
                if time.monotonic() > deadline:
                    raise OperationalError(
                        f"replication slot {stream.slot} is streamed by another session "
                        f"({first_line(exc)}): is another process applying this cache file's "
                        "stream? Close it, or end that session at the backend"
                    ) from exc
                time.sleep(0.2)
            except psycopg.errors.UndefinedObject:  # dropped since we looked
                self._recover(stream)
                return None
        self._source, self._decoder = source, Transactions()
        return source

    def _confirm(self, source: SlotStream, lsn: int, wait: float = 0.0) -> None:
        """Confirm to the backend what the cache file holds (it may recycle that WAL). Not
        after every batch: the position is safe in the file already."""
        faults.hit("stream_advance", self.faults)  # applied and stored, not confirmed
        source.confirm(lsn, wait)
        self._confirmed_at = time.monotonic()

    def _apply(self, stream: StreamRow, txns: list[Transaction]) -> None:
        """Apply in as few DuckDB transactions as correctness allows: a run of transactions
        that leaves the pending pulls as they are goes in one; a batch that needs a pull is
        halved until the one transaction that needs it is found (it goes with its pull)."""
        schema, catalog = self.store.load_schema(), self._catalog()
        remaining = list(txns)
        limit: int | None = None
        current: StreamRow | None = stream
        while remaining:
            current = current or load_stream(self.store.con)
            assert current is not None
            pendings = pending_pulls(self.store.con)  # only pulls (this thread) add to them
            group = _run_of(remaining, pendings)[:limit]
            try:
                with self.store.transaction() as con:
                    done = apply_transactions(con, schema, catalog, current, group, pendings,
                                              self.faults)  # fmt: skip
                    self.store.changed(done.views)
            except NeedsPull as need:
                if len(group) > 1:
                    limit = len(group) // 2
                    continue
                self._upquery(schema, catalog, group[0], need)
            remaining = remaining[len(group) :]
            limit, current = None, None  # moved on: read again

    def _catalog(self) -> Catalog:
        """The shadow catalog, read again only after DDL or a reflect saved it."""
        version = self.store.catalog_version
        if self._catalog_at is None or self._catalog_at[0] != version:
            self._catalog_at = (version, self.store.load_catalog())
        return self._catalog_at[1]

    def _pass_idle(self, stream: StreamRow, reached: int) -> None:
        """Everything committed before ``reached`` is applied: every pull whose transactions
        all committed before it is passed (the stream holds all it saw), with no transaction
        to show it."""
        with self.store.transaction() as con:
            pendings = pending_pulls(con)
            passed = [p for p in pendings if p.until_lsn <= reached]
            if not passed:
                return
            schema = self.store.load_schema()
            stream_time = stream.stream_time
            for pending in passed:
                con.execute("DELETE FROM mtcache.stream_pulls WHERE snapshot_id = ?",
                            [pending.snapshot_id])  # fmt: skip
                stream_time = _later(stream_time, pending.backend_time)
            applied = Applied()
            held = [p.snapshot_id for p in pendings if p not in passed]
            _stamp(con, schema, stream, stream.applied_lsn, stream_time, held, applied)
            self.store.changed(applied.views)

    def _upquery(
        self, schema: CacheSchema, catalog: Catalog, txn: Transaction, need: NeedsPull
    ) -> None:
        """Pull what ``txn`` brings in that the stream does not carry, in the backend's
        snapshot now, and apply ``txn`` in the same DuckDB transaction (the pull's regions
        skip it: the snapshot holds it)."""
        self.upqueries += 1

        def then(con: duckdb.DuckDBPyConnection, _: int) -> None:
            current = load_stream(con)
            assert current is not None
            done = apply_transactions(con, schema, catalog, current, [txn],
                                      pending_pulls(con), self.faults)  # fmt: skip
            self.store.changed(done.views)

        maintainer = Maintainer(self.store, self.dsn)
        maintainer._run("stream upquery", schema, need.seeds, need.admitted, then=then)

    # -- trouble -------------------------------------------------------------------------------

    def _report(self, problem: str) -> None:
        with self.store.transaction() as con:
            con.execute("UPDATE mtcache.stream SET problem = ?", [problem])
        log.error("%s", problem)

    def _check_lag(self, lag: int | None) -> None:
        if lag is not None and lag > self.lag_limit:
            text = (f"the replication slot holds {lag} bytes of WAL, over the limit of "
                    f"{self.lag_limit}: the consumer is behind")  # fmt: skip
            if self._warned != "lag":
                log.warning("%s", text)
                self._warned = "lag"
        elif self._warned == "lag":
            self._warned = None

    def _recover(self, stream: StreamRow) -> None:
        """The slot is gone (dropped at the backend): make a new one and pull every
        continuously maintained region again, lined up with it."""
        log.warning("replication slot %s is gone at the backend: making it again and pulling "
                    "the continuously maintained views anew", stream.slot)  # fmt: skip
        with create_slot(self.dsn, stream.slot) as start, self.store.transaction() as con:
            con.execute("DELETE FROM mtcache.stream_pulls")
            con.execute("UPDATE mtcache.stream SET applied_lsn = ?, problem = NULL",
                        [start.consistent_lsn])  # fmt: skip
        schema = self.store.load_schema()
        maintainer = Maintainer(self.store, self.dsn)
        for name in schema.continuous_views():
            if not schema.views[name].is_gray:
                maintainer.refresh(name)

    # -- running ---------------------------------------------------------------------------------

    def catch_up(self, timeout: float = 60.0) -> int:
        """Apply until the stream has passed the backend's WAL position of now (a mark made
        in the WAL: everything committed before the call is applied); the number of
        transactions applied."""
        target = wal_mark(self.connection())
        deadline = time.monotonic() + timeout
        total, marked_again = 0, False
        while True:
            applied = self.step(confirm=False, wait=self.poll)
            total += applied
            position = self.position
            if position is None and self._source is None:
                stream = load_stream(self.store.con)
                if stream is None or stream.problem is not None:
                    problem = stream.problem if stream is not None else None
                    raise OperationalError(f"the stream cannot be applied: {problem or 'none'}")
            source = self._source
            if (position is not None and position > target) or (
                source is not None and source.reached > target
            ):
                if pending_pulls(self.store.con):
                    self.step(confirm=False)  # passes the pulls the stream has reached
                if pending_pulls(self.store.con) and not marked_again:
                    # a pull made during the call (an upquery) may have read past every
                    # position the server has reported: mark the WAL again and go on until
                    # the stream passes that mark, and with it the pull
                    target, marked_again = wal_mark(self.connection()), True
                    continue
                return total
            if time.monotonic() > deadline:
                raise OperationalError(f"the stream did not reach {lsn_text(target)} in "
                                       f"{timeout:g} s")  # fmt: skip
            if not applied and source is not None:
                source.ping()  # where is the server? (its reply moves `reached`)

    def start(self) -> None:
        if load_stream(self.store.con) is not None:
            with contextlib.suppress(duckdb.Error), self.store.transaction() as con:
                # what `mtcache status` compares the slot's lag with
                con.execute("INSERT OR REPLACE INTO mtcache.meta VALUES "
                            "('stream_lag_limit', ?)", [str(self.lag_limit)])  # fmt: skip
        self._loop.start(self._run)

    def stop(self) -> None:
        self._loop.stop()
        self.close()

    def _run(self) -> None:
        while not self._loop.stopping.is_set():
            try:
                if load_stream(self.store.con) is None:  # no continuous view (yet)
                    self.release()
                    self._loop.stopping.wait(IDLE_SECONDS)
                    continue
                applied = self.step()
            except Exception as exc:  # the backend away, mostly: try again later
                self._close()
                if self._warned != "error":
                    log.warning("stream consumer: %s (retrying)", first_line(exc))
                    self._warned = "error"
                self._loop.stopping.wait(2.0)
                continue
            if self._warned == "error":
                log.warning("stream consumer: applying again")
                self._warned = None
            if not applied:
                self._wait(self.poll)

    def _wait(self, seconds: float) -> None:
        """Until the server sends something (or ``seconds``), outside the stream lock."""
        source = self._source
        if source is None:
            self._loop.stopping.wait(seconds)
            return
        with contextlib.suppress(OSError, ValueError):  # released meanwhile: no matter
            select.select([source.fileno()], [], [], seconds)

    def close(self) -> None:
        """End the streaming session, confirming the slot up to what the file holds (best
        effort: the file is what counts), and close the backend connection (`step` and
        `catch_up` open them again)."""
        self.release(confirm=True)
        self._close()

    def release(self, confirm: bool = False) -> None:
        """End the streaming session (the slot is free; the next step starts another from
        the file's position), confirming the file's position first if ``confirm``."""
        with self.store.stream_lock:
            source, self._source = self._source, None
            if source is None:
                return
            lsn = None
            if confirm:
                with contextlib.suppress(duckdb.Error):
                    stream = load_stream(self.store.con)
                    lsn = stream.applied_lsn if stream is not None else None
            with contextlib.suppress(Exception):
                source.close(confirm=lsn)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connection(self) -> psycopg.Connection[t.Any]:
        """The consumer's plain backend connection (slot state, WAL marks), opened if needed."""
        if self._conn is None or self._conn.closed:
            conn = connect_backend(self.dsn, autocommit=True)
            conn.execute("SET TimeZone = 'UTC'")
            conn.execute("SET DateStyle = 'ISO, YMD'")
            self._conn = conn
        return self._conn

    def _close(self) -> None:
        self.release()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


def stream_status(store: CacheStore, dsn: Callable[[], str] | None) -> dict[str, t.Any] | None:
    """The stream's part of `mtcache status` (lag in bytes needs the backend), against the
    lag limit of the owning process that ran last."""
    stream = load_stream(store.con)
    if stream is None:
        return None
    row = store.con.execute(
        "SELECT value FROM mtcache.meta WHERE key = 'stream_lag_limit'"
    ).fetchone()
    lag_limit = int(row[0]) if row else DEFAULT_LAG_LIMIT
    lag_bytes = None
    exists = None
    if dsn is not None:
        with contextlib.suppress(Exception), connect_backend(dsn(), autocommit=True) as conn:
            state = slot_state(conn, stream.slot)
            exists, lag_bytes = state.exists, state.lag_bytes
    now = dt.datetime.now(dt.UTC)
    return {
        "slot": stream.slot,
        "applied_lsn": lsn_text(stream.applied_lsn),
        "stream_time": stream.stream_time.isoformat() if stream.stream_time else None,
        "lag_seconds": (now - stream.stream_time).total_seconds() if stream.stream_time else None,
        "lag_bytes": lag_bytes,
        "slot_exists": exists,
        "lag_limit_bytes": lag_limit,
        "over_limit": lag_bytes is not None and lag_bytes > lag_limit,
        "problem": stream.problem,
    }
