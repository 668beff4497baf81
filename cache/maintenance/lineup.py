"""Lining pulls up with the WAL stream (continuous maintenance,
docs/decisions/lining-pulls-up-with-the-stream.md).

A pull of continuously maintained regions reads one backend snapshot S; the stream consumer
is somewhere behind it (the pull holds the file's stream lock, so the stream cannot pass S
meanwhile). The pull's rows already hold every transaction S sees, so until the stream has
passed them, the consumer must not apply those transactions to the pulled regions again (it
would take rows back in time). The pull records, in its own DuckDB transaction, S's
transaction snapshot (``pg_current_snapshot()``), the WAL insert position once S was taken
and, per view, the predicate of the regions it pulled (`record_pull`). The consumer then skips,
inside those regions, the changes of every transaction S sees (`visible`). The first
transaction S does not see ends this: a transaction S does not see committed after every one
it does, so from there on the stream is past S and the pulled regions move with the others
(`Pending.passed_by`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

import duckdb

from cache.maintenance.engines import Snapshot
from control_tables.regions import Region, region_predicate
from control_tables.schema import CacheSchema


def visible(xid: int, pg_snapshot: str) -> bool:
    """Whether the transaction ``xid`` (32 bits, as pgoutput sends it) committed before the
    snapshot ``xmin:xmax:xip,...`` (``pg_current_snapshot()``'s text, 64-bit ids) was taken."""
    low, high, running = pg_snapshot.split(":")
    xmin, xmax = int(low), int(high)
    full = (xmax & ~0xFFFFFFFF) | (xid & 0xFFFFFFFF)
    if full - xmax > 1 << 31:  # an id of the epoch before xmax's
        full -= 1 << 32
    elif xmax - full > 1 << 31:
        full += 1 << 32
    if full < xmin:
        return True
    if full >= xmax:
        return False
    return str(full) not in running.split(",")


@dataclass(frozen=True)
class Pending:
    """A pull the stream has not passed yet."""

    snapshot_id: int
    pg_snapshot: str
    until_lsn: int  # every transaction the pull saw committed before this position
    backend_time: dt.datetime
    predicates: dict[str, str] = field(default_factory=dict)  # view -> DuckDB predicate

    def passed_by(self, xid: int, commit_lsn: int) -> bool:
        """Whether applying this transaction takes the stream past the pull."""
        return commit_lsn >= self.until_lsn or not visible(xid, self.pg_snapshot)


def record_pull(
    con: duckdb.DuckDBPyConnection,
    schema: CacheSchema,
    omega: Iterable[Region],
    snapshot_id: int,
    snapshot: Snapshot,
    copies: Iterable[str] = (),
) -> None:
    """Inside the pull's apply transaction: what the stream must skip until it passes S
    (``copies``: the derived views' copies of tables it pulled, skipped whole)."""
    by_view: dict[str, set[Region]] = {}
    for region in omega:
        if schema.continuous(region.view):
            by_view.setdefault(region.view, set()).add(region)
    predicates = {
        view: region_predicate(regions).sql("duckdb") for view, regions in by_view.items()
    }
    predicates |= {name: "true" for name in copies}  # (a derived view's copies: all of them)
    for view, predicate in sorted(predicates.items()):
        con.execute(
            "INSERT INTO mtcache.stream_pulls VALUES (?, ?, ?, ?, ?, ?)",
            [
                snapshot_id,
                snapshot.pg_snapshot,
                snapshot.wal_lsn,
                snapshot.backend_time,
                view,
                predicate,
            ],
        )


def pending_pulls(con: duckdb.DuckDBPyConnection) -> list[Pending]:
    found: dict[int, Pending] = {}
    rows = con.execute(
        "SELECT snapshot_id, pg_snapshot, until_lsn, backend_time, view, predicate "
        "FROM mtcache.stream_pulls ORDER BY snapshot_id"
    ).fetchall()
    for snapshot_id, pg_snapshot, until, backend_time, view, predicate in rows:
        pending = found.setdefault(
            snapshot_id, Pending(snapshot_id, pg_snapshot, until, backend_time)
        )
        pending.predicates[view] = predicate
    return list(found.values())
