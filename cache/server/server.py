"""`mtcache serve`: the cache as a server that speaks PostgreSQL's protocol to every client.

The server moves bytes; the engine converses. One `Server` owns one engine
(`cache.engine.Engine`: the cache file, its scheduler, stream consumer and heartbeat) and a
listening socket; each client's conversation in the protocol - cached answers, passthrough,
pooling, positions and settings - is the engine's (`cache.engine.conversation`), which the
server feeds the client's bytes and whose answers it writes. An event loop (asyncio on
uvloop) owns every client socket: it reads and parses the messages and has the conversation
answer on the spot what needs no waiting - the cached point lookups of prepared statements
from the result memo or a lookup index, and runs passed through whose answer the loop relays
as it comes (`cache.engine.conversation.at_once`). Everything else a session asks (planning,
DuckDB statements, the backend) is answered by a worker thread of a pool, one message after
another, the session's messages kept in order; a session holds a thread only while it has
work, so idle sessions are cheap, a slow remote statement never holds up another session, and
statements of different sessions run in parallel wherever DuckDB and the backend allow
(docs/decisions/the-server-loop-and-workers.md). A worker writes to the client's socket
itself, once what the loop wrote has gone out, and waits while the client does not read; the
loop answers nothing more while its own output waits (backpressure on both paths).

Startup: SSLRequest is answered "S" and TLS set up on the connection when the server has a
certificate (`ServerOptions.tls`; the workers then write through the loop, which owns the TLS
transport), else "N", as is GSSENCRequest; the client then authenticates as its rules say
(`cache.server.auth`: loopback clients trusted by default, SCRAM or a password over TLS), and
its backend connection logs in as that role. ParameterStatus reports the backend's
settings as the backend reports them to a session with the client's parameters; BackendKeyData
gives the key a CancelRequest presents, which cancels the session's running statement, local
or remote (the DuckDB interrupt repeated while that statement runs); a client that goes away
while its statement runs has it cancelled. SIGTERM/SIGINT: stop accepting, let running
statements finish for a grace period, cancel what still runs, close the sessions and the
cache file.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import uvloop

from cache.backend.reflect import redact
from cache.backend.session_pool import SessionPool
from cache.engine.admin import Admin
from cache.engine.conversation.opening import Conversations
from cache.engine.conversation.statistics import StatementStats
from cache.engine.engine import Engine
from cache.engine.session import Session
from cache.engine.stats import Sample
from cache.server.connection import ClientConnection
from cache.server.counters import ServerCounter
from cache.server.limits import TICK_SECONDS, Admission
from cache.server.metrics import MetricsEndpoint, server_samples
from cache.server.options import ServerOptions, listen_socket, metrics_address
from cache.server.watch import BackendWatch
from cache.wire import protocol

log = logging.getLogger("mtcache.server")

# Linux's PID_MAX_LIMIT: no process has a pid past it; a session told none of its own gets one
# from here (to the protocol's last) as its pid
PID_MAX_LIMIT = 1 << 22
_LAST_PID = (1 << 31) - 1
WORKERS = 1024  # threads answering sessions' work at once, at most (made when needed)
WORKER_STACK = 512 * 1024  # a worker thread's stack


class Server:
    """Listens and serves until `shutdown` (see the module)."""

    def __init__(
        self,
        engine: Engine,
        options: ServerOptions | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        self.engine = engine
        self.options = options or ServerOptions()
        self._socket = sock if sock is not None else listen_socket(self.options.listen)
        self.address = self._socket.getsockname()[:2]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._clients: dict[tuple[int, bytes], ClientConnection] = {}
        self._connections: set[ClientConnection] = set()  # the event loop's own
        self._next_pid = PID_MAX_LIMIT  # (`register`)
        self._signals = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread: int | None = None
        self._stopping: asyncio.Event | None = None
        self.workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="mtcache-session")
        self.admission = Admission(self.options.limits)
        self.pool = (
            SessionPool(self.options.pool_size, self.options.pool_timeout)
            if self.options.pool_size
            else None
        )
        # statements by route and outcome, and their latency: kept while metrics are served
        self.statement_stats = StatementStats() if self.options.metrics is not None else None
        self._own_stats = functools.partial(server_samples, self)
        engine.stats_sources.append(self._own_stats)  # (SHOW CACHE STATS over the wire too)
        # prepared runs taken whole (`ClientConnection._at_hand`, `AtOnce.take`), by the path
        # that answered them: a statement's lane, at hand, passed through by the loop
        # (`ClientConnection._relay`) byte for byte or not (`cache.server.counters`)
        self.counters = ServerCounter.zeros()
        self.conversations = Conversations(
            engine,
            pool=self.pool,
            currency_bound=self.options.currency_bound,
            backend_settings=self.options.limits.backend_settings(),
            max_result_bytes=self.options.max_result_bytes,
            statement_stats=self.statement_stats,
        )
        self.watch = BackendWatch(self.conversations.reported.probe)
        self.metrics: MetricsEndpoint | None = None
        if self.options.metrics is not None:
            self.metrics = _metrics_endpoint(self, self.options.metrics)

    # -- serving -----------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Accept clients until `shutdown` (or SIGTERM/SIGINT, see `install_signals`)."""
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self._serve())

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self.loop, self.loop_thread = loop, threading.get_ident()
        if self._signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.shutdown)
        listening = await loop.create_server(
            lambda: ClientConnection(self), sock=self._socket, backlog=512
        )
        log.info(
            "mtcache serving %s on %s:%d (backend %s)",
            self.engine.cache_path,
            self.address[0],
            self.address[1],
            redact(self.engine.backend),
        )
        self.watch.start()
        limits = self.options.limits
        if limits.statement_timeout is not None or limits.idle_in_transaction_timeout is not None:
            loop.call_later(TICK_SECONDS, self._tick)
        try:
            if not self._stop.is_set():
                await self._stopping.wait()
        finally:
            listening.close()
            await self._finish()

    def shutdown(self) -> None:
        """Refuse new sessions; `serve_forever` then finishes the running ones and returns
        (from any thread)."""
        self._stop.set()
        loop, stopping = self.loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended
                loop.call_soon_threadsafe(stopping.set)

    def install_signals(self) -> None:
        """SIGTERM and SIGINT shut the server down (call before `serve_forever`, in the main
        thread)."""
        self._signals = True
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.shutdown())

    async def _finish(self) -> None:
        """Let running statements finish within the grace period, cancel the rest, close."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.grace_seconds
        connections = list(self._connections)
        for client in connections:
            client.stop_reading()
        while loop.time() < deadline and any(c.working for c in connections):
            await asyncio.sleep(0.05)
        for client in connections:
            if client.busy:
                log.info("cancelling a statement still running at shutdown")
                client.cancel()
        farewell = protocol.error_response(
            "57P01", "terminating connection due to administrator command", severity="FATAL"
        )
        for client in connections:
            client.close(farewell)
        end = loop.time() + 15
        while self._connections and loop.time() < end:  # sessions close in the workers
            await asyncio.sleep(0.02)
        await loop.run_in_executor(None, self.workers.shutdown)
        if self.pool is not None:
            self.pool.close()
        if self.metrics is not None:
            self.metrics.close()
        self.watch.stop()
        self.conversations.close()
        with contextlib.suppress(ValueError):
            self.engine.stats_sources.remove(self._own_stats)
        log.info("mtcache server stopped")

    def _tick(self) -> None:
        """Statements and idle transactions past their time (`cache.server.limits`)."""
        if self._stop.is_set():
            return
        now, limits = time.monotonic(), self.options.limits
        for client in list(self._connections):
            client.check_time(now, limits)
        assert self.loop is not None
        self.loop.call_later(TICK_SECONDS, self._tick)

    def stats(self) -> list[Sample]:
        """The cache's figures and the server's (`cache.engine.stats`), read now through a
        DuckDB handle of their own (the Prometheus endpoint's scrape)."""
        engine = self.engine
        store = engine.store.for_thread()
        try:
            document = Admin(
                store, lambda: engine.backend, counters=lambda: engine.counters(store)
            ).status()
        finally:
            store.close()
        return engine.stats(document)

    def responsive(self, timeout: float) -> bool:
        """Whether the event loop runs a callback within ``timeout`` seconds (from another
        thread)."""
        loop, answered = self.loop, threading.Event()
        if loop is None or self._stop.is_set():
            return False
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # the loop has ended
            return False
        return answered.wait(timeout)

    def run(self, job: Callable[[], None]) -> None:
        """Run ``job`` on a worker thread (from the event loop)."""
        size = threading.stack_size(WORKER_STACK)  # (a thread made now gets this stack)
        try:
            self.workers.submit(job)
        finally:
            threading.stack_size(size)

    # -- sessions ----------------------------------------------------------------------------------

    def opened(self, client: ClientConnection) -> None:
        self._connections.add(client)

    def closed(self, client: ClientConnection) -> None:
        self._connections.discard(client)

    def register(self, client: ClientConnection, pid: int | None = None) -> tuple[int, bytes]:
        """The key a client's CancelRequest presents (BackendKeyData): ``pid``, the process of
        the session's own backend connection, as PostgreSQL tells it; None (a session without
        one yet, or a pooled one) a pid no process can have, never another's."""
        with self._lock:
            if pid is None:
                pid = self._next_pid
                self._next_pid = pid + 1 if pid < _LAST_PID else PID_MAX_LIMIT
            key = secrets.token_bytes(4)
            self._clients[(pid, key)] = client
        return pid, key

    def unregister(self, key: tuple[int, bytes]) -> None:
        with self._lock:
            self._clients.pop(key, None)

    def cancel(self, pid: int, key: bytes) -> None:
        with self._lock:
            client = self._clients.get((pid, key))
        if client is not None:
            client.cancel()

    def session_of(self, pid: int) -> Session | None:
        """The session of the client whose BackendKeyData gave this process id."""
        with self._lock:
            found = [client for (key_pid, _), client in self._clients.items() if key_pid == pid]
        return found[0].session if found else None

    def sessions(self) -> int:
        """How many client sessions are open."""
        with self._lock:
            return len(self._clients)

    def running(self) -> int:
        """How many sessions are answering a message now."""
        with self._lock:
            return sum(1 for client in self._clients.values() if client.busy)

    def quiet(self) -> bool:
        """Whether no session's messages are being answered by a worker or relayed now (a
        session's answer may reach its client a moment before its worker lets go of it)."""
        return not any(client.working for client in list(self._connections))

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def backend_up(self) -> bool:
        return self.watch.up

    @property
    def ready(self) -> bool:
        """Accepting sessions, and the backend reached since the start (`BackendWatch`)."""
        return not self.stopping and self.watch.reached


def _metrics_endpoint(server: Server, address: str) -> MetricsEndpoint:
    """The Prometheus endpoint of ``--metrics HOST:PORT``."""
    host, port = metrics_address(address)
    return MetricsEndpoint(server, host, port)


__all__ = ["Server"]
