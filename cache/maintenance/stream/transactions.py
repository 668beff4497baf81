"""Applying whole backend transactions, in commit order, to the continuously maintained views
in one DuckDB transaction with the stream position (`apply_transactions`)."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Sequence

import duckdb
import numpy as np
import pyarrow as pa

from cache.backend.pgoutput.messages import Relation
from cache.backend.pgoutput.rows import RowChanges
from cache.backend.pgoutput.transactions import Transaction, rows_of_run
from cache.maintenance import faults
from cache.maintenance.lineup import Pending
from cache.maintenance.stream.arrangements import Arrangements
from cache.maintenance.stream.derived import apply_derived, copies_of, plan_of
from cache.maintenance.stream.position import Applied, StreamProblem, StreamRow, load_stream
from cache.maintenance.stream.staging import stage_changes
from cache.maintenance.stream.views import apply_view, delete_where, not_pending, stamp_regions
from cache.store.budget import pulled_copies
from control_tables.schema import CachedView, CacheSchema
from heartbeat.beat import TABLE as HEARTBEAT_TABLE
from optimizer.derived.delta import copy_name
from sql_ext.catalog import Catalog


def apply_transactions(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    catalog: Catalog,
    stream: StreamRow,
    txns: Sequence[Transaction],
    pendings: list[Pending],
    enabled_faults: frozenset[str] = frozenset(),
    arrangements: Arrangements | None = None,
) -> Applied:
    """Apply whole transactions inside the caller's DuckDB transaction (`_apply_run`), with
    the consumer's ``arrangements`` of the copies (the caller forgets them if it fails). A
    transaction spilled to disk (`Transaction.pieces`), alone in its run, goes
    `PIECES_AT_ONCE` pieces at a time, so it lands whole or not at all while memory holds a
    few pieces; pieces are applied as a run of whole transactions would be (a later piece's
    change of a row follows an earlier one's)."""
    if len(txns) != 1 or txns[0].spill is None:
        return _apply_run(
            con, schema, catalog, stream, txns, pendings, enabled_faults, arrangements
        )
    applied = Applied()
    current = stream
    pieces = txns[0].pieces()
    for index, group in enumerate(iter(lambda: list(itertools.islice(pieces, PIECES_AT_ONCE)), [])):
        if index:
            faults.hit("stream_piece", enabled_faults)  # pieces applied, the rest not yet
            found = load_stream(con)
            assert found is not None
            current = found
        done = _apply_run(
            con, schema, catalog, current, group, pendings, enabled_faults, arrangements
        )
        applied.views |= done.views
    return applied


PIECES_AT_ONCE = 4  # a spilled transaction's pieces applied in one step (fewer statements)


def _apply_run(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    catalog: Catalog,
    stream: StreamRow,
    txns: Sequence[Transaction],
    pendings: list[Pending],
    enabled_faults: frozenset[str],
    arrangements: Arrangements | None,
) -> Applied:
    """Apply whole transactions inside the caller's DuckDB transaction, then stamp the
    regions and record the stream position. ``pendings`` (pulls the stream has not passed)
    is updated: a pull the first of ``txns`` passes is resolved (the caller applies a batch
    of more than one transaction only when there is none)."""
    stream_time = stream.stream_time
    skip: dict[str, list[str]] = {}
    for pending in list(pendings):
        if pending.passed_by(txns[0].xid, txns[0].commit_lsn):
            con.execute(
                "DELETE FROM mtcache.stream_pulls WHERE snapshot_id = ?", [pending.snapshot_id]
            )
            stream_time = later(stream_time, pending.backend_time)
            pendings.remove(pending)
        else:
            for view, predicate in pending.predicates.items():
                skip.setdefault(view, []).append(predicate)
    assert all(not p.passed_by(x.xid, x.commit_lsn) for p in pendings for x in txns[1:]), (
        "a run of transactions that leaves the pending pulls as they are (`run_of`)"
    )
    applied = Applied()
    by_table: dict[str, list[tuple[np.ndarray, RowChanges]]] = {}  # a run's position of each
    truncated: dict[str, int] = {}  # the run's position of a table's last TRUNCATE
    checked: set[int] = set()  # relations (as described in this batch) checked
    base = 0
    for txn in txns:
        for at, cut in txn.truncates():
            if cut.name != HEARTBEAT_TABLE:
                _check_relation(stream, cut)
                truncated[cut.name] = base + at
        base += txn.count
    for rows in rows_of_run(txns):
        relation = rows.relation
        if relation.name == HEARTBEAT_TABLE:
            stream_time = later(stream_time, _heartbeat_time(rows))
            continue
        if id(relation) not in checked:
            _check_relation(stream, relation)
            checked.add(id(relation))
        by_table.setdefault(relation.name, []).append((rows.at, rows))
    for name, since in truncated.items():  # a table's changes before its TRUNCATE are gone
        by_table[name] = [
            (at[at >= since], rows.where(at >= since)) for at, rows in by_table.get(name, [])
        ]
    views = [schema.views[name] for name in schema.continuous_views()]
    # a derived view's changes go through the copies of the tables it reads: the copies the
    # stream keeps (pulled, and not pending: a pending copy was pulled with every view
    # reading it, whose groups are then all of that pull's snapshot), then to the view's
    # groups but those of a pending pull (`apply_derived`)
    filled = pulled_copies(con)
    kept_copies = {
        table: copy
        for table, copy in copies_of(views, catalog).items()
        if copy_name(table) in filled and copy.name not in skip
    }
    # (a base view that is its table's copy changes at the table's turn, `apply_derived`)
    shared = {copy.name for copy in kept_copies.values()} & schema.views.keys()
    held_copies = {copy.name for copy in copies_of(views, catalog).values()} - shared
    filled_plans = [
        plan
        for plan in (plan_of(v, catalog) for v in views if v.is_derived)
        if all(copy_name(a.table) in filled for a in plan.auxiliaries)
    ]
    derived = [p for p in filled_plans if all(a.table in kept_copies for a in p.auxiliaries)]
    readers: dict[str, list[CachedView]] = {}
    for cached in views:
        if not cached.is_derived:
            readers.setdefault(cached.table, []).append(cached)
    for table, copy in kept_copies.items():
        if copy.name not in schema.views:  # (a base view that is the copy reads it already)
            readers.setdefault(table, []).append(copy)
    staged = {
        table: stage_changes(found, catalog, table, by_table.get(table, []))
        for table, found in readers.items()
    }
    try:
        for cached in views:
            if cached.is_derived or cached.name in shared:
                continue
            name = cached.name
            if cached.table in truncated:
                # TRUNCATE: the rows leave (their regions stay present, empty)
                delete_where(con, schema, cached, not_pending(skip.get(name, [])), applied)
            if staged[cached.table].count:
                apply_view(con, schema, cached, staged[cached.table], skip.get(name, []), applied)
                if arrangements is not None and name in held_copies:  # (a copy pulled, not yet
                    arrangements.forget(cached.table)  # passed by the stream: not probed now)
        apply_derived(
            con,
            schema,
            derived,
            kept_copies,
            staged,
            set(truncated),
            skip,
            applied,
            arrangements,
            filled,
            filled_plans,  # (a view waiting for a pull: the arrangements it reads stay)
        )
    finally:
        for stage in staged.values():
            stage.close(con)
    faults.hit("stream_apply", enabled_faults)  # the changes made, the position not yet
    last = txns[-1]
    stamp_regions(
        con, schema, stream, last.end_lsn, stream_time, [p.snapshot_id for p in pendings], applied
    )
    return applied


def run_of(txns: list[Transaction], pendings: list[Pending]) -> list[Transaction]:
    """The leading transactions that one `apply_transactions` call may take: the first may
    pass pending pulls, the others none of those left; a transaction spilled to disk goes
    alone (piece by piece)."""
    if txns[0].spill is not None:
        return txns[:1]
    left = [p for p in pendings if not p.passed_by(txns[0].xid, txns[0].commit_lsn)]
    for index, txn in enumerate(txns[1:], start=1):
        if txn.spill is not None or any(p.passed_by(txn.xid, txn.commit_lsn) for p in left):
            return txns[:index]
    return txns


def later(a: dt.datetime | None, b: dt.datetime | None) -> dt.datetime | None:
    if a is None or b is None:
        return a or b
    return max(a, b)


def _heartbeat_time(rows: RowChanges) -> dt.datetime | None:
    """The latest beat among a batch's changes of the heartbeat table."""
    if "beat_at" not in rows.new.column_names:
        return None
    beats = rows.new.column("beat_at").filter(pa.array(rows.has_new)).drop_null().to_pylist()
    if not beats:
        return None
    return max(dt.datetime.fromisoformat(b).astimezone(dt.UTC) for b in beats)


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
