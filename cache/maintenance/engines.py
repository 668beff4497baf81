"""Refresh engines behind one Protocol: an engine runs the pulls of one operation
inside the coordinator's backend snapshot and returns one Arrow table per pull query.

`InlineEngine` pulls in this process (small on-demand pulls: a presence miss's admission);
`cache.maintenance.spark.SparkEngine` runs them as Spark tasks, each joined to the exported
snapshot. `Coordinator` is the backend side of an operation: the REPEATABLE READ transaction
whose snapshot every pull reads.
"""

from __future__ import annotations

import datetime as dt
import time
import typing as t
from dataclasses import dataclass

import psycopg
import pyarrow as pa

from cache.backend.copy_arrow import copy_to_arrow
from cache.backend.pgoutput.messages import lsn_value
from cache.backend.reflect import connect_backend
from control_tables.types import select_list
from sql_ext.errors import translate


@dataclass(frozen=True)
class Snapshot:
    backend_time: dt.datetime
    exported: str  # pg_export_snapshot(): other sessions join it with SET TRANSACTION SNAPSHOT
    pg_snapshot: str  # pg_current_snapshot() as text: which transactions the pull saw
    wal_lsn: int = 0  # the WAL insert position once the snapshot was taken: every transaction
    # it saw committed before this (continuous maintenance lines the stream up with the pull)


@dataclass(frozen=True)
class PullQuery:
    view: str
    table: str  # backend table (schema-qualified, quoted)
    columns: tuple[tuple[str, str], ...]  # (column, DuckDB type) in view order
    where: str  # PostgreSQL predicate: the view's WHERE and the regions'
    pages: int = 0  # backend heap pages: lets an engine split a large pull by block range

    def sql(self, extra: str | None = None) -> str:
        where = self.where if extra is None else f"({self.where}) AND ({extra})"
        return f"SELECT {select_list(list(self.columns))} FROM {self.table} WHERE {where}"


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
                "SELECT statement_timestamp(), pg_export_snapshot(), pg_current_snapshot()::text, "
                "pg_current_wal_insert_lsn()::text"
            ).fetchone()
        except psycopg.Error as exc:
            self.conn.close()
            raise translate(exc, "opening the refresh snapshot on the backend") from exc
        assert row is not None
        self.snapshot = Snapshot(row[0], row[1], row[2], lsn_value(row[3]))

    def snapshot_age(self) -> t.Callable[[], float]:
        """How old the snapshot is, in seconds, from now on: the backend's clock read once
        here, then the local monotonic clock (no round trip later)."""
        row = self.conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        began, then = time.monotonic(), (row[0] - self.snapshot.backend_time).total_seconds()
        return lambda: then + time.monotonic() - began

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


class Engine(t.Protocol):
    """Runs pulls inside the coordinator's snapshot and returns one Arrow table per query."""

    name: str
    reason: str  # why it pulled (a report shows it): "asked for", or an engine chosen by size's

    def pull(self, coordinator: Coordinator, queries: list[PullQuery]) -> list[pa.Table]: ...


class InlineEngine:
    """Pulls in this process over the coordinator's own connection (psycopg COPY into Arrow):
    for small on-demand pulls such as a presence miss's admission."""

    name = "inline"

    def __init__(self, reason: str = "asked for") -> None:
        self.reason = reason  # why it pulls (a report and status show it)

    def pull(self, coordinator: Coordinator, queries: list[PullQuery]) -> list[pa.Table]:
        return [
            copy_to_arrow(coordinator.conn, query.sql(), list(query.columns)) for query in queries
        ]
