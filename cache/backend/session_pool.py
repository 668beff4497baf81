"""Backend connections shared by the client sessions of a cache server, a transaction at a time
(transaction pooling, as pgbouncer's ``pool_mode = transaction``).

A session takes a connection when a statement first needs the backend and gives it back when
the backend is idle again after the client's ReadyForQuery (`cache.engine.session`): a
connection is held for a transaction block, or for one statement outside one. Connections are
pooled by role and startup parameters (`PoolKey`); at most ``size`` are open per role, and a
session that finds none free waits for one, up to ``timeout`` seconds (then its statement
fails with 53300, the session going on).

Each connection carries what the sessions left on it that a session must see again: the
session-level settings it holds (`Pooled.settings`, replayed by a session whose settings
differ) and the server's prepared statements parsed on it (`Pooled.prepared`, named by their
text, so sessions preparing the same statement share it; the least recently used are closed
past `PREPARED_LIMIT`). What cannot be carried (temporary tables, LISTEN, session advisory
locks, WITH HOLD cursors, SQL PREPARE, role changes) pins the session to its connection until
it ends; that connection is then closed, not reused.

A connection is taken in the waiting session's own thread (a refusal of the backend reaches
that session at once, as without a pool), and checked before it is handed out: one the
backend ended while it sat idle (a restart, an administrator) is closed and replaced.

The pool is our own, not psycopg_pool's: that one connects in a background thread (a backend
that is down is seen as a wait until the timeout) and has no notion of a connection's session
state or of a per-role bound over several startup parameter sets.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
import typing as t
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
from psycopg import pq

from sql_ext.errors import OperationalError

PREPARED_LIMIT = 500  # server-prepared statements kept parsed per connection
DEFAULT_TIMEOUT = 60.0  # seconds a session waits for a connection of a full pool


class PoolKey(t.NamedTuple):
    role: str
    parameters: tuple[tuple[str, str], ...]  # the startup parameters, sorted


@dataclass(eq=False)
class Pooled:
    """A pooled backend connection and what sessions left on it (see the module)."""

    conn: psycopg.Connection[t.Any]
    key: PoolKey
    settings: tuple[tuple[str, str], ...] = ()  # session-level settings (SET) it holds
    # the custom settings (placeholders: ``bars.tag``) its backend session has defined: once
    # defined, one stays so (RESET makes it empty, not unknown), so the connection serves
    # only sessions that define them too
    defined: frozenset[str] = frozenset()
    # the server's statement names parsed on it, least recently used first
    prepared: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    cancelled: bool = False  # a cancel was sent on it: it is closed, never reused


class PoolExhausted(OperationalError):
    """No connection of a full pool became free in time."""

    sqlstate = "53300"


@dataclass
class PoolStats:
    open: dict[str, int]  # connections open per role (idle ones included)
    idle: dict[str, int]
    waiting: int  # sessions waiting for a connection now
    waits: int  # acquisitions that had to wait, since start
    wait_seconds: float  # the time they waited, in all
    timeouts: int  # acquisitions that gave up
    acquired: int  # connections handed to sessions, since start
    opened: int  # connections opened, since start
    peak: dict[str, int]  # the most open at once per role, since start


class SessionPool:
    """Transaction pooling of backend connections (see the module)."""

    def __init__(self, size: int, timeout: float = DEFAULT_TIMEOUT) -> None:
        if size < 1:
            raise ValueError("a session pool holds at least one connection per role")
        self.size = size
        self.timeout = timeout
        self._cond = threading.Condition()
        self._idle: dict[PoolKey, list[Pooled]] = {}  # the last returned first (warm)
        self._open: dict[str, int] = {}
        self._waiting = 0
        self._waits = 0
        self._wait_seconds = 0.0
        self._timeouts = 0
        self._acquired = 0
        self._opened = 0
        self._peak: dict[str, int] = {}
        self._closed = False

    def acquire(
        self,
        key: PoolKey,
        connect: Callable[[], psycopg.Connection[t.Any]],
        defines: frozenset[str] = frozenset(),
    ) -> Pooled:
        """A connection for ``key`` whose backend session defined no custom setting but
        ``defines`` (the session's own): an idle one, a new one (``connect``) while the role
        has fewer than ``size``, one in place of an idle connection of the role it cannot
        take (other startup parameters, other custom settings), or the next one returned
        (`PoolExhausted` after ``timeout``)."""
        started: float | None = None
        retired: list[Pooled] = []
        try:
            with self._cond:
                while True:
                    pooled = self._take_idle(key, defines, retired)
                    if pooled is not None:
                        self._acquired += 1
                        return pooled
                    held = self._open.get(key.role, 0)
                    if held < self.size:
                        self._open[key.role] = held + 1
                        self._peak[key.role] = max(self._peak.get(key.role, 0), held + 1)
                        break
                    other = self._idle_of_role(key, defines)
                    if other is not None:  # its slot is ours (the count stays)
                        retired.append(other)
                        break
                    now = time.monotonic()
                    if started is None:
                        started = now
                        self._waits += 1
                    remaining = started + self.timeout - now
                    if remaining <= 0:
                        self._timeouts += 1
                        raise PoolExhausted(
                            f'no backend connection of role "{key.role}" became free within '
                            f"{self.timeout:g}s (all {self.size} of its pool are in "
                            "transactions or pinned): retry, keep transactions short, or "
                            "start the server with a larger --pool-size"
                        )
                    self._waiting += 1
                    try:
                        self._cond.wait(remaining)
                    finally:
                        self._waiting -= 1
                        self._wait_seconds += time.monotonic() - now
        finally:
            for gone in retired:
                _close(gone)
        try:
            conn = connect()
        except BaseException:
            with self._cond:
                self._give_back_slot(key.role)
            raise
        with self._cond:
            self._acquired += 1
            self._opened += 1
        return Pooled(conn, key)

    def release(self, pooled: Pooled) -> None:
        """A connection idle again, for the next session of its key (closed if it cannot be
        reused: cancelled, broken, inside a transaction, or the pool closed)."""
        conn = pooled.conn
        if (
            pooled.cancelled
            or conn.closed
            or conn.pgconn.transaction_status != pq.TransactionStatus.IDLE
        ):
            self.discard(pooled)
            return
        with self._cond:
            if not self._closed:
                self._idle.setdefault(pooled.key, []).append(pooled)
                self._cond.notify()
                return
        self.discard(pooled)

    def discard(self, pooled: Pooled) -> None:
        """Close a connection taken from the pool: its slot is free."""
        _close(pooled)
        with self._cond:
            self._give_back_slot(pooled.key.role)

    def stats(self) -> PoolStats:
        with self._cond:
            idle: dict[str, int] = {}
            for key, found in self._idle.items():
                if found:
                    idle[key.role] = idle.get(key.role, 0) + len(found)
            return PoolStats(
                dict(self._open),
                idle,
                self._waiting,
                self._waits,
                self._wait_seconds,
                self._timeouts,
                self._acquired,
                self._opened,
                dict(self._peak),
            )

    def close(self) -> None:
        """Close the idle connections; those in use are closed when returned."""
        with self._cond:
            self._closed = True
            idle = [p for found in self._idle.values() for p in found]
            self._idle.clear()
            for pooled in idle:
                self._give_back_slot(pooled.key.role)
            self._cond.notify_all()
        for pooled in idle:
            _close(pooled)

    # -- under the lock ----------------------------------------------------------------------------

    def _take_idle(
        self, key: PoolKey, defines: frozenset[str], retired: list[Pooled]
    ) -> Pooled | None:
        found = self._idle.get(key)
        if not found:
            return None
        for i in range(len(found) - 1, -1, -1):  # (the last returned first: warm)
            pooled = found[i]
            if not pooled.defined <= defines:
                continue
            del found[i]
            if _usable(pooled.conn):
                return pooled
            retired.append(pooled)  # (closed by the caller, outside the lock)
            self._give_back_slot(key.role)
        return None

    def _idle_of_role(self, key: PoolKey, defines: frozenset[str]) -> Pooled | None:
        """An idle connection of the role the session cannot take, the longest idle: its
        slot is the session's."""
        for other, found in self._idle.items():
            if other.role != key.role:
                continue
            for i, pooled in enumerate(found):
                if other != key or not pooled.defined <= defines:
                    return found.pop(i)
        return None

    def _give_back_slot(self, role: str) -> None:
        held = self._open.get(role, 0) - 1
        if held > 0:
            self._open[role] = held
        else:
            self._open.pop(role, None)
        self._cond.notify()


def _usable(conn: psycopg.Connection[t.Any]) -> bool:
    """Whether an idle connection is still the backend's: an idle connection that is not
    listening (LISTEN pins a session) has nothing to read unless the backend ended it (its
    farewell, or the end of the stream)."""
    if conn.closed or conn.pgconn.status != pq.ConnStatus.OK:
        return False
    poller = select.poll()
    poller.register(conn.pgconn.socket, select.POLLIN | select.POLLERR | select.POLLHUP)
    return not poller.poll(0)


def _close(pooled: Pooled) -> None:
    with contextlib.suppress(psycopg.Error, OSError):
        pooled.conn.close()


__all__ = ["PREPARED_LIMIT", "PoolExhausted", "PoolKey", "PoolStats", "Pooled", "SessionPool"]
