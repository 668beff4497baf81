"""What the stream modules share: the stream's row in the cache file (slot, publication, the
position applied, the relations as signed at DDL time), its timing constants, and the
exceptions and values applying passes between modules."""

from __future__ import annotations

import datetime as dt
import json
import logging
import typing as t
from dataclasses import dataclass, field

import duckdb

from control_tables.regions import Region

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
    rows = con.execute(
        "SELECT slot, publication, applied_lsn, stream_time, applied_at, relations, problem "
        "FROM mtcache.stream"
    ).fetchall()  # (all: a result left unfinished would keep DuckDB from registering Arrow)
    if not rows:
        return None
    row = rows[0]
    return StreamRow(
        row[0], row[1], int(row[2]), row[3], row[4], json.loads(row[5] or "{}"), row[6]
    )


@dataclass
class NeedsPull(Exception):
    """The stream cannot carry what a transaction brings into the cache: pull these."""

    seeds: set[Region]
    admitted: dict[str, list[tuple[t.Any, ...]]] = field(default_factory=dict)


@dataclass
class Applied:
    views: set[str] = field(default_factory=set)  # whose rows the batch changed
    # seconds spent on each copy of a table and on each derived view's delta (`apply_derived`)
    spent: dict[str, float] = field(default_factory=dict)
