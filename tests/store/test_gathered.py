"""What the reads teach, kept in the cache file: the bounds asked and the reads the backend
answered, read back and added to what a process counted before reading them (a one-shot
command counts, then closes: nothing is lost). No backend needed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cache.store.bound_asks import BoundAsks
from cache.store.cache_file import CacheStore
from cache.store.remote_reads import RemoteReads

ASKS = (("salescopy", 600.0, 2.0),)


def test_what_a_process_counted_is_added_to_what_the_file_kept(tmp_path: Path) -> None:
    now = time.time()
    store = CacheStore(tmp_path / "cache.duckdb")
    try:
        store.asks.asked(ASKS)
        store.asks.fold(now)
        store.remote_reads.answered("SELECT %s", "no view", "no view: ...", 5.0, now)
        store.save_gathered(now, force=True)
        asks_rows = store.con.execute(
            "SELECT view, bound, queries, saved, epoch(since), epoch(as_of) FROM mtcache.bound_asks"
        ).fetchall()
        read_rows = store.con.execute(
            "SELECT statement, calls, backend_ms, kind, reason, epoch(first_seen), "
            "epoch(last_seen) FROM mtcache.remote_reads"
        ).fetchall()
    finally:
        store.close()
    # another process: it counts before it reads the file's, then reads them
    asks = BoundAsks()
    asks.asked(ASKS)
    asks.asked(ASKS)
    asks.fold(now)
    asks.load(asks_rows)
    assert asks.counts("salescopy", now) == pytest.approx({600.0: 3.0})
    reads = RemoteReads()
    reads.answered("SELECT %s", "no view", "no view: ...", 7.0, now)
    reads.load(read_rows)
    [shape] = reads.shapes()
    assert (shape.calls, shape.backend_ms) == (2, 12.0)
    assert shape.reason == ("no view", "no view: ...")
