"""The stream's part of `mtcache status`."""

from __future__ import annotations

import contextlib
import datetime as dt
import typing as t
from collections.abc import Callable

from cache.backend.pgoutput.messages import lsn_text
from cache.backend.reflect import connect_backend
from cache.backend.replication import (
    slot_state,
)
from cache.maintenance.stream.position import DEFAULT_LAG_LIMIT, load_stream
from cache.store.cache_file import CacheStore


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
