"""Backend connections shared by all sessions of a process for the remote branches of cached
queries: the rows a mixed plan's remote leaves import into DuckDB.

A session's own backend connection stays the session's: plain SQL, writes, transactions and
whole-statement remote execution run there, in the session's transaction. Remote leaves need
no transaction of the session (they read committed data; a leaf over a table the session has
written but not committed reads through the session instead, see cache.dbapi.connection), so
they come from a psycopg pool, several leaves of one plan in parallel and in one snapshot.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import typing as t
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from sql_ext.errors import BackendUnavailableError, first_line

POOL_SIZE = 4  # backend connections per backend, shared by the process's sessions
WAIT_SECONDS = 5.0  # for a pooled connection before the backend counts as unreachable
READY_SECONDS = 0.05  # a ready connection comes at once; beyond this, check the backend is up
PROBE_SECONDS = 2  # connect timeout of that check

_pools: dict[str, ConnectionPool[t.Any]] = {}
_lock = threading.Lock()
_workers = ThreadPoolExecutor(max_workers=POOL_SIZE, thread_name_prefix="mtcache-leaf")


def backend_pool(dsn: str) -> ConnectionPool[t.Any]:
    """The process's pool for a backend (opened on first use, closed at exit)."""
    with _lock:
        pool = _pools.get(dsn)
        if pool is None or pool.closed:
            # check: a connection the backend ended while it waited in the pool (a restart, an
            # administrator) is replaced when taken, not handed out to fail (one round trip)
            pool = ConnectionPool(
                dsn,
                min_size=1,
                max_size=POOL_SIZE,
                kwargs={"autocommit": True},
                name="mtcache-backend",
                timeout=WAIT_SECONDS,
                open=True,
                check=ConnectionPool.check_connection,
            )
            _pools[dsn] = pool
        return pool


@contextmanager
def pooled(dsn: str) -> Iterator[psycopg.Connection[t.Any]]:
    """A backend connection from the pool, returned afterwards (reset if it failed). When none
    is ready at once, a direct connection attempt tells a down backend (fail now) from a busy
    pool (wait up to WAIT_SECONDS)."""
    pool = backend_pool(dsn)
    try:
        conn = pool.getconn(timeout=READY_SECONDS)
    except PoolTimeout:
        _check_reachable(dsn)
        try:
            conn = pool.getconn(timeout=WAIT_SECONDS)
        except PoolTimeout as exc:
            raise BackendUnavailableError(
                f"no backend connection within {WAIT_SECONDS:g}s: the backend is unreachable "
                f"or busy ({exc}); a remote part of the query needs it"
            ) from exc
    try:
        yield conn
    finally:
        pool.putconn(conn)


def _check_reachable(dsn: str) -> None:
    try:
        psycopg.connect(dsn, connect_timeout=PROBE_SECONDS).close()
    except psycopg.OperationalError as exc:
        raise BackendUnavailableError(
            f"the backend is unreachable ({first_line(exc)}); a remote part of the query needs it"
        ) from exc


R = t.TypeVar("R")


def in_one_snapshot(dsn: str, tasks: Sequence[Callable[[psycopg.Connection[t.Any]], R]]) -> list[R]:
    """Run the tasks concurrently on pooled connections, all reading one backend snapshot:
    the first connection opens a REPEATABLE READ transaction and exports its
    snapshot, the others join it (as the refresh pipeline's tasks do). Results in task order."""
    if len(tasks) == 1:
        with pooled(dsn) as conn:
            return [tasks[0](conn)]
    width = min(len(tasks), POOL_SIZE)
    shares = [list(range(i, len(tasks), width)) for i in range(width)]
    results: list[t.Any] = [None] * len(tasks)
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(pooled(dsn)) for _ in range(width)]
        snapshot = None
        for conn in conns:
            stack.enter_context(conn.transaction())
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            if snapshot is None:
                row = conn.execute("SELECT pg_export_snapshot()").fetchone()
                assert row is not None
                snapshot = row[0]
            else:
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))

        def run(share: int) -> None:
            for index in shares[share]:
                results[index] = tasks[index](conns[share])

        list(_workers.map(run, range(width)))
    return results


def close_all() -> None:
    with _lock:
        for pool in _pools.values():
            pool.close()
        _pools.clear()


atexit.register(close_all)
